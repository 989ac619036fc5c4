"""tunix_ppo_ext._src.ops.attention (blockwise segment-masked attention) against a float64
NumPy reference written from the formula, a dense JAX version for the gradients, and its
jaxpr (no `[T, T]` array)."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.attention import value_shapes
from tunix_ppo_ext._src.ops.attention import (
  packed_segment_ids,
  segment_attention,
  segment_ids_from_mask,
)

pytestmark = pytest.mark.fast

TOL = dict(rtol=2e-5, atol=2e-5)
HYP = settings(max_examples=25, deadline=None)
HB, HT = 2, 12  # fixed shapes for the hypothesis tests (one compilation per block size)

# ----------------------------------------------------------------------------
# Independent references
# ----------------------------------------------------------------------------


def np_reference(q, k, v, seg_q, seg_kv=None, pos_q=None, pos_kv=None, causal=True, scale=None):
  """float64, one query at a time: softmax of `q.k * scale` over the keys with the same
  nonzero segment id (and, if causal, a position not after the query's); 0 if none."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  (b, t, hq, d), s, hkv = q.shape, k.shape[1], k.shape[2]
  seg_kv = seg_q if seg_kv is None else seg_kv
  pos_q = np.broadcast_to(np.arange(t), (b, t)) if pos_q is None else pos_q
  pos_kv = np.broadcast_to(np.arange(s), (b, s)) if pos_kv is None else pos_kv
  scale = d**-0.5 if scale is None else scale
  out = np.zeros_like(q)
  for row in range(b):
    for i in range(t):
      visible = (seg_kv[row] == seg_q[row, i]) & (seg_q[row, i] != 0)
      if causal:
        visible &= pos_kv[row] <= pos_q[row, i]
      if not visible.any():
        continue
      for h in range(hq):
        kh, vh = k[row, visible, h // (hq // hkv)], v[row, visible, h // (hq // hkv)]
        scores = kh @ q[row, i, h] * scale
        p = np.exp(scores - scores.max())
        out[row, i, h] = (p / p.sum()) @ vh
  return out


def np_packed(lengths, width):
  """Ids 1, 2, ... for consecutive runs of `lengths` tokens, then 0, cut at `width`."""
  ids = np.concatenate([np.full(n, e + 1) for e, n in enumerate(lengths)] + [np.zeros(width)])
  return ids[:width].astype(np.int32)


def dense_jax(q, k, v, seg, causal=True):
  """The same masked attention with a full `[T, T]` score matrix (float32, autodiff)."""
  (_, t, hq, d), hkv = q.shape, k.shape[2]
  k, v = jnp.repeat(k, hq // hkv, axis=2), jnp.repeat(v, hq // hkv, axis=2)
  mask = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] != 0)
  if causal:
    mask &= jnp.tril(jnp.ones((t, t), bool))
  mask = mask[:, None]
  s = jnp.where(mask, jnp.einsum("bqhd,bkhd->bhqk", q, k) * d**-0.5, -1e30)
  p = jnp.exp(s - s.max(-1, keepdims=True)) * mask
  p = p / jnp.maximum(p.sum(-1, keepdims=True), 1e-30)
  return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def qkv(b, t, hq, hkv, d=8, seed=0, std=1.0, s=None):
  rng = np.random.default_rng(seed)
  s = t if s is None else s
  return (
    (std * rng.standard_normal((b, t, hq, d))).astype(np.float32),
    (std * rng.standard_normal((b, s, hkv, d))).astype(np.float32),
    rng.standard_normal((b, s, hkv, d)).astype(np.float32),
  )


def prompt_completion_ids(t, prompt_lens, completion_lens, prompt_width):
  """Rows as the package builds them: a left-padded prompt of `prompt_width`, then a
  right-padded completion; ids from the attention mask."""
  pos = np.arange(t)[None, :]
  p, c = np.array(prompt_lens)[:, None], np.array(completion_lens)[:, None]
  mask = ((pos >= prompt_width - p) & (pos < prompt_width)) | (
    (pos >= prompt_width) & (pos < prompt_width + c)
  )
  return np.asarray(segment_ids_from_mask(mask.astype(np.int32)))


@functools.partial(jax.jit, static_argnames=("block_size",))
def attend(q, k, v, seg, block_size):
  return segment_attention(q, k, v, seg, block_size=block_size)


# ----------------------------------------------------------------------------
# Values against the reference
# ----------------------------------------------------------------------------

PADDED = prompt_completion_ids(13, [3, 5, 0], [4, 8, 0], prompt_width=5)  # row 2: all padding
PACKED = np.asarray(packed_segment_ids(np.array([[1, 4, 1, 3], [6, 0, 2, 1], [2, 2, 2, 2]]), 13))
SINGLES = np.tile(np.arange(1, 14), (3, 1))  # every token its own segment

# (layout, block_size, Hq, Hkv): T=13 is a multiple of no block but 1 and 13.
CASES = [
  ("padded", 4, 4, 4),
  ("padded", 1, 4, 2),
  ("padded", 16, 4, 1),  # T smaller than a block
  ("packed", 4, 4, 2),
  ("packed", 5, 4, 1),
  ("packed", 13, 4, 4),
  ("singles", 4, 4, 2),
  ("singles", 1, 4, 1),
]
LAYOUTS = {"padded": PADDED, "packed": PACKED, "singles": SINGLES}


@pytest.mark.parametrize("layout,block,hq,hkv", CASES)
def test_matches_the_reference(layout, block, hq, hkv):
  seg = LAYOUTS[layout]
  q, k, v = qkv(3, 13, hq, hkv, seed=block + hkv)
  out = np.asarray(attend(q, k, v, seg, block))
  np.testing.assert_allclose(out, np_reference(q, k, v, seg), **TOL)
  assert out.dtype == np.float32 and np.all(out[seg == 0] == 0)


def test_layouts_say_what_they_are():
  assert PADDED.tolist() == [
    [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0],  # left and right padding
    [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],  # a full row
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # all padding
  ]
  assert PACKED.tolist() == [
    [1, 2, 2, 2, 2, 3, 4, 4, 4, 0, 0, 0, 0],
    [1, 1, 1, 1, 1, 1, 3, 3, 4, 0, 0, 0, 0],  # a zero-length episode leaves id 2 unused
    [1, 1, 2, 2, 3, 3, 4, 4, 0, 0, 0, 0, 0],
  ]


def test_one_token_segments_return_their_own_value():
  q, k, v = qkv(3, 13, 4, 2, seed=1)
  out = np.asarray(attend(q, k, v, SINGLES, 4))
  np.testing.assert_allclose(out, np.repeat(v, 2, axis=2), **TOL)


def test_non_causal_cross_attention_with_positions():
  """T != S: key segments and positions given; not causal, then causal by the positions."""
  q, k, v = qkv(2, 5, 4, 2, s=9, seed=2)
  seg_q, seg_kv = (
    np.array([[1, 1, 2, 2, 0], [3, 3, 3, 0, 0]]),
    np.array([[1, 1, 1, 2, 2, 0, 0, 0, 0]] * 2),
  )
  seg_kv[1, :5] = 3
  pos_q, pos_kv = np.array([[1, 2, 4, 6, 0], [0, 3, 8, 0, 0]]), np.tile(np.arange(9), (2, 1))
  for causal in (False, True):
    out = segment_attention(
      q, k, v, seg_q, causal=causal, block_size=4, kv_segment_ids=seg_kv,
      q_positions=pos_q, kv_positions=pos_kv, scale=0.3,
    )  # fmt: skip
    want = np_reference(q, k, v, seg_q, seg_kv, pos_q, pos_kv, causal=causal, scale=0.3)
    np.testing.assert_allclose(out, want, **TOL)


def test_bfloat16_inputs():
  q, k, v = qkv(3, 13, 4, 2, seed=3)
  q16, k16, v16 = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
  out = attend(q16, k16, v16, PACKED, 4)
  assert out.dtype == jnp.bfloat16
  want = np_reference(*(np.asarray(x, np.float32) for x in (q16, k16, v16)), PACKED)
  np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=2e-2, atol=2e-2)


