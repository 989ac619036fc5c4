"""Segment-masked attention computed blockwise: never a `[T, T]` array, forward or backward.

The reference path for long rows beside tunix's TPU splash kernel: the same mask (per-token
`segment_ids`, causal, padding attends to nothing) in plain JAX, so it runs on CPU and GPU.
An online softmax (Rabe & Staats 2021, arXiv:2112.05682; FlashAttention, Dao et al. 2022,
arXiv:2205.14135) walks the key/value blocks with `lax.scan` for each query block
(`lax.map`), and a `jax.custom_vjp` recomputes each tile's probabilities from the saved
per-row log-normalizer in the backward (FlashAttention's backward), so both passes hold
one `[B, block, H, block]` tile of scores at a time.

Shapes: `B` rows (batch), `T` query tokens, `S` key/value tokens, `Hq` query heads, `Hkv`
key/value heads (`Hq % Hkv == 0`: grouped-query attention, kv head `h` serves query heads
`h * G ... h * G + G - 1`, `G = Hq / Hkv`, as Qwen3's and Llama's attention), `D` the head
width. Segment ids are ints: tokens attend to tokens of their own id; id 0 is padding.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["packed_segment_ids", "segment_attention", "segment_ids_from_mask"]


class _Tiling(NamedTuple):
  """The static part of one call: hashable, so it is a `nondiff_argnums` of the VJP."""

  causal: bool
  scale: float


class _Ids(NamedTuple):
  """Blocked segment ids and positions: queries `[nq, B, bq]`, keys `[nk, B, bk]`."""

  q_segments: jax.Array
  q_positions: jax.Array
  kv_segments: jax.Array
  kv_positions: jax.Array


# ----------------------------------------------------------------------------
# One tile: queries `[B, bq, Hkv, G, D]` against keys `[B, bk, Hkv, D]`, float32.
# ----------------------------------------------------------------------------


def _tile_mask(
  q_seg: jax.Array, q_pos: jax.Array, kv_seg: jax.Array, kv_pos: jax.Array, causal: bool
) -> jax.Array:
  """`[B, bq, 1, 1, bk]` bool: same segment, not padding and (if causal) key not after query."""
  mask = (q_seg[:, :, None] == kv_seg[:, None, :]) & (q_seg[:, :, None] != 0)
  if causal:
    mask &= q_pos[:, :, None] >= kv_pos[:, None, :]
  return mask[:, :, None, None, :]


def _scores(q: jax.Array, k: jax.Array, scale: float) -> jax.Array:
  """`q k^T * scale`, `[B, bq, Hkv, G, bk]` float32."""
  return jnp.einsum("bqhgd,bkhd->bqhgk", q.astype(jnp.float32), k.astype(jnp.float32)) * scale


def _online_update(
  carry: tuple[jax.Array, jax.Array, jax.Array],
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  mask: jax.Array,
  scale: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Folds one key block into the running max `m`, normalizer `denom` and numerator `acc`."""
  m, denom, acc = carry
  s = jnp.where(mask, _scores(q, k, scale), -jnp.inf)
  m_new = jnp.maximum(m, s.max(-1))
  m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # -inf while no key was visible
  p = jnp.exp(s - m_safe[..., None])  # exactly 0 on masked keys
  alpha = jnp.exp(m - m_safe)  # 0 while m is -inf (acc and denom are 0 then)
  pv = jnp.einsum("bqhgk,bkhd->bqhgd", p, v.astype(jnp.float32))
  return m_new, alpha * denom + p.sum(-1), alpha[..., None] * acc + pv


def _unless_empty(mask: jax.Array, compute: Callable[..., Any], empty: Callable[..., Any]) -> Any:
  """`compute()`, or `empty()` when `mask` has no visible pair (a `lax.cond`: causal and
  packed layouts leave many tiles empty, and an empty tile changes nothing)."""
  return lax.cond(mask.any(), compute, empty)


# ----------------------------------------------------------------------------
# The blocked forward and backward. Queries `[nq, B, bq, Hkv, G, D]`, keys and values
# `[nk, B, bk, Hkv, D]`.
# ----------------------------------------------------------------------------


