"""Median PPO step time: stock tunix `PPOLearner` vs `PpoExtLearner`, side by side, and the
fused LM head (`fused_head=True`) against the unfused one at the same `logits_chunk_size`.

Both learners train the same toy Qwen3 (same seed), on the same single-turn prompts and
rewards, in this one process; the step time is the wall time between consecutive
batches drawn by tunix's training loop, after `--warmup` compiled steps. Each learner
runs `--repeats` times, interleaved; the median of the runs' medians is reported.

  python bench/step_time.py [--steps 40 --warmup 8 --repeats 2 --batch 8 --gen 16
                             --chunk-size 8 --fused-only]

`--fused-only` times just the pair (d) chunked logits / (e) fused head, both `PpoExtLearner`.
"""

from __future__ import annotations

import argparse
import statistics
import string

import jax
import numpy as np
from _timing import timed
from tunix.rl.ppo import ppo_learner

from tunix_ppo_ext import PpoExtConfig, PpoExtLearner
from tunix_ppo_ext.data import CharTokenizer
from tunix_ppo_ext.models import ClusterSpec, build_cluster, make_models


def prompts(batch: int, seed: int):
  """Endless batches `{"prompts", "answer"}` of `say <word>:` prompts."""
  rng = np.random.default_rng(seed)
  letters = list(string.ascii_lowercase)
  while True:
    words = ["".join(rng.choice(letters, size=3)) for _ in range(batch)]
    yield {"prompts": np.array([f"say {w}:" for w in words]), "answer": np.array(words)}


def matched_chars(prompts, completions, answer, **_):
  return [
    float(sum(a == b for a, b in zip(c, str(t), strict=False)))
    for c, t in zip(completions, answer, strict=True)
  ]


def median_step_s(learner_cls, config, args) -> float:
  tokenizer = CharTokenizer(eos_id=0)
  policy, critic, reference = make_models(tokenizer, seed=0, num_layers=2, embed_dim=64)
  cluster = build_cluster(
    policy,
    critic,
    tokenizer,
    ClusterSpec(
      max_steps=args.steps, batch=args.batch, max_prompt_length=9, max_tokens_to_generate=args.gen
    ),
    reference=reference,
  )
  learner = learner_cls(cluster, config, reward_fns=matched_chars)
  stamps: list[float] = []
  learner.train(timed(prompts(args.batch, seed=0), stamps))
  steps = np.diff(stamps)[args.warmup :]
  return statistics.median(steps)


def main() -> None:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--warmup", type=int, default=8)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--gen", type=int, default=16)
  parser.add_argument("--repeats", type=int, default=2, help="interleaved runs of each learner")
  parser.add_argument("--chunk-size", type=int, default=8, help="logits_chunk_size of (d), (e)")
  parser.add_argument("--fused-only", action="store_true", help="time only (d) and (e)")
  args = parser.parse_args()
  print(
    f"jax {jax.__version__} on {jax.default_backend()}; batch {args.batch}, "
    f"{args.gen} generated tokens, {args.steps} steps, median after {args.warmup}"
  )
  features = PpoExtConfig(
    entropy_coef=0.01, epsilon_c=3.0, kl_method="low_var_kl", kl_penalty="loss", kl_loss_coef=0.05
  )
  chunked = PpoExtConfig(logits_chunk_size=args.chunk_size)
  fused = PpoExtConfig(logits_chunk_size=args.chunk_size, fused_head=True)
  learners = {
    "stock": (ppo_learner.PPOLearner, ppo_learner.PPOConfig()),
    "ext": (PpoExtLearner, PpoExtConfig()),
    "features": (PpoExtLearner, features),
    "chunked": (PpoExtLearner, chunked),
    "fused": (PpoExtLearner, fused),
  }
  if args.fused_only:
    learners = {k: learners[k] for k in ("chunked", "fused")}
  runs = {k: [] for k in learners}
  for _ in range(args.repeats):  # interleaved, so slow phases of the machine hit them all
    for name, (learner_cls, config) in learners.items():
      runs[name].append(median_step_s(learner_cls, config, args))
  print("per-run medians (s):", {k: [round(v, 4) for v in vs] for k, vs in runs.items()})
  chunked_s, fused_s = (statistics.median(runs[k]) for k in ("chunked", "fused"))
  label = f"(d) PpoExtLearner, logits_chunk_size={args.chunk_size}"
  print(f"{label:58s} {chunked_s:12.4f}   1.000")
  label = f"(e) PpoExtLearner, logits_chunk_size={args.chunk_size}, fused_head"
  print(f"{label:58s} {fused_s:12.4f}   {fused_s / chunked_s:.3f}")
  print(f"FUSED RATIO: fused/chunked = {fused_s / chunked_s:.3f} (target <= 1.10)")
  if args.fused_only:
    return
  stock, ext, ext_features = (statistics.median(runs[k]) for k in ("stock", "ext", "features"))
  print(f"{'learner':58s} median step s   ratio")
  print(f"{'(a) tunix PPOLearner, PPOConfig()':58s} {stock:12.4f}   1.000")
  print(f"{'(b) PpoExtLearner, PpoExtConfig()':58s} {ext:12.4f}   {ext / stock:.3f}")
  label = "(c) PpoExtLearner, entropy 0.01 + dual clip + low_var_kl loss"
  print(f"{label:58s} {ext_features:12.4f}   {ext_features / stock:.3f}")
  print(
    f"RATIOS: ext/stock = {ext / stock:.3f} (target <= 1.05), "
    f"ext+features/stock = {ext_features / stock:.3f}"
  )


if __name__ == "__main__":
  main()
