"""Packing a batch's episodes into fewer rows (`ops.plan_packing`, `pack`, `unpack`,
`packed_model_inputs`) against references written from the definition: each episode's real
tokens one run of consecutive slots in one packed row, in order; padding dropped; attention
inside an episode only, causal."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tunix_ppo_ext import ops

pytestmark = pytest.mark.fast


def rows(prompt_lens, completion_lens, p: int, t: int) -> np.ndarray:
  """`[B, P+T]` real-token mask: a left-padded prompt, then a right-padded completion."""
  real = np.zeros((len(prompt_lens), p + t), bool)
  for b, (pl, cl) in enumerate(zip(prompt_lens, completion_lens, strict=True)):
    real[b, p - pl : p + cl] = True
  return real


def check_plan(real: np.ndarray, chunks: list[int], rows: int, round_to: int) -> None:
  """The plan's definition, checked token by token (a plain-Python reference)."""
  slots, segment, k = ops.plan_packing(real, chunks, rows, round_to)
  columns = real.shape[1]
  width = k * columns
  most = -(-max(chunks) // rows)  # one episode a batch width always fits
  assert 1 <= k <= max(most, 1) and (k % round_to == 0 or k == most), (k, most)
  start = 0
  for size in chunks:
    taken: set[int] = set()
    for b in range(start, start + size):
      mine = slots[b, np.flatnonzero(real[b])]
      assert np.all(slots[b, ~real[b]] == rows * width)  # padding: the dropped slot
      if mine.size:
        assert np.all(np.diff(mine) == 1)  # one run, in order
        assert mine[0] // width == mine[-1] // width  # one packed row
        assert segment[b] == mine[0] // columns  # where it starts
      for s in mine:
        assert 0 <= s < rows * width and s not in taken, (b, s)
        taken.add(int(s))
    start += size


def test_a_hand_made_batch_packs_as_first_fit_decreasing_would():
  # P=3, T=5: lengths 2+5=7, 1+1=2, 3+2=5, 1+0=1, 0+0=0 (an empty row): 15 tokens
  real = rows([2, 1, 3, 1, 0], [5, 1, 2, 0, 0], 3, 5)
  slots, segment, k = ops.plan_packing(real)  # one stream of k x 8 slots
  assert k == 2
  np.testing.assert_array_equal(slots[0, 1:8], np.arange(7))  # longest first
  np.testing.assert_array_equal(slots[2, 0:5], 7 + np.arange(5))
  np.testing.assert_array_equal(slots[1, 2:4], [12, 13])
  assert slots[3, 2] == 14 and np.all(slots[4] == 16)
  np.testing.assert_array_equal(segment[:4], [0, 1, 0, 1])
  slots, _, k = ops.plan_packing(real, rows=2)  # two rows of 8: 7 + 1 | 5 + 2
  assert k == 1 and slots[3, 2] == 7 and slots[1, 2] == 13
  check_plan(real, [5], 1, 1)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
  st.lists(st.tuples(st.integers(0, 4), st.integers(0, 6)), min_size=1, max_size=12),
  st.integers(1, 3),
  st.integers(1, 4),
  st.data(),
)
def test_every_plan_keeps_each_episode_one_ordered_run_in_one_row(
  lengths, packed_rows, round_to, data
):
  """Any lengths (empty rows, one-token episodes, an episode filling its whole row), any
  split into chunks, one to three packed rows, any rounding."""
  real = rows([p for p, _ in lengths], [c for _, c in lengths], 4, 6)
  cuts = sorted(data.draw(st.sets(st.integers(1, len(lengths) - 1))) if len(lengths) > 1 else [])
  chunks = list(np.diff([0, *cuts, len(lengths)]))
  check_plan(real, chunks, packed_rows, round_to)


def test_a_stream_takes_as_many_batch_widths_as_its_tokens_need():
  real = rows([3, 3, 3, 3], [3, 3, 3, 3], 3, 5)  # 6 of 8 columns each: 24 tokens
  slots, _, k = ops.plan_packing(real)
  assert k == 3  # 24 slots: no padding at all
  np.testing.assert_array_equal(np.sort(slots[real]), np.arange(24))
  assert ops.plan_packing(real, round_to=2)[2] == 4  # rounded up: one shape for 3 and 4
  assert ops.plan_packing(real, rows=4)[2] == 1  # one a row: the padded layout


def test_pack_then_unpack_gives_the_real_tokens_back_and_zeros_at_padding():
  real = rows([2, 1, 3, 4], [5, 1, 2, 6], 4, 6)
  slots, _, k = ops.plan_packing(real, [2, 2])
  x = np.random.default_rng(0).normal(size=(4, 10, 3)).astype(np.float32)
  for lo in (0, 2):  # each chunk is packed on its own
    packing = ops.Packing(jnp.asarray(slots[lo : lo + 2]), 1, k * 10)
    packed = ops.pack(jnp.asarray(x[lo : lo + 2]), packing)
    assert packed.shape == (1, k * 10, 3)
    back = np.asarray(ops.unpack(packed, packing))
    np.testing.assert_array_equal(back, x[lo : lo + 2] * real[lo : lo + 2, :, None])


def test_the_packed_mask_lets_a_token_see_its_own_episode_up_to_itself():
  real = rows([2, 1, 3], [3, 1, 2], 3, 4)
  slots, _, k = ops.plan_packing(real, rows=2)
  r, width = 2, k * 7
  packing = ops.Packing(jnp.asarray(slots), r, width)
  ids = jnp.asarray(np.arange(21).reshape(3, 7), jnp.int32)
  positions = jnp.asarray(np.maximum(np.cumsum(real, 1) - 1, 0), jnp.int32)
  p_ids, p_pos, mask, segments = ops.packed_model_inputs(ids, positions, jnp.asarray(real), packing)
  want = np.zeros((r, width, width), bool)
  for b in range(3):  # the reference: an episode's slots, each seeing its own earlier ones
    mine = slots[b, real[b]]
    for i, si in enumerate(mine):
      for sj in mine[: i + 1]:
        want[si // width, si % width, sj % width] = True
      assert int(p_ids.reshape(-1)[si]) == int(ids[b, real[b]][i])
      assert int(p_pos.reshape(-1)[si]) == i  # its own positions, from 0
      assert int(segments.reshape(-1)[si]) == b + 1
  np.testing.assert_array_equal(np.asarray(mask), want)


def test_a_row_with_padding_between_real_tokens_is_refused_in_one_line():
  real = np.array([[0, 1, 1, 0, 1, 0]], bool)
  with pytest.raises(ValueError, match=r"^packing: row 0's real tokens are not one run"):
    ops.plan_packing(real)


def test_chunks_that_do_not_split_the_batch_are_refused():
  with pytest.raises(ValueError, match="do not split 3 rows"):
    ops.plan_packing(np.ones((3, 4), bool), [2, 2])
