"""The NaN guard: skipped non-finite updates, their count in the metrics, the stop + checkpoint.

The numerical blow-up is real arithmetic inside tunix's jitted train step: the policy and
value losses below are this package's own `ppo_ext` losses multiplied by NaN when the
batch's prompts contain `POISON` (standing for a loss that overflows on some batches), so
the gradient is NaN on exactly those steps and finite on the others.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from tunix.rl import function_registry

from tests.helpers.clusters import param_leaf, toy_cluster
from tunix_ppo_ext import PpoExtConfig
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.metrics import keys as metric_keys
from tunix_ppo_ext._src.optim.guards import (
  NonFiniteTrainingError,
  SkipCounts,
  guarded_adam,
  skip_counts,
)
from tunix_ppo_ext._src.tunix.learner import loss_fns as tunix_losses
from tunix_ppo_ext._src.tunix.learner.ppo_learner import PpoExtLearner

pytestmark = pytest.mark.tunix

POISON = "#"
TOKENIZER = CharTokenizer(eos_id=0)
POISON_ID = TOKENIZER.encode(POISON)[0]
BATCH = 4


def _nan_if_poisoned(loss, train_example):
  poisoned = jnp.any(train_example.prompt_ids == POISON_ID)
  return loss * jnp.where(poisoned, jnp.nan, 1.0)


@function_registry.register_policy_loss_fn("nan_guard_test")
def poisoned_policy_loss(
  model, train_example, algo_config, pad_id, eos_id, temperature=1.0, ref_model=None
):
  """`ppo_ext` policy loss, NaN on batches with a poisoned prompt.

  Keyword arguments are named (not `**kwargs`): tunix's `nnx.value_and_grad` binds them.
  """
  loss, aux = tunix_losses.ppo_ext_policy_loss_fn(
    model, train_example, algo_config, pad_id, eos_id, temperature, ref_model
  )
  return _nan_if_poisoned(loss, train_example), aux


@function_registry.register_value_loss_fn("nan_guard_test")
def poisoned_value_loss(
  model, train_example, clip_range_value, pad_id, eos_id, loss_agg_mode="token-mean"
):
  """`ppo_ext` value loss, NaN on batches with a poisoned prompt."""
  loss, aux = tunix_losses.ppo_ext_value_loss_fn(
    model, train_example, clip_range_value, pad_id, eos_id, loss_agg_mode
  )
  return _nan_if_poisoned(loss, train_example), aux


def reward(prompts, completions, **_):
  return [(sum(map(ord, c)) % 7) / 7 for c in completions]


def batches(pattern: str) -> list[dict[str, np.ndarray]]:
  """One batch per character of `pattern`: `x` poisoned, `.` clean."""
  return [
    {"prompts": np.array([f"say {POISON if p == 'x' else 'a'}b:"] + ["say cd:"] * (BATCH - 1))}
    for p in pattern
  ]


def setup(checkpoint_dir, steps, max_nonfinite_steps):
  cluster = toy_cluster(
    TOKENIZER,
    prompt_len=8,
    tokens_per_call=4,
    max_steps=steps,
    batch=BATCH,
    checkpoint_dir=str(checkpoint_dir),
    checkpoint_every=100,  # only the guard's final checkpoint is written in this test
  )
  config = PpoExtConfig(
    policy_loss_fn="nan_guard_test",
    value_loss_fn="nan_guard_test",
    max_nonfinite_steps=max_nonfinite_steps,
  )
  return cluster, config


class ObservedLearner(PpoExtLearner):
  """Records the trained parameters after every global step (an observer, not a stand-in)."""

  snapshots: list

  def _run_global_step(self, *args, **kwargs):
    try:
      super()._run_global_step(*args, **kwargs)
    finally:
      self.snapshots.append(_state(self.rl_cluster))


def _state(cluster) -> dict[str, np.ndarray]:
  actor, critic = cluster.actor_trainer, cluster.critic_trainer
  mu, count = _adam(actor.optimizer.opt_state)
  return {
    "actor": param_leaf(actor.model),
    "critic": np.array(nnx.state(critic.model.value_head)["kernel"][...]),
    "adam_mu": mu,
    "adam_count": count,
  }


def _adam(opt_state) -> tuple[np.ndarray, int]:
  """`(first moments, flattened; step count)` of the Adam state inside an optimizer state."""
  leaves = jax.tree_util.tree_leaves(
    opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState)
  )
  adam = next(x for x in leaves if isinstance(x, optax.ScaleByAdamState))
  mu = np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(adam.mu)])
  return mu, int(np.asarray(jax.tree.leaves(adam.count)[0]))


def test_guarded_adam_skips_non_finite_gradients_and_keeps_the_learning_rate():
  params = {"w": jnp.ones(3)}
  optimizer = guarded_adam(0.1)
  state = optimizer.init(params)
  assert float(state.hyperparams["learning_rate"]) == pytest.approx(0.1)  # what tunix logs
  for bad in (jnp.nan, jnp.inf):
    updates, state = optimizer.update({"w": jnp.array([1.0, bad, 1.0])}, state, params)
    np.testing.assert_array_equal(updates["w"], 0.0)
  assert skip_counts(state) == skip_counts(state).__class__(consecutive=2, total=2)
  mu, count = _adam(state)
  assert count == 0 and not np.any(mu)
  updates, state = optimizer.update({"w": jnp.ones(3)}, state, params)
  assert np.all(np.asarray(updates["w"]) < 0)
  assert skip_counts(state).consecutive == 0 and skip_counts(state).total == 2


def test_guarded_adam_trains_bfloat16_leaves_like_plain_adam():
  """A bfloat16 checkpoint (float32 value head beside it) trains: the guarded update equals
  optax's Adam in the gradient's dtype, and a NaN gradient is still skipped."""
  params = {"w": jnp.linspace(-1, 1, 5).astype(jnp.bfloat16), "head": jnp.ones(2)}
  grads = {"w": jnp.array([0.5, -1, 2, 0, 3], jnp.bfloat16), "head": jnp.array([1.0, -2])}
  optimizer, plain = jax.jit(guarded_adam(0.01).update), optax.adam(0.01)
  updates, state = optimizer(grads, guarded_adam(0.01).init(params), params)
  want, _ = plain.update(grads, plain.init(params), params)
  for key in params:
    assert updates[key].dtype == grads[key].dtype, key
    np.testing.assert_allclose(
      np.asarray(updates[key], np.float32),
      np.asarray(want[key].astype(grads[key].dtype), np.float32),
      rtol=1e-2,
    )
  nan = {"w": grads["w"].at[1].set(jnp.nan), "head": grads["head"]}
  skipped, state = optimizer(nan, state, params)
  assert not np.any(np.asarray(skipped["w"], np.float32)) and skip_counts(state).total == 1


def test_skips_are_counted_and_the_run_stops_with_a_checkpoint_of_the_last_good_state(tmp_path):
  pattern = ".x.xxx.."  # clean, skip, clean, then three skips in a row: stop after step 6
  cluster, config = setup(tmp_path, steps=len(pattern), max_nonfinite_steps=3)
  learner = ObservedLearner(cluster, config, reward_fns=reward)
  learner.snapshots = [_state(cluster)]
  with pytest.raises(NonFiniteTrainingError) as caught:
    learner.train(batches(pattern))
  message = str(caught.value)
  assert message.startswith("training stopped at step 6: the actor trainer skipped its last 3")
  assert "(4 to 6; 4 skipped in total)" in message
  assert "critic trainer skipped its last 3" in message
  assert "max_nonfinite_steps=3" in message and "actor at step 6" in message

  states = learner.snapshots
  assert len(states) == 7  # before training + six global steps
  for step, poisoned in enumerate(pattern[:6], start=1):
    for name in ("actor", "critic", "adam_mu"):
      unchanged = np.array_equal(states[step][name], states[step - 1][name])
      assert unchanged == (poisoned == "x"), (step, name)
  assert [s["adam_count"] for s in states] == [0, 1, 1, 2, 2, 2, 2]

  def history(name):
    logger = cluster._rl_metrics_logger
    return list(np.asarray(logger.get_metric_history("learner", name, "train")))

  for role in ("actor", "critic"):
    assert history(f"{role}_nonfinite_skips") == [0, 1, 0, 1, 1, 1]
    assert metric_keys.published_key(f"learner/{role}_nonfinite_skips", "train") == (
      f"{role}/nonfinite_skips"
    )
  actor_loss = np.asarray(cluster._rl_metrics_logger.get_metric_history("actor", "loss", "train"))
  assert np.isfinite(actor_loss[[0, 2]]).all() and np.isnan(actor_loss[[1, 3, 4, 5]]).all()

  # The checkpoint the guard wrote (the trainers' own interval is 100 steps) resumes at
  # update 6 with the parameters and Adam state of the last clean update (step 3).
  resumed, _ = setup(tmp_path, steps=len(pattern), max_nonfinite_steps=3)
  assert resumed.actor_trainer.train_steps == 6 and resumed.critic_trainer.train_steps == 6
  restored = _state(resumed)
  for name in ("actor", "critic", "adam_mu", "adam_count"):
    np.testing.assert_array_equal(restored[name], states[3][name])
  assert skip_counts(resumed.actor_trainer.optimizer.opt_state).consecutive == 3


def test_a_short_run_that_ends_skipping_fails_at_its_last_step_with_a_checkpoint(tmp_path):
  """Shorter than `max_nonfinite_steps`, so the in-a-row stop never comes: the last step's
  check refuses a run whose final skips are at least half of its updates (3 of 4 here)."""
  pattern = ".xxx"
  cluster, config = setup(tmp_path, steps=len(pattern), max_nonfinite_steps=10)
  learner = PpoExtLearner(cluster, config, reward_fns=reward)
  with pytest.raises(NonFiniteTrainingError) as caught:
    learner.train(batches(pattern))
  message = str(caught.value)
  assert message.startswith("training ended untrained at step 4: the actor trainer skipped ")
  assert "its last 3 of the run's 4 optimizer updates (2 to 4; 3 skipped in total)" in message
  assert "actor at step 4" in message  # the checkpoint of the last good state
  resumed, _ = setup(tmp_path, steps=len(pattern), max_nonfinite_steps=10)
  assert resumed.actor_trainer.train_steps == 4


def test_a_short_run_whose_skips_are_not_at_its_end_succeeds(tmp_path):
  cluster, config = setup(tmp_path, steps=3, max_nonfinite_steps=10)
  PpoExtLearner(cluster, config, reward_fns=reward).train(batches("xx."))
  assert skip_counts(cluster.actor_trainer.optimizer.opt_state) == SkipCounts(0, 2)


def test_an_update_that_would_overflow_the_parameters_is_skipped_and_counted():
  """A finite gradient with a huge step: the parameters stay as they were (last good)."""
  params = {"w": jnp.array([3e38, 1.0], jnp.float32)}
  optimizer = guarded_adam(1e38)
  state = optimizer.init(params)
  updates, state = optimizer.update({"w": jnp.array([-1.0, 1.0])}, state, params)
  np.testing.assert_array_equal(optax.apply_updates(params, updates)["w"], params["w"])
  assert skip_counts(state) == SkipCounts(consecutive=1, total=1)
  sane = guarded_adam(0.1)
  state = sane.init(params)
  updates, state = sane.update({"w": jnp.array([-1.0, 1.0])}, state, params)
  np.testing.assert_allclose(optax.apply_updates(params, updates)["w"], [3e38, 0.9], rtol=1e-6)
  assert skip_counts(state) == SkipCounts(consecutive=0, total=0)
