"""Rows without padding: a batch's episodes packed into fewer rows, one after another.

A `[B, W]` batch (a left-padded prompt, then a right-padded completion: `W = P + T`) holds
each episode's real tokens as one run of columns. Packing places the runs one after another
in `R` rows of `L = k W` slots (first-fit decreasing bin packing, Johnson 1973; `R = 1` is
one stream of tokens), so a model pass runs on `R x L` token slots instead of `B x W`.
Every per-token array moves with one scatter (`pack`) into the packed layout and back with
one gather (`unpack`); whatever comes after the model
(log-probs, losses, advantages) sees the padded layout unchanged, which is what makes a
packed pass exactly the padded one. verl's `use_remove_padding` unpads into one token
stream for the same reason; with static shapes the
stream here is `R` rows whose width `k W` is rounded to few values.

In the packed rows an episode keeps its own positions (counted over its real tokens, as the
padded path counts them) and its own segment id (1, 2, ... within a chunk; 0 marks an empty
slot): attention stays inside one episode and never reaches an empty slot.

`plan_packing` runs on the host (NumPy) once per batch; `pack`, `unpack` and
`packed_model_inputs` are JAX and run inside the passes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Packing", "pack", "packed_model_inputs", "plan_packing", "unpack"]


@functools.partial(
  jax.tree_util.register_dataclass, data_fields=["slots"], meta_fields=["rows", "width"]
)
@dataclasses.dataclass(frozen=True)
class Packing:
  """Where each token of a `[B, W]` chunk sits in its `rows` packed rows of `width` slots.

  `slots`: `[B, W]` int32, the token's index in the packed chunk read row by row
  (`row * width + column`), `rows * width` for a padding token (dropped). `rows` (`R`) and
  `width` (`L`, at least `W`): static (compilation keys, Python ints).
  """

  slots: jax.Array
  rows: int
  width: int


def _runs(real: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """`(start [B], length [B])` of each row's one run of real tokens; ValueError otherwise."""
  length = real.sum(axis=1)
  start = np.where(length > 0, np.argmax(real, axis=1), 0)
  inside = (np.arange(real.shape[1])[None] >= start[:, None]) & (
    np.arange(real.shape[1])[None] < (start + length)[:, None]
  )
  broken = np.flatnonzero(np.any(inside != real, axis=1))
  if broken.size:
    raise ValueError(
      f"packing: row {int(broken[0])}'s real tokens are not one run of columns (a padding "
      "token between real ones); such a batch cannot be packed"
    )
  return start, length


