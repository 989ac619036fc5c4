"""Shadow estimators (`ppo.shadow_step`): the checks of `metrics.shadow_estimators`, the
halves, and each estimator's advantages as the estimator itself gives them."""

from __future__ import annotations

import numpy as np
import pytest

from tunix_ppo_ext import PpoExtConfig
from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.ops.advantages import compute_grpo_advantages, compute_rloo_advantages
from tunix_ppo_ext._src.ppo import shadow_step

pytestmark = pytest.mark.fast

KEY = "config key 'metrics.shadow_estimators'"


@pytest.mark.parametrize(
  "names, has_critic, message",
  [
    (["grpo", "gpro"], True, r"'gpro' is not an advantage estimator"),
    (["gae"], False, r"'gae' needs a critic's values; this run has none"),
    (["rloo", "rloo"], True, r"names an estimator twice"),
    ("grpo", True, r"must be a list of advantage estimators"),
    ([3], True, r"3 is not an advantage estimator"),
  ],
)
def test_bad_shadow_estimators_are_refused_in_one_line(names, has_critic, message):
  with pytest.raises(ConfigError, match=message) as err:
    shadow_step.check_shadow_estimators(names, has_critic, KEY)
  assert str(err.value).startswith(KEY) and "\n" not in str(err.value)


def test_gae_is_a_shadow_where_the_run_has_a_critic():
  assert shadow_step.check_shadow_estimators(["gae", "grpo"], True, KEY) == ("gae", "grpo")


def test_the_halves_split_by_groups():
  np.testing.assert_array_equal(
    shadow_step.halves(np.array([4, 4, 9, 9, 2, 2, 7, 7])), [1, 1, 0, 0, 1, 1, 0, 0]
  )
  assert shadow_step.halves(np.array([3, 3])).all()  # one group: no second half


def test_shadow_advantages_are_the_estimators_own():
  rng = np.random.default_rng(0)
  mask = np.ones((4, 5), np.float32)
  rewards = rng.normal(size=(4, 5)).astype(np.float32)
  groups = np.array([0, 0, 1, 1])
  config = PpoExtConfig(advantage_estimator="grpo", num_generations=2, norm_adv_by_std=True)
  terms = (rewards, np.zeros_like(rewards), mask, groups)
  found, metrics = shadow_step.shadow_advantages(config, ["grpo", "rloo"], terms)
  scores = rewards.sum(-1)
  np.testing.assert_allclose(found["grpo"], compute_grpo_advantages(scores, groups, mask), 1e-6)
  np.testing.assert_allclose(found["rloo"], compute_rloo_advantages(scores, groups, mask), 1e-6)
  # on one scale: GRPO's raw advantages over (n-1)/n are RLOO's
  grpo, rloo = metrics["shadow/grpo/advantage_noise"], metrics["shadow/rloo/advantage_noise"]
  assert grpo == pytest.approx(rloo, rel=1e-5)
