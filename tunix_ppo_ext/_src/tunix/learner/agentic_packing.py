"""Sequence packing (`max_seq_token_per_tpu`) for `AgenticPpoLearner`: tunix's packed rows
trained as this learner's padded rows, every model pass on tunix's packed layout.

tunix main's agentic loop packs the examples a learner hands it (`rl.utils.pack_sequences`:
each episode's real prompt and completion tokens one after another in rows of
`max_seq_token_per_tpu` slots, with `segment_ids` and `segment_positions`). It keeps tunix's
fields only, so this package's attention and loss masks, per-step scalars (`kl_coef`,
`actor_scale`) and rollout-correction weights would be lost, and it cuts each episode at
its `completion_mask`'s sum (the loss mask's: an episode's observations would shift it).

So under packing the learner hands tunix each example with the attention mask as its
`completion_mask` (an episode's real tokens are one run: tunix then packs them whole) and
keeps its rows (`PackedRows.add`); when tunix gives back a packed chunk (its
`_compute_packed_logps` hook) the chunk's episodes are found among the kept rows by their
tokens and advantages as tunix packed them, and come back as padded rows in the order tunix
packed them, with `pack_slots`: each token's slot in tunix's packed rows
(`PackedRows.restore`). The losses run the model on tunix's rows (`loss_fns.example_packing`:
one segment per episode, positions counted within it, the model given the segment ids) and
gather its outputs back into the padded rows: every token's log-prob and value is the
unpacked pass's, and every loss and aggregation mode (the per-sequence ones too) sees one
row per episode, as unpacked. Advantages and values are computed before packing, on the
padded rows, as without it.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tunix.rl import utils as rl_utils


def segment_key(tokens: Any, advantages: Any) -> bytes:
  """The key of one packed episode: its tokens and its per-token advantages (0 on its
  prompt) as tunix packs them."""
  return np.asarray(tokens, np.int32).tobytes() + np.asarray(advantages, np.float32).tobytes()


def item_key(item: dict[str, Any]) -> bytes:
  """The key of one of tunix's unpadded episodes (`rl.utils.unpad_train_example`), as
  `pack_sequences` lays it out in a packed row."""
  prompt, completion = item["prompt_ids"], item["completion_ids"]
  advantages = np.asarray(item["advantages"], np.float32)
  if not item["adv_is_per_token"]:
    advantages = np.full(len(completion), advantages, np.float32)
  tokens = np.concatenate([prompt, completion])
  return segment_key(tokens, np.concatenate([np.zeros(len(prompt), np.float32), advantages]))


def _rows_of(example: Any) -> list[Any]:
  """The example's rows, each a one-row example of host arrays."""
  host = jax.tree.map(np.asarray, example)
  batch = np.shape(host.completion_ids)[0]
  return [jax.tree.map(lambda x, i=i: x[i : i + 1], host) for i in range(batch)]


def _real_columns(row: Any) -> np.ndarray:
  """The columns of a one-row example's real tokens (prompt, then completion)."""
  prompt = np.asarray(row.prompt_mask)[0] != 0
  return np.flatnonzero(np.concatenate([prompt, np.asarray(row.attention_mask)[0] != 0]))


class PackedRows:
  """The padded rows of the examples handed to tunix's packing, until tunix trains them.

  `add` runs on tunix's producer thread, `restore` on its training loop: a lock guards
  the rows kept. Each key (`item_key`) holds its rows first in, first out: copies of one
  episode with the same advantages are interchangeable in a packed row.
  """

  def __init__(self) -> None:
    self._rows: dict[bytes, collections.deque] = {}
    self._lock = threading.Lock()

  def clear(self) -> None:
    with self._lock:
      self._rows.clear()

  def add(self, example: Any) -> Any:
    """Keeps the example's rows; returns the example as tunix packs it: its attention mask
    as its `completion_mask`, so that tunix packs each episode's real tokens whole."""
    packed = example.replace(completion_mask=example.attention_mask)
    items = rl_utils.unpad_train_example(packed)
    with self._lock:
      for item, row in zip(items, _rows_of(example), strict=True):
        self._rows.setdefault(item_key(item), collections.deque()).append(row)
    return packed

  def _take(self, key: bytes) -> Any:
    with self._lock:
      rows = self._rows.get(key)
      if not rows:
        raise ValueError(
          "packing: a packed episode is none of the rows AgenticPpoLearner handed tunix "
          "(tunix's pack_sequences changed its tokens or advantages?)"
        )
      row = rows.popleft()
      if not rows:
        del self._rows[key]
      return row

  def restore(self, packed: Any) -> Any:
    """The padded rows of tunix's packed chunk `packed` (`[R, L]`, `segment_ids`), in the
    order tunix packed them, with `pack_slots` `[N, P+T]` (each token's slot `r L + l` in
    the packed rows, `R L` for padding) and tunix's packed fields kept (`segment_ids`,
    `segment_positions`, `num_segments`, `is_update_step`). `N` is rounded up to a power of
    two and a multiple of `R` with rows that train nothing (fewer shapes to compile)."""
    segments, ids = np.asarray(packed.segment_ids), np.asarray(packed.completion_ids)
    advantages = np.asarray(packed.advantages, np.float32)
    height, width = segments.shape
    rows, slots = [], []
    for r in range(height):
      for segment in dict.fromkeys(segments[r][segments[r] > 0]):  # in packed order
        where = np.flatnonzero(segments[r] == segment)
        row = self._take(segment_key(ids[r, where], advantages[r, where]))
        columns = np.shape(row.prompt_ids)[1] + np.shape(row.completion_ids)[1]
        slot = np.full(columns, height * width)
        slot[_real_columns(row)] = r * width + where
        rows.append(row)
        slots.append(slot)
    if not rows:  # a chunk of empty rows only: nothing to train
      return packed
    size = 1 << (len(rows) - 1).bit_length()
    size = -(-size // height) * height
    empty = rows[0].replace(loss_mask=np.zeros_like(rows[0].loss_mask))
    empty = empty.replace(completion_mask=empty.loss_mask)
    rows += [empty] * (size - len(rows))
    slots += [np.full_like(slots[0], height * width)] * (size - len(slots))
    example = jax.tree.map(lambda *x: jnp.asarray(np.concatenate(x)), *rows)
    return example.replace(
      pack_slots=jnp.asarray(np.stack(slots), jnp.int32),
      segment_ids=packed.segment_ids,
      segment_positions=packed.segment_positions,
      num_segments=packed.num_segments,
      is_update_step=packed.is_update_step,
    )