def _forward(
  tiling: _Tiling, q: jax.Array, k: jax.Array, v: jax.Array, ids: _Ids
) -> tuple[jax.Array, jax.Array]:
  """`(out, lse)`: the output `[nq, B, bq, Hkv, G, D]` in q's dtype (0 on rows that see no
  key) and the float32 log-normalizer `[nq, B, bq, Hkv, G]` (0 on those rows)."""

  def query_block(xs: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
    q_i, seg_i, pos_i = xs

    def key_block(carry: tuple[jax.Array, ...], ys: tuple[jax.Array, ...]) -> tuple:
      k_j, v_j, seg_j, pos_j = ys
      mask = _tile_mask(seg_i, pos_i, seg_j, pos_j, tiling.causal)

      def update() -> tuple[jax.Array, ...]:
        return _online_update(carry, q_i, k_j, v_j, mask, tiling.scale)

      return _unless_empty(mask, update, lambda: carry), None

    rows = q_i.shape[:-1]
    init = (jnp.full(rows, -jnp.inf), jnp.zeros(rows), jnp.zeros(q_i.shape, jnp.float32))
    kv = (k, v, ids.kv_segments, ids.kv_positions)
    (m, denom, acc), _ = lax.scan(key_block, init, kv)
    seen = denom > 0
    out = acc / jnp.where(seen, denom, 1.0)[..., None]
    return out.astype(q.dtype), jnp.where(seen, m + jnp.log(jnp.where(seen, denom, 1.0)), 0.0)

  return lax.map(query_block, (q, ids.q_segments, ids.q_positions))


def _tile_grads(
  tiling: _Tiling, q_i: jax.Array, g_i: jax.Array, stats: tuple[jax.Array, ...], kv: tuple
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """One tile's `(dq_i, dk_j, dv_j)` in float32, its probabilities recomputed from the lse:
  `p = exp(s - lse)`, `dv = p^T g`, `ds = p * (g v^T - delta)`, `dq = ds k * scale`,
  `dk = ds^T q * scale` with `delta = rowsum(g * out)`."""
  lse_i, delta_i, mask = stats
  k_j, v_j = kv
  s = _scores(q_i, k_j, tiling.scale)
  p = jnp.where(mask, jnp.exp(s - lse_i[..., None]), 0.0)
  g32 = g_i.astype(jnp.float32)
  dv = jnp.einsum("bqhgk,bqhgd->bkhd", p, g32)
  dp = jnp.einsum("bqhgd,bkhd->bqhgk", g32, v_j.astype(jnp.float32))
  ds = p * (dp - delta_i[..., None]) * tiling.scale
  dq = jnp.einsum("bqhgk,bkhd->bqhgd", ds, k_j.astype(jnp.float32))
  dk = jnp.einsum("bqhgk,bqhgd->bkhd", ds, q_i.astype(jnp.float32))
  return dq, dk, dv


def _backward(
  tiling: _Tiling, residuals: tuple[jax.Array, ...], g: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, None]:
  """Outer scan over key blocks (each one's dk, dv summed over the query blocks), inner scan
  over query blocks (their dq contributions added to a float32 dq)."""
  q, k, v, ids, out, lse = residuals
  delta = jnp.sum(g.astype(jnp.float32) * out.astype(jnp.float32), -1)
  per_query = (q, g, lse, delta, ids.q_segments, ids.q_positions)

  def key_block(dq: jax.Array, ys: tuple[jax.Array, ...]) -> tuple:
    k_j, v_j, seg_j, pos_j = ys

    def query_block(dkv: tuple[jax.Array, jax.Array], xs: tuple[jax.Array, ...]) -> tuple:
      q_i, g_i, lse_i, delta_i, seg_i, pos_i = xs
      mask = _tile_mask(seg_i, pos_i, seg_j, pos_j, tiling.causal)

      def grads() -> tuple[jax.Array, jax.Array, jax.Array]:
        return _tile_grads(tiling, q_i, g_i, (lse_i, delta_i, mask), (k_j, v_j))

      def zeros() -> tuple[jax.Array, jax.Array, jax.Array]:
        return jnp.zeros(q_i.shape), jnp.zeros(k_j.shape), jnp.zeros(v_j.shape)

      dq_i, dk, dv = _unless_empty(mask, grads, zeros)
      return (dkv[0] + dk, dkv[1] + dv), dq_i

    zero_kv = (jnp.zeros(k_j.shape), jnp.zeros(v_j.shape))
    (dk_j, dv_j), dq_j = lax.scan(query_block, zero_kv, per_query)
    return dq + dq_j, (dk_j, dv_j)

  kv = (k, v, ids.kv_segments, ids.kv_positions)
  dq, (dk, dv) = lax.scan(key_block, jnp.zeros(q.shape), kv)
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _blocked_attention(
  tiling: _Tiling, q: jax.Array, k: jax.Array, v: jax.Array, ids: _Ids
) -> jax.Array:
  return _forward(tiling, q, k, v, ids)[0]


def _blocked_fwd(tiling: _Tiling, q: jax.Array, k: jax.Array, v: jax.Array, ids: _Ids) -> tuple:
  out, lse = _forward(tiling, q, k, v, ids)
  return out, (q, k, v, ids, out, lse)


_blocked_attention.defvjp(_blocked_fwd, _backward)


# ----------------------------------------------------------------------------
# Blocking: `[B, N, ...]` <-> `[n, B, size, ...]`, padded at the end.
# ----------------------------------------------------------------------------


def _to_blocks(x: jax.Array, size: int) -> jax.Array:
  """`[B, N, ...]` -> `[ceil(N / size), B, size, ...]`, the tail padded with zeros."""
  n = -(-x.shape[1] // size)
  x = jnp.pad(x, [(0, 0), (0, n * size - x.shape[1])] + [(0, 0)] * (x.ndim - 2))
  return jnp.moveaxis(x.reshape(x.shape[0], n, size, *x.shape[2:]), 1, 0)


def _from_blocks(x: jax.Array, length: int) -> jax.Array:
  """`[n, B, size, ...]` -> `[B, length, ...]` (the padded tail dropped)."""
  x = jnp.moveaxis(x, 0, 1)
  return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :length]


def _check_int(name: str, value: object, low: int) -> None:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
    raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _check_shapes(q: jax.Array, k: jax.Array, v: jax.Array) -> None:
  """Raises ValueError for ranks, head counts, widths or dtypes that do not fit."""
  chex.assert_rank([q, k, v], 4)
  chex.assert_equal_shape([k, v])
  (batch, _, heads, width), (kv_batch, _, kv_heads, kv_width) = q.shape, k.shape
  if batch != kv_batch or width != kv_width:
    raise ValueError(f"q {q.shape} and k/v {k.shape} differ in B or D")
  if heads % kv_heads:
    raise ValueError(f"query heads ({heads}) must be a multiple of kv heads ({kv_heads})")
  for name, x in (("q", q), ("k", k), ("v", v)):
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise ValueError(f"{name} must be floating point, got {x.dtype}")


def _ids(shape: tuple[int, int], ids: jax.Array, name: str) -> jax.Array:
  """`ids` as int32 `[B, N]`, checked against `shape`."""
  ids = jnp.asarray(ids)
  if ids.shape != shape or not jnp.issubdtype(ids.dtype, jnp.integer):
    raise ValueError(f"{name} must be an int array of shape {shape}, got {ids.dtype}{ids.shape}")
  return ids.astype(jnp.int32)


def segment_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  segment_ids: jax.Array,
  *,
  causal: bool = True,
  block_size: int = 512,
  scale: float | None = None,
  kv_segment_ids: jax.Array | None = None,
  q_positions: jax.Array | None = None,
  kv_positions: jax.Array | None = None,
) -> jax.Array:
  """Segment-masked (grouped-query) softmax attention, blockwise: never a `[T, S]` array.

  For query token `i` of row `b` and query head `h` (kv head `h // G`, `G = Hq / Hkv`):
  `out[b, i, h] = sum_j softmax_j(s_ij) v[b, j, h // G]` over the visible keys `j`,
  `s_ij = scale * q[b, i, h] . k[b, j, h // G]`, where key `j` is visible to query `i`
  iff `seg_q[b, i] == seg_kv[b, j] != 0` and, if `causal`, `pos_q[b, i] >= pos_kv[b, j]`.
  A row with no visible key (padding, id 0, or a segment with nothing before it) is 0,
  never NaN. The same mask as tunix's TPU splash kernel with `segment_ids`.

  Computed as FlashAttention (Dao et al. 2022, arXiv:2205.14135; the online softmax of
  Rabe & Staats 2021, arXiv:2112.05682): for each block of `block_size` queries, a
  `lax.scan` over the key blocks keeps a running max `m`, normalizer `denom` and numerator
  `acc` in float32, rescaled by `exp(m_old - m_new)` as each block comes in; tiles with
  no visible pair are skipped (`lax.cond`). T and S need not be multiples of the block
  (the tails are padded with segment 0); a block is at most T (or S) long.

  Memory. Forward: per query block one float32 tile of scores/probabilities
  `[B, bq, Hq, bk]` and the carry `m, denom [B, bq, Hq]`, `acc [B, bq, Hq, D]`; it keeps for
  the backward only the output (q's dtype) and the float32 log-normalizer `[B, T, Hq]`.
  Backward (a `jax.custom_vjp`, FlashAttention's): recomputes each tile's probabilities
  from the log-normalizer, holding per tile the scores, probabilities and their gradient
  `[B, bq, Hq, bk]` float32, plus float32 gradient accumulators `dq [B, T, Hq, D]` (and
  one key block's dq contributions, the same size) and `dk, dv [B, bk, Hkv, D]`. Forward
  mode (`jax.jvp`) is not defined (a custom VJP).

  Args:
    q: `[B, T, Hq, D]` float queries.
    k: `[B, S, Hkv, D]` float keys, `Hq % Hkv == 0`.
    v: `[B, S, Hkv, D]` float values.
    segment_ids: `[B, T]` int, the queries' segments (0: padding); also the keys' when
      `kv_segment_ids` is None (then `S == T`).
    causal: mask keys after the query (by position).
    block_size: queries and keys per block (static, >= 1).
    scale: the scores' factor; None: `D ** -0.5`.
    kv_segment_ids: `[B, S]` int, the keys' segments.
    q_positions: `[B, T]` int positions of the queries for the causal mask; None: `0, 1,
      ...` (with `causal`, giving one needs both when `T != S`).
    kv_positions: `[B, S]` int positions of the keys, likewise.

  Returns:
    `[B, T, Hq, D]` in q's dtype.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> q = k = jnp.zeros((1, 3, 1, 2))  # equal scores: the mean of the visible values
    >>> v = jnp.arange(1.0, 4.0).reshape(1, 3, 1, 1) * jnp.ones((1, 3, 1, 2))
    >>> out = ops.segment_attention(q, k, v, jnp.array([[1, 1, 2]]), block_size=2)
    >>> print(np.round(out[0, :, 0, 0], 4))  # token 2 sees itself only: a new segment
    [1.  1.5 3. ]
  """
  _check_shapes(q, k, v)
  _check_int("block_size", block_size, 1)
  (batch, length, _, width), kv_length = q.shape, k.shape[1]
  if causal and length != kv_length and (q_positions is None or kv_positions is None):
    raise ValueError("causal attention with T != S needs q_positions and kv_positions")
  if kv_segment_ids is None and length != kv_length:
    raise ValueError("kv_segment_ids is needed when T != S")
  seg_q = _ids((batch, length), segment_ids, "segment_ids")
  seg_kv = seg_q if kv_segment_ids is None else kv_segment_ids
  seg_kv = _ids((batch, kv_length), seg_kv, "kv_segment_ids")
  pos_q = _ids((batch, length), _or_arange(q_positions, batch, length), "q_positions")
  pos_kv = _ids((batch, kv_length), _or_arange(kv_positions, batch, kv_length), "kv_positions")
  tiling = _Tiling(bool(causal), width**-0.5 if scale is None else float(scale))
  blocks = (min(block_size, length), min(block_size, kv_length))
  return _attention(q, k, v, (seg_q, seg_kv, pos_q, pos_kv), tiling=tiling, blocks=blocks)


def _or_arange(positions: jax.Array | None, batch: int, length: int) -> jax.Array:
  """`positions`, or `0, 1, ..., length - 1` in every row."""
  if positions is not None:
    return positions
  return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))


