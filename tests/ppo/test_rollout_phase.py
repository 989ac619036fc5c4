"""`ppo.rollout_phase`: the rollout phase without tunix, against the NumPy references of the
math tests (GAE with whitening, Ziegler et al.'s adaptive KL controller) and the layer's
own pieces (the critic warm-up's rule, the packing and shared-prompt plans)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types

import numpy as np
import pytest

from tests.helpers.advantages import ref_gae_turn_discount, ref_whiten
from tunix_ppo_ext._src.config.critic_warmup import CriticWarmup
from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch
from tunix_ppo_ext._src.ops.packing import plan_rows
from tunix_ppo_ext._src.ops.shared_prompts import plan_shared_prompts
from tunix_ppo_ext._src.ppo import rollout_phase

pytestmark = pytest.mark.fast

B, P, T = 4, 3, 6
TOL = dict(rtol=1e-5, atol=1e-5)


@dataclasses.dataclass
class Config:
  """The `PpoExtConfig` fields the rollout phase reads (tunix's config needs tunix)."""

  advantage_estimator: str = "gae"
  gamma: float = 0.9
  gae_lambda: float = 0.8
  target_lambda: float = 0.8
  critic_warmup_lambda: float = 1.0
  adaptive_lambda_alpha: float | None = None
  turn_discount: float = 1.0
  whiten_advantages: bool = True
  norm_adv_by_std: bool = True
  gigpo_step_weight: float = 1.0
  gigpo_norm_by_std: bool = True
  num_generations: int = 1
  kl_penalty: str = "reward"
  kl_ctrl: str = "adaptive"
  kl_coef: float = 0.1
  kl_target: float = 0.05
  kl_horizon: float = 100.0
  critic_warmup_steps: int = 0
  critic_warmup_until_ev: float | None = None
  critic_warmup_patience: int | None = None
  entropy_coef: float = 0.0
  num_iterations: int = 1
  recompute_old_logps: bool = False
  rollout_is: str | None = None
  rollout_rs: str | None = None


def batch(seed: int = 0) -> tuple[TrajectoryBatch, types.SimpleNamespace]:
  """Episodes of uneven lengths, an observation token off the loss mask, and their inputs."""
  rng = np.random.default_rng(seed)
  lengths = np.array([6, 4, 5, 2])
  attention = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
  loss = attention.copy()
  loss[:, 1] = 0
  rewards = np.zeros((B, T), np.float32)
  rewards[np.arange(B), lengths - 1] = rng.normal(size=B)
  prompt = np.array([[0, 5, 6], [0, 5, 6], [7, 8, 9], [0, 0, 4]])
  episodes = TrajectoryBatch(
    prompt_ids=prompt,
    completion_ids=rng.integers(1, 20, (B, T)) * attention,
    attention_mask=attention,
    loss_mask=loss,
    token_rewards=rewards,
  )
  inputs = types.SimpleNamespace(
    prompt=prompt,
    completion=episodes.completion_ids,
    attention_mask=attention,
    loss_mask=loss.astype(np.float32),
    pad_id=0,
  )
  return episodes, inputs


def passes(inputs, seed: int = 1) -> rollout_phase.Passes:
  rng = np.random.default_rng(seed)
  values = (rng.normal(size=(B, T)) * inputs.loss_mask).astype(np.float32)
  kl = np.abs(rng.normal(size=(B, T))).astype(np.float32)
  return rollout_phase.Passes(None, values, None, kl)


def test_the_core_imports_no_tunix():
  """Importing it loads no tunix (`tests/test_layout.py` checks the import graph)."""
  code = "import sys, tunix_ppo_ext._src.ppo.rollout_phase; print('tunix' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"


@pytest.mark.parametrize("train", [True, False])
def test_kl_shaping_and_the_adaptive_controller(train):
  """`r - beta KL` on agent tokens; the controller moves `beta *= 1 + clip(KL/target - 1,
  +-0.2) B / horizon` on a training step only."""
  config = Config()
  episodes, inputs = batch()
  model = passes(inputs)
  state = rollout_phase.initial_state(config)
  rewards, kl, after = rollout_phase.kl_penalty(
    config, state, episodes.token_rewards, model, inputs.loss_mask, train
  )
  masked = model.per_token_kl * inputs.loss_mask
  np.testing.assert_allclose(kl, masked, **TOL)
  np.testing.assert_allclose(rewards, episodes.token_rewards - 0.1 * masked, **TOL)
  seq = (masked.sum(-1) / inputs.loss_mask.sum(-1)).mean()
  expected = 0.1 * (1 + np.clip(seq / 0.05 - 1, -0.2, 0.2) * B / 100.0) if train else 0.1
  assert rollout_phase.kl_coef(config, after) == pytest.approx(expected, rel=1e-6)
  assert rollout_phase.kl_coef(config, state) == 0.1  # the state given is not changed


def test_no_kl_leaves_the_rewards_and_the_state():
  config = Config(kl_penalty="none")
  episodes, inputs = batch()
  state = rollout_phase.initial_state(config)
  assert not rollout_phase.needs_reference(config, state)
  model = dataclasses.replace(passes(inputs), per_token_kl=None)
  rewards, kl, after = rollout_phase.kl_penalty(
    config, state, episodes.token_rewards, model, inputs.loss_mask, True
  )
  np.testing.assert_array_equal(rewards, episodes.token_rewards)
  assert kl is None and after == state


@pytest.mark.parametrize("warmup_steps", [0, 2])
def test_one_phase_against_numpy_gae(warmup_steps):
  """Advantages: whitened GAE (turn-discounted) of the shaped rewards with the policy's
  lambda; returns with
  the targets' (the warm-up's on a warm-up step), the actor scaled by 0 then; the example's
  `kl_coef` is 0 unless the KL is in the loss."""
  config = Config(critic_warmup_steps=warmup_steps)
  episodes, inputs = batch()
  model = passes(inputs)
  state = rollout_phase.initial_state(config)
  where = rollout_phase.Step(step=0, train=True, has_critic=True)
  result = rollout_phase.rollout_phase(config, state, where, episodes, inputs, model)
  shaped = episodes.token_rewards - 0.1 * model.per_token_kl * inputs.loss_mask
  np.testing.assert_allclose(result.rewards, shaped, **TOL)
  m = inputs.loss_mask  # two turns a row (an observation token at 1): gamma_turn between
  raw, _ = ref_gae_turn_discount(shaped, model.values, m, 0.9, 1.0, 0.8)
  advantages = ref_whiten(raw, m) * m
  _, returns = ref_gae_turn_discount(
    shaped, model.values, m, 0.9, 1.0, 1.0 if warmup_steps else 0.8
  )
  np.testing.assert_allclose(result.advantages, advantages, **TOL)
  np.testing.assert_allclose(result.returns, returns, **TOL)
  fields = result.fields
  np.testing.assert_array_equal(fields["actor_scale"], 0.0 if warmup_steps else 1.0)
  np.testing.assert_array_equal(fields["kl_coef"], 0.0)
  np.testing.assert_array_equal(fields["completion_mask"], m)
  np.testing.assert_array_equal(fields["prompt_mask"], inputs.prompt != 0)
  metrics = result.metrics
  assert metrics["learner/kl_coef"][0] == rollout_phase.kl_coef(config, result.state)
  assert ("learner/critic_warmup" in metrics) is bool(warmup_steps)
  assert {"learner/advantage_sq_mean", "learner/kl", "rewards/reward_kl_penalty"} <= set(metrics)


def test_the_warmup_ends_on_its_rule_and_its_state_round_trips():
  """`critic_warmup_until_ev` reached on step 0 ends the warm-up after it, as
  `CriticWarmup`; the state goes through the checkpoint's metadata unchanged."""
  config = Config(critic_warmup_steps=5, critic_warmup_until_ev=-1e9)
  state = rollout_phase.initial_state(config)
  after, metrics = rollout_phase.after_rollout(config, state, 0, 0.5)
  reference = CriticWarmup(5, -1e9)
  reference.after_rollout(0, 0.5)
  assert dict(after.critic_warmup) == reference.state_dict()
  assert metrics == {k: (v, np.mean) for k, v in reference.metrics(0).items()}
  assert not rollout_phase.warming_up(config, after, 1)
  assert rollout_phase.initial_state(config, after.to_metadata()) == after


def test_eval_steps_change_no_state():
  config = Config(critic_warmup_steps=5, critic_warmup_until_ev=-1e9)
  episodes, inputs = batch()
  state = rollout_phase.initial_state(config)
  where = rollout_phase.Step(step=0, train=False, has_critic=True)
  result = rollout_phase.rollout_phase(config, state, where, episodes, inputs, passes(inputs))
  assert result.state == state


def test_micro_batch_layouts():
  """Packed per micro-batch as `math.packing.plan_rows`, else each distinct prompt once
  (`math.shared_prompts`); nothing when tunix's sizes are unknown."""
  _, inputs = batch()
  args = (inputs.prompt, inputs.attention_mask)
  assert rollout_phase.micro_batch_layout(*args, (), 0, packing=True) == {}
  packed = rollout_phase.micro_batch_layout(*args, (2, 2), 0, packing=True)
  slots, *_ = plan_rows(inputs.prompt, inputs.attention_mask, 0, [2, 2])
  np.testing.assert_array_equal(packed["pack_slots"], slots)
  shared = rollout_phase.micro_batch_layout(*args, (2, 2), 0, packing=False)
  groups = plan_shared_prompts(inputs.prompt, [2, 2], 1)
  if groups is None:
    assert shared == {}
  else:
    np.testing.assert_array_equal(shared["prompt_groups"], groups)


def test_old_logps_in_update_only_when_nothing_reads_them():
  one_step = types.SimpleNamespace(mini_batch_size=None)
  config = Config(kl_penalty="none")
  assert rollout_phase.old_logps_in_update(config, one_step, tunix_loss=False)
  assert not rollout_phase.old_logps_in_update(config, one_step, tunix_loss=True)
  assert not rollout_phase.old_logps_in_update(Config(), one_step, tunix_loss=False)
  minibatches = types.SimpleNamespace(mini_batch_size=2)
  assert not rollout_phase.old_logps_in_update(config, minibatches, tunix_loss=False)
