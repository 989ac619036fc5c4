"""Does `AgenticPpoLearner` with a critic learn a multi-turn task on tunix's agentic stack?

Trains the toy model on `GuessTheLetter` (bench/_agentic_task.py: guess a secret letter
of `abcd` in 3 turns from `<`/`>` hints, through tunix main's orchestrator, `ModelAgent`
and a tunix `BaseTaskEnv`) with `AgenticPpoLearner`, `advantage_estimator=gae` and a
critic, one run per seed, and writes each seed's per-batch success rates to
`OUT/seed<k>.json`; then the table of every seed in `OUT` to `OUT/README.md`. A seed whose
JSON exists is skipped (rerun to resume). The first `--warmup` steps train only the critic
(`critic_warmup_steps`), so their batches are all sampled by the untrained policy: their
success is the seed's baseline (with `--warmup 0`, the first batch's). A seed passes when
its success over the last `--last` batches is above that baseline.

Episodes are `--width` tokens (the agent's replies, the hints and role markers of all its
turns): the untrained toy's replies run about 15-20 tokens, so 32 holds about one turn and
64 the game's three. tunix gives each model call what is left of the episode's width;
`--max-tokens-per-turn` (the learner's `max_tokens_per_turn`; 0: none) caps each call, by
default at 1: the game reads a reply's first character only, so a one-token reply is the
move and nothing else is trained. `--invalid-penalty` (default 0.1) is the task's format
penalty: a guess that is not a letter (an empty reply too) earns minus it. The runs before
these two (`bench/results/agentic_toy`, `agentic_toy_kl`; earlier sampling keys, an empty
reply answered `>`) had neither; `--max-tokens-per-turn 0 --invalid-penalty 0` is that
setting. Each seed's JSON also keeps, per batch, the share of empty first replies, the
first replies' mean length and the turns an episode took.

  python bench/agentic_toy.py [--seeds 0 1 2] [--steps 40] [--out bench/results/agentic_toy]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time
from typing import Any

import _agentic_task as task
import numpy as np

CONFIG = {"advantage_estimator": "gae", "beta": 0.0, "entropy_coef": 0.0, "gae_lambda": 1.0}
PROMPT_ROOM = 32  # prompt slots beyond the episode width: the first prompt and its markers


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, Any]:
  """One seed's training run: its settings, per-batch success and wall time."""
  engine = task.cluster(
    seed,
    critic=True,
    steps=args.steps,
    batch=args.batch,
    lr=args.lr,
    prompt_len=args.width + PROMPT_ROOM,
    width=args.width,
  )
  log, replies = task.SuccessLog(), task.ReplyLog()
  keys = {**CONFIG, "num_generations": args.generations, "critic_warmup_steps": args.warmup}
  keys |= {"beta": args.beta, "entropy_coef": args.entropy_coef}
  keys |= {"max_tokens_per_turn": args.max_tokens_per_turn or None}
  env, penalty = replies.env_class(), args.invalid_penalty
  learner = task.ppo_learner(engine, [log], args.width, env, penalty, **keys)
  start = time.perf_counter()
  learner.train(task.dataset(args.steps + 1, args.batch, seed))
  wall = time.perf_counter() - start
  engine.close()
  success = log.per_batch(args.batch * args.generations)[: args.steps]
  baseline_batches = max(args.warmup, 1)  # the untrained policy's batches
  baseline = float(np.mean(success[:baseline_batches]))
  last = float(np.mean(success[-args.last :]))
  return {
    "seed": seed,
    "config": {**keys, "lr": args.lr, "batch": args.batch, "steps": args.steps}
    | {"width": args.width, "invalid_penalty": args.invalid_penalty},
    "baseline_batches": baseline_batches,
    "success_per_batch": success,
    "baseline_success": baseline,
    "last_success": last,
    "last_batches": args.last,
    "rises": last > baseline,
    "first_replies_per_batch": replies.per_batch(args.batch, args.steps),
    "wall_s": round(wall, 1),
  }


def table(out: pathlib.Path) -> str:
  """The markdown table of every `seed*.json` in `out`."""
  rows = [json.loads(p.read_text()) for p in sorted(out.glob("seed*.json"))]
  lines = [
    "| seed | baseline success (batches) | success, last batches | best batch | rises | "
    "empty first replies, last batches | wall s |",
    "| --- | --- | --- | --- | --- | --- | --- |",
  ]
  for r in rows:
    empty = r.get("first_replies_per_batch", {}).get("empty_first", [])[-r["last_batches"] :]
    lines.append(
      f"| {r['seed']} | {r['baseline_success']:.2f} ({r.get('baseline_batches', 1)}) | "
      f"{r['last_success']:.2f} "
      f"(last {r['last_batches']}) | {max(r['success_per_batch']):.2f} | "
      f"{'yes' if r['rises'] else 'no'} | {f'{np.mean(empty):.2f}' if empty else '-'} | "
      f"{r['wall_s']} |"
    )
  return "\n".join(lines) + "\n"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--batch", type=int, default=4, help="prompts per batch")
  parser.add_argument("--generations", type=int, default=4, help="episodes per prompt")
  parser.add_argument("--lr", type=float, default=1e-3)
  parser.add_argument("--width", type=int, default=64, help="an episode's tokens")
  parser.add_argument("--warmup", type=int, default=8, help="critic-only steps first")
  parser.add_argument("--beta", type=float, default=0.0, help="the KL's coefficient")
  parser.add_argument("--entropy-coef", type=float, default=0.0)
  parser.add_argument(
    "--max-tokens-per-turn", type=int, default=1, help="a model call's token cap (0: none)"
  )
  parser.add_argument(
    "--invalid-penalty", type=float, default=0.1, help="the reward of a guess not a letter, negated"
  )
  parser.add_argument("--last", type=int, default=5, help="batches averaged at the end")
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/agentic_toy"))
  args = parser.parse_args()
  args.out.mkdir(parents=True, exist_ok=True)
  for seed in args.seeds:
    path = args.out / f"seed{seed}.json"
    if path.exists():
      print(f"seed {seed}: done before ({path}), skipped")
      continue
    result = run_seed(seed, args)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"seed {seed}: {result['baseline_success']:.2f} -> {result['last_success']:.2f}")
  load = os.getloadavg()[0]
  text = f"# agentic_toy\n\n{table(args.out)}\nLoad average at the end: {load:.1f}.\n"
  (args.out / "README.md").write_text(text)
  print(text)


if __name__ == "__main__":
  main()
