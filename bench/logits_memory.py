"""XLA temporary memory of log-prob + entropy (and full KL) forward+backward, stock vs chunked.

Compiles `jax.value_and_grad` w.r.t. bf16 logits of `sum(logp) + sum(entropy)` for
  (a) tunix 0.1.7's `selective_log_softmax` + `compute_entropy_from_logits` (stock), and
  (b) `tunix_ppo_ext.ops.logps_and_entropy(chunk_size=N)`,
and of `sum(full_kl_divergence)` unchunked vs chunked; then, from bf16 hidden states
`[B, T, --hidden]` and a bf16 head `[--hidden, V]`, (c) the unfused head (the model's
logits, then (b)) against (d) the fused head `tunix_ppo_ext.ops.fused_logps_and_entropy`
(gradients w.r.t. hidden states and head), and (e) the exact KL from two models' bf16
logits against (f) `fused_full_kl_divergence` from their hidden states; and prints XLA's
`memory_analysis().temp_size_in_bytes` (compile only: nothing runs at the full shape).
The numerical comparison runs at the smaller `--check-shape` (full-shape execution
of the stock path needs ~14 GiB of temporaries plus the inputs).

  python bench/logits_memory.py [--batch 2 --seq 2048 --vocab 151936 --chunk-size 128
                                 --hidden 1024]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from tunix.rl.algo_core import compute_entropy_from_logits
from tunix.rl.common import selective_log_softmax

from tunix_ppo_ext.ops import (
  full_kl_divergence,
  fused_full_kl_divergence,
  fused_logps_and_entropy,
  logps_and_entropy,
)

GIB = 2.0**30


def stock_loss(logits: jax.Array, ids: jax.Array):
  """tunix stock path: scalar loss and (logp, entropy) `[B, T]`."""
  logp = selective_log_softmax(logits, ids)
  ent = compute_entropy_from_logits(logits).astype(jnp.float32)
  return jnp.sum(logp) + jnp.sum(ent), (logp, ent)


def chunked_loss(chunk_size: int):
  """Our path: scalar loss and (logp, entropy) `[B, T]`."""

  def loss(logits: jax.Array, ids: jax.Array):
    logp, ent = logps_and_entropy(logits, ids, chunk_size=chunk_size)
    return jnp.sum(logp) + jnp.sum(ent), (logp, ent)

  return loss


def kl_loss(chunk_size: int):
  def loss(logits: jax.Array, ref_logits: jax.Array):
    return jnp.sum(full_kl_divergence(logits, ref_logits, chunk_size=chunk_size))

  return loss


def head_loss(chunk_size: int, fused: bool):
  """From hidden states: the fused head, or the model's logits then `chunked_loss`."""

  def loss(hidden: jax.Array, head: jax.Array, ids: jax.Array):
    if fused:
      logp, ent = fused_logps_and_entropy(hidden, head, ids, chunk_size=chunk_size)
      return jnp.sum(logp) + jnp.sum(ent)
    logits = jnp.einsum("btd,dv->btv", hidden, head)  # bf16, as a model writes them
    return chunked_loss(chunk_size)(logits, ids)[0]

  return loss


def head_kl_loss(chunk_size: int, fused: bool):
  """The exact KL from two models' hidden states: fused, or their bf16 logits then chunked."""

  def loss(hidden: jax.Array, head: jax.Array, ref_hidden: jax.Array, ref_head: jax.Array):
    if fused:
      return jnp.sum(
        fused_full_kl_divergence(hidden, head, ref_hidden, ref_head, chunk_size=chunk_size)
      )
    logits = jnp.einsum("btd,dv->btv", hidden, head)
    return kl_loss(chunk_size)(logits, jnp.einsum("btd,dv->btv", ref_hidden, ref_head))

  return loss


def temp_gib(fn, *args) -> float:
  """XLA temporary bytes (GiB) of `jit(fn)` compiled for `args` (arrays or ShapeDtypeStructs)."""
  return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes / GIB


