"""tunix_ppo_ext._src.ops.logits against a float64 NumPy reference written from the formulas."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.logits import ATOL, RTOL, logp_ent, make_inputs
from tunix_ppo_ext._src.ops.logits import (
  full_kl_divergence,
  fused_full_kl_divergence,
  fused_logps_and_entropy,
  logps_and_entropy,
)

pytestmark = pytest.mark.fast

GRAD_ATOL = 1e-6

# (B, T, V, chunk_size, temperature): unchunked, chunk 1, T not a multiple of the chunk,
# chunk dividing T, chunk == T, chunk > T; temperatures 1 and != 1.
CASES = [
  (2, 7, 11, 0, 1.0),
  (2, 7, 11, 0, 0.7),
  (2, 7, 11, 1, 0.7),
  (2, 13, 50, 4, 1.0),
  (2, 13, 50, 4, 0.7),
  (2, 12, 30, 5, 1.3),
  (2, 12, 30, 4, 0.7),
  (2, 9, 23, 9, 0.7),
  (2, 10, 17, 16, 1.0),
]


# ----------------------------------------------------------------------------
# Independent float64 reference
# ----------------------------------------------------------------------------


def np_log_softmax(x: np.ndarray) -> np.ndarray:
  """log softmax over the last axis, float64."""
  x = np.asarray(x, np.float64)
  z = x - x.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def np_reference(logits, ids, temperature, w_logp=None, w_ent=None):
  """(logp, entropy, d/dlogits of sum(w_logp * logp + w_ent * entropy))."""
  logp_all = np_log_softmax(np.asarray(logits, np.float64) / temperature)
  p = np.exp(logp_all)
  logp = np.take_along_axis(logp_all, ids[..., None], -1)[..., 0]
  ent = -(p * logp_all).sum(-1)
  grad = None
  if w_logp is not None:
    onehot = np.eye(logits.shape[-1])[ids]
    grad = w_logp[..., None] * (onehot - p) + w_ent[..., None] * (-p * (logp_all + ent[..., None]))
    grad = grad / temperature
  return logp, ent, grad


def np_kl_reference(logits, ref_logits, temperature, w=None):
  """(KL(p || q), d/dlogits of sum(w * KL))."""
  logp = np_log_softmax(np.asarray(logits, np.float64) / temperature)
  logq = np_log_softmax(np.asarray(ref_logits, np.float64) / temperature)
  p = np.exp(logp)
  kl = (p * (logp - logq)).sum(-1)
  grad = None if w is None else w[..., None] * p * (logp - logq - kl[..., None]) / temperature
  return kl, grad


def loss_logp_ent(logits, ids, w1, w2, temperature, chunk_size):
  logp, ent = logps_and_entropy(logits, ids, temperature=temperature, chunk_size=chunk_size)
  return jnp.sum(w1 * logp + w2 * ent)


def loss_kl(logits, ref, w, temperature, chunk_size):
  return jnp.sum(w * full_kl_divergence(logits, ref, temperature, chunk_size))


# jitted entry points (static temperature / chunk size) so shapes compile once.
_grad_logp_ent = jax.jit(jax.grad(loss_logp_ent), static_argnums=(4, 5))
_grad_kl = jax.jit(jax.grad(loss_kl), static_argnums=(3, 4))
_kl = jax.jit(full_kl_divergence, static_argnums=(2, 3))


# ----------------------------------------------------------------------------
# Values and gradients vs the reference
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("b,t,v,chunk,temperature", CASES)
def test_logps_entropy_values_and_grads(b, t, v, chunk, temperature):
  logits, _, ids, w1, w2 = make_inputs(b, t, v, seed=t * v)
  logp, ent = logp_ent(logits, ids, temperature, chunk)
  ref_logp, ref_ent, ref_grad = np_reference(logits, ids, temperature, w1, w2)
  assert logp.dtype == jnp.float32 and ent.dtype == jnp.float32
  assert logp.shape == ent.shape == (b, t)
  np.testing.assert_allclose(logp, ref_logp, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(ent, ref_ent, rtol=RTOL, atol=ATOL)
  grad = _grad_logp_ent(logits, ids, w1, w2, temperature, chunk)
  assert grad.dtype == jnp.float32
  np.testing.assert_allclose(grad, ref_grad, rtol=RTOL, atol=GRAD_ATOL)


@pytest.mark.parametrize("chunk", [0, 3])
def test_no_entropy(chunk):
  logits, _, ids, w1, _ = make_inputs(2, 8, 19, seed=1)
  kwargs = {"temperature": 1.3, "chunk_size": chunk, "return_entropy": False}
  logp, ent = logps_and_entropy(logits, ids, **kwargs)
  assert ent is None
  ref_logp, _, ref_grad = np_reference(logits, ids, 1.3, w1, np.zeros_like(w1))
  np.testing.assert_allclose(logp, ref_logp, rtol=RTOL, atol=ATOL)

  def loss(x):
    lp, _ = logps_and_entropy(x, ids, **kwargs)
    return jnp.sum(w1 * lp)

  np.testing.assert_allclose(jax.grad(loss)(logits), ref_grad, rtol=RTOL, atol=GRAD_ATOL)


@pytest.mark.parametrize("b,t,v,chunk,temperature", CASES)
def test_full_kl_values_and_grads(b, t, v, chunk, temperature):
  logits, ref, _, w, _ = make_inputs(b, t, v, seed=t + v)
  kl = _kl(logits, ref, temperature, chunk)
  ref_kl, ref_grad = np_kl_reference(logits, ref, temperature, w)
  assert kl.dtype == jnp.float32 and kl.shape == (b, t)
  np.testing.assert_allclose(kl, ref_kl, rtol=RTOL, atol=ATOL)
  grad = _grad_kl(logits, ref, w, temperature, chunk)
  np.testing.assert_allclose(grad, ref_grad, rtol=RTOL, atol=GRAD_ATOL)


@pytest.mark.parametrize("chunk", [0, 4])
def test_kl_reference_gets_no_gradient(chunk):
  logits, ref, _, w, _ = make_inputs(2, 6, 13, seed=2)
  g_ref = jax.grad(loss_kl, argnums=1)(logits, ref, w, 1.0, chunk)
  np.testing.assert_array_equal(g_ref, np.zeros_like(ref))


def test_jit_and_vmap_match():
  logits, ref, ids, _, _ = make_inputs(2, 9, 21, seed=3)
  f = jax.jit(lambda x, i: logps_and_entropy(x, i, chunk_size=4))
  g = jax.vmap(lambda x, i: logps_and_entropy(x[None], i[None], chunk_size=4))
  (lp1, e1), (lp2, e2) = f(logits, ids), g(logits, ids)
  np.testing.assert_allclose(lp1, lp2[:, 0], rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(e1, e2[:, 0], rtol=RTOL, atol=ATOL)


# ----------------------------------------------------------------------------
# bfloat16 and extreme inputs
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [0, 4])
def test_bfloat16_inputs(chunk):
  logits, ref, ids, w1, w2 = make_inputs(2, 11, 37, seed=4)
  lb, rb = jnp.asarray(logits, jnp.bfloat16), jnp.asarray(ref, jnp.bfloat16)
  lf, rf = lb.astype(jnp.float32), rb.astype(jnp.float32)  # same rounded inputs

  logp_b, ent_b = logp_ent(lb, ids, 0.9, chunk)
  logp_f, ent_f = logp_ent(lf, ids, 0.9, chunk)
  assert logp_b.dtype == ent_b.dtype == jnp.float32
  assert np.all(np.isfinite(logp_b)) and np.all(np.isfinite(ent_b))
  np.testing.assert_allclose(logp_b, logp_f, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(ent_b, ent_f, rtol=RTOL, atol=ATOL)

  g_b = _grad_logp_ent(lb, ids, w1, w2, 0.9, chunk)
  g_f = _grad_logp_ent(lf, ids, w1, w2, 0.9, chunk)
  assert g_b.dtype == jnp.bfloat16
  np.testing.assert_allclose(g_b.astype(np.float32), g_f, rtol=1e-2, atol=1e-3)

  kl_b = _kl(lb, rb, 0.9, chunk)
  np.testing.assert_allclose(kl_b, _kl(lf, rf, 0.9, chunk), rtol=RTOL, atol=ATOL)
  gk_b = _grad_kl(lb, rb, w1, 0.9, chunk)
  assert gk_b.dtype == jnp.bfloat16
  gk_f = _grad_kl(lf, rf, w1, 0.9, chunk)
  np.testing.assert_allclose(gk_b.astype(np.float32), gk_f, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("chunk", [0, 3])
def test_huge_logits_stay_finite(chunk):
  rng = np.random.default_rng(5)
  logits = rng.uniform(-1e4, 1e4, (2, 7, 29)).astype(np.float32)
  ref = rng.uniform(-1e4, 1e4, (2, 7, 29)).astype(np.float32)
  ids = rng.integers(0, 29, (2, 7)).astype(np.int32)
  w = np.ones((2, 7), np.float32)
  logp, ent = logp_ent(logits, ids, 1.0, chunk)
  kl = _kl(logits, ref, 1.0, chunk)
  for arr in (
    logp,
    ent,
    kl,
    _grad_logp_ent(logits, ids, w, w, 1.0, chunk),
    _grad_kl(logits, ref, w, 1.0, chunk),
  ):
    assert np.all(np.isfinite(arr))
  ref_logp, ref_ent, _ = np_reference(logits, ids, 1.0)
  np.testing.assert_allclose(logp, ref_logp, rtol=RTOL, atol=1e-2)  # |logits| ~ 1e4: ulp ~ 1e-3
  np.testing.assert_allclose(ent, ref_ent, atol=1e-3)


# ----------------------------------------------------------------------------
# Agreement with tunix
# ----------------------------------------------------------------------------


# ----------------------------------------------------------------------------
# Memory: the chunked VJP keeps no full [B, T, V] float32 temporaries
# ----------------------------------------------------------------------------


def _temp_bytes(fn, *args) -> int:
  return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_chunked_temp_memory_is_small():
  b, t, v = 1, 512, 8192
  x = jax.ShapeDtypeStruct((b, t, v), jnp.bfloat16)
  ids = jax.ShapeDtypeStruct((b, t), jnp.int32)
  f32_full = b * t * v * 4

  def lp_ent(chunk):
    return jax.value_and_grad(
      lambda lg, i: sum(jnp.sum(a) for a in logps_and_entropy(lg, i, chunk_size=chunk))
    )

  def kl(chunk):
    return jax.value_and_grad(lambda lg, r: jnp.sum(full_kl_divergence(lg, r, chunk_size=chunk)))

  plain, chunked = _temp_bytes(lp_ent(0), x, ids), _temp_bytes(lp_ent(64), x, ids)
  assert plain >= f32_full  # the unchunked path does hold float32 [B, T, V] temporaries
  assert chunked * 8 < plain, (chunked, plain)
  assert chunked < f32_full / 4, (chunked, f32_full)
  plain, chunked = _temp_bytes(kl(0), x, x), _temp_bytes(kl(64), x, x)
  assert chunked * 8 < plain, (chunked, plain)
  assert chunked < f32_full / 2, (chunked, f32_full)


# ----------------------------------------------------------------------------
# The fused LM head: from hidden states and output weights, against NumPy
# ----------------------------------------------------------------------------

D = 6  # hidden width of the fused-head cases


def head_inputs(b, t, v, seed=0, dtype=np.float32):
  rng = np.random.default_rng(seed)
  hidden = rng.standard_normal((b, t, D)).astype(dtype)
  weight = (rng.standard_normal((D, v)) * 1.5).astype(dtype)
  ids = rng.integers(0, v, (b, t)).astype(np.int32)
  w1, w2 = rng.standard_normal((2, b, t)).astype(np.float32)
  return hidden, weight, ids, w1, w2


def np_head_reference(hidden, weight, ids, temperature, w1, w2):
  """(logp, entropy, d hidden, d weight) of sum(w1 logp + w2 entropy), float64: the
  logits' gradient of `np_reference` taken back through `logits = hidden @ weight`."""
  h, w = np.asarray(hidden, np.float64), np.asarray(weight, np.float64)
  logp, ent, grad = np_reference(h @ w, ids, temperature, w1, w2)
  return logp, ent, grad @ w.T, np.einsum("btd,btv->dv", h, grad)


