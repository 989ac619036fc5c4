"""DAPO's overlong penalty and dynamic-sampling filter against NumPy references."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.scores import np_overlong
from tunix_ppo_ext._src.ops import overlong as dapo

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("max_len, cache, factor", [(16, 4, 1.0), (10, 10, 0.5), (8, 1, 2.0)])
def test_overlong_penalty_matches_the_paper(max_len, cache, factor):
  lengths = np.arange(0, max_len + 3)
  got = np.asarray(dapo.overlong_penalty(lengths, max_len, cache, factor))
  expected = [np_overlong(n, max_len, cache, factor) for n in lengths]
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_overlong_penalty_refuses_a_bad_cache():
  with pytest.raises(ValueError, match="cache_len must be in"):
    dapo.overlong_penalty(np.array([3]), 8, 9)


@settings(max_examples=20)
@given(
  groups=st.lists(
    st.lists(st.sampled_from([0.0, 0.5, 1.0, -1e9]), min_size=1, max_size=4), min_size=1, max_size=5
  )
)
def test_informative_groups_keeps_groups_with_different_scores(groups):
  groups = groups + [[7.0]] * (20 - sum(map(len, groups)))  # one shape: one compilation
  scores = np.array([s for g in groups for s in g], np.float32)
  ids = np.array([i for i, g in enumerate(groups) for _ in g])
  expected = np.array([len(g) == 1 or len(set(g)) > 1 for g in groups for _ in g])
  np.testing.assert_array_equal(np.asarray(dapo.informative_groups(scores, ids)), expected)
