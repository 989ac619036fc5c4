"""Each new field of the policy-loss toolbox and rollout correction: one clear line naming it."""

import pytest

from tunix_ppo_ext import PpoExtConfig
from tunix_ppo_ext._src.run.run_config import load_resolved, load_run_config

pytestmark = pytest.mark.tunix


@pytest.mark.parametrize(
  "fields, message",
  [
    ({"tau_pos": 0.0}, r"PpoExtConfig.tau_pos=0.0 is invalid: must be a finite number in \(0.0"),
    ({"tau_neg": float("nan")}, r"PpoExtConfig.tau_neg=nan is invalid"),
    ({"clip_cov_ratio": 1.5}, r"PpoExtConfig.clip_cov_ratio=1.5 is invalid: .* \(0.0, 1.0\]"),
    ({"kl_cov_ratio": 0}, r"PpoExtConfig.kl_cov_ratio=0 is invalid"),
    ({"ppo_kl_coef": -0.1}, r"PpoExtConfig.ppo_kl_coef=-0.1 is invalid"),
    ({"clip_cov_lb": 2.0, "clip_cov_ub": 1.0}, r"PpoExtConfig.clip_cov_ub=1.0 is invalid"),
    ({"rollout_is": "tokens"}, r"PpoExtConfig.rollout_is='tokens' .*did you mean 'token'"),
    ({"rollout_is_threshold": -2}, r"PpoExtConfig.rollout_is_threshold=-2 is invalid"),
    ({"rollout_rs": "seq_mean"}, r"PpoExtConfig.rollout_rs='seq_mean' .*did you mean"),
    ({"rollout_rs_threshold": "2"}, r"PpoExtConfig.rollout_rs_threshold='2' is invalid"),
    (
      {"rollout_rs": "token_k3", "rollout_rs_threshold_lower": 0.5},
      r"rollout_rs_threshold_lower=0.5 is invalid with rollout_rs='token_k3'.*upper threshold",
    ),
    (
      {"rollout_rs": "token_k1", "rollout_rs_threshold": 2.0, "rollout_rs_threshold_lower": 3.0},
      r"rollout_rs_threshold_lower=3.0 is invalid .*lower < upper",
    ),
    ({"policy_loss_fn": "cipso"}, r"PpoExtConfig.policy_loss_fn='cipso' .*did you mean 'cispo'"),
  ],
)
def test_bad_toolbox_field_names_itself(fields, message):
  with pytest.raises(ValueError, match=message):
    PpoExtConfig(**fields)


def test_run_config_passes_the_fields_and_refuses_typos():
  config = load_resolved(None, ["ppo.policy_loss_fn=clip_cov", "ppo.clip_cov_ratio=0.01"]).ppo
  assert config.policy_loss_fn == "clip_cov" and config.clip_cov_ratio == 0.01
  with pytest.raises(ValueError, match="'ppo.rollout_is_treshold'; did you mean"):
    load_run_config(None, ["ppo.rollout_is_treshold=2"])