def _first_fit_decreasing(lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
  """`(row [n], offset [n])`: each length's packed row and first column, longest first."""
  row, offset = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
  filled: list[int] = []
  for i in np.argsort(-lengths, kind="stable"):
    fits = [r for r, used in enumerate(filled) if used + lengths[i] <= width]
    r = fits[0] if fits else len(filled)
    if not fits:
      filled.append(0)
    row[i], offset[i] = r, filled[r]
    filled[r] += int(lengths[i])
  return row, offset


def _fit(lengths: np.ndarray, rows: int, columns: int, k: int) -> int:
  """The least multiple `k' >= k` of the batch width `columns` whose `rows` rows hold
  `lengths` by first-fit decreasing."""
  while int(_first_fit_decreasing(lengths, k * columns)[0].max(initial=0)) >= rows:
    k += 1
  return k


def plan_packing(
  real: np.ndarray,
  chunks: Sequence[int] | None = None,
  rows: int = 1,
  round_to: int = 1,
) -> tuple[np.ndarray, np.ndarray, int]:
  """Packs each chunk of a batch's rows on its own into `rows` rows of `k W` slots:
  `(slots [B, W], segment [B], k)`.

  `k` is the least that holds every chunk (first-fit decreasing, the episodes longest
  first), rounded up to a multiple of `round_to` (fewer distinct shapes to compile) but
  never past what the largest chunk could need.

  Args:
    real: `[B, W]`, nonzero on real tokens, one run per row.
    chunks: consecutive row counts summing to `B` (the micro-batches a pass or an update
      sees; `slots` are local to the chunk). Default: one chunk.
    rows: `R`, the packed rows of each chunk (e.g. the data-parallel devices: 1 is one
      stream of tokens).
    round_to: see above.

  Returns:
    `slots` (see `Packing`, with `rows` and `width = k W`), `segment` the batch-width
    segment (`0 .. R k - 1`, row by row) where each episode starts, and `k`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> real = np.array([[0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 1, 0]])  # three runs, W=4
    >>> slots, segment, k = ops.plan_packing(real)
    >>> packing = ops.Packing(jnp.asarray(slots), rows=1, width=k * real.shape[1])
    >>> slots.tolist(), segment.tolist(), k
    ([[8, 0, 1, 8], [2, 3, 8, 8], [8, 8, 4, 8]], [0, 0, 1], 2)
  """
  real = np.asarray(real) != 0
  batch, columns = real.shape
  chunks = [batch] if chunks is None else [int(c) for c in chunks]
  if sum(chunks) != batch or min(chunks, default=1) < 1 or rows < 1:
    raise ValueError(f"packing: chunks {chunks} do not split {batch} rows into {rows} rows")
  start, length = _runs(real)
  bounds = list(zip(np.cumsum([0, *chunks])[:-1], np.cumsum(chunks), strict=True))
  least = [max(1, -(-int(length[lo:hi].sum()) // (rows * columns))) for lo, hi in bounds]
  k = max(_fit(length[lo:hi], rows, columns, n) for (lo, hi), n in zip(bounds, least, strict=True))
  k = min(-(-k // round_to) * round_to, max(-(-max(chunks) // rows), k))
  row, offset = np.zeros(batch, np.int64), np.zeros(batch, np.int64)
  for lo, hi in bounds:
    k = _fit(length[lo:hi], rows, columns, k)  # first-fit is not monotone in the width
  for lo, hi in bounds:
    row[lo:hi], offset[lo:hi] = _first_fit_decreasing(length[lo:hi], k * columns)
  first = row * k * columns + offset
  slots = first[:, None] + (np.arange(columns)[None] - start[:, None])
  slots = np.where(real, slots, rows * k * columns).astype(np.int32)
  return slots, (first // columns).astype(np.int32), k


def pack(x: jax.Array, packing: Packing) -> jax.Array:
  """`x` `[B, W, ...]` in the packed layout `[R, L, ...]` (zeros in empty slots).

  Args:
    x: `[B, W, ...]` a per-token array in the padded layout, any dtype.
    packing: where each token goes (`plan_packing`), for `R` rows of `L` slots.

  Returns:
    `[R, L, ...]` in `x`'s dtype; padding tokens are dropped.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> # two rows of W=3: tokens 1-2 of row 0 and token 0 of row 1, in 1 row of 3 slots
    >>> packing = ops.Packing(jnp.array([[3, 0, 1], [2, 3, 3]]), rows=1, width=3)
    >>> ops.pack(jnp.array([[0, 7, 8], [9, 0, 0]]), packing).tolist()
    [[7, 8, 9]]
  """
  batch, columns = packing.slots.shape
  chex.assert_shape(x, (batch, columns, ...))
  tail = x.shape[2:]
  flat = jnp.zeros((packing.rows * packing.width + 1, *tail), x.dtype)
  flat = flat.at[packing.slots.reshape(-1)].set(x.reshape(batch * columns, *tail))
  return flat[:-1].reshape(packing.rows, packing.width, *tail)


def unpack(y: jax.Array, packing: Packing) -> jax.Array:
  """`y` `[R, L, ...]` back in the padded layout `[B, W, ...]` (zeros at padding).

  Args:
    y: `[R, L, ...]` a per-token array in the packed layout, any dtype.
    packing: the `Packing` that `y` was packed with.

  Returns:
    `[B, W, ...]` in `y`'s dtype.

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> slots = jnp.array([[3, 0, 1], [2, 3, 3]])  # slot 3 (= rows * width): padding
    >>> ops.unpack(jnp.array([[7, 8, 9]]), ops.Packing(slots, rows=1, width=3)).tolist()
    [[0, 7, 8], [9, 0, 0]]
  """
  chex.assert_shape(y, (packing.rows, packing.width, ...))
  flat = y.reshape(-1, *y.shape[2:])
  flat = jnp.concatenate([flat, jnp.zeros((1, *y.shape[2:]), y.dtype)])
  return flat[packing.slots]


def packed_model_inputs(
  input_ids: jax.Array, positions: jax.Array, real: jax.Array, packing: Packing
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """The model inputs of the padded `[B, W]` layout packed: `(input_ids [R, L], positions
  [R, L], causal mask [R, L, L] bool, segment ids [R, L] int32)`. A token attends to the
  tokens of its own episode at or before it; an empty slot to nothing.

  Args:
    input_ids: `[B, W]` int token ids in the padded layout.
    positions: `[B, W]` int positions (counted over each episode's real tokens).
    real: `[B, W]` nonzero on real tokens (each row one run).
    packing: the chunk's `Packing` (`plan_packing`).

  Returns:
    `(input_ids, positions, mask, segment_ids)`: `[R, L]`, `[R, L]`, bool `[R, L, L]`
    and int32 `[R, L]` (episode `b` is segment `b + 1`, 0 an empty slot).

  Examples:
    >>> import jax.numpy as jnp
    >>> from tunix_ppo_ext import ops
    >>> input_ids, real = jnp.array([[0, 11, 12], [13, 0, 0]]), jnp.array([[0, 1, 1], [1, 0, 0]])
    >>> positions = jnp.array([[0, 0, 1], [0, 0, 0]])
    >>> packing = ops.Packing(jnp.array([[3, 0, 1], [2, 3, 3]]), rows=1, width=3)
    >>> ids, pos, mask, seg = ops.packed_model_inputs(input_ids, positions, real, packing)
    >>> ids.tolist(), pos.tolist(), seg.tolist()
    ([[11, 12, 13]], [[0, 1, 0]], [[1, 1, 2]])
    >>> mask[0].astype(int).tolist()  # token 2 (episode 1) sees only itself
    [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
  """
  episode = (jnp.arange(real.shape[0], dtype=jnp.int32) + 1)[:, None] * (real != 0)
  segments = pack(episode.astype(jnp.int32), packing)
  columns = jnp.arange(segments.shape[1])
  causal = columns[:, None] >= columns[None, :]
  same = segments[:, :, None] == segments[:, None, :]
  mask = same & causal[None] & (segments[:, None, :] > 0)
  return pack(input_ids, packing), pack(positions, packing), mask, segments


# Each chunk's episodes are packed into one row per `PACK_EPISODES` of them (dense attention
# holds `[rows, k W, k W]` scores: a row's width grows with the episodes it holds), `k`
# batch widths long with `k` rounded up to a multiple of a quarter of what a row could need:
# at most four shapes to compile a pass for, whatever the episode lengths.
PACK_EPISODES = 4
PACK_SHAPES = 4


def pack_rows_for(episodes: int) -> int:
  """The packed rows of a chunk of `episodes` rows."""
  return -(-episodes // PACK_EPISODES)


def plan_rows(
  prompt_tokens: Any, attention_mask: Any, pad_id: int, chunks: list[int] | None = None
) -> tuple[np.ndarray, np.ndarray, int, int]:
  """`plan_packing` of a `[B, P]` prompt and `[B, T]` completion attention mask
  (on the host), each chunk of rows packed on its own into the rows its largest chunk gets
  (`pack_rows_for`): `(slots, segment, rows, k)`."""
  prompt, mask = np.asarray(prompt_tokens), np.asarray(attention_mask)
  real = np.concatenate([prompt != pad_id, mask != 0], axis=1)
  largest = max(chunks) if chunks else real.shape[0]
  rows = pack_rows_for(largest)
  round_to = max(1, -(-largest // rows) // PACK_SHAPES)
  return (*plan_packing(real, chunks, rows, round_to), rows)
