"""Step time of `AgenticPpoLearner` against tunix's own agentic `GRPOLearner`, one run.

The same task, model, batch and rollout (bench/_agentic_task.py: `GuessTheLetter` on the
toy model through tunix main's orchestrator), no KL (`beta=0`, so no reference pass), the
sampler's log-probs as the old ones (both learners' default), three learners one after
the other in this process:

- `tunix_grpo`: tunix's `GRPOLearner` (`GRPOConfig`);
- `ppo_grpo`: `AgenticPpoLearner` with `advantage_estimator=grpo` (no critic): our
  rollout phase and PPO loss against tunix's;
- `ppo_gae`: `AgenticPpoLearner` with `advantage_estimator=gae` and a critic, its critic
  passes timed: the value pass of the rollout phase and tunix's `update_critic`.

A step's time is the wall time between successive `update_actor` calls of tunix's loop
(rollout, rollout phase and updates), the median over the steps after `--warmup`, at
learning rate 0 (the updates computed in full, the policy unchanged: every learner samples
the same kind of episodes). Prints
a table with each learner's step time, its ratio to `tunix_grpo`, the critic's share, and
`ppo_gae`'s time less its critic passes against `tunix_grpo` (the issue's bound: within
1.3x plus the critic's own passes); `--out` writes it as JSON too.

  python bench/agentic_step.py [--steps 12] [--warmup 4] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import statistics
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


def run(name: str, args: argparse.Namespace) -> dict[str, Any]:
  """One learner's steps: median step time and, for `ppo_gae`, its critic passes' time
  per step (value pass + critic update, medians after the warm-up)."""
  critic = name == "ppo_gae"
  engine = task.cluster(0, critic=critic, steps=args.steps, batch=BATCH, lr=LR)
  keys = {"num_generations": GENERATIONS, "beta": 0.0}
  if name == "tunix_grpo":
    learner = task.grpo_learner(engine, [], **keys)
  else:
    estimator = "gae" if critic else "grpo"
    learner = task.ppo_learner(engine, [], advantage_estimator=estimator, **keys)
  stamps, values_s, update_s = [], [], []
  engine.update_actor = stamped(engine.update_actor, stamps)
  if critic:
    learner._passes.values = timed(learner._passes.values, values_s, lambda out: out)
    model = engine.critic_trainer.model
    update = timed(engine.update_critic, update_s, lambda _: nnx.state(model, nnx.Param))
    engine.update_critic = update
  learner.train(task.dataset(args.steps + 2, BATCH, 0))
  engine.close()
  steps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)][args.warmup :]
  result = {"learner": name, "step_s": statistics.median(steps), "steps_timed": len(steps)}
  if critic:
    result["critic_s"] = per_step(values_s, len(stamps), args) + per_step(
      update_s, len(stamps), args
    )
  return result


def per_step(spent: list[float], steps: int, args: argparse.Namespace) -> float:
  """Seconds per step of a pass called `len(spent) / steps` times a step: the median call
  after the warm-up's calls, times the calls per step."""
  calls = len(spent) / steps
  return statistics.median(spent[round(args.warmup * calls) :]) * calls


def report(results: dict[str, dict[str, Any]]) -> str:
  """The markdown table of the three learners and the bound's figures."""
  base = results["tunix_grpo"]["step_s"]
  lines = ["| learner | step s | / tunix_grpo | critic passes s |", "| --- | --- | --- | --- |"]
  for name, r in results.items():
    critic = f"{r['critic_s']:.3f}" if "critic_s" in r else "-"
    lines.append(f"| {name} | {r['step_s']:.3f} | {r['step_s'] / base:.2f} | {critic} |")
  gae = results["ppo_gae"]
  less = (gae["step_s"] - gae["critic_s"]) / base
  share = gae["critic_s"] / gae["step_s"]
  critic = gae["step_s"] - results["ppo_grpo"]["step_s"]  # what the critic adds, by difference
  lines.append("")
  lines.append(
    f"ppo_gae less its timed critic passes: {less:.2f}x tunix_grpo (the timed passes: "
    f"{share:.0%} of its step). ppo_gae less ppo_grpo (the critic, by difference): "
    f"{critic:.3f} s; ppo_gae less that: {(gae['step_s'] - critic) / base:.2f}x tunix_grpo."
  )
  return "\n".join(lines) + "\n"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=12)
  parser.add_argument("--warmup", type=int, default=4, help="steps left out (compiles)")
  parser.add_argument("--out", type=pathlib.Path, default=None)
  args = parser.parse_args()
  results = {name: run(name, args) for name in ("tunix_grpo", "ppo_grpo", "ppo_gae")}
  text = report(results) + f"Load average: {os.getloadavg()[0]:.1f}.\n"
  print(text)
  if args.out is not None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"results": results, "table": text}, indent=1) + "\n")


if __name__ == "__main__":
  main()