def fused(hidden, weight, ids, w1, w2, temperature, chunk, return_entropy=True):
  def loss(h, w):
    logp, ent = fused_logps_and_entropy(
      h, w, ids, temperature=temperature, chunk_size=chunk, return_entropy=return_entropy
    )
    total = jnp.sum(w1 * logp) + (0.0 if ent is None else jnp.sum(w2 * ent))
    return total, (logp, ent)

  (_, (logp, ent)), grads = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(hidden, weight)
  return logp, ent, *grads


@pytest.mark.parametrize("b, t, v, chunk, temperature", CASES)
def test_fused_head_values_and_grads(b, t, v, chunk, temperature):
  hidden, weight, ids, w1, w2 = head_inputs(b, t, v)
  got = fused(hidden, weight, ids, w1, w2, temperature, chunk)
  want = np_head_reference(hidden, weight, ids, temperature, w1, w2)
  for name, g, w in zip(("logp", "entropy", "d hidden", "d weight"), got, want, strict=True):
    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4, err_msg=name)


def test_fused_head_without_entropy_and_with_a_tied_embedding():
  hidden, weight, ids, w1, _ = head_inputs(2, 9, 13, seed=1)
  embedding = jnp.asarray(weight.T)  # tied: [V, D], passed transposed
  logp, ent, d_hidden, d_weight = fused(hidden, embedding.T, ids, w1, w1, 0.8, 4, False)
  assert ent is None
  want = np_head_reference(hidden, weight, ids, 0.8, w1, np.zeros_like(w1))
  for g, w in zip((logp, d_hidden, d_weight), (want[0], *want[2:]), strict=True):
    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4)


