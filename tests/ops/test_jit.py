"""Every public `tunix_ppo_ext.ops` function under `jax.jit` gives what it gives eagerly
(the learner calls them inside tunix's jitted train step). Python values (modes, sizes,
flags, callables) are closed over, as static values are inside a jitted step."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tunix_ppo_ext import ops

pytestmark = pytest.mark.fast

B, T, V = 4, 6, 11
_rng = np.random.default_rng(0)
LOGP = jnp.asarray(-_rng.exponential(1.0, (B, T)), jnp.float32)
OLD = LOGP + jnp.asarray(_rng.normal(0, 0.3, (B, T)), jnp.float32)
ADV = jnp.asarray(_rng.normal(0, 1, (B, T)), jnp.float32)
MASK = jnp.asarray(np.arange(T)[None, :] < np.array([[6], [3], [1], [0]]), jnp.float32)
VALUES = jnp.asarray(_rng.normal(0, 1, (B, T)), jnp.float32)
LOGITS = jnp.asarray(_rng.normal(0, 2, (B, T, V)), jnp.float32)
REF_LOGITS = LOGITS + jnp.asarray(_rng.normal(0, 0.5, (B, T, V)), jnp.float32)
IDS = jnp.asarray(_rng.integers(0, V, (B, T)), jnp.int32)
HIDDEN = jnp.asarray(_rng.normal(0, 1, (B, T, 5)), jnp.float32)
HEAD = jnp.asarray(_rng.normal(0, 0.5, (5, V)), jnp.float32)
SCORES = jnp.asarray([1.0, 0.0, 0.5, 0.5], jnp.float32)
GROUPS = jnp.asarray([0, 0, 1, 1], jnp.int32)
ANCHORS = jnp.asarray([[0, 1], [0, 2], [3, 3], [0, 1]], jnp.int32)
KEY = jax.random.key(3)
QUERIES = jnp.asarray(_rng.normal(0, 1, (B, T, 4, 3)), jnp.float32)
KEYS, VALS = (jnp.asarray(_rng.normal(0, 1, (B, T, 2, 3)), jnp.float32) for _ in range(2))
SEGMENTS = jnp.asarray([[1, 1, 2, 2, 2, 0], [0, 1, 1, 1, 0, 0], [1, 2, 3, 4, 5, 6], [0] * T])

_SLOTS, _, _K = ops.plan_packing(np.asarray(MASK))  # rows of 6, 3, 1 and 0 real tokens
PACKING = ops.Packing(jnp.asarray(_SLOTS), 1, _K * T)
POSITIONS = jnp.asarray(np.maximum(np.cumsum(np.asarray(MASK), 1) - 1, 0), jnp.int32)

PG = (LOGP, OLD, ADV, MASK)
# name -> (array arguments, Python keyword arguments)
CASES = {
  "aggregate_loss": ((ADV, MASK), {"loss_agg_mode": "seq-mean-token-mean"}),
  "cispo_loss": (PG, {}),
  "clip_cov_loss": ((*PG, KEY), {"clip_cov_ratio": 0.2}),
  "compute_gae_advantages": ((ADV, VALUES, MASK), {"gamma": 0.9, "gae_lambda": 0.8}),
  "compute_grpo_advantages": ((SCORES, GROUPS, MASK), {}),
  "compute_gigpo_advantages": (
    (ADV, MASK, GROUPS, ANCHORS),
    {"gamma_turn": 0.9, "step_weight": 0.5, "norm_by_std": True},
  ),
  "kl_divergence": ((LOGP, OLD), {"estimator": ops.kl_k3, "straight_through": True}),
  "compute_reinforce_plus_plus_advantages": ((ADV, MASK), {"gamma": 0.95}),
  "compute_rloo_advantages": ((SCORES, GROUPS, MASK), {}),
  "compute_turn_gae_advantages": ((ADV, VALUES, MASK), {"gamma_turn": 0.9, "gae_lambda": 0.8}),
  "entropy_from_logits": ((LOGITS,), {"chunk_size": 4}),
  "full_kl_divergence": ((LOGITS, REF_LOGITS), {"temperature": 0.7, "chunk_size": 5}),
  "fused_full_kl_divergence": (
    (HIDDEN, HEAD, HIDDEN[::-1], HEAD * 0.5),
    {"temperature": 0.9, "chunk_size": 4},
  ),
  "fused_logps_and_entropy": ((HIDDEN, HEAD, IDS), {"temperature": 0.9, "chunk_size": 4}),
  "geo_mean_loss": (PG, {}),
  "gpg_loss": (PG, {}),
  "gspo_loss": (PG, {}),
  "informative_groups": ((SCORES, GROUPS), {}),
  "kl_abs": ((LOGP, OLD), {}),
  "kl_cov_loss": (PG, {"kl_cov_ratio": 0.2}),
  "kl_k1": ((LOGP, OLD), {}),
  "kl_k2": ((LOGP, OLD), {}),
  "kl_k3": ((LOGP, OLD), {}),
  "length_adaptive_lambda": ((MASK,), {"alpha": 0.3}),
  "logps_and_entropy": ((LOGITS, IDS), {"temperature": 0.9, "chunk_size": 4}),
  "masked_mean": ((ADV, MASK), {"axis": 1}),
  "masked_sum": ((ADV, MASK), {}),
  "masked_whiten": ((ADV, MASK), {}),
  "normalize_scores": ((SCORES, GROUPS), {"num_segments": 2, "method": "mean_std"}),
  "overlong_penalty": ((jnp.asarray([1, 4, 6, 9]),), {"max_len": 8, "cache_len": 4}),
  "pack": ((LOGITS, PACKING), {}),
  "packed_model_inputs": ((IDS, POSITIONS, MASK, PACKING), {}),
  "unpack": ((jnp.ones((1, _K * T, V)), PACKING), {}),
  "packed_segment_ids": ((jnp.asarray([[2, 3], [6, 1], [0, 1], [0, 0]]),), {"num_tokens": T}),
  "policy_loss": (PG, {"epsilon_c": 3.0, "loss_agg_mode": "seq-mean-token-sum"}),
  "rollout_is_weights": ((LOGP, OLD, MASK), {"level": "sequence"}),
  "rollout_rejection_mask": ((LOGP, OLD, MASK), {}),
  "sapo_loss": (PG, {}),
  "segment_attention": ((QUERIES, KEYS, VALS, SEGMENTS), {"block_size": 4}),
  "segment_ids_from_mask": ((MASK,), {}),
  "top_spread_groups": ((SCORES, GROUPS), {"num_groups": 2, "keep": 1}),
  "value_loss": ((VALUES, ADV, OLD, MASK), {"clip_range_value": 0.2}),
}
# a Python controller object; a host (NumPy) plan
NOT_ARRAY_FUNCTIONS = {"make_kl_controller", "plan_packing"}


def test_every_public_function_has_a_jit_case():
  functions = {
    name
    for name in ops.__all__
    if callable(getattr(ops, name)) and not inspect.isclass(getattr(ops, name))
  }
  assert functions - NOT_ARRAY_FUNCTIONS == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_jit_matches_eager(name):
  fn = getattr(ops, name)
  arrays, kwargs = CASES[name]
  eager = fn(*arrays, **kwargs)
  jitted = jax.jit(lambda *a: fn(*a, **kwargs))(*arrays)
  eager_leaves, tree = jax.tree.flatten(eager)
  jitted_leaves, jitted_tree = jax.tree.flatten(jitted)
  assert tree == jitted_tree
  for e, j in zip(eager_leaves, jitted_leaves, strict=True):
    e, j = np.asarray(e), np.asarray(j)
    assert e.shape == j.shape and e.dtype == j.dtype
    assert np.all(np.isfinite(e[np.isfinite(j)]))  # no NaN where the other is finite
    # XLA may fuse differently under jit on CPU: a few float32 ulps
    np.testing.assert_allclose(j, e, rtol=2e-5, atol=2e-6, equal_nan=True)