@functools.partial(jax.jit, static_argnames=("tiling", "blocks"))
def _attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  ids: tuple[jax.Array, ...],
  tiling: _Tiling,
  blocks: tuple[int, int],
) -> jax.Array:
  """`segment_attention` on checked arguments: `ids` = (query segments, key segments, query
  positions, key positions), `blocks` = (query block, key block)."""
  (batch, length, heads, width), kv_heads = q.shape, k.shape[2]
  (seg_q, seg_kv, pos_q, pos_kv), (bq, bk) = ids, blocks
  blocked_ids = _Ids(
    _to_blocks(seg_q, bq), _to_blocks(pos_q, bq), _to_blocks(seg_kv, bk), _to_blocks(pos_kv, bk)
  )
  grouped = _to_blocks(q.reshape(batch, length, kv_heads, heads // kv_heads, width), bq)
  out = _blocked_attention(tiling, grouped, _to_blocks(k, bk), _to_blocks(v, bk), blocked_ids)
  return _from_blocks(out, length).reshape(q.shape)


def segment_ids_from_mask(attention_mask: jax.Array) -> jax.Array:
  """`[B, T]` int32 segment ids from a 0/1 attention mask: 1 on real tokens, 0 on padding.

  For the rows this package builds (a left-padded prompt, then a right-padded completion):
  every real token of a row is one segment, so with `segment_attention(causal=True)` a token
  attends to the real tokens at or before it, as tunix's dense mask does.

  Args:
    attention_mask: `[B, T]`, any dtype (nonzero: a real token).

  Returns:
    int32 `[B, T]`: 1 on real tokens, 0 on padding.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> ops.segment_ids_from_mask(jnp.array([[0, 1, 1, 0], [1, 1, 1, 1]])).tolist()
    [[0, 1, 1, 0], [1, 1, 1, 1]]
  """
  attention_mask = jnp.asarray(attention_mask)
  chex.assert_rank(attention_mask, 2)
  return (attention_mask != 0).astype(jnp.int32)


def packed_segment_ids(lengths: jax.Array, num_tokens: int) -> jax.Array:
  """`[B, num_tokens]` int32 segment ids for episodes packed one after another in a row.

  Row `b` holds `lengths[b, 0]` tokens of id 1, then `lengths[b, 1]` of id 2, ..., then 0
  (padding) to the end; an episode of length 0 leaves its id unused, and tokens past
  `num_tokens` are cut off.

  Args:
    lengths: `[B, K]` non-negative ints, the episodes' token counts.
    num_tokens: T, the row width (static).

  Returns:
    int32 `[B, num_tokens]`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> ops.packed_segment_ids(jnp.array([[2, 0, 3], [4, 2, 0]]), 6).tolist()
    [[1, 1, 3, 3, 3, 0], [1, 1, 1, 1, 2, 2]]
  """
  lengths = jnp.asarray(lengths, jnp.int32)
  chex.assert_rank(lengths, 2)
  _check_int("num_tokens", num_tokens, 0)
  if not lengths.shape[1]:  # no episodes: all padding
    return jnp.zeros((lengths.shape[0], num_tokens), jnp.int32)
  ends = jnp.cumsum(lengths, axis=-1)  # [B, K]
  position = jnp.arange(num_tokens, dtype=jnp.int32)[None, :, None]
  ids = 1 + jnp.sum(position >= ends[:, None, :], axis=-1, dtype=jnp.int32)
  return jnp.where(position[..., 0] < ends[:, -1:], ids, 0)