def test_fused_head_bfloat16_matches_float32_of_the_rounded_inputs():
  hidden, weight, ids, w1, w2 = head_inputs(2, 11, 40, seed=2)
  h16, w16 = jnp.asarray(hidden, jnp.bfloat16), jnp.asarray(weight, jnp.bfloat16)
  logp, ent, d_hidden, d_weight = fused(h16, w16, ids, w1, w2, 1.0, 4)
  assert d_hidden.dtype == jnp.bfloat16 and d_weight.dtype == jnp.bfloat16
  rounded = (np.asarray(h16, np.float64), np.asarray(w16, np.float64))
  want = np_head_reference(*rounded, ids, 1.0, w1, w2)
  np.testing.assert_allclose(np.asarray(logp), want[0], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(ent), want[1], rtol=1e-4, atol=1e-4)
  for g, w in zip((d_hidden, d_weight), want[2:], strict=True):  # rounded to bfloat16
    np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=2e-2, atol=2e-2)


def test_fused_head_holds_one_chunk_of_logits_not_the_sequence():
  """Forward and backward of the fused head at a shape where one float32 [B, T, V]
  buffer would dwarf everything else: its temporaries stay a small fraction of it."""
  b, t, d, v = 1, 4096, 64, 16384
  hidden = jax.ShapeDtypeStruct((b, t, d), jnp.bfloat16)
  weight = jax.ShapeDtypeStruct((d, v), jnp.bfloat16)
  ids = jax.ShapeDtypeStruct((b, t), jnp.int32)
  f32_full = b * t * v * 4

  def step(chunk):
    def loss(h, w, i):
      return sum(jnp.sum(a) for a in fused_logps_and_entropy(h, w, i, chunk_size=chunk))

    return jax.value_and_grad(loss, (0, 1))

  chunk = 128
  plain, chunked = (
    _temp_bytes(step(0), hidden, weight, ids),
    _temp_bytes(step(chunk), hidden, weight, ids),
  )
  assert plain >= f32_full  # unfused: the logits and their gradient are [B, T, V]
  # a few float32 [B, chunk, V] buffers (logits, softmax, their gradient) at a time
  assert chunked < 6 * b * chunk * v * 4 < f32_full / 4, (chunked, f32_full)


