"""Mixed batches: which environment each group plays (`spread_env_ids`) and the `env` key
of a training input (`episode_batches`, `episode_env_ids`)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tunix_ppo_ext._src.data.trajectory import episode_batches, episode_env_ids, spread_env_ids

pytestmark = pytest.mark.fast


def test_environments_are_spread_through_the_batch():
  np.testing.assert_array_equal(spread_env_ids([2, 2]), [0, 1, 0, 1])
  np.testing.assert_array_equal(spread_env_ids([3, 1]), [0, 0, 1, 0])
  np.testing.assert_array_equal(spread_env_ids([4]), [0, 0, 0, 0])
  with pytest.raises(ValueError, match="at least one group"):
    spread_env_ids([2, 0])


@given(st.lists(st.integers(1, 12), min_size=1, max_size=5), st.integers(1, 6))
def test_every_slice_holds_each_environment_in_proportion(groups, parts):
  ids = spread_env_ids(groups)
  assert np.bincount(ids, minlength=len(groups)).tolist() == groups
  total = sum(groups)
  if total % parts == 0 and all(g % parts == 0 for g in groups):  # proportions divide
    for chunk in ids.reshape(parts, -1):
      assert np.bincount(chunk, minlength=len(groups)).tolist() == [g // parts for g in groups]


def test_the_env_key_travels_with_each_row():
  batch = next(episode_batches(1, 4, seed=2, env_ids=spread_env_ids([1, 3])))
  np.testing.assert_array_equal(batch["env"], [1, 0, 1, 1])
  repeated = {k: np.repeat(v, 2, axis=0) for k, v in batch.items()}  # what tunix does
  np.testing.assert_array_equal(episode_env_ids(repeated, 2), [1, 1, 0, 0, 1, 1, 1, 1])
  assert "env" not in next(episode_batches(1, 4, seed=2))
  np.testing.assert_array_equal(episode_env_ids(next(episode_batches(1, 3)), 1), [0, 0, 0])
  with pytest.raises(ValueError, match=r"'env' must hold one index in \[0, 1\) .* e.g. 1"):
    episode_env_ids(batch, 1)
