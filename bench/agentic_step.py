"""Step time, compiles and whole-run time of `AgenticPpoLearner` against tunix's own agentic
`GRPOLearner`, side by side.

The same task, model, batch and rollout (bench/_agentic_task.py: `GuessTheLetter` on the
toy model through tunix main's orchestrator), no KL (`beta=0`, so no reference pass), the
sampler's log-probs as the old ones (both learners' default). Each learner runs in a
process of its own (its own compilations, nothing compiled by another learner reused):

- `tunix_grpo`: tunix's `GRPOLearner` (`GRPOConfig`);
- `ppo_grpo`: `AgenticPpoLearner` with `advantage_estimator=grpo` (no critic): our
  rollout phase and PPO loss against tunix's;
- `ppo_grpo_capped`: the same with `max_tokens_per_turn` (`--cap` tokens a reply);
- `ppo_gae`: `AgenticPpoLearner` with `advantage_estimator=gae` and a critic, its critic
  passes timed: the value pass of the rollout phase and tunix's `update_critic`.

A step's time is the wall time between successive `update_actor` calls of tunix's loop
(rollout, rollout phase and updates), the median over the steps after `--warmup`, at
learning rate 0 (the updates computed in full, the policy unchanged: every learner samples
the same kind of episodes). `compiles` counts the XLA programs the process compiled
during `train` (JAX's `/jax/core/compile/backend_compile_duration` events: jitted
functions and eager operations alike); `run s` is `train`'s wall time, compilations
included. Prints a table with each learner's figures and their ratios to `tunix_grpo`;
`--out` writes it as JSON too.

  python bench/agentic_step.py [--steps 15] [--warmup 4] [--cap 8] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import _agentic_task as task
import jax
from flax import nnx

# lr 0: the updates run in full (gradients, Adam) but the policy stays the one it starts
# as, so every learner samples the same kind of episodes (a policy that learns shorter
# replies would make its rollouts, most of a step, cheaper)
BATCH, GENERATIONS, LR = 4, 4, 0.0


def stamped(fn: Callable[..., Any], stamps: list[float]) -> Callable[..., Any]:
  """`fn`, appending `time.perf_counter()` before each call."""

  @functools.wraps(fn)
  def wrapper(*args: Any, **kwargs: Any) -> Any:
    stamps.append(time.perf_counter())
    return fn(*args, **kwargs)

  return wrapper


def timed(fn: Callable[..., Any], spent: list[float], done: Callable[[Any], Any]) -> Callable:
  """`fn`, appending each call's seconds to `spent`, `done(result)` blocked on first
  (JAX dispatches asynchronously)."""

  @functools.wraps(fn)
  def wrapper(*args: Any, **kwargs: Any) -> Any:
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    jax.block_until_ready(done(result))
    spent.append(time.perf_counter() - start)
    return result

  return wrapper


LEARNERS = ("tunix_grpo", "ppo_grpo", "ppo_grpo_capped", "ppo_gae")
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def run(name: str, args: argparse.Namespace) -> dict[str, Any]:
  """One learner's run in this process: median step time, XLA programs compiled and the
  whole `train`'s seconds; for `ppo_gae`, its critic passes' time per step (value pass +
  critic update, medians after the warm-up)."""
  critic = name == "ppo_gae"
  engine = task.cluster(0, critic=critic, steps=args.steps, batch=BATCH, lr=LR)
  keys = {"num_generations": GENERATIONS, "beta": 0.0}
  if name == "tunix_grpo":
    learner = task.grpo_learner(engine, [], **keys)
  else:
    estimator = "gae" if critic else "grpo"
    if name == "ppo_grpo_capped":
      keys["max_tokens_per_turn"] = args.cap
    learner = task.ppo_learner(engine, [], advantage_estimator=estimator, **keys)
  stamps, values_s, update_s = [], [], []
  engine.update_actor = stamped(engine.update_actor, stamps)
  if critic:
    learner._passes.values = timed(learner._passes.values, values_s, lambda out: out)
    model = engine.critic_trainer.model
    update = timed(engine.update_critic, update_s, lambda _: nnx.state(model, nnx.Param))
    engine.update_critic = update
  compiles = [0]
  count = lambda event, _s, **_kw: compiles.__setitem__(0, compiles[0] + (event == COMPILE_EVENT))  # noqa: E731
  jax.monitoring.register_event_duration_secs_listener(count)
  start = time.perf_counter()
  learner.train(task.dataset(args.steps + 2, BATCH, 0))
  whole = time.perf_counter() - start
  engine.close()
  steps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)][args.warmup :]
  result = {
    "learner": name,
    "step_s": statistics.median(steps),
    "steps_timed": len(steps),
    "compiles": compiles[0],
    "run_s": whole,
  }
  if critic:
    result["critic_s"] = per_step(values_s, len(stamps), args) + per_step(
      update_s, len(stamps), args
    )
  return result


def in_own_process(name: str, args: argparse.Namespace) -> dict[str, Any]:
  """`run(name)` in a fresh Python process (nothing compiled by another learner)."""
  command = [sys.executable, __file__, "--one", name, "--steps", str(args.steps)]
  command += ["--warmup", str(args.warmup), "--cap", str(args.cap)]
  done = subprocess.run(command, check=True, capture_output=True, text=True)
  return json.loads(done.stdout.strip().splitlines()[-1])


def per_step(spent: list[float], steps: int, args: argparse.Namespace) -> float:
  """Seconds per step of a pass called `len(spent) / steps` times a step: the median call
  after the warm-up's calls, times the calls per step."""
  calls = len(spent) / steps
  return statistics.median(spent[round(args.warmup * calls) :]) * calls