def test_fused_head_bad_shapes_are_named():
  hidden, weight, ids, _, _ = head_inputs(1, 3, 7)
  with pytest.raises(ValueError, match=r"weight \(7, 6\) must be \[D, V\] with D = hidden"):
    fused_logps_and_entropy(hidden, weight.T, ids)
  with pytest.raises(ValueError, match=r"target_ids shape \(1, 2\) does not match hidden"):
    fused_logps_and_entropy(hidden, weight, ids[:, :2])


def np_head_kl_reference(hidden, weight, ref_hidden, ref_weight, temperature, w):
  """(KL, d hidden, d weight) of sum(w KL), float64: `np_kl_reference`'s logit gradient
  taken back through `logits = hidden @ weight` (the reference's logits held constant)."""
  h, wt = np.asarray(hidden, np.float64), np.asarray(weight, np.float64)
  ref_logits = np.asarray(ref_hidden, np.float64) @ np.asarray(ref_weight, np.float64)
  kl, grad = np_kl_reference(h @ wt, ref_logits, temperature, w)
  return kl, grad @ wt.T, np.einsum("btd,btv->dv", h, grad)


def fused_kl(hidden, weight, ref_hidden, ref_weight, w, temperature, chunk):
  def loss(h, wt, rh, rw):
    kl = fused_full_kl_divergence(h, wt, rh, rw, temperature=temperature, chunk_size=chunk)
    return jnp.sum(w * kl), kl

  grad = jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True)
  (_, kl), grads = jax.jit(grad)(hidden, weight, ref_hidden, ref_weight)
  return kl, *grads


