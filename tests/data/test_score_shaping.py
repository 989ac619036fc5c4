"""Score normalization on trajectory batches: the segments of each grouping, and the
normalized score landing on the last agent token with every turn reward kept; the format
penalty on each malformed turn's token, after it."""

import numpy as np
import pytest

from tests.helpers.scores import batch, ref_normalize
from tunix_ppo_ext._src.checks import whole_share
from tunix_ppo_ext._src.data.score_shaping import (
  filter_groups,
  normalize_batch_scores,
  penalize_malformed_turns,
  segment_ids,
)
from tunix_ppo_ext._src.data.trajectory import MultiTurnBatch, TrajectoryBatch

pytestmark = pytest.mark.fast


def test_segments_of_each_grouping():
  b = batch()
  np.testing.assert_array_equal(segment_ids(b, "group"), [0, 0, 1, 1, 2, 2])
  np.testing.assert_array_equal(segment_ids(b, "batch"), [0] * 6)
  np.testing.assert_array_equal(segment_ids(b, "state"), [0, 0, 1, 1, 0, 0])
  with pytest.raises(ValueError, match="'episode' unknown"):
    segment_ids(b, "episode")


@pytest.mark.parametrize("grouping", ["group", "batch", "state"])
@pytest.mark.parametrize("method", ["mean", "mean_std", "asym_clip"])
def test_normalized_score_sits_on_the_last_agent_token(grouping, method):
  b = batch()
  shaped = normalize_batch_scores(b, grouping, method)
  scores = b.token_rewards.sum(-1)
  expected = ref_normalize(scores, segment_ids(b, grouping), method)
  expected[3] = scores[3]  # no agent token: nowhere to put a change
  np.testing.assert_allclose(shaped.token_rewards.sum(-1), expected, rtol=1e-5, atol=1e-5)
  last = np.array([3, 4, 2, 0, 0, 4])
  changed = shaped.token_rewards != b.token_rewards
  for row in range(6):  # only the last agent token of a row may change
    assert set(np.flatnonzero(changed[row])) <= {last[row]}, row
  assert normalize_batch_scores(b, grouping, "identity") is b


def test_filtering_keeps_the_groups_with_the_largest_spread():
  b = batch()  # group scores: [1.25, -2], [0.5, 0], [3, 2] -> std 1.625, 0.25, 0.5
  filtered, stats = filter_groups(b, 1 / 3)
  kept_rows = filtered.loss_mask.any(1)
  np.testing.assert_array_equal(kept_rows, [True, True, False, False, False, False])
  np.testing.assert_array_equal(filtered.loss_mask[:2], b.loss_mask[:2])
  assert stats["kept_frac"] == pytest.approx(1 / 3)
  assert stats["in_group_std"] == pytest.approx((1.625 + 0.25 + 0.5) / 3)
  assert stats["kept_in_group_std"] == pytest.approx(1.625)
  reverse, _ = filter_groups(b, 1 / 3, reverse=True)
  np.testing.assert_array_equal(reverse.loss_mask.any(1), [False, False, True, False, False, False])
  same, stats = filter_groups(b, 1.0)
  assert same is b and stats["kept_frac"] == 1.0
  with pytest.raises(ValueError, match=r"keep_ratio=0.5 of 3 groups is 1.5 groups"):
    filter_groups(b, 0.5)


def test_a_ratio_whole_up_to_float_rounding_keeps_that_many_groups():
  assert 0.28 * 50 != 14 and whole_share(0.28, 50) == 14  # 14.000000000000002
  assert whole_share(0.3, 8) is None and whole_share(1 / 3, 3) == 1
  ones = np.ones((100, 1), int)
  many = TrajectoryBatch(  # 50 groups of 2 one-token episodes
    prompt_ids=ones,
    completion_ids=ones,
    attention_mask=ones,
    loss_mask=ones,
    token_rewards=np.random.default_rng(0).normal(size=(100, 1)).astype(np.float32),
    group_ids=np.repeat(np.arange(50), 2),
  )
  filtered, stats = filter_groups(many, 0.28)
  assert filtered.loss_mask.any(1).sum() == 28 and stats["kept_frac"] == pytest.approx(0.28)


def ref_penalize(rewards: np.ndarray, malformed: np.ndarray, penalty: float) -> np.ndarray:
  """Loop reference: every malformed turn counted on a token takes `penalty` there."""
  out = np.array(rewards, np.float64)
  for row, col in np.argwhere(malformed > 0):
    for _ in range(int(malformed[row, col])):
      out[row, col] += penalty
  return out


def test_format_penalty_lands_on_each_malformed_turn_after_normalization():
  b = batch()
  malformed = np.zeros((6, 5), np.int32)
  malformed[0, 1] = malformed[0, 3] = 1  # both turns malformed
  malformed[1, 4] = 2  # two turns whose rewards were moved to one token by a cut
  malformed[4, 0] = 1
  mtb = MultiTurnBatch(**vars(b), malformed_turns=malformed)
  mtb.validate()
  normalized = normalize_batch_scores(mtb, "group", "mean_std")
  shaped, stats = penalize_malformed_turns(normalized, -0.1)
  expected = ref_penalize(normalized.token_rewards, malformed, -0.1)
  np.testing.assert_allclose(shaped.token_rewards, expected, rtol=1e-6, atol=1e-7)
  assert stats["malformed_turns"] == pytest.approx(5 / 6)
  assert stats["format_penalty"] == pytest.approx(-0.1 * 5 / 6)
  # a group-wide penalty survives mean_std (it comes after the normalization)
  assert shaped.token_rewards[0].sum() - normalized.token_rewards[0].sum() == pytest.approx(-0.2)
  huge, _ = penalize_malformed_turns(MultiTurnBatch(**vars(b), malformed_turns=malformed), -1e30)
  np.testing.assert_allclose(huge.token_rewards, ref_penalize(b.token_rewards, malformed, -1e30))
  assert penalize_malformed_turns(b, -0.1) == (b, {})  # no counts: nothing to do
  same, stats = penalize_malformed_turns(mtb, 0.0)
  assert same is mtb and stats["format_penalty"] == 0.0
  with pytest.raises(ValueError, match="malformed_turns shape"):
    MultiTurnBatch(**vars(b), malformed_turns=malformed[:, :3]).validate()
