"""The trajectory-source wrappers from Python, without a run config: each against a NumPy
reference of what it promises, stacked, their state route and their argument checks. The
run config's sections build the same classes (tests/run/test_dapo_section.py, test_recipe.py)."""

import numpy as np
import pytest

from tests.helpers.clusters import MetricsRecorder
from tests.helpers.scores import multi_turn_batch
from tunix_ppo_ext.rollout import (
  DynamicSampling,
  FilterGroupsSection,
  FilterSection,
  GroupFilter,
  Mode,
  MultiTurnRollout,
  ObservationsInLoss,
  OverlongBufferSection,
  OverlongPenalty,
  ScoreShaping,
  ShapingSection,
  SourceWrapper,
  ValidationEpisodes,
)

pytestmark = pytest.mark.tunix


class StatefulSource:
  """A source with checkpointed state, as `MultiTurnRollout` has (its sampling state)."""

  def __init__(self, batch):
    self.batch, self.calls = batch, 0

  def __call__(self, learner, training_input, mode):
    self.calls += 1
    return self.batch

  def state_dict(self):
    return {"calls": self.calls}

  def load_state_dict(self, state):
    self.calls = state["calls"]


SCORES = [1.0, 3.0, 2.0, 2.0, 0.0, 4.0]  # three groups of two: spreads 1, 0, 2


def test_score_shaping_normalizes_within_groups_as_numpy_does():
  batch = multi_turn_batch(SCORES)
  source = ScoreShaping(lambda *_: batch, ShapingSection(method="mean_std", eps=1e-6))
  shaped = source(MetricsRecorder(), {}, Mode.TRAIN)
  groups = np.asarray(SCORES).reshape(3, 2)
  mean, std = groups.mean(1, keepdims=True), groups.std(1, keepdims=True)
  expected = ((groups - mean) / (std + 1e-6)).reshape(-1)
  np.testing.assert_allclose(shaped.token_rewards.sum(-1), expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(shaped.token_rewards[:, :2], 0.0)  # on the last agent token


def test_the_group_filter_keeps_the_widest_groups_in_training_only():
  batch = multi_turn_batch(SCORES)
  learner = MetricsRecorder()
  source = GroupFilter(lambda *_: batch, FilterSection(keep_ratio=2 / 3))
  kept = source(learner, {}, Mode.TRAIN)
  # spreads (population std) 1, 0, 2: the two widest are groups 0 and 2
  np.testing.assert_array_equal(kept.loss_mask.any(1), [True, True, False, False, True, True])
  assert learner.metrics["rollout/filter_kept_frac"] == pytest.approx(2 / 3)
  assert learner.metrics["rollout/in_group_std"] == pytest.approx(1.0)
  assert learner.metrics["rollout/kept_in_group_std"] == pytest.approx(1.5)
  assert source(learner, {}, Mode.EVAL) is batch
  reverse = GroupFilter(lambda *_: batch, FilterSection(1 / 3, by="std_rev"))
  reverse = reverse(learner, {}, Mode.TRAIN)
  np.testing.assert_array_equal(reverse.loss_mask.any(1), [False, False, True, True, False, False])
  # the mode as tunix's string value filters as the enum does; anything else is refused
  by_name = source(learner, {}, "train")
  np.testing.assert_array_equal(by_name.loss_mask, kept.loss_mask)
  with pytest.raises(ValueError, match=r"mode 'training' is not one of tunix's modes"):
    source(learner, {}, "training")


def test_stacked_wrappers_compose_in_order_and_keep_the_innermost_state():
  batch = multi_turn_batch([1.0, 1.0, 0.0, 1.0])  # group 0 uninformative, group 1 informative
  inner = StatefulSource(batch)
  learner = MetricsRecorder()
  overlong = OverlongPenalty(inner, 4, OverlongBufferSection(len=2))
  sampled = DynamicSampling(overlong, FilterGroupsSection(max_num_gen_batches=2))
  source = GroupFilter(ScoreShaping(sampled, ShapingSection("batch", "mean")), FilterSection())
  out = source(learner, {"seed": np.array([7, 7, 8, 8])}, Mode.TRAIN)
  # 3 agent tokens of a budget of 4 with a buffer of 2: -(3 - 2) / 2 = -0.5 each; each of
  # the two rounds keeps group 1 (rows 2, 3) and drops group 0, which fills the batch
  assert inner.calls == 2
  assert learner.metrics["rollout/overlong_penalty"] == pytest.approx(-0.5)
  assert learner.metrics["rollout/dynamic_sampling_rounds"] == 2.0
  assert learner.metrics["rollout/dynamic_sampling_masked_frac"] == 0.0
  np.testing.assert_array_equal(out.completion_ids[:, 0], [2, 3, 2, 3])
  # the batch-wide mean of [-0.5, 0.5, -0.5, 0.5] is 0: shaping leaves the penalized scores
  np.testing.assert_allclose(out.token_rewards.sum(-1), [-0.5, 0.5, -0.5, 0.5], atol=1e-6)
  assert out.loss_mask.all()
  assert source.state_dict() == {"calls": 2}
  source.load_state_dict({"calls": 0})
  assert inner.calls == 0
  plain = ScoreShaping(lambda *_: batch, ShapingSection())
  assert not hasattr(plain, "state_dict") and not hasattr(plain, "load_state_dict")


def test_observations_in_loss_does_not_change_the_inner_batch():
  batch = multi_turn_batch([1.0, 0.0])
  batch.loss_mask[:, 0] = 0  # an observation token
  out = ObservationsInLoss(lambda *_: batch)(MetricsRecorder(), {}, Mode.TRAIN)
  np.testing.assert_array_equal(out.loss_mask, batch.attention_mask)
  assert not batch.loss_mask[:, 0].any()


@pytest.mark.parametrize(
  "build, message",
  [
    (lambda s: ShapingSection(method="mean_sd"), r"'shaping.method'='mean_sd' unknown; did"),
    (lambda s: ShapingSection(format_penalty=0.1), r"'shaping.format_penalty'=0.1 must be <= 0"),
    (lambda s: FilterSection(keep_ratio=0.0), r"'filter.keep_ratio'=0.0 is invalid"),
    (lambda s: FilterSection(0.5, by="spread"), r"'filter.by'='spread' unknown"),
    (
      lambda s: OverlongPenalty(s, 4, OverlongBufferSection(len=5)),
      r"'dapo.overlong_buffer.len'=5 exceeds the budget of 4 agent tokens: OverlongPenalty's "
      r"budget$",
    ),
    (
      lambda s: FilterGroupsSection(max_num_gen_batches=0),
      r"'dapo.filter_groups.max_num_gen_batches'=0 is invalid",
    ),
    (lambda s: FilterGroupsSection(metric="reward"), r"'dapo.filter_groups.metric'='reward' unk"),
    (lambda s: SourceWrapper(None), r"SourceWrapper: the wrapped source None is not callable"),
    (
      lambda s: OverlongPenalty(MultiTurnRollout, 8, OverlongBufferSection(len=4)),
      r"OverlongPenalty: the wrapped source MultiTurnRollout is a class, not a source: pass an "
      r"instance, e.g. MultiTurnRollout\(\.\.\.\)",
    ),
    (
      lambda s: ValidationEpisodes(s, evaluation=None),
      r"ValidationEpisodes: evaluation None is not callable",
    ),
  ],
)
def test_bad_arguments_are_refused_naming_them(build, message):
  with pytest.raises((ValueError, TypeError), match=message):
    build(lambda *_: None)