@pytest.mark.parametrize("b, t, v, chunk, temperature", CASES)
def test_fused_kl_values_and_grads(b, t, v, chunk, temperature):
  """Another width for the reference (D' = 4), as a reference of another size would have;
  the reference's hidden states and head get no gradient."""
  hidden, weight, _, w, _ = head_inputs(b, t, v)
  rng = np.random.default_rng(7)
  ref_hidden = rng.standard_normal((b, t, 4)).astype(np.float32)
  ref_weight = (rng.standard_normal((4, v)) * 1.5).astype(np.float32)
  kl, d_hidden, d_weight, d_ref_h, d_ref_w = fused_kl(
    hidden, weight, ref_hidden, ref_weight, w, temperature, chunk
  )
  want = np_head_kl_reference(hidden, weight, ref_hidden, ref_weight, temperature, w)
  for name, g, x in zip(
    ("KL", "d hidden", "d weight"), (kl, d_hidden, d_weight), want, strict=True
  ):
    np.testing.assert_allclose(np.asarray(g), x, rtol=1e-4, atol=1e-4, err_msg=name)
  assert not np.any(np.asarray(d_ref_h)) and not np.any(np.asarray(d_ref_w))


def test_fused_kl_of_a_model_with_itself_is_zero_and_it_is_never_negative():
  hidden, weight, _, w, _ = head_inputs(2, 13, 50, seed=3)
  kl, d_hidden, d_weight, _, _ = fused_kl(hidden, weight, hidden, weight, w, 0.7, 4)
  # zero up to a few float32 ulps of the log-probs (about 4 here: 5e-7 each): the policy's
  # and the reference's log-softmax are separate XLA fusions, equal bit for bit only where
  # XLA happens to emit them alike (its loop emitters, which the suite compiles with, do not)
  np.testing.assert_allclose(kl, 0.0, atol=1e-5)
  np.testing.assert_allclose(d_hidden, 0.0, atol=1e-5)  # KL's minimum: no gradient
  np.testing.assert_allclose(d_weight, 0.0, atol=1e-5)
  other = (hidden[:, ::-1] * 3.0).copy()  # huge log-ratios
  kl = fused_kl(hidden, weight, other, weight, w, 1.0, 5)[0]
  assert np.all(np.asarray(kl) >= -1e-6) and np.all(np.isfinite(kl))


def test_fused_kl_bfloat16_matches_float32_of_the_rounded_inputs():
  hidden, weight, _, w, _ = head_inputs(2, 11, 40, seed=4)
  ref_hidden = hidden[::-1].copy()
  h16, w16, r16 = (jnp.asarray(x, jnp.bfloat16) for x in (hidden, weight, ref_hidden))
  kl, d_hidden, d_weight, _, _ = fused_kl(h16, w16, r16, w16, w, 0.9, 4)
  assert kl.dtype == jnp.float32 and d_hidden.dtype == d_weight.dtype == jnp.bfloat16
  rounded = [np.asarray(x, np.float64) for x in (h16, w16, r16, w16)]
  want = np_head_kl_reference(*rounded, 0.9, w)
  np.testing.assert_allclose(np.asarray(kl), want[0], rtol=1e-4, atol=1e-4)
  for g, x in zip((d_hidden, d_weight), want[1:], strict=True):  # rounded to bfloat16
    np.testing.assert_allclose(np.asarray(g, np.float64), x, rtol=2e-2, atol=2e-2)


