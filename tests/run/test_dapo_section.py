"""The run config's `dapo` section: each key's error, the agent-token budget, and the source
wrapper (penalty and rounds on training batches, evaluation untouched). The CLI run with
both pieces on is `tests/tunix/learner/test_verl_loss_fns.py`
(`test_cli_trains_with_the_registered_losses`).
"""

import numpy as np
import pytest

from tests.helpers.clusters import MetricsRecorder
from tests.helpers.runs import SMOKE
from tests.helpers.scores import multi_turn_batch, np_overlong
from tunix_ppo_ext._src.run.dapo_section import agent_token_budget, dapo_source
from tunix_ppo_ext._src.run.run_config import episode_budget, load_run_config
from tunix_ppo_ext._src.tunix.rollout.multi_turn import Mode

pytestmark = pytest.mark.tunix

ON = ["dapo.overlong_buffer.enable=true", "dapo.filter_groups.enable=true"]


@pytest.mark.parametrize(
  "overrides, message",
  [
    (["dapo.overlong_buffer.len=0"], r"'dapo.overlong_buffer.len'=0 is invalid"),
    (
      [*ON, "ppo.num_generations=2", "dapo.overlong_buffer.len=9"],
      r"'dapo.overlong_buffer.len'=9 exceeds the budget of 8 agent tokens: min\(env",
    ),
    (["dapo.overlong_buffer.penalty_factor=-1"], r"'dapo.overlong_buffer.penalty_factor'=-1.0"),
    (["dapo.overlong_buffer.lenght=3"], r"'dapo.overlong_buffer.lenght'; did you mean 'len'"),
    (["dapo.filter_groups.metric=seq_rewards"], r"'seq_rewards' unknown; did you mean 'seq_rew"),
    (["dapo.filter_groups.max_num_gen_batches=0"], r"'dapo.filter_groups.max_num_gen_batches'=0"),
    (["dapo.filter_groups.enable=true"], r"'dapo.filter_groups.enable'=True needs groups"),
    (["dapo.filter_group.enable=true"], r"'dapo.filter_group'; did you mean 'filter_groups'"),
  ],
)
def test_bad_dapo_settings_name_the_key(overrides, message):
  with pytest.raises(ValueError, match=message):
    load_run_config(str(SMOKE), overrides)


def test_the_budget_is_the_most_agent_tokens_an_episode_holds():
  assert agent_token_budget(16, 4, 2) == 8  # turn-limited: 4 turns of at most 2 tokens
  assert agent_token_budget(5, 4, 2) == 5  # cut at the completion width
  assert agent_token_budget(16, 1, 10) == 10  # single-turn: the response budget
  run = load_run_config(str(SMOKE), [*ON, "ppo.num_generations=2", "dapo.overlong_buffer.len=8"])
  assert episode_budget(run) == 8 and run.dapo.overlong_buffer.len == 8


def test_the_wrapper_shapes_training_batches_and_leaves_evaluation_alone():
  run = load_run_config(str(SMOKE), [*ON, "ppo.num_generations=2", "dapo.overlong_buffer.len=2"])
  batch = multi_turn_batch([1.0, 1.0, 0.0, 0.0])  # 3 agent tokens each; both groups equal
  seen = []

  def source(learner, training_input, mode):
    seen.append((int(training_input["seed"][0]), mode))
    return batch

  wrapped = dapo_source(source, run.dapo, budget=4)
  seeds = np.array([5, 5, 6, 6])
  learner = MetricsRecorder()
  assert wrapped(learner, {"seed": seeds}, Mode.EVAL) is batch and not learner.metrics
  trained = wrapped(learner, {"seed": seeds}, Mode.TRAIN)
  penalty = np_overlong(3, 4, 2, 1.0)  # -0.5: every group still equal, so 4 rounds
  np.testing.assert_allclose(trained.token_rewards.sum(-1), [1 + penalty] * 2 + [penalty] * 2)
  rounds = [s for s, mode in seen if mode == Mode.TRAIN]
  assert rounds[0] == 5 and len(set(rounds)) == 4  # each later round plays new episodes
  assert learner.metrics["rollout/dynamic_sampling_rounds"] == 4.0
  assert learner.modes["rollout/dynamic_sampling_rounds"] == Mode.TRAIN
  assert learner.metrics["rollout/dynamic_sampling_masked_frac"] == 1.0
  assert learner.metrics["rollout/overlong_penalty"] == pytest.approx(penalty)
  assert not trained.loss_mask.any()  # nothing informative: nothing trains
  assert dapo_source(source, load_run_config(str(SMOKE)).dapo, budget=4) is source
