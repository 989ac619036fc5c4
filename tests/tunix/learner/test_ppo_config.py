"""PpoExtConfig validation and registration into tunix's function registry."""

import dataclasses
import re
import subprocess
import sys
import typing

import pytest
from tunix.rl import algorithm_config, function_registry
from tunix.rl.ppo import ppo_learner

from tunix_ppo_ext import PpoExtConfig
from tunix_ppo_ext._src.config import ppo_section
from tunix_ppo_ext._src.tunix.learner import loss_fns as tunix_losses

# tunix_facing: also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.tunix, pytest.mark.tunix_facing]


def test_defaults_mean_tunix_ppo_config_behaviour():
  ours, theirs = PpoExtConfig(), ppo_learner.PPOConfig()
  for field in dataclasses.fields(ppo_learner.PPOConfig):
    if field.name in ("policy_loss_fn", "value_loss_fn", "entropy_coef"):
      continue
    assert getattr(ours, field.name) == getattr(theirs, field.name), field.name
  assert ours.entropy_coef == 0.0 and theirs.entropy_coef is None
  assert ours.kl_penalty == "reward" and ours.kl_coef == theirs.beta
  assert isinstance(ours, ppo_learner.PPOConfig)


def test_accepts_every_knob():
  config = PpoExtConfig(
    kl_method="k3+",
    kl_clamp_value=10.0,
    kl_penalty="loss",
    kl_loss_coef=0.1,
    kl_ctrl="adaptive",
    kl_target=0.05,
    kl_horizon=500,
    entropy_coef=0.01,
    epsilon_low=0.1,
    epsilon_high=0.28,
    epsilon_c=3.0,
    loss_agg_mode="sequence-mean-token-mean",
    value_loss_agg_mode="seq-mean-token-sum",
    advantage_estimator="gae",  # critic warm-up needs a critic (refused with group estimators)
    norm_adv_by_std=False,
    whiten_advantages=False,
    critic_warmup_steps=3,
    logits_chunk_size=128,
  )
  assert config.kl_method == "low_var_kl+"
  assert config.loss_agg_mode == "seq-mean-token-mean"
  assert config.kl_coef == 0.1


def test_full_kl_requires_loss_placement():
  assert PpoExtConfig(kl_method="full", kl_penalty="loss").kl_method == "full"
  with pytest.raises(ValueError, match=r"kl_method='full'.*kl_penalty='loss'"):
    PpoExtConfig(kl_method="full")


