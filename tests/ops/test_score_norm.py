"""Score normalization before the estimator against a float64 NumPy reference written from
the formulas (per-segment loops), on awkward inputs: groups of one, constant groups,
negative scores, bfloat16, scores of 1e20."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tests.helpers.numeric import flush_subnormals
from tests.helpers.scores import EPS, ref_normalize
from tunix_ppo_ext._src.ops.score_norm import (
  SCORE_NORMALIZATIONS,
  normalize_scores,
  top_spread_groups,
)

pytestmark = pytest.mark.fast

B = 8


CASES = {
  "groups_of_four": (np.array([1.0, 0, 0, 0, 0.5, 0.5, -2, 4]), np.repeat(np.arange(2), 4)),
  "groups_of_one": (np.array([3.0, -1, 0, 7, 2, 2, 5, -5]), np.arange(8)),
  "constant_group": (np.array([0.25] * 4 + [1.0, 0, 1, 0]), np.repeat(np.arange(2), 4)),
  "one_batch_segment": (np.linspace(-3, 5, 8), np.zeros(8, int)),
  "huge_scores": (np.array([1e20, -1e20, 3e19, 0, 1, 2, 3, 4]), np.repeat(np.arange(2), 4)),
  "outlier_clipped": (np.array([100.0, 0, 0, 0, 0, 0, 0, 0]), np.zeros(8, int)),
}


@pytest.mark.parametrize("method", SCORE_NORMALIZATIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_normalization_matches_the_reference(method, case):
  x, ids = CASES[case]
  got = normalize_scores(jnp.asarray(x, jnp.float32), jnp.asarray(ids), B, method, EPS)
  expected = ref_normalize(np.asarray(x, np.float32), ids, method)
  assert got.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(got)))
  scale = max(1.0, float(np.max(np.abs(expected))))
  np.testing.assert_allclose(
    flush_subnormals(got), flush_subnormals(expected), rtol=1e-5, atol=1e-5 * scale
  )


def test_bfloat16_scores_are_normalized_in_float32():
  x = jnp.asarray([0.5, 1.5, -1.0, 2.0], jnp.bfloat16)
  got = normalize_scores(x, jnp.zeros(4, int), 1, "mean_std")
  expected = ref_normalize(np.asarray(x.astype(jnp.float32)), np.zeros(4, int), "mean_std")
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)


@settings(max_examples=30)
@given(
  x=hnp.arrays(np.float32, B, elements=st.floats(-1e3, 1e3, width=32)),
  group=st.sampled_from([1, 2, 4, 8]),
  method=st.sampled_from(SCORE_NORMALIZATIONS),
)
def test_random_scores_match_the_reference(x, group, method):
  ids = np.arange(B) // group
  got = normalize_scores(jnp.asarray(x), jnp.asarray(ids), B, method, EPS)
  expected = ref_normalize(x, ids, method)
  # a spread near eps divides by ~eps: compare relative to the result's size
  scale = max(1.0, float(np.max(np.abs(expected))))
  np.testing.assert_allclose(
    flush_subnormals(got), flush_subnormals(expected), rtol=2e-4, atol=2e-4 * scale
  )


def test_unknown_method_names_the_choices():
  with pytest.raises(ValueError, match=r"'zscore' unknown \(valid: \('identity'"):
    normalize_scores(jnp.zeros(2), jnp.zeros(2, int), 1, "zscore")


def ref_top_spread(x, ids, keep, reverse):
  """Groups ranked by population std (largest first; `reverse`: smallest), ties by id."""
  groups = sorted(set(ids.tolist()))
  std = {g: float(np.std(np.asarray(x, np.float64)[ids == g])) for g in groups}
  ranked = sorted(groups, key=lambda g: ((std[g] if reverse else -std[g]), g))
  chosen = set(ranked[:keep])
  return np.array([i in chosen for i in ids]), np.array([std[g] for g in groups])


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("keep", [1, 2, 3, 4])
def test_top_spread_groups_match_the_reference(keep, reverse):
  # 4 groups of 2: spreads 0.5, 0 (constant), 3 (negative scores), 0 (tie with group 1)
  x = np.array([0.0, 1.0, 0.25, 0.25, -4.0, 2.0, 7.0, 7.0], np.float32)
  ids = np.repeat(np.arange(4), 2)
  kept, std = top_spread_groups(jnp.asarray(x), jnp.asarray(ids), 4, keep, reverse)
  expected_kept, expected_std = ref_top_spread(x, ids, keep, reverse)
  np.testing.assert_allclose(np.asarray(std), expected_std, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(np.asarray(kept), expected_kept)
  assert np.asarray(kept).sum() == 2 * keep