def report(results: dict[str, dict[str, Any]]) -> str:
  """The markdown table of the learners, their ratios to `tunix_grpo`, and the critic's
  share of `ppo_gae`'s step."""
  base = results["tunix_grpo"]
  lines = [
    "| learner | step s | / tunix | compiles | / tunix | run s | / tunix | critic passes s |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
  ]
  for name, r in results.items():
    critic = f"{r['critic_s']:.3f}" if "critic_s" in r else "-"
    ratios = [r[key] / base[key] for key in ("step_s", "compiles", "run_s")]
    lines.append(
      f"| {name} | {r['step_s']:.3f} | {ratios[0]:.2f} | {r['compiles']} | {ratios[1]:.2f} "
      f"| {r['run_s']:.1f} | {ratios[2]:.2f} | {critic} |"
    )
  if "ppo_gae" in results and "ppo_grpo" in results:
    gae = results["ppo_gae"]
    critic = gae["step_s"] - results["ppo_grpo"]["step_s"]  # what the critic adds
    lines.append("")
    lines.append(
      f"ppo_gae less ppo_grpo (the critic, by difference): {critic:.3f} s a step; "
      f"ppo_gae less that: {(gae['step_s'] - critic) / base['step_s']:.2f}x tunix_grpo."
    )
  return "\n".join(lines) + "\n"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=15)
  parser.add_argument("--warmup", type=int, default=4, help="steps left out (compiles)")
  parser.add_argument("--cap", type=int, default=8, help="ppo_grpo_capped's tokens a reply")
  parser.add_argument("--learners", nargs="+", choices=LEARNERS, default=list(LEARNERS))
  parser.add_argument("--one", choices=LEARNERS, help=argparse.SUPPRESS)  # a child's learner
  parser.add_argument("--out", type=pathlib.Path, default=None)
  args = parser.parse_args()
  if args.one:
    print(json.dumps(run(args.one, args)))
    return
  results = {
    name: in_own_process(name, args) for name in dict.fromkeys(["tunix_grpo", *args.learners])
  }
  text = report(results) + f"Load average: {os.getloadavg()[0]:.1f}.\n"
  print(text)
  if args.out is not None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"results": results, "table": text}, indent=1) + "\n")


if __name__ == "__main__":
  main()