@pytest.mark.parametrize(
  "kwargs, field, allowed",
  [
    (dict(epsilon_c=1.0), "epsilon_c", r"\(1.0, inf\)"),
    (dict(epsilon_c=0.5), "epsilon_c", r"\(1.0"),
    (dict(epsilon_low=1.5), "epsilon_low", r"\(0.0, 1.0\)"),
    (dict(epsilon_low=0.0), "epsilon_low", r"\(0.0, 1.0\)"),
    (dict(epsilon_high=-0.2), "epsilon_high", r"\(0.0"),
    (dict(entropy_coef=-0.01), "entropy_coef", r"\[0.0"),
    (dict(entropy_coef="0.1"), "entropy_coef", "a finite number"),
    (dict(beta=float("nan")), "beta", "a finite number"),
    (dict(gamma=1.5), "gamma", r"\[0.0, 1.0\]"),
    (dict(gae_lambda=-0.1), "gae_lambda", r"\[0.0, 1.0\]"),
    (dict(kl_target=0.0), "kl_target", r"\(0.0"),
    (dict(kl_horizon=-1), "kl_horizon", r"\(0.0"),
    (dict(kl_clamp_value=0.0), "kl_clamp_value", r"\(0.0"),
    (dict(clip_range_value=0.0), "clip_range_value", r"\(0.0"),
    (dict(num_iterations=0), "num_iterations", "integer >= 1"),
    (dict(critic_warmup_steps=-1), "critic_warmup_steps", "integer >= 0"),
    (dict(critic_warmup_steps=1.5), "critic_warmup_steps", "integer >= 0"),
    (dict(critic_lambda=1.2), "critic_lambda", r"\[0.0, 1.0\]"),
    (dict(adaptive_lambda_alpha=0.0), "adaptive_lambda_alpha", r"\(0.0"),
    (dict(gamma_turn=-0.5), "gamma_turn", r"\[0.0, 1.0\]"),
    (dict(critic_warmup_lambda=2.0), "critic_warmup_lambda", r"\[0.0, 1.0\]"),
    (dict(critic_warmup_until_ev=1.5), "critic_warmup_until_ev", r"1.0\]"),
    (dict(critic_warmup_until_ev="high"), "critic_warmup_until_ev", "a finite number"),
    (dict(critic_warmup_patience=0, critic_warmup_steps=4), "critic_warmup_patience", ">= 1"),
    (dict(logits_chunk_size=-8), "logits_chunk_size", "integer >= 0"),
    (dict(norm_adv_by_std="yes"), "norm_adv_by_std", "True or False"),
    (dict(kl_penalty="rewards"), "kl_penalty", "did you mean 'reward'"),
    (dict(kl_ctrl="adaptve"), "kl_ctrl", "did you mean 'adaptive'"),
    (dict(kl_method="low_var"), "kl_method", "low_var_kl"),
    (dict(loss_agg_mode="token_mean"), "loss_agg_mode", "token-mean"),
    (dict(value_loss_agg_mode="sum"), "value_loss_agg_mode", "token-mean"),
    (dict(advantage_estimator="gea"), "advantage_estimator", "did you mean 'gae'"),
    (dict(policy_loss_fn="nope"), "policy_loss_fn", "ppo_ext"),
  ],
)
def test_bad_values_name_field_value_and_allowed(kwargs, field, allowed):
  with pytest.raises(ValueError, match=field) as info:
    PpoExtConfig(**kwargs)
  message = str(info.value)
  assert repr(next(iter(kwargs.values())))[:6] in message or "nan" in message
  assert re.search(allowed, message), message


@pytest.mark.parametrize(
  "kwargs, field",
  [
    (dict(kl_penalty="loss", kl_method="full"), "kl_method"),
    (dict(kl_penalty="loss", kl_method="low_var_kl"), "kl_method"),
    (dict(kl_penalty="loss", kl_method="kl", kl_ctrl="adaptive"), "kl_ctrl"),
    (dict(loss_agg_mode="seq-mean-token-mean"), "loss_agg_mode"),
    (dict(rollout_is="token"), "rollout_is"),
    (dict(rollout_rs="token_k1"), "rollout_rs"),
    (dict(clip_range_value=None), "clip_range_value"),
    (dict(value_loss_agg_mode="seq-mean-token-sum"), "value_loss_agg_mode"),
  ],
)
def test_what_tunix_own_losses_cannot_do_is_refused_naming_both_keys(kwargs, field):
  """tunix's `ppo` losses would drop these silently (its KL is k1 at the initial
  coefficient, its aggregation token-mean, no rollout correction, the value loss always
  clips): one line naming the key and the loss instead. Our own losses take them all."""
  loss = "value_loss_fn" if field.startswith(("clip_range", "value_")) else "policy_loss_fn"
  with pytest.raises(ValueError, match=rf"PpoExtConfig\.{field}=.*{loss}='ppo'") as info:
    PpoExtConfig(**{loss: "ppo", **kwargs})
  assert "\n" not in str(info.value) and "tunix's own" in str(info.value)
  PpoExtConfig(**kwargs)  # with this package's losses: trains as configured
  # what tunix's loss does honour stays accepted: k1 in the loss at a fixed coefficient
  PpoExtConfig(policy_loss_fn="ppo", value_loss_fn="ppo", kl_penalty="loss", kl_method="kl")


@pytest.mark.parametrize("estimator", ["gigpo", "grpo", "rloo"])
def test_a_group_estimator_with_groups_of_one_is_refused_as_the_yaml_refuses_it(estimator):
  # built in Python, as a run config's `ppo` section is: the same one check, one message
  with pytest.raises(
    ValueError,
    match=rf"^PpoExtConfig\.num_generations=1 is invalid: must be at least 2 with "
    rf"advantage_estimator='{estimator}'",
  ) as info:
    PpoExtConfig(advantage_estimator=estimator, num_generations=1)
  assert "\n" not in str(info.value)
  assert PpoExtConfig(advantage_estimator=estimator, num_generations=2).num_generations == 2