def memory_table(shape: tuple[int, int, int], chunk_size: int, hidden: int) -> dict[str, float]:
  b, t, v = shape
  x = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
  ids = jax.ShapeDtypeStruct((b, t), jnp.int32)
  h = jax.ShapeDtypeStruct((b, t, hidden), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((hidden, v), jnp.bfloat16)
  vg = lambda f: jax.value_and_grad(f, has_aux=True)  # noqa: E731
  head = lambda fused: jax.value_and_grad(head_loss(chunk_size, fused), (0, 1))  # noqa: E731
  head_kl = lambda fused: jax.value_and_grad(head_kl_loss(chunk_size, fused), (0, 1))  # noqa: E731
  return {
    "head_unfused": temp_gib(head(False), h, w, ids),
    "head_fused": temp_gib(head(True), h, w, ids),
    "head_kl_unfused": temp_gib(head_kl(False), h, w, h, w),
    "head_kl_fused": temp_gib(head_kl(True), h, w, h, w),
    "stock": temp_gib(vg(stock_loss), x, ids),
    "chunked": temp_gib(vg(chunked_loss(chunk_size)), x, ids),
    "kl_plain": temp_gib(jax.value_and_grad(kl_loss(0)), x, x),
    "kl_chunked": temp_gib(jax.value_and_grad(kl_loss(chunk_size)), x, x),
  }


def max_diff(a, b) -> float:
  return float(jnp.max(jnp.abs(jnp.asarray(a, jnp.float32) - jnp.asarray(b, jnp.float32))))


def numeric_check(shape: tuple[int, int, int], chunk_size: int) -> list[tuple[str, float]]:
  """Runs both paths at `shape`; max |diff| of logp, entropy, gradients, KL."""
  b, t, v = shape
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  logits = (3.0 * jax.random.normal(k1, shape, jnp.float32)).astype(jnp.bfloat16)
  ref = (logits.astype(jnp.float32) + jax.random.normal(k2, shape)).astype(jnp.bfloat16)
  ids = jax.random.randint(k3, (b, t), 0, v)
  vg = lambda f: jax.jit(jax.value_and_grad(f, has_aux=True))  # noqa: E731
  (_, (lp_s, en_s)), g_s = vg(stock_loss)(logits, ids)
  # Stock math on float32-upcast inputs: the exact tunix formulas without bf16 rounding.
  (_, (lp_f, en_f)), g_f = vg(stock_loss)(logits.astype(jnp.float32), ids)
  (_, (lp_c, en_c)), g_c = vg(chunked_loss(chunk_size))(logits, ids)
  kl_p = jax.jit(lambda x: full_kl_divergence(x, ref))(logits)
  kl_c = jax.jit(lambda x: full_kl_divergence(x, ref, chunk_size=chunk_size))(logits)
  gk_p = jax.jit(jax.grad(kl_loss(0)))(logits, ref)
  gk_c = jax.jit(jax.grad(kl_loss(chunk_size)))(logits, ref)
  return [
    ("logp      chunked vs stock (bf16 in)", max_diff(lp_c, lp_s)),
    ("logp      chunked vs stock (f32-upcast in)", max_diff(lp_c, lp_f)),
    ("entropy   chunked vs stock (bf16 in; tunix entropy math is bf16)", max_diff(en_c, en_s)),
    ("entropy   chunked vs stock (f32-upcast in)", max_diff(en_c, en_f)),
    ("grad      chunked(bf16) vs stock (bf16 in)", max_diff(g_c, g_s)),
    ("grad      chunked(bf16) vs stock f32 grad", max_diff(g_c, g_f)),
    ("grad      chunked(bf16) vs stock f32 grad->bf16", max_diff(g_c, g_f.astype(jnp.bfloat16))),
    ("KL        chunked vs unchunked", max_diff(kl_c, kl_p)),
    ("KL grad   chunked vs unchunked (bf16)", max_diff(gk_c, gk_p)),
  ]


def parse_shape(text: str) -> tuple[int, int, int]:
  b, t, v = (int(s) for s in text.split(","))
  return b, t, v


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--seq", type=int, default=2048)
  parser.add_argument("--vocab", type=int, default=151936)
  parser.add_argument("--chunk-size", type=int, default=128)
  parser.add_argument("--hidden", type=int, default=1024, help="hidden width (Qwen3-0.6B: 1024)")
  parser.add_argument(
    "--check-shape",
    type=parse_shape,
    default=(2, 256, 151936),
    help="B,T,V at which results are actually computed and compared",
  )
  parser.add_argument("--no-check", action="store_true", help="memory analysis only")
  parser.add_argument(
    "--sweep",
    type=str,
    default="",
    help="comma-separated chunk sizes: print chunked temp memory and check-shape time for each",
  )
  args = parser.parse_args()
  shape = (args.batch, args.seq, args.vocab)
  grad_gib = np.prod(shape) * 2 / GIB

  print(
    f"jax {jax.__version__} on {jax.devices()[0].platform}; logits bf16 {shape}; "
    f"chunk_size={args.chunk_size}"
  )
  start = time.perf_counter()
  mem = memory_table(shape, args.chunk_size, args.hidden)
  print(f"(compile-only memory analysis: {time.perf_counter() - start:.1f} s)")
  print(f"{'value_and_grad path':<52}{'temp GiB':>10}{'ratio':>9}")
  rows = [
    ("(a) tunix selective_log_softmax+entropy", mem["stock"], 1.0),
    (
      f"(b) logps_and_entropy(chunk_size={args.chunk_size})",
      mem["chunked"],
      mem["stock"] / mem["chunked"],
    ),
    ("full_kl_divergence(chunk_size=0)", mem["kl_plain"], 1.0),
    (
      f"full_kl_divergence(chunk_size={args.chunk_size})",
      mem["kl_chunked"],
      mem["kl_plain"] / mem["kl_chunked"],
    ),
  ]
  rows += [
    (f"(c) hidden {args.hidden} -> bf16 logits -> (b)", mem["head_unfused"], 1.0),
    (
      f"(d) fused_logps_and_entropy(chunk_size={args.chunk_size})",
      mem["head_fused"],
      mem["head_unfused"] / mem["head_fused"],
    ),
    (f"(e) 2 x hidden {args.hidden} -> bf16 logits -> KL", mem["head_kl_unfused"], 1.0),
    (
      f"(f) fused_full_kl_divergence(chunk_size={args.chunk_size})",
      mem["head_kl_fused"],
      mem["head_kl_unfused"] / mem["head_kl_fused"],
    ),
  ]
  for name, gib, ratio in rows:
    print(f"{name:<52}{gib:>10.3f}{ratio:>8.1f}x")
  print(f"{'(floor) size of the bf16 gradient output':<52}{grad_gib:>10.3f}")

  for c in [int(s) for s in args.sweep.split(",") if s]:
    m = memory_table(shape, c, args.hidden)
    check = jax.jit(jax.value_and_grad(chunked_loss(c), has_aux=True))
    x = jnp.zeros(args.check_shape, jnp.bfloat16)
    ids = jnp.zeros(args.check_shape[:2], jnp.int32)
    jax.block_until_ready(check(x, ids))
    t0 = time.perf_counter()
    jax.block_until_ready(check(x, ids))
    dt = time.perf_counter() - t0
    print(
      f"sweep chunk_size={c:<5} temp GiB: logp+ent {m['chunked']:.3f}, "
      f"kl {m['kl_chunked']:.3f}; fwd+bwd at {args.check_shape}: {dt:.2f} s"
    )

  if not args.no_check:
    print(f"numerical check at smaller shape {args.check_shape} (bf16 logits; max |diff|):")
    start = time.perf_counter()
    for name, diff in numeric_check(args.check_shape, args.chunk_size):
      print(f"  {name:<66}{diff:.3g}")
    print(f"  (check took {time.perf_counter() - start:.1f} s)")

  print(
    f"RATIOS: stock/chunked logp+entropy = {mem['stock'] / mem['chunked']:.1f}x "
    f"(target >= 8x; {mem['chunked']:.3f} GiB vs floor {grad_gib:.3f} GiB), "
    f"KL unchunked/chunked = {mem['kl_plain'] / mem['kl_chunked']:.1f}x"
  )


if __name__ == "__main__":
  main()
