"""Per-token log-probabilities, entropy and full-vocabulary KL from logits.

All functions take logits `[B, T, V]` of any float dtype, divide them by a static
`temperature`, compute in float32 and return float32 `[B, T]` values. Gradients
w.r.t. `logits` come back in the logits' dtype.

With `chunk_size > 0` the work runs over chunks of `chunk_size` positions along
the sequence axis T inside a `jax.custom_vjp`: the forward saves only per-token
float32 residuals (max, log-normalizer, entropy / KL) next to the input logits,
and the backward recomputes each chunk's softmax in float32 and writes that
chunk's gradient straight into the result in the logits' dtype. So neither pass
holds a full `[B, T, V]` float32 temporary. T need not be a multiple of
`chunk_size`: the last chunk is shifted back to end at T (it overlaps the one
before it and recomputes those positions; every result is per-token, so the
overlapping writes are identical). `chunk_size >= T` is a single chunk.
`chunk_size=0` is the plain (autodiff) implementation of the same formulas.

`fused_logps_and_entropy` goes one step further back: from the final hidden states and
the output weights, it computes each chunk's logits inside the custom VJP too, so not
even the model's `[B, T, V]` logits exist (the fused LM head).
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp
from jax import lax

# ----------------------------------------------------------------------------
# Argument validation
# ----------------------------------------------------------------------------


def _check_common(logits: jax.Array, temperature: float, chunk_size: int) -> None:
  """Raises ValueError (naming the argument) for bad static arguments."""
  if (
    isinstance(temperature, bool)
    or not isinstance(temperature, numbers.Real)
    or not temperature > 0
  ):
    raise ValueError(f"temperature must be a Python number > 0, got {temperature!r}")
  if isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral):
    raise ValueError(f"chunk_size must be an int >= 0, got {chunk_size!r}")
  if chunk_size < 0:
    raise ValueError(f"chunk_size must be >= 0, got {chunk_size}")
  if jnp.ndim(logits) != 3:
    raise ValueError(f"logits must have rank 3 [B, T, V], got shape {jnp.shape(logits)}")
  if not jnp.issubdtype(jnp.result_type(logits), jnp.floating):
    raise ValueError(f"logits must be floating point, got {jnp.result_type(logits)}")


# ----------------------------------------------------------------------------
# Per-chunk math (float32). `x` is the tempered float32 logits `[..., V]`.
# ----------------------------------------------------------------------------


def _scaled(logits: jax.Array, temperature: float) -> jax.Array:
  """`logits / temperature` in float32."""
  x = logits.astype(jnp.float32)
  return x if temperature == 1.0 else x / jnp.float32(temperature)


def _normalizer(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """`(m, log_s)` with `m = max(x)` and `log_s = log sum exp(x - m)`, both `[...]`.

  `logsumexp(x) = m + log_s`; `log p = (x - m) - log_s` avoids cancellation.
  """
  m = lax.stop_gradient(jnp.max(x, axis=-1))
  log_s = jnp.log(jnp.sum(jnp.exp(x - m[..., None]), axis=-1))
  return m, log_s


def _log_probs(x: jax.Array, m: jax.Array, log_s: jax.Array) -> jax.Array:
  """Log-softmax `[..., V]` from `x` and its `_normalizer` stats."""
  return (x - m[..., None]) - log_s[..., None]


def _target_logp(x: jax.Array, target_ids: jax.Array, m: jax.Array, log_s: jax.Array) -> jax.Array:
  """`log p(target)` `[...]`: picked logit minus logsumexp."""
  picked = jnp.take_along_axis(x, target_ids[..., None], axis=-1)[..., 0]
  return (picked - m) - log_s


def _entropy(x: jax.Array, m: jax.Array, log_s: jax.Array) -> jax.Array:
  """`H = logsumexp(x) - sum(p * x)`, written with `x - m` so no term is large."""
  z = x - m[..., None]
  p = jnp.exp(z - log_s[..., None])
  return log_s - jnp.sum(p * z, axis=-1)


def _kl(logp: jax.Array, logq: jax.Array) -> jax.Array:
  """`KL(p || q) = sum p (log p - log q)` over the last axis."""
  return jnp.sum(jnp.exp(logp) * (logp - logq), axis=-1)


# ----------------------------------------------------------------------------
# The one chunking helper
# ----------------------------------------------------------------------------


def _scan_seq_chunks(fn: Callable[..., Any], chunk_size: int, args: Any, init: Any) -> Any:
  """`(outs [B, T, ...], acc)`: `fn(chunk_args, fresh, acc) -> (chunk_outs, acc)` over
  `[B, c, ...]` slices (axis 1) of `args`, the per-token outputs assembled into `[B, T, ...]`
  and `acc` (a pytree of arrays, `init`; `()` for none) carried from chunk to chunk.

  `args` is a pytree of arrays `[B, T, ...]` (None leaves allowed); `fn`'s chunk outputs are
  per-token arrays `[B, c, ...]`. Chunks start at `i * c`, the last one clamped to end at T
  (overlapping its predecessor): `fresh` `[c]` is True at the chunk's positions no earlier
  chunk covered, so a sum over positions into `acc` counts each once. Results are written in
  place into preallocated outputs by a `fori_loop`, so no stacked per-chunk copy exists.
  Requires `T >= 1`.

  The inputs ride in the loop carry behind an `optimization_barrier`, which keeps
  XLA from hoisting a whole-array op out of the loop (XLA:CPU, lacking bf16
  dynamic-slice, upcasts the operand to float32; hoisted, that is a full
  `[B, T, V]` float32 temporary; left in the loop it fuses into the slice).
  """
  seq_len = jax.tree.leaves(args)[0].shape[1]
  size = min(chunk_size, seq_len)
  num_chunks = -(-seq_len // size)

  def take(args: Any, start: jax.Array | int) -> Any:
    return jax.tree.map(lambda a: lax.dynamic_slice_in_dim(a, start, size, axis=1), args)

  fresh0 = jnp.ones((size,), jnp.bool_)
  out_shapes = jax.eval_shape(lambda: fn(take(args, 0), fresh0, init)[0])
  outs = jax.tree.map(
    lambda s: jnp.zeros(s.shape[:1] + (seq_len,) + s.shape[2:], s.dtype), out_shapes
  )

  def body(i: jax.Array, carry: Any) -> Any:
    outs, args, acc, i = lax.optimization_barrier((*carry, i))
    start = jnp.minimum(i * size, seq_len - size)
    fresh = (start + jnp.arange(size)) >= i * size  # not covered by the chunk before
    chunk_outs, acc = fn(take(args, start), fresh, acc)
    outs = jax.tree.map(
      lambda o, c: lax.dynamic_update_slice_in_dim(o, c, start, axis=1), outs, chunk_outs
    )
    return outs, args, acc

  outs, _, acc = lax.fori_loop(0, num_chunks, body, (outs, args, init))
  return outs, acc


def _map_seq_chunks(fn: Callable[..., Any], chunk_size: int, *args: Any) -> Any:
  """`fn` applied to `[B, c, ...]` slices (axis 1) of `args`, assembled into `[B, T, ...]`
  (`_scan_seq_chunks` with nothing accumulated)."""
  return _scan_seq_chunks(lambda a, fresh, acc: (fn(*a), acc), chunk_size, args, ())[0]


# ----------------------------------------------------------------------------
# log p(target) and entropy
# ----------------------------------------------------------------------------


def _logp_entropy_stats(
  logits: jax.Array, target_ids: jax.Array, temperature: float, return_entropy: bool
) -> tuple[jax.Array, jax.Array | None, jax.Array, jax.Array]:
  """`(logp, entropy|None, m, log_s)`, all float32 `[B, t]`, for logits `[B, t, V]`."""
  x = _scaled(logits, temperature)
  m, log_s = _normalizer(x)
  logp = _target_logp(x, target_ids, m, log_s)
  return logp, (_entropy(x, m, log_s) if return_entropy else None), m, log_s


def _logp_entropy_grad(
  logits: jax.Array,
  target_ids: jax.Array,
  m: jax.Array,
  log_s: jax.Array,
  ent: jax.Array | None,
  g_logp: jax.Array,
  g_ent: jax.Array | None,
  temperature: float,
) -> jax.Array:
  """VJP w.r.t. logits `[B, t, V]` (logits' dtype), recomputing softmax in float32.

  With x = logits / temperature: d logp / dx = onehot - p, d H / dx = -p (log p + H),
  so d logits = (g_logp onehot - p (g_logp + g_H (log p + H))) / temperature.
  """
  x = _scaled(logits, temperature)
  logp_all = _log_probs(x, m, log_s)
  onehot = lax.broadcasted_iota(target_ids.dtype, x.shape, x.ndim - 1) == target_ids[..., None]
  coef = g_logp[..., None]
  grad = jnp.where(onehot, coef, 0.0)
  if g_ent is not None:
    coef = coef + g_ent[..., None] * (logp_all + ent[..., None])
  grad = grad - jnp.exp(logp_all) * coef
  if temperature != 1.0:
    grad = grad / jnp.float32(temperature)
  return grad.astype(logits.dtype)


def _logps_entropy_fwd(
  logits: jax.Array,
  target_ids: jax.Array,
  temperature: float,
  chunk_size: int,
  return_entropy: bool,
) -> tuple[tuple[jax.Array, jax.Array | None], tuple[Any, ...]]:
  """Chunked forward: `(logp, entropy|None)` and residuals (inputs + per-token stats)."""
  stats = functools.partial(
    _logp_entropy_stats, temperature=temperature, return_entropy=return_entropy
  )
  logp, ent, m, log_s = _map_seq_chunks(stats, chunk_size, logits, target_ids)
  return (logp, ent), (logits, target_ids, m, log_s, ent)


def _logps_entropy_bwd(
  temperature: float,
  chunk_size: int,
  return_entropy: bool,
  res: tuple[Any, ...],
  cts: tuple[jax.Array, jax.Array | None],
) -> tuple[jax.Array, None]:
  """Chunked backward: `_logp_entropy_grad` per chunk; no cotangent for target ids."""
  del return_entropy  # `ent` and the entropy cotangent are None when it is off.
  grad_fn = functools.partial(_logp_entropy_grad, temperature=temperature)
  return _map_seq_chunks(grad_fn, chunk_size, *res, *cts), None


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _logps_entropy_chunked(
  logits: jax.Array,
  target_ids: jax.Array,
  temperature: float,
  chunk_size: int,
  return_entropy: bool,
) -> tuple[jax.Array, jax.Array | None]:
  """Chunked `(logp, entropy|None)` with a memory-lean custom VJP."""
  return _logps_entropy_fwd(logits, target_ids, temperature, chunk_size, return_entropy)[0]


_logps_entropy_chunked.defvjp(_logps_entropy_fwd, _logps_entropy_bwd)


def _check_targets(target_ids: jax.Array, shape: tuple[int, ...], of: str) -> None:
  """Raises ValueError unless `target_ids` is an integer `[B, T]` array of `shape`."""
  if jnp.ndim(target_ids) != 2:
    raise ValueError(f"target_ids must have rank 2 [B, T], got shape {jnp.shape(target_ids)}")
  if tuple(jnp.shape(target_ids)) != tuple(shape):
    raise ValueError(
      f"target_ids shape {jnp.shape(target_ids)} does not match {of} [B, T] {tuple(shape)}"
    )
  if not jnp.issubdtype(jnp.result_type(target_ids), jnp.integer):
    raise ValueError(f"target_ids must be integer, got {jnp.result_type(target_ids)}")


def logps_and_entropy(
  logits: jax.Array,
  target_ids: jax.Array,
  *,
  temperature: float = 1.0,
  chunk_size: int = 0,
  return_entropy: bool = True,
) -> tuple[jax.Array, jax.Array | None]:
  """Per-token `log p(target)` and entropy of `softmax(logits / temperature)`.

  logits `[B, T, V]` (any float dtype), target_ids int `[B, T]`. Returns float32
  `(logps [B, T], entropy [B, T] or None if not return_entropy)`. `chunk_size > 0`
  chunks along T (any T) with a custom VJP; 0 is unchunked. `temperature` is static.

  Args:
    logits: `[B, T, V]` unnormalized logits, any float dtype.
    target_ids: `[B, T]` int token ids in `[0, V)` whose log-probability is read.
    temperature: the sampling temperature the logits are divided by, > 0 (static).
    chunk_size: tokens per chunk along T (less memory); 0 computes all at once.
    return_entropy: also compute the entropy (else `None` is returned in its place).

  Returns:
    `(logps, entropy)`: float32 `[B, T]` log-probabilities (nats, <= 0) and float32
    `[B, T]` entropies (nats), or `None` for the entropy when `return_entropy=False`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> logits = jnp.array([[[0.0, 0.0], [2.0, 0.0]]])
    >>> logps, entropy = ops.logps_and_entropy(logits, jnp.array([[0, 1]]))
    >>> print(np.round(logps, 4), np.round(entropy, 4))
    [[-0.6931 -2.1269]] [[0.6931 0.3653]]
  """
  _check_common(logits, temperature, chunk_size)
  _check_targets(target_ids, jnp.shape(logits)[:2], "logits")
  temperature = float(temperature)
  return_entropy = bool(return_entropy)
  if chunk_size == 0 or logits.shape[1] == 0:
    logp, ent, _, _ = _logp_entropy_stats(logits, target_ids, temperature, return_entropy)
  else:
    logp, ent = _logps_entropy_chunked(
      logits, target_ids, temperature, int(chunk_size), return_entropy
    )
  chex.assert_shape(logp, target_ids.shape)
  if ent is not None:
    chex.assert_shape(ent, target_ids.shape)
  return logp, ent


# ----------------------------------------------------------------------------
# Full-vocabulary KL(pi || pi_ref)
# ----------------------------------------------------------------------------


def _kl_stats(
  logits: jax.Array, ref_logits: jax.Array, temperature: float
) -> tuple[jax.Array, ...]:
  """`(kl, m_p, log_s_p, m_q, log_s_q)`, float32 `[B, t]`, for logits `[B, t, V]`."""
  x, y = _scaled(logits, temperature), _scaled(ref_logits, temperature)
  mx, lsx = _normalizer(x)
  my, lsy = _normalizer(y)
  return _kl(_log_probs(x, mx, lsx), _log_probs(y, my, lsy)), mx, lsx, my, lsy


def _kl_grad(
  logits: jax.Array,
  ref_logits: jax.Array,
  kl: jax.Array,
  mx: jax.Array,
  lsx: jax.Array,
  my: jax.Array,
  lsy: jax.Array,
  g: jax.Array,
  temperature: float,
) -> jax.Array:
  """VJP w.r.t. logits `[B, t, V]` (logits' dtype): g p ((log p - log q) - KL) / temperature."""
  logp = _log_probs(_scaled(logits, temperature), mx, lsx)
  logq = _log_probs(_scaled(ref_logits, temperature), my, lsy)
  grad = jnp.exp(logp) * ((logp - logq) - kl[..., None]) * g[..., None]
  if temperature != 1.0:
    grad = grad / jnp.float32(temperature)
  return grad.astype(logits.dtype)


def _kl_fwd(
  logits: jax.Array, ref_logits: jax.Array, temperature: float, chunk_size: int
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
  """Chunked forward: KL `[B, T]` and residuals (inputs + per-token stats)."""
  stats = functools.partial(_kl_stats, temperature=temperature)
  kl, *norms = _map_seq_chunks(stats, chunk_size, logits, ref_logits)
  return kl, (logits, ref_logits, kl, *norms)


def _kl_bwd(
  temperature: float, chunk_size: int, res: tuple[jax.Array, ...], g: jax.Array
) -> tuple[jax.Array, None]:
  """Chunked backward: `_kl_grad` per chunk; none for `ref_logits`."""
  grad_fn = functools.partial(_kl_grad, temperature=temperature)
  return _map_seq_chunks(grad_fn, chunk_size, *res, g), None


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _kl_chunked(
  logits: jax.Array, ref_logits: jax.Array, temperature: float, chunk_size: int
) -> jax.Array:
  """Chunked KL with a memory-lean custom VJP (no gradient for `ref_logits`)."""
  return _kl_fwd(logits, ref_logits, temperature, chunk_size)[0]


_kl_chunked.defvjp(_kl_fwd, _kl_bwd)


def full_kl_divergence(
  logits: jax.Array,
  ref_logits: jax.Array,
  temperature: float = 1.0,
  chunk_size: int = 0,
) -> jax.Array:
  """Exact per-token `KL(pi || pi_ref)` over the vocabulary, float32 `[B, T]`.

  `pi = softmax(logits / temperature)`, `pi_ref` likewise from `ref_logits` (same
  `[B, T, V]`, held constant: no gradient flows into it). `chunk_size` as in
  `logps_and_entropy`.

  Args:
    logits: `[B, T, V]` logits of the trained policy, any float dtype.
    ref_logits: `[B, T, V]` logits of the reference policy.
    temperature: both logits are divided by it, > 0.
    chunk_size: tokens per chunk along T (less memory); 0 computes all at once.

  Returns:
    float32 `[B, T]`, the exact KL in nats (>= 0).

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> logits = jnp.array([[[0.0, 0.0], [1.0, 0.0]]])
    >>> ref_logits = jnp.zeros((1, 2, 2))
    >>> print(np.round(ops.full_kl_divergence(logits, ref_logits), 4))
    [[0.     0.1109]]
  """
  _check_common(logits, temperature, chunk_size)
  if jnp.shape(ref_logits) != jnp.shape(logits):
    raise ValueError(
      f"ref_logits shape {jnp.shape(ref_logits)} must equal logits shape {jnp.shape(logits)}"
    )
  if not jnp.issubdtype(jnp.result_type(ref_logits), jnp.floating):
    raise ValueError(f"ref_logits must be floating point, got {jnp.result_type(ref_logits)}")
  temperature = float(temperature)
  ref_logits = lax.stop_gradient(ref_logits)
  if chunk_size == 0 or logits.shape[1] == 0:
    kl = _kl_stats(logits, ref_logits, temperature)[0]
  else:
    kl = _kl_chunked(logits, ref_logits, temperature, int(chunk_size))
  chex.assert_shape(kl, logits.shape[:2])
  return kl


# ----------------------------------------------------------------------------
# The fused LM head: log p(target) and entropy from hidden states and output weights
# ----------------------------------------------------------------------------


def _head_logits(hidden: jax.Array, weight: jax.Array) -> jax.Array:
  """float32 logits `[B, t, V]` of hidden states `[B, t, D]` through `weight [D, V]`."""
  return jnp.einsum("btd,dv->btv", hidden, weight, preferred_element_type=jnp.float32)


def _head_fwd(
  hidden: jax.Array,
  weight: jax.Array,
  target_ids: jax.Array,
  temperature: float,
  chunk_size: int,
  return_entropy: bool,
) -> tuple[tuple[jax.Array, jax.Array | None], tuple[Any, ...]]:
  """Chunked forward: one chunk's logits at a time; residuals: inputs + per-token stats."""

  def stats(h: jax.Array, ids: jax.Array) -> tuple[Any, ...]:
    return _logp_entropy_stats(_head_logits(h, weight), ids, temperature, return_entropy)

  logp, ent, m, log_s = _map_seq_chunks(stats, chunk_size, hidden, target_ids)
  return (logp, ent), (hidden, weight, target_ids, m, log_s, ent)


def _head_bwd(
  temperature: float,
  chunk_size: int,
  return_entropy: bool,
  res: tuple[Any, ...],
  cts: tuple[jax.Array, jax.Array | None],
) -> tuple[jax.Array, jax.Array, None]:
  """Chunked backward: each chunk's logits recomputed, their gradient (`_logp_entropy_grad`)
  taken back through the head: `dh = dz W^T` per chunk, `dW = sum_chunks h^T dz`.

  The last chunk is shifted back to end at T (`_scan_seq_chunks`); its positions that the
  chunk before already covered get no share of `dW` (they would be counted twice).
  """
  del return_entropy  # `ent` and its cotangent are None when it is off
  hidden, weight, target_ids, m, log_s, ent = res
  g_logp, g_ent = cts

  def chunk(per_token: tuple[Any, ...], fresh: jax.Array, grad_w: jax.Array) -> Any:
    h, ids, m_c, ls_c, ent_c, gl_c, ge_c = per_token
    dz = _logp_entropy_grad(_head_logits(h, weight), ids, m_c, ls_c, ent_c, gl_c, ge_c, temperature)
    return _through_head(dz, h, weight, fresh, grad_w)

  per_token = (hidden, target_ids, m, log_s, ent, g_logp, g_ent)
  grad_h, grad_w = _scan_head_grads(chunk, chunk_size, per_token, weight)
  return grad_h, grad_w, None


def _through_head(
  dz: jax.Array, h: jax.Array, weight: jax.Array, fresh: jax.Array, grad_w: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """One chunk's logit gradient `dz [B, c, V]` taken back through `logits = h @ weight`:
  `(dh [B, c, D] in h's dtype, grad_w + h^T dz)`, the positions not `fresh` left out of the
  weight's sum (the chunk before covered them)."""
  dh = jnp.einsum("btv,dv->btd", dz, weight, preferred_element_type=jnp.float32)
  dz = jnp.where(fresh[None, :, None], dz, 0.0)
  grad_w = grad_w + jnp.einsum("btd,btv->dv", h, dz, preferred_element_type=jnp.float32)
  return dh.astype(h.dtype), grad_w


def _scan_head_grads(
  chunk: Callable[..., Any], chunk_size: int, per_token: tuple[Any, ...], weight: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """`(d hidden [B, T, D], d weight [D, V] in weight's dtype)` of a head's chunked backward,
  `chunk` returning `_through_head`'s pair; the weight's gradient summed in float32."""
  init = jnp.zeros(weight.shape, jnp.float32)
  grad_h, grad_w = _scan_seq_chunks(chunk, chunk_size, per_token, init)
  return grad_h, grad_w.astype(weight.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _head_chunked(
  hidden: jax.Array,
  weight: jax.Array,
  target_ids: jax.Array,
  temperature: float,
  chunk_size: int,
  return_entropy: bool,
) -> tuple[jax.Array, jax.Array | None]:
  """Fused head `(logp, entropy|None)` whose passes hold one chunk's logits at a time."""
  return _head_fwd(hidden, weight, target_ids, temperature, chunk_size, return_entropy)[0]


_head_chunked.defvjp(_head_fwd, _head_bwd)


def fused_logps_and_entropy(
  hidden: jax.Array,
  weight: jax.Array,
  target_ids: jax.Array,
  *,
  temperature: float = 1.0,
  chunk_size: int = 256,
  return_entropy: bool = True,
) -> tuple[jax.Array, jax.Array | None]:
  """`logps_and_entropy(hidden @ weight, target_ids)` without the `[B, T, V]` logits.

  The LM head fused into the log-probs, as Liger's fused linear cross-entropy and Cut
  Cross-Entropy (Wijmans et al., 2024, "Cut Your Losses in Large-Vocabulary Language
  Models") do for the loss: hidden states `[B, T, D]` (the final norm applied) and the
  output weights `[D, V]` (a tied embedding `[V, D]` is passed as its transpose) go
  through the head `chunk_size` positions at a time inside a `jax.custom_vjp`, so the
  forward and the backward each hold one chunk's float32 logits `[B, chunk, V]`, never
  the whole sequence's. Gradients flow to `hidden` and `weight` (in their dtypes; the
  weight's accumulated in float32). Returns float32 `(logps [B, T], entropy [B, T] or
  None)`, equal to the unfused `logps_and_entropy` of float32 logits `hidden @ weight`.
  `chunk_size=0` is the unfused autodiff path (the reference).

  Args:
    hidden: `[B, T, D]` final hidden states (after the final norm), any float dtype.
    weight: `[D, V]` the LM head's weights.
    target_ids: `[B, T]` int token ids in `[0, V)` whose log-probability is read.
    temperature: the logits are divided by it, > 0.
    chunk_size: positions per chunk through the head; 0 is the unfused path.
    return_entropy: also compute the entropy (else `None` is returned in its place).

  Returns:
    `(logps, entropy)`: float32 `[B, T]` log-probabilities and entropies (nats), the
    entropy `None` when `return_entropy=False`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> hidden = jnp.array([[[1.0, 0.0], [0.0, 1.0]]])  # [B=1, T=2, D=2]
    >>> weight = jnp.array([[2.0, 0.0], [0.0, 0.0]])  # [D=2, V=2]
    >>> logps, entropy = ops.fused_logps_and_entropy(hidden, weight, jnp.array([[0, 1]]))
    >>> print(np.round(logps, 4), np.round(entropy, 4))
    [[-0.1269 -0.6931]] [[0.3653 0.6931]]
  """
  _check_head(hidden, weight)
  _check_common(hidden, temperature, chunk_size)
  _check_targets(target_ids, jnp.shape(hidden)[:2], "hidden")
  if chunk_size == 0 or jnp.shape(hidden)[1] == 0:
    return logps_and_entropy(
      _head_logits(hidden, weight), target_ids, temperature=temperature,
      return_entropy=return_entropy,
    )  # fmt: skip
  return _head_chunked(
    hidden, weight, target_ids, float(temperature), int(chunk_size), bool(return_entropy)
  )


# ----------------------------------------------------------------------------
# The fused exact KL: KL(pi || pi_ref) over the vocabulary from two models' hidden states
# ----------------------------------------------------------------------------


def _head_kl_fwd(
  hidden: jax.Array,
  weight: jax.Array,
  ref_hidden: jax.Array,
  ref_weight: jax.Array,
  temperature: float,
  chunk_size: int,
) -> tuple[jax.Array, tuple[Any, ...]]:
  """Chunked forward: KL `[B, T]`, one chunk of both models' logits at a time; residuals:
  the inputs and both normalizers per token."""

  def stats(h: jax.Array, rh: jax.Array) -> tuple[jax.Array, ...]:
    return _kl_stats(_head_logits(h, weight), _head_logits(rh, ref_weight), temperature)

  kl, *norms = _map_seq_chunks(stats, chunk_size, hidden, ref_hidden)
  return kl, (hidden, weight, ref_hidden, ref_weight, kl, *norms)


def _head_kl_bwd(
  temperature: float, chunk_size: int, res: tuple[Any, ...], g: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Chunked backward: both chunks' logits recomputed, the policy's logit gradient
  (`_kl_grad`) taken back through its head (`_through_head`); the reference gets none."""
  hidden, weight, ref_hidden, ref_weight, kl, mx, lsx, my, lsy = res

  def chunk(per_token: tuple[Any, ...], fresh: jax.Array, grad_w: jax.Array) -> Any:
    h, rh, kl_c, mx_c, lsx_c, my_c, lsy_c, g_c = per_token
    logits, ref_logits = _head_logits(h, weight), _head_logits(rh, ref_weight)
    dz = _kl_grad(logits, ref_logits, kl_c, mx_c, lsx_c, my_c, lsy_c, g_c, temperature)
    return _through_head(dz, h, weight, fresh, grad_w)

  per_token = (hidden, ref_hidden, kl, mx, lsx, my, lsy, g)
  grad_h, grad_w = _scan_head_grads(chunk, chunk_size, per_token, weight)
  return grad_h, grad_w, jnp.zeros_like(ref_hidden), jnp.zeros_like(ref_weight)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _head_kl_chunked(
  hidden: jax.Array,
  weight: jax.Array,
  ref_hidden: jax.Array,
  ref_weight: jax.Array,
  temperature: float,
  chunk_size: int,
) -> jax.Array:
  """Fused exact KL `[B, T]` whose passes hold one chunk of each model's logits."""
  return _head_kl_fwd(hidden, weight, ref_hidden, ref_weight, temperature, chunk_size)[0]


_head_kl_chunked.defvjp(_head_kl_fwd, _head_kl_bwd)


def _check_head(hidden: jax.Array, weight: jax.Array, of: str = "hidden") -> None:
  """`hidden [B, T, D]` and `weight [D, V]`, named in the error."""
  if jnp.ndim(hidden) != 3 or jnp.ndim(weight) != 2:
    raise ValueError(
      f"{of} must be [B, T, D] and its weight [D, V], got {jnp.shape(hidden)} and "
      f"{jnp.shape(weight)}"
    )
  if jnp.shape(weight)[0] != jnp.shape(hidden)[2]:
    raise ValueError(
      f"weight {jnp.shape(weight)} must be [D, V] with D = {of}'s last axis "
      f"{jnp.shape(hidden)[2]} (pass a tied [V, D] embedding transposed)"
    )


def fused_full_kl_divergence(
  hidden: jax.Array,
  weight: jax.Array,
  ref_hidden: jax.Array,
  ref_weight: jax.Array,
  *,
  temperature: float = 1.0,
  chunk_size: int = 256,
) -> jax.Array:
  """`full_kl_divergence(hidden @ weight, ref_hidden @ ref_weight)` without `[B, T, V]` logits.

  The exact per-token `KL(pi || pi_ref) = sum_v pi_v (log pi_v - log pi_ref_v)`, float32
  `[B, T]`, with `pi = softmax(hidden @ weight / temperature)` and `pi_ref` likewise from
  the reference's hidden states `[B, T, D']` and head `[D', V]` (held constant: no gradient
  flows into them). As in `fused_logps_and_entropy`, both heads run `chunk_size` positions
  at a time inside a `jax.custom_vjp`, the backward recomputing each chunk's logits: the
  logits' gradient `pi (log pi - log pi_ref - KL) / temperature` goes back through the
  policy's head to `hidden` and `weight`. `chunk_size=0` is the unfused path (the
  reference).

  Args:
    hidden: `[B, T, D]` the trained policy's final hidden states, any float dtype.
    weight: `[D, V]` the trained policy's LM head.
    ref_hidden: `[B, T, D']` the reference policy's final hidden states.
    ref_weight: `[D', V]` the reference policy's LM head.
    temperature: both logits are divided by it, > 0.
    chunk_size: positions per chunk through the heads; 0 is the unfused path.

  Returns:
    float32 `[B, T]`, the exact KL in nats (>= 0).

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from tunix_ppo_ext import ops
    >>> hidden = jnp.array([[[1.0, 0.0], [0.0, 1.0]]])  # [B=1, T=2, D=2]
    >>> weight = jnp.array([[1.0, 0.0], [0.0, 0.0]])  # [D=2, V=2]
    >>> kl = ops.fused_full_kl_divergence(hidden, weight, hidden, jnp.zeros((2, 2)))
    >>> print(np.round(kl, 4))
    [[0.1109 0.    ]]
  """
  _check_head(hidden, weight)
  _check_head(ref_hidden, ref_weight, "ref_hidden")
  if jnp.shape(ref_hidden)[:2] != jnp.shape(hidden)[:2]:
    raise ValueError(
      f"ref_hidden {jnp.shape(ref_hidden)} must have hidden's [B, T] {jnp.shape(hidden)[:2]}"
    )
  if jnp.shape(ref_weight)[1] != jnp.shape(weight)[1]:
    raise ValueError(
      f"ref_weight {jnp.shape(ref_weight)} must have weight's V {jnp.shape(weight)[1]}"
    )
  _check_common(hidden, temperature, chunk_size)
  ref_hidden, ref_weight = lax.stop_gradient(ref_hidden), lax.stop_gradient(ref_weight)
  if chunk_size == 0 or jnp.shape(hidden)[1] == 0:
    logits, ref_logits = _head_logits(hidden, weight), _head_logits(ref_hidden, ref_weight)
    return full_kl_divergence(logits, ref_logits, temperature)
  return _head_kl_chunked(
    hidden, weight, ref_hidden, ref_weight, float(temperature), int(chunk_size)
  )