def test_accepts_names_registered_in_tunix_registry():
  # tunix's own PPOConfig refuses every advantage estimator but 'grpo' and 'gae'.
  with pytest.raises(ValueError):
    algorithm_config.AlgorithmConfig(algo_variant="ppo", advantage_estimator="rloo")
  assert PpoExtConfig(advantage_estimator="rloo", num_generations=2).advantage_estimator == "rloo"
  tunix_losses.register_builtins()
  assert PpoExtConfig(advantage_estimator="ppo_ext_gae").advantage_estimator == "ppo_ext_gae"

  @function_registry.register_advantage_estimator("test_config_custom_estimator")
  def custom(rewards, values, completion_mask, gamma, gae_lambda):
    return rewards, rewards

  @function_registry.register_policy_loss_fn("test_config_custom_loss")
  def custom_loss(model, train_example, algo_config, pad_id, eos_id, **kw):
    return 0.0, {}

  config = PpoExtConfig(
    advantage_estimator="test_config_custom_estimator", policy_loss_fn="test_config_custom_loss"
  )
  assert config.policy_loss_fn == "test_config_custom_loss"


def test_importing_registers_nothing_in_tunix():
  code = (
    "import tunix_ppo_ext._src.tunix.learner.ppo_learner\n"
    "import tunix_ppo_ext._src.tunix.learner.loss_fns\n"
    "from tunix.rl import function_registry as f\n"
    "print(sorted(f.default_registry.list_functions('policy_loss_fn')))"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert "ppo_ext" not in out.stdout, out.stdout


def test_register_builtins_puts_its_functions_in_tunix():
  tunix_losses.register_builtins()
  registry = function_registry.default_registry
  assert registry.get("policy_loss_fn", "ppo_ext") is tunix_losses.ppo_ext_policy_loss_fn
  assert registry.get("value_loss_fn", "ppo_ext") is tunix_losses.ppo_ext_value_loss_fn
  for name in [
    "ppo_ext_gae",
    "ppo_ext_reinforce_plus_plus",
    "ppo_ext_grpo",
    "ppo_ext_drgrpo",
    "ppo_ext_rloo",
  ]:
    assert callable(registry.get("advantage_estimator", name))
  # tunix's own entries are untouched.
  from tunix.rl import algo_core

  assert registry.get("policy_loss_fn", "ppo") is algo_core.ppo_policy_loss_fn
  assert registry.get("advantage_estimator", "gae") is algo_core.compute_gae_advantages


def test_register_builtins_puts_every_estimator_in_tunix_under_its_name():
  """`turn_gae`, `reinforce_plus_plus` and `gigpo` under their own names (tunix keeps its
  `gae`, `grpo`, `rloo`): `turn_gae` through tunix's PPO signature is the package's, and
  `gigpo`, whose anchor states tunix's signature does not pass, says where to select it."""
  import jax.numpy as jnp

  from tunix_ppo_ext import ops

  tunix_losses.register_builtins()
  get = function_registry.get_advantage_estimator
  rewards = jnp.array([[0.0, 0.0, 1.0, 0.0, 0.5], [0.0, 1.0, 0.0, 0.0, 0.0]])
  values = jnp.array([[0.1, 0.2, 0.3, 0.0, 0.4], [0.5, 0.1, 0.0, 0.2, 0.1]])
  mask = jnp.array([[1.0, 1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0, 0.0]])
  ours = ops.compute_turn_gae_advantages(rewards, values, mask, gamma_turn=1.0, gae_lambda=0.9)
  theirs = get("turn_gae")(rewards, values, mask, 1.0, 0.9)
  for a, b in zip(ours, theirs, strict=True):
    assert jnp.allclose(a, b)
  assert callable(get("reinforce_plus_plus"))
  with pytest.raises(ValueError, match=r"'compute_gigpo_advantages' needs each agent turn's"):
    get("gigpo")(rewards, values, mask, 1.0, 0.9)
  from tunix.rl import algo_core

  assert get("gae") is algo_core.compute_gae_advantages  # tunix's own names stay tunix's


def test_a_tunix_registered_estimator_is_accepted_and_an_unknown_one_lists_every_name():
  @function_registry.register_advantage_estimator("my_tunix_gae_72")
  def my_tunix_gae_72(rewards, values, completion_mask, gamma, gae_lambda):
    return rewards, rewards

  assert PpoExtConfig(advantage_estimator="my_tunix_gae_72").advantage_estimator == (
    "my_tunix_gae_72"
  )
  with pytest.raises(ValueError, match=r"advantage_estimator='gea' is invalid") as info:
    PpoExtConfig(advantage_estimator="gea")
  for name in ("my_tunix_gae_72", "turn_gae", "reinforce_plus_plus", "gae"):
    assert f"'{name}'" in str(info.value), str(info.value)


def test_only_estimators_that_take_values_use_a_critic():
  assert PpoExtConfig(advantage_estimator="gae").uses_critic
  for name in ("grpo", "rloo", "reinforce_plus_plus"):
    assert not PpoExtConfig(advantage_estimator=name, num_generations=2).uses_critic, name
  with pytest.raises(ValueError, match=r"critic_warmup_steps=3 is invalid: must be 0 with "):
    PpoExtConfig(advantage_estimator="grpo", critic_warmup_steps=3)
  with pytest.raises(ValueError, match=r"critic_lambda=1.0 is invalid: must be None with "):
    PpoExtConfig(advantage_estimator="rloo", critic_lambda=1.0)
  with pytest.raises(ValueError, match=r"critic_warmup_until_ev=0.5 is invalid: must be None "):
    PpoExtConfig(critic_warmup_until_ev=0.5)  # no warm-up to end
  with pytest.raises(ValueError, match=r"critic_warmup_patience=3 is invalid: must be None "):
    PpoExtConfig(critic_warmup_patience=3)


def test_lambdas_and_turn_discount_default_to_the_shared_ones():
  config = PpoExtConfig(gamma=0.9, gae_lambda=0.8)
  assert (config.target_lambda, config.turn_discount) == (0.8, 0.9)
  config = PpoExtConfig(gamma=0.9, gae_lambda=0.8, critic_lambda=1.0, gamma_turn=0.5)
  assert (config.target_lambda, config.turn_discount) == (1.0, 0.5)
  assert PpoExtConfig(advantage_estimator="turn_gae").uses_critic


def test_the_light_key_table_is_ppo_ext_config_s_fields_with_their_types():
  # `config.ppo_section` checks a run config's `ppo` keys without tunix: its table must name
  # every field of PpoExtConfig (tunix's PPOConfig's on this tunix version too), each of
  # the kind its type says
  fields = {f.name: f for f in dataclasses.fields(PpoExtConfig)}
  assert set(ppo_section.FIELDS) == set(fields)
  hints = typing.get_type_hints(PpoExtConfig)
  kinds = {**dict.fromkeys(ppo_section.NUMBERS, float), **dict.fromkeys(ppo_section.INTEGERS, int)}
  kinds |= dict.fromkeys(ppo_section.FLAGS, bool) | dict.fromkeys(ppo_section.TEXTS, str)
  for name, kind in kinds.items():
    allowed = set(typing.get_args(hints[name])) or {hints[name]}
    assert kind in allowed, (name, hints[name])
    none_ok = type(None) in allowed
    if kind is float:
      declared = ppo_section.NUMBERS[name].get("none_ok", False)
    elif kind is int:
      declared = ppo_section.INTEGERS[name][1]
    else:
      declared = kind is str and ppo_section.TEXTS[name][1]
    # None allowed wherever the type allows it (tunix's epsilon_low/high and entropy_coef
    # default to None, filled in by PpoExtConfig); `clip_range_value` None is also ours (no
    # clipping), though tunix's type says float
    assert declared or not none_ok, (name, hints[name])
