"""Multi-turn rollout throughput against the number of turns: re-encoding vs continuing.

For 1, 2, 4, 8 and 16 turns at a fixed number of agent tokens per turn (`--turn-tokens`)
and observation tokens per turn (`--obs-tokens`), plays `--batch` episodes with
`MultiTurnRollout` on a real tunix cluster (vanilla engine, a toy Qwen3 of
`--layers`/`--dim`, float32) whose KV cache is sized as a run's would be
(`max_prompt_length + max_completion_len + max_turn_tokens`, the completion width
`turns * (turn + observation tokens)`), and prints agent tokens per second with
`kv_cache="reencode"` (every turn prefills the whole history: before) and
`kv_cache="continue"` (each turn prefills only what the previous one added: after), and
each one's throughput at 16 turns over its throughput at 1 turn. Agent tokens are the
tokens sampled (a turn ends early where the policy samples EOS); the time is the median
of `--repeats` rollouts after one warm-up rollout (compilation).

  python bench/rollout.py [--batch 16 --turn-tokens 8 --obs-tokens 8 --layers 4 --dim 256]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax

from tunix_ppo_ext import PpoExtConfig, PpoExtLearner
from tunix_ppo_ext.data import CharTokenizer, episode_batches
from tunix_ppo_ext.models import ClusterSpec, build_cluster, make_models
from tunix_ppo_ext.rollout import Mode, MultiTurnRollout

PROMPT = 16  # max_prompt_length
TURNS = (1, 2, 4, 8, 16)


class FixedEnv:
  """Observations of a fixed length; ends after exactly `turns` agent turns."""

  name = "fixed"
  max_return = 0.0

  def __init__(self, turns: int, obs_tokens: int):
    self.turns, self.text = turns, ("look around " * obs_tokens)[:obs_tokens]

  def reset(self, seed):
    self.turn = 0
    return "start " + str(seed % 10), {}

  def step(self, action):
    self.turn += 1
    return self.text, 0.0, self.turn == self.turns, False, {}


def rollout_seconds(args, turns: int, kv_cache: str) -> tuple[float, float, int]:
  """`(median seconds, agent tokens per rollout, turns re-encoded)` for one setting."""
  tokenizer = CharTokenizer()
  policy, critic, _ = make_models(tokenizer, seed=0, num_layers=args.layers, embed_dim=args.dim)
  width = turns * (args.turn_tokens + args.obs_tokens)
  cluster = build_cluster(
    policy,
    critic,
    tokenizer,
    ClusterSpec(
      max_steps=1,
      batch=args.batch,
      max_prompt_length=PROMPT,
      max_tokens_to_generate=width + args.turn_tokens,
      return_logprobs=True,
    ),
  )
  source = MultiTurnRollout(
    FixedEnv,
    {"turns": turns, "obs_tokens": args.obs_tokens},
    max_completion_len=width,
    max_turns=turns,
    max_turn_tokens=args.turn_tokens,
    group_size=1,
    kv_cache=kv_cache,
  )
  learner = PpoExtLearner(
    cluster, PpoExtConfig(beta=0.0, num_generations=1), trajectory_source=source
  )
  batches = episode_batches(args.repeats + 1, args.batch, seed=0)
  seconds, tokens = [], []
  for i, data in enumerate(batches):
    start = time.perf_counter()
    batch = source(learner, data, Mode.TRAIN)
    reencoded = batch.metrics.get("rollout/reencoded_turns", (0.0, None))[0]
    if i:  # the first rollout compiles
      seconds.append(time.perf_counter() - start)
      tokens.append(int(batch.sampler_logp_mask.sum()))
  return statistics.median(seconds), statistics.mean(tokens), int(reencoded)


def main() -> None:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--turn-tokens", type=int, default=8)
  parser.add_argument("--obs-tokens", type=int, default=8)
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--dim", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--turns", type=int, nargs="+", default=list(TURNS))
  args = parser.parse_args()
  print(
    f"jax {jax.__version__} on {jax.default_backend()} ({jax.devices()[0].device_kind}); "
    f"batch {args.batch}, {args.turn_tokens} agent + {args.obs_tokens} observation tokens "
    f"per turn, toy Qwen3 {args.layers} layers x {args.dim}, median of {args.repeats}"
  )
  rates: dict[str, dict[int, float]] = {"reencode": {}, "continue": {}}
  print("| turns | re-encode tok/s | continue tok/s | speed-up | re-encoded turns (continue) |")
  print("| --- | --- | --- | --- | --- |")
  for turns in args.turns:
    row = {}
    for kv_cache in rates:
      seconds, tokens, reencodes = rollout_seconds(args, turns, kv_cache)
      rates[kv_cache][turns] = row[kv_cache] = tokens / seconds
    speedup = row["continue"] / row["reencode"]
    print(
      f"| {turns} | {row['reencode']:.0f} | {row['continue']:.0f} | {speedup:.2f}x | "
      f"{reencodes} of {turns} |",
      flush=True,
    )
  first, last = min(args.turns), max(args.turns)
  for kv_cache, rate in rates.items():
    ratio = rate[last] / rate[first]
    print(f"{kv_cache}: {last}-turn / {first}-turn throughput = {ratio:.2f}")


if __name__ == "__main__":
  main()