def test_huge_logits_neither_overflow_nor_nan():
  """Scores past 1e4 (float32's `exp` overflows past 88)."""
  q, k, v = qkv(3, 13, 4, 2, seed=4, std=60.0)
  out, grads = jax.value_and_grad(
    lambda *a: jnp.sum(segment_attention(*a, PACKED, block_size=4, scale=1.0) ** 2), (0, 1, 2)
  )(q, k, v)
  scores = np.einsum("bqhd,bkhd->bhqk", q, np.repeat(k, 2, axis=2))
  assert np.abs(scores).max() > 1e4
  assert np.isfinite(out) and all(np.isfinite(g).all() for g in grads)
  got = segment_attention(q, k, v, PACKED, block_size=4, scale=1.0)
  np.testing.assert_allclose(got, np_reference(q, k, v, PACKED, scale=1.0), rtol=1e-3, atol=1e-3)


# ----------------------------------------------------------------------------
# Gradients, jit, the memory claim
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("layout,block,hq,hkv", [("padded", 4, 4, 2), ("packed", 5, 4, 4)])
def test_value_and_gradients_match_dense_autodiff(layout, block, hq, hkv):
  seg = LAYOUTS[layout]
  q, k, v = qkv(3, 13, hq, hkv, seed=5)
  w = np.random.default_rng(6).standard_normal(q.shape).astype(np.float32)

  def loss(attention):
    return lambda *a: jnp.sum(w * jnp.tanh(attention(*a)))

  blocked = jax.jit(jax.value_and_grad(loss(lambda *a: attend(*a, seg, block)), (0, 1, 2)))
  dense = jax.value_and_grad(loss(lambda *a: dense_jax(*a, jnp.asarray(seg))), (0, 1, 2))
  (value, grads), (want_value, want_grads) = blocked(q, k, v), dense(q, k, v)
  np.testing.assert_allclose(value, want_value, rtol=1e-5, atol=1e-5)
  for g, want in zip(grads, want_grads, strict=True):
    np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)
  assert np.all(np.asarray(grads[0])[seg == 0] == 0)  # padding queries get no gradient


