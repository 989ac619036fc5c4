"""GiGPO end to end: `ppo.advantage_estimator=gigpo` trains on every built-in multi-turn
environment in one mixed run, logs its step groups and, with `metrics.shadow_estimators`,
the shadows' metrics; its keys refuse nonsense."""

import math

import pytest

from tests.helpers.runs import SMOKE
from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.metrics.sinks import read_jsonl
from tunix_ppo_ext._src.run import job
from tunix_ppo_ext._src.run.run_config import load_resolved, load_run_config

pytestmark = pytest.mark.tunix

ENVS = ("memory", "guess", "sokoban", "frozenlake", "stash", "countdown")
KWARGS = {"guess": ", kwargs: {max_turns: 3}", "sokoban": ", kwargs: {max_steps: 3}"}
EVERY_ENV = [
  "train.steps=2",
  f"train.batch_size={2 * len(ENVS)}",
  "ppo.num_generations=2",
  "ppo.advantage_estimator=gigpo",
  "ppo.gigpo_step_weight=0.5",
  "ppo.entropy_coef=0.0",
  "ppo.kl_penalty=none",
  "ppo.whiten_advantages=false",
  "metrics.shadow_estimators=[grpo, rloo]",
  "model.alphabet=null",  # letters, digits, punctuation: every environment's replies
  "train.max_prompt_length=160",
  "env.max_turns=3",
  "env.max_tokens_per_turn=3",
  "env.max_completion_len=200",
  "train.eval_every=100",
  "envs=[" + ", ".join(f"{{name: {name}, groups: 1{KWARGS.get(name, '')}}}" for name in ENVS) + "]",
]


def test_gigpo_trains_on_every_built_in_environment(tmp_path):
  resolved = load_resolved(str(SMOKE), [f"output_dir={tmp_path}", "wandb=disabled", *EVERY_ENV])
  job.train(resolved)
  rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["step"] > 0]
  assert [r["step"] for r in rows] == [1, 2]
  for row in rows:
    # the first turn of every group is one state (its episodes share the first observation);
    # a step group never spans two episode groups (of 2 episodes here)
    assert 1.0 < row["actor/gigpo_step_group_size"] <= 2.0
    assert 0.0 <= row["actor/gigpo_step_singleton_frac"] < 1.0
    assert all(math.isfinite(v) for v in row.values() if isinstance(v, float))
    for name in ENVS:
      assert f"train/env/{name}/episode_return" in row
    for name in ("grpo", "rloo", "gigpo"):  # the shadows, and the run's own gradient beside
      assert -1.0 <= row[f"shadow/{name}/grad_cosine"] <= 1.0
    assert row["shadow/grpo/advantage_noise"] == pytest.approx(row["shadow/rloo/advantage_noise"])
    assert row["timing_s/shadow"] > 0.0


@pytest.mark.parametrize(
  "override, message",
  [
    ("ppo.gigpo_step_weight=-1", r"ppo.gigpo_step_weight.*-1"),
    ("ppo.gigpo_step_weight=nan", r"ppo.gigpo_step_weight"),
    ("ppo.gigpo_step_weight=[1]", r"ppo.gigpo_step_weight"),
    ("ppo.gigpo_norm_by_std=maybe", r"ppo.gigpo_norm_by_std"),
    ("ppo.advantage_estimator=gipgo", r"did you mean 'gigpo'"),
    ("metrics.shadow_estimators=[gae]", r"'gae' needs a critic's values"),
    ("ppo.num_generations=1", r"at least 2 with advantage_estimator='gigpo'"),
  ],
)
def test_bad_gigpo_keys_are_refused_in_one_line(override, message):
  with pytest.raises(ConfigError, match=message) as err:
    gigpo = ["ppo.advantage_estimator=gigpo", "ppo.num_generations=2"]
    load_run_config(str(SMOKE), [*gigpo, override])
  assert "\n" not in str(err.value)


def test_a_group_shadow_needs_groups():
  with pytest.raises(ConfigError, match=r"'rloo' needs ppo.num_generations at least 2"):
    load_run_config(str(SMOKE), ["ppo.num_generations=1", "metrics.shadow_estimators=[rloo]"])


def test_gigpo_needs_groups():
  with pytest.raises(ConfigError, match=r"at least 2 with advantage_estimator='gigpo'"):
    load_run_config(str(SMOKE), ["ppo.advantage_estimator=gigpo", "ppo.num_generations=1"])