def test_fused_kl_holds_one_chunk_of_logits_not_the_sequence():
  b, t, d, v = 1, 4096, 64, 16384
  hidden = jax.ShapeDtypeStruct((b, t, d), jnp.bfloat16)
  weight = jax.ShapeDtypeStruct((d, v), jnp.bfloat16)
  f32_full = b * t * v * 4

  def step(chunk):
    def loss(h, wt, rh, rw):
      return jnp.sum(fused_full_kl_divergence(h, wt, rh, rw, chunk_size=chunk))

    return jax.value_and_grad(loss, (0, 1))

  chunk = 128
  plain = _temp_bytes(step(0), hidden, weight, hidden, weight)
  chunked = _temp_bytes(step(chunk), hidden, weight, hidden, weight)
  assert plain >= 2 * f32_full  # unfused: both models' logits are [B, T, V]
  # a few float32 [B, chunk, V] buffers of each model at a time
  assert chunked < 10 * b * chunk * v * 4 < f32_full / 3, (chunked, f32_full)


def test_fused_kl_bad_shapes_are_named():
  hidden, weight, _, _, _ = head_inputs(1, 3, 7)
  with pytest.raises(ValueError, match=r"ref_hidden \(1, 2, 6\) must have hidden's \[B, T\]"):
    fused_full_kl_divergence(hidden, weight, hidden[:, :2], weight)
  with pytest.raises(ValueError, match=r"ref_weight \(6, 5\) must have weight's V 7"):
    fused_full_kl_divergence(hidden, weight, hidden, weight[:, :5])
  with pytest.raises(ValueError, match=r"ref_hidden must be \[B, T, D\]"):
    fused_full_kl_divergence(hidden, weight, hidden[0], weight)


# ----------------------------------------------------------------------------
# Properties
# ----------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
  b=st.integers(1, 2),
  t=st.integers(1, 6),
  v=st.integers(2, 12),
  chunk=st.sampled_from([0, 1, 4]),
  scale=st.sampled_from([0.1, 1.0, 10.0]),
  temperature=st.sampled_from([0.5, 1.0, 2.0]),
  seed=st.integers(0, 2**16),
)
def test_properties(b, t, v, chunk, scale, temperature, seed):
  logits, ref, ids, _, _ = make_inputs(b, t, v, seed=seed, scale=scale)
  kl = np.asarray(_kl(logits, ref, temperature, chunk))
  assert np.all(kl >= -1e-6)
  np.testing.assert_allclose(_kl(logits, logits, temperature, chunk), 0.0, atol=1e-6)
  _, ent = logp_ent(logits, ids, temperature, chunk)
  ent = np.asarray(ent)
  assert np.all(ent >= -1e-6) and np.all(ent <= np.log(v) + 1e-5)


# ----------------------------------------------------------------------------
# Argument validation
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
  "kwargs,name",
  [
    ({"temperature": 0.0}, "temperature"),
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": "1"}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"chunk_size": -1}, "chunk_size"),
    ({"chunk_size": 2.5}, "chunk_size"),
  ],
)
def test_bad_static_args(kwargs, name):
  logits, ref, ids, _, _ = make_inputs(1, 4, 5)
  with pytest.raises(ValueError, match=name):
    logps_and_entropy(logits, ids, **kwargs)
  with pytest.raises(ValueError, match=name):
    full_kl_divergence(logits, ref, **kwargs)


def test_bad_shapes():
  logits, ref, ids, _, _ = make_inputs(2, 4, 5)
  with pytest.raises(ValueError, match="logits"):
    logps_and_entropy(logits[0], ids)
  with pytest.raises(ValueError, match="target_ids"):
    logps_and_entropy(logits, ids[0])
  with pytest.raises(ValueError, match="target_ids"):
    logps_and_entropy(logits, ids[:, :3])
  with pytest.raises(ValueError, match="target_ids"):
    logps_and_entropy(logits, ids.astype(np.float32))
  with pytest.raises(ValueError, match="logits"):
    logps_and_entropy(ids[..., None], ids)
  with pytest.raises(ValueError, match="logits"):
    full_kl_divergence(logits[0], ref[0])
  with pytest.raises(ValueError, match="ref_logits"):
    full_kl_divergence(logits, ref[:, :3])