def test_a_row_of_padding_gives_zeros_and_zero_gradients():
  q, k, v = qkv(1, 7, 2, 1, seed=7)
  seg = np.zeros((1, 7), np.int32)
  out, grads = jax.value_and_grad(
    lambda *a: jnp.sum(segment_attention(*a, seg, block_size=3)), (0, 1, 2)
  )(q, k, v)
  assert out == 0 and all(np.all(np.asarray(g) == 0) for g in grads)


def test_jit_matches_eager():
  q, k, v = qkv(3, 13, 4, 2, seed=8)
  eager = segment_attention(q, k, v, PADDED, block_size=4)
  np.testing.assert_allclose(attend(q, k, v, PADDED, 4), eager, rtol=1e-6, atol=1e-6)


def test_no_t_by_t_array_forward_or_backward():
  t = 1024
  q, k, v = qkv(1, t, 2, 1, d=4, seed=9)
  seg = np.ones((1, t), np.int32)

  def loss(q, k, v):
    return jnp.sum(segment_attention(q, k, v, seg, block_size=128))

  for fn in (loss, jax.grad(loss, (0, 1, 2))):
    shapes = value_shapes(jax.make_jaxpr(fn)(q, k, v).jaxpr)
    assert len(shapes) > 20 and max(len(s) for s in shapes) >= 5  # it saw inside the scans
    assert any(128 in s for s in shapes)  # the tiles are there
    big = [s for s in shapes if s.count(t) >= 2 or np.prod(s, dtype=np.int64) >= t * t // 4]
    assert not big, big
    hlo = jax.jit(fn).lower(q, k, v).as_text()
    assert not re.search(rf"\b{t}x{t}x|x{t}x{t}\b", hlo)


def test_dense_jax_does_form_t_by_t():
  """The jaxpr check above would see a `[T, T]` array if there were one."""
  q, k, v = qkv(1, 1024, 2, 1, d=4)
  shapes = value_shapes(jax.make_jaxpr(dense_jax)(q, k, v, jnp.ones((1, 1024), jnp.int32)).jaxpr)
  assert any(s.count(1024) >= 2 for s in shapes)


# ----------------------------------------------------------------------------
# Properties
# ----------------------------------------------------------------------------

layouts = st.lists(st.integers(0, 5), min_size=1, max_size=5)


@HYP
@given(
  rows=st.lists(st.tuples(st.integers(0, 3), layouts), min_size=HB, max_size=HB),
  block_hkv=st.sampled_from([(1, 1), (5, 2), (12, 1), (16, 2)]),  # one compilation each
  seed=st.integers(0, 2**16),
)
def test_random_layouts_match_the_reference(rows, block_hkv, seed):
  """Each row: some left padding, then packed episodes of random lengths (0 allowed), then
  right padding."""
  block, hkv = block_hkv
  seg = np.zeros((HB, HT), np.int32)
  for row, (left, lengths) in enumerate(rows):
    seg[row, left:] = np_packed(lengths, HT - left)
  q, k, v = qkv(HB, HT, 2, hkv, d=4, seed=seed)
  np.testing.assert_allclose(attend(q, k, v, seg, block), np_reference(q, k, v, seg), **TOL)


@HYP
@given(
  lengths=st.lists(st.integers(1, 3), min_size=2, max_size=4),  # at most HT tokens
  order=st.randoms(use_true_random=False),
  block=st.sampled_from([5, 16]),
  seed=st.integers(0, 2**16),
)
def test_packing_order_does_not_change_an_episode(lengths, order, block, seed):
  """Episodes packed in one row, in any order, each give what they give alone: the row's
  output is the episodes' outputs, moved with them."""
  q, k, v = qkv(1, HT, 2, 1, d=4, seed=seed)
  starts = np.cumsum([0, *lengths])
  perm = list(range(len(lengths)))
  order.shuffle(perm)
  index = np.concatenate([np.arange(starts[e], starts[e + 1]) for e in perm])
  tail = np.arange(starts[-1], HT)
  index = np.concatenate([index, tail]).astype(np.int64)
  seg = np_packed(lengths, HT)[None]
  seg_moved = np_packed([lengths[e] for e in perm], HT)[None]
  out = np.asarray(attend(q, k, v, seg, block))
  moved = np.asarray(attend(q[:, index], k[:, index], v[:, index], seg_moved, block))
  np.testing.assert_allclose(moved, out[:, index], **TOL)


# ----------------------------------------------------------------------------
# The segment-id helpers and the argument checks
# ----------------------------------------------------------------------------


def test_segment_ids_from_mask():
  mask = np.array([[0, 1, 1, 1, 0], [1, 1, 0, 0, 0]], np.float32)
  ids = segment_ids_from_mask(mask)
  assert ids.dtype == jnp.int32 and ids.tolist() == [[0, 1, 1, 1, 0], [1, 1, 0, 0, 0]]
  assert segment_ids_from_mask(mask.astype(bool)).tolist() == ids.tolist()


def test_packed_segment_ids_cut_at_the_row_width():
  ids = packed_segment_ids(np.array([[3, 4], [0, 1], [0, 0]]), 5)
  assert ids.dtype == jnp.int32
  assert ids.tolist() == [[1, 1, 1, 2, 2], [2, 0, 0, 0, 0], [0, 0, 0, 0, 0]]
  assert packed_segment_ids(np.zeros((2, 0), np.int32), 3).tolist() == [[0, 0, 0]] * 2
  lengths = np.array([[1, 4, 1, 3], [6, 0, 2, 1], [2, 2, 2, 2]])
  np.testing.assert_array_equal(PACKED, [np_packed(row, 13) for row in lengths])


@pytest.mark.parametrize(
  "change,match",
  [
    (dict(k=np.zeros((1, 4, 3, 2), np.float32)), "multiple of kv heads"),
    (dict(block_size=0), "block_size"),
    (dict(segment_ids=np.ones((1, 3), np.int32)), "segment_ids"),
    (dict(segment_ids=np.ones((1, 4), np.float32)), "segment_ids"),
    (dict(q=np.zeros((1, 4, 4, 2), np.int32)), "floating"),
  ],
)
def test_bad_arguments_are_named(change, match):
  args = dict(
    q=np.zeros((1, 4, 4, 2), np.float32),
    k=np.zeros((1, 4, 2, 2), np.float32),
    v=np.zeros((1, 4, 2, 2), np.float32),
    segment_ids=np.ones((1, 4), np.int32),
    block_size=2,
  )
  args.update(change)
  if "k" in change:
    args["v"] = change["k"]
  with pytest.raises(ValueError, match=match):
    segment_attention(**args)


def test_t_differs_from_s_needs_key_segments_and_positions():
  q, k, v = qkv(1, 4, 2, 1, s=6)
  with pytest.raises(ValueError, match="q_positions and kv_positions"):
    segment_attention(q, k, v, np.ones((1, 4), np.int32))
  with pytest.raises(ValueError, match="kv_segment_ids"):
    segment_attention(q, k, v, np.ones((1, 4), np.int32), causal=False)
