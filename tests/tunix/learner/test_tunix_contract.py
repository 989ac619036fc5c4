"""tunix v0.1.7's PPO learner contract, with `PpoExtLearner` where tunix has `PPOLearner`.

The scenarios of tunix's own `tests/rl/ppo/ppo_learner_test.py` (reward model or reward
functions, dual clip, entropy, another evaluation rollout config, several iterations with
and without KL), written here on tunix's own toy model and vocabulary
(`tunix.tests.test_common`), a stock `RLCluster` and `PpoExtConfig` with tunix's numbers.
Checked as tunix checks: the actor and critic weights move, tunix's loop counters, tunix's
metric names in its metrics loggers (train and eval), and which `RLCluster` passes run at
which actor step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers.learner import EVAL_EVERY, TRAIN_STEPS, length_reward, make_cluster
from tunix_ppo_ext import PpoExtConfig, PpoExtLearner

# tunix_facing: also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.tunix, pytest.mark.tunix_facing]

PROMPTS = ["input string", "hello world", "My name", "hello there"]


def dataset(repeat: int, batch: int) -> list[dict[str, np.ndarray]]:
  prompts = PROMPTS * repeat
  return [
    {"prompts": np.array(prompts[i : i + batch]), "answer": np.array(prompts[i : i + batch])}
    for i in range(0, len(prompts), batch)
  ]


def answer_reward(prompts, answer, **_):
  return jnp.arange(len(answer), dtype=jnp.float32)


def params(model, filt=nnx.Param):
  return jax.tree.map(np.array, nnx.state(model, filt))


def assert_all_moved(before, after):
  for (path, old), new in zip(
    jax.tree_util.tree_leaves_with_path(before), jax.tree.leaves(after), strict=True
  ):
    assert not np.array_equal(old, new), jax.tree_util.keystr(path)


CRITIC_BODY = nnx.All(nnx.Param, lambda path, x: "output" not in path)
CASES = {
  "with_reward_model": dict(reward_model=True, fns=None, eval_t=0.5, eps_c=None, ent=None),
  "dual_clip": dict(reward_model=True, fns=None, eval_t=0.5, eps_c=2.0, ent=None),
  "dual_clip_with_entropy": dict(reward_model=True, fns=None, eval_t=0.5, eps_c=2.0, ent=0.1),
  "with_reward_fns": dict(
    reward_model=False, fns=[length_reward, answer_reward], eval_t=None, eps_c=None, ent=None
  ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_training_keeps_tunix_counters_and_metric_names(name):
  case = CASES[name]
  cluster, actor, critic = make_cluster(
    reward_model=case["reward_model"], eval_temperature=case["eval_t"]
  )
  actor_before, critic_before = params(actor), params(critic, CRITIC_BODY)
  config = PpoExtConfig(num_iterations=1, epsilon_c=case["eps_c"], entropy_coef=case["ent"])
  learner = PpoExtLearner(rl_cluster=cluster, ppo_config=config, reward_fns=case["fns"])
  assert not learner.should_sync_weights and not learner.can_enable_async_rollout
  learner.train(dataset(repeat=TRAIN_STEPS, batch=2), dataset(repeat=1, batch=2))

  # the trainers' models (the cluster may hold copies of the modules it was given)
  assert_all_moved(actor_before, params(cluster.actor_trainer.model))
  assert_all_moved(critic_before, params(cluster.critic_trainer.model, CRITIC_BODY))
  assert learner.rl_cluster.actor_trainer.iter_steps == TRAIN_STEPS
  assert learner.rl_cluster.critic_trainer.iter_steps == TRAIN_STEPS
  logger = cluster._rl_metrics_logger
  for name_ in ("score/mean", "reward/mean", "reward_kl_penalty"):
    assert len(logger.get_metric_history("rewards", name_, "train")) == cluster.global_steps
  for name_ in ("mean_length", "max_length", "min_length"):
    assert len(logger.get_metric_history("generation", f"completions/{name_}", "train"))
  evals = TRAIN_STEPS // EVAL_EVERY
  actor_metrics = ["loss", "pg_clipfrac"] + (["pg_clipfrac_lower"] if case["eps_c"] else [])
  for metric in actor_metrics:
    history = cluster.actor_trainer.metrics_logger.get_metric_history
    assert len(history("actor", metric, "train")) == TRAIN_STEPS, metric
    assert len(history("actor", metric, "eval")) == evals, metric
  for metric in ("loss", "vpred_mean", "vf_clipfrac"):
    history = cluster.critic_trainer.metrics_logger.get_metric_history
    assert len(history("critic", metric, "train")) == TRAIN_STEPS, metric
    assert len(history("critic", metric, "eval")) == evals, metric


@pytest.mark.parametrize(
  ("iterations", "beta", "generate_at", "ref_at"),
  [
    (1, 0.04, [0, 1, 2, 3], [0, 1, 2, 3]),
    (2, 0.04, [0, 2], [0, 2]),
    (1, 0.0, [0, 1, 2, 3], []),
  ],
)
def test_role_passes_run_where_tunix_runs_them(iterations, beta, generate_at, ref_at):
  cluster, _, _ = make_cluster(reward_model=True, eval_temperature=None)
  learner = PpoExtLearner(
    rl_cluster=cluster, ppo_config=PpoExtConfig(num_iterations=iterations, beta=beta)
  )
  calls: dict[str, list[int]] = {"generate": [], "old": [], "ref": [], "values": [], "rewards": []}

  def spy(owner, attribute, key):
    original = getattr(owner, attribute)

    def wrapper(*args, **kwargs):
      calls[key].append(cluster.actor_trainer.iter_steps)
      return original(*args, **kwargs)

    setattr(owner, attribute, wrapper)

  spy(learner, "_generate_and_compute_advantage", "generate")
  spy(cluster.rollout, "get_per_token_logps", "old")
  spy(cluster.inference_worker, "get_ref_per_token_logps", "ref")
  spy(cluster, "get_values", "values")
  spy(cluster, "get_rewards", "rewards")
  learner.train(dataset(repeat=TRAIN_STEPS // 4 * iterations, batch=1), None)

  assert calls["generate"] == generate_at
  assert calls["old"] == generate_at  # the rollout engine's own log-probs
  assert calls["ref"] == ref_at
  assert calls["values"] == generate_at and calls["rewards"] == generate_at


def test_tunix_default_empty_mesh_trains():
  """tunix's own test passes the current thread's physical mesh, empty outside a `with mesh`."""
  empty = jax.sharding.Mesh(np.empty((), dtype=object), ())  # what tunix's test gets
  assert empty.empty
  cluster, _, _ = make_cluster(reward_model=True, eval_temperature=None, mesh=empty)
  learner = PpoExtLearner(rl_cluster=cluster, ppo_config=PpoExtConfig())
  learner.train(dataset(repeat=1, batch=1), None)
  assert cluster.actor_trainer.train_steps == TRAIN_STEPS


def test_the_learner_takes_both_tunix_spellings_of_its_arguments():
  """tunix 0.1.7: `PPOLearner(rl_cluster=, ppo_config=)`; tunix main:
  `PPOLearner(rl_engine=, algo_config=)` (`rl_cluster=` still accepted there)."""
  cluster, _, _ = make_cluster(reward_model=True, eval_temperature=None)
  config = PpoExtConfig()
  for kwargs in (
    {"rl_cluster": cluster, "ppo_config": config},
    {"rl_engine": cluster, "algo_config": config},
    {"rl_cluster": cluster, "algo_config": config},
  ):
    learner = PpoExtLearner(**kwargs)
    assert learner.rl_cluster is cluster and learner.algo_config is config, kwargs
  assert PpoExtLearner(cluster, config).rl_cluster is cluster
  with pytest.raises(ValueError, match="both 'rl_engine' and 'rl_cluster'"):
    PpoExtLearner(rl_cluster=cluster, rl_engine=cluster, ppo_config=config)
  with pytest.raises(ValueError, match="both 'algo_config' and 'ppo_config'"):
    PpoExtLearner(cluster, ppo_config=config, algo_config=config)
  with pytest.raises(TypeError, match="'algo_config' \\(or 'ppo_config'\\)"):
    PpoExtLearner(cluster)
