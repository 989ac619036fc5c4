"""PpoExtLearner on a real tunix RLCluster with toy Qwen3 models: parity, rewards, knobs, resume."""

import numpy as np
import pytest
from flax import nnx
from tunix.rl.ppo import ppo_learner

from tests.helpers.clusters import param_leaf
from tests.helpers.learner import BATCH, GEN_LEN, PROMPT_LEN, setup
from tunix_ppo_ext import PpoExtConfig
from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch
from tunix_ppo_ext._src.ppo import rollout_phase
from tunix_ppo_ext._src.ppo.rollout_phase import old_logps_in_update
from tunix_ppo_ext._src.tunix.learner import loss_fns as tunix_losses
from tunix_ppo_ext._src.tunix.learner import passes
from tunix_ppo_ext._src.tunix.learner.ppo_learner import PpoExtLearner
from tunix_ppo_ext._src.tunix.learner.role_passes import RolePasses
from tunix_ppo_ext.rollout import RolloutContext

pytestmark = pytest.mark.tunix


def spread_reward(prompts, completions, **_):
  """A deterministic reward in [0, 1) that differs between completions (so groups differ)."""
  return [(sum(map(ord, c)) % 7) / 7 for c in completions]


def fractional_reward(prompts, completions, **_):
  return [0.7] * len(completions)


def history(cluster, prefix, name):
  return np.asarray(cluster._rl_metrics_logger.get_metric_history(prefix, name, "train"))


@pytest.mark.tunix_facing  # on tunix main too (lane 2 of .ci/run runs no other here)
def test_default_config_matches_stock_ppo_step_for_step():
  losses = {}
  for cls, config in [
    (ppo_learner.PPOLearner, ppo_learner.PPOConfig(num_iterations=2)),
    (PpoExtLearner, PpoExtConfig(num_iterations=2)),
  ]:
    cluster, learner, data = setup(config, steps=4, learner_cls=cls)
    learner.train(data)
    losses[cls] = (history(cluster, "actor", "loss"), history(cluster, "critic", "loss"))
  (stock_actor, stock_critic), (ext_actor, ext_critic) = losses.values()
  assert len(stock_actor) == len(ext_actor) == 4  # 2 global steps x 2 PPO epochs
  assert np.max(np.abs(stock_actor[1::2])) > 1e-4  # second epochs see a moved policy
  np.testing.assert_allclose(ext_actor, stock_actor, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ext_critic, stock_critic, rtol=1e-5, atol=1e-5)


@pytest.mark.tunix_facing
def test_tunix_own_losses_get_tunix_inputs_and_log_tunix_metrics_as_stock_ppo():
  """`policy_loss_fn="ppo"`, `value_loss_fn="ppo"` (tunix's own, held only by tunix's
  registry) train as in stock `PPOLearner`: tunix's inputs (no temperature, no aggregation
  keyword) and tunix's metric names and values (its entropy term switched on)."""
  shared = dict(num_iterations=2, entropy_coef=0.05, epsilon_c=3.0)
  names = [("actor", "loss"), ("critic", "loss"), ("actor", "pg_clipfrac")]
  names += [("actor", "pg_clipfrac_lower"), ("actor", "loss/entropy")]
  names += [("critic", "vpred_mean"), ("critic", "vf_clipfrac")]
  logged = {}
  for cls, config in [
    (ppo_learner.PPOLearner, ppo_learner.PPOConfig(**shared)),
    (PpoExtLearner, PpoExtConfig(**shared, policy_loss_fn="ppo", value_loss_fn="ppo")),
  ]:
    cluster, learner, data = setup(config, steps=4, learner_cls=cls)
    learner.train(data)
    logged[cls] = {name: history(cluster, *name) for name in names}
  stock, ours = logged.values()
  for name in names:
    assert len(stock[name]) == 4, name  # 2 global steps x 2 PPO epochs
    np.testing.assert_allclose(ours[name], stock[name], rtol=1e-5, atol=1e-5, err_msg=str(name))
  assert np.all(ours[("actor", "loss/entropy")] > 0)


def test_fractional_rewards_reach_returns_and_advantages():
  """tunix 0.1.7 builds int32 token rewards and truncates 0.7 to 0; we keep float32."""
  config = dict(beta=0.0, gamma=1.0, gae_lambda=1.0)
  results = {}
  for cls, cfg in [
    (ppo_learner.PPOLearner, ppo_learner.PPOConfig(**config)),
    (PpoExtLearner, PpoExtConfig(**config, whiten_advantages=False)),
  ]:
    cluster, learner, data = setup(cfg, reward=fractional_reward, learner_cls=cls)
    example = learner._generate_and_compute_advantage(data[0])
    mask = np.asarray(example.completion_mask) > 0
    values = np.asarray(example.old_values)
    results[cls] = (
      np.asarray(example.returns)[mask],
      (np.asarray(example.advantages) + values)[mask],
    )
  stock_returns, _ = results[ppo_learner.PPOLearner]
  returns, adv_plus_values = results[PpoExtLearner]
  np.testing.assert_allclose(returns, 0.7, rtol=1e-6)  # reward-to-go of 0.7 on every agent token
  np.testing.assert_allclose(adv_plus_values, 0.7, rtol=1e-5)
  assert not np.allclose(stock_returns, 0.7, atol=1e-3)  # stock lost the fractional reward


# Each run switches on several knobs that do not interact, so every knob trains at least
# once while the suite compiles 8 learners instead of 17.
tunix_losses.register_builtins()  # stock tunix names such as `ppo_ext_gae`
KNOBS = {
  "k1_reward+seq_mean_token_sum": dict(
    kl_method="kl", loss_agg_mode="seq-mean-token-sum", value_loss_agg_mode="seq-mean-token-mean"
  ),
  "abs_reward+seq_mean_token_sum_norm": dict(
    kl_method="abs", loss_agg_mode="seq-mean-token-sum-norm"
  ),
  "mse_reward+entropy+dual_clip+seq_mean_token_mean": dict(
    kl_method="mse_kl",
    entropy_coef=0.05,
    epsilon_low=0.1,
    epsilon_high=0.3,
    epsilon_c=2.0,
    loss_agg_mode="seq-mean-token-mean",
  ),
  "k3plus_loss+reinforce_pp": dict(
    kl_method="k3+",
    kl_penalty="loss",
    kl_loss_coef=0.1,
    kl_clamp_value=5.0,
    advantage_estimator="reinforce_plus_plus",
  ),
  "k1plus_loss+grpo": dict(
    kl_method="k1+",
    kl_penalty="loss",
    kl_loss_coef=0.1,
    advantage_estimator="grpo",
    num_generations=2,
  ),
  "full_loss+drgrpo": dict(
    kl_method="full",
    kl_penalty="loss",
    kl_loss_coef=0.1,
    logits_chunk_size=2,
    advantage_estimator="grpo",
    num_generations=2,
    norm_adv_by_std=False,
  ),
  "kl_none+rloo": dict(kl_penalty="none", advantage_estimator="rloo", num_generations=2),
  "adaptive_ctrl+tunix_registered_gae": dict(  # tunix_losses.register_builtins() above
    kl_ctrl="adaptive", kl_target=10.0, kl_horizon=10, advantage_estimator="ppo_ext_gae"
  ),
}


# estimators that are >= 0 for any two distributions (|x|, x^2 / 2, e^-x + x - 1 of the log-ratio
# x, the exact KL); `kl`/`k1` (x itself) can be negative. `+`: the same value, another gradient
NONNEGATIVE_KL = {"abs", "mse_kl", "mse", "k2", "low_var_kl", "k3", "full"}


def entropy_bound(loss_agg_mode: str, vocab: int) -> float:
  """The most the logged `entropy` can be: log(vocab) nats a token (a uniform policy),
  aggregated as `loss_agg_mode` aggregates: a mean of tokens (or of per-row means), a mean
  of per-row sums (at most `GEN_LEN` tokens a row), or the batch's sum over `GEN_LEN`."""
  tokens = {"seq-mean-token-sum": GEN_LEN, "seq-mean-token-sum-norm": BATCH}
  return float(np.log(vocab)) * tokens.get(loss_agg_mode, 1)


@pytest.mark.parametrize("name", list(KNOBS))
def test_each_knob_trains(name):
  config = PpoExtConfig(**KNOBS[name])
  cluster, learner, data = setup(
    config, reward=spread_reward, num_generations=config.num_generations
  )
  policy = cluster.actor_trainer.model
  before = param_leaf(policy)
  learner.train(data)
  assert cluster.actor_trainer.train_steps == 2
  assert not np.allclose(param_leaf(policy), before)
  actor_loss = history(cluster, "actor", "loss")
  critic_loss = history(cluster, "critic", "loss")
  assert len(actor_loss) == len(critic_loss) == 2  # one update per global step
  assert np.all(np.isfinite(actor_loss)) and np.all(critic_loss >= 0)  # a squared error
  names = ["pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "entropy"]
  metrics = {m: history(cluster, "actor", m) for m in names}
  for metric in ["pg_clipfrac", "pg_clipfrac_lower"]:  # shares of tokens
    assert np.all((metrics[metric] >= 0) & (metrics[metric] <= 1)), (metric, metrics[metric])
  assert np.all(np.isfinite(metrics["pg_loss"]))
  # One epoch of one mini-batch: each update is the first on a batch the same weights just
  # sampled and scored, so the ratio is 1 (the old log-probs' pass and the loss's agree):
  # no token clipped, no KL between the two.
  assert config.num_iterations == 1
  np.testing.assert_array_equal(metrics["pg_clipfrac"], 0.0)
  np.testing.assert_array_equal(metrics["pg_clipfrac_lower"], 0.0)
  np.testing.assert_allclose(metrics["ppo_kl"], 0.0, atol=1e-5)
  vocab = cluster.tokenizer.vocab_size  # the toy policy's logits are this wide
  assert policy.config.vocab_size == vocab
  entropy = metrics["entropy"]
  assert np.all((entropy > 0) & (entropy <= entropy_bound(config.loss_agg_mode, vocab))), entropy
  kl_loss = 0.0
  if config.kl_penalty == "loss":
    kl_loss = history(cluster, "actor", "kl_loss")
    np.testing.assert_allclose(kl_loss[0], 0.0, atol=1e-6)  # first update: policy = reference
    if config.kl_method.rstrip("+") in NONNEGATIVE_KL:
      assert np.all(kl_loss >= -1e-6), kl_loss
  # the loss is its terms with the configured coefficients
  expected = metrics["pg_loss"] - config.entropy_coef * entropy + config.kl_loss_coef * kl_loss
  np.testing.assert_allclose(actor_loss, expected, rtol=1e-5, atol=1e-6)
  if config.kl_penalty != "none":
    kl = history(cluster, "learner", "kl")  # rollout policy to reference, on loss tokens
    # the reference is a copy of the policy, which samples the first step's batch
    np.testing.assert_allclose(kl[0], 0.0, atol=1e-6)
    if config.kl_method.rstrip("+") in NONNEGATIVE_KL:
      assert np.all(kl >= 0), kl
  coef = history(cluster, "learner", "kl_coef")
  if config.kl_ctrl == "adaptive":
    # measured KL far below the target: the coefficient shrinks by 20% x 4 samples / 10
    np.testing.assert_allclose(coef, config.beta * 0.92 ** np.arange(1, 3), rtol=1e-6)
  elif config.kl_penalty != "none":
    np.testing.assert_allclose(coef, config.kl_coef)


def test_critic_warmup_freezes_the_actor():
  config = PpoExtConfig(critic_warmup_steps=2)
  cluster, learner, data = setup(config, steps=2)
  actor_before = param_leaf(cluster.actor_trainer.model)
  critic_before = np.array(nnx.state(cluster.critic_trainer.model.value_head)["kernel"][...])
  learner.train(data)
  np.testing.assert_array_equal(param_leaf(cluster.actor_trainer.model), actor_before)
  critic_after = np.array(nnx.state(cluster.critic_trainer.model.value_head)["kernel"][...])
  assert not np.allclose(critic_after, critic_before)


def test_critic_warmup_ends_after_the_step_that_reaches_its_explained_variance():
  # any explained variance reaches -1e9: the warm-up is step 0 alone, then the actor trains
  config = PpoExtConfig(critic_warmup_steps=3, critic_warmup_until_ev=-1e9)
  cluster, learner, data = setup(config, steps=3, reward=spread_reward)
  learner.train(data)
  np.testing.assert_array_equal(history(cluster, "learner", "critic_warmup"), [1, 0, 0])
  np.testing.assert_array_equal(history(cluster, "learner", "critic_warmup_steps"), [1, 1, 1])
  assert learner.state.critic_warmup["ended_at"] == 1
  assert np.any(history(cluster, "actor", "pg_loss")[1:] != 0.0)


def _first_example(config, reward=spread_reward):
  _, learner, data = setup(config, reward=reward)
  example = learner._generate_and_compute_advantage(data[0])
  return {k: np.asarray(getattr(example, k)) for k in ("advantages", "returns", "actor_scale")}


def test_decoupled_lambdas_give_advantages_and_value_targets_each_their_own():
  shared = dict(kl_penalty="none", gamma=1.0, whiten_advantages=False)
  both = _first_example(PpoExtConfig(**shared, gae_lambda=0.5, critic_lambda=1.0))
  actor = _first_example(PpoExtConfig(**shared, gae_lambda=0.5))
  critic = _first_example(PpoExtConfig(**shared, gae_lambda=1.0))
  np.testing.assert_array_equal(both["advantages"], actor["advantages"])
  np.testing.assert_array_equal(both["returns"], critic["returns"])
  assert not np.allclose(actor["returns"], critic["returns"])
  # a warm-up step's targets use the warm-up's lambda (1.0), and the actor's loss is off
  warm = _first_example(PpoExtConfig(**shared, gae_lambda=0.5, critic_warmup_steps=1))
  np.testing.assert_array_equal(warm["returns"], critic["returns"])
  np.testing.assert_array_equal(warm["actor_scale"], 0.0)
  np.testing.assert_array_equal(both["actor_scale"], 1.0)


def test_length_adaptive_and_turn_level_estimators_reach_the_example():
  shared = dict(kl_penalty="none", whiten_advantages=False, gae_lambda=0.5, critic_lambda=1.0)
  adaptive = _first_example(PpoExtConfig(**shared, adaptive_lambda_alpha=0.05))
  zero = _first_example(PpoExtConfig(**{**shared, "gae_lambda": 0.0}))
  # 6-token rows: 1 - 1 / (0.05 * l) < 0, so every row's lambda is 0
  np.testing.assert_allclose(adaptive["advantages"], zero["advantages"], rtol=1e-6)
  turn = _first_example(PpoExtConfig(**shared, advantage_estimator="turn_gae", gamma_turn=0.9))
  # single-turn rows: one turn, its advantage on every agent token of the row
  for row in turn["advantages"]:
    assert len(set(row[row != 0].tolist())) <= 1


def test_resume_in_the_middle_of_the_critic_warmup(tmp_path):
  config = PpoExtConfig(critic_warmup_steps=3)
  cluster, learner, data = setup(config, steps=2, checkpoint_dir=str(tmp_path))
  actor_before = param_leaf(cluster.actor_trainer.model)
  learner.train(data)
  np.testing.assert_array_equal(param_leaf(cluster.actor_trainer.model), actor_before)
  cluster2, learner2, data2 = setup(config, steps=4, checkpoint_dir=str(tmp_path))
  assert cluster2.actor_trainer.train_steps == 2
  learner2.train(data2)  # step 2 still warms up, step 3 trains the actor
  np.testing.assert_array_equal(history(cluster2, "learner", "critic_warmup"), [1, 0])
  np.testing.assert_array_equal(history(cluster2, "learner", "critic_warmup_steps"), [3, 3])
  assert not np.allclose(param_leaf(cluster2.actor_trainer.model), actor_before)


def test_an_early_end_of_the_warmup_survives_a_resume(tmp_path):
  config = PpoExtConfig(critic_warmup_steps=5, critic_warmup_until_ev=-1e9)
  _, learner, data = setup(config, steps=2, checkpoint_dir=str(tmp_path), reward=spread_reward)
  learner.train(data)
  assert learner.state.critic_warmup["ended_at"] == 1
  cluster2, learner2, data2 = setup(
    config, steps=3, checkpoint_dir=str(tmp_path), reward=spread_reward
  )
  assert learner2.state.critic_warmup["ended_at"] == 1
  learner2.train(data2)
  np.testing.assert_array_equal(history(cluster2, "learner", "critic_warmup"), [0])


@pytest.mark.tunix_facing  # on tunix main too (lane 2 of .ci/run runs no other here)
def test_group_estimators_train_without_a_critic():
  # one estimator here; `grpo` through the CLI in tests/run/test_sweep.py
  config = PpoExtConfig(advantage_estimator="reinforce_plus_plus", num_generations=2)
  assert not config.uses_critic
  cluster, learner, data = setup(config, steps=2, with_critic=False, reward=spread_reward)
  actor_before = param_leaf(cluster.actor_trainer.model)
  learner.train(data)
  assert not learner.has_critic and cluster.actor_trainer.train_steps == 2
  assert not np.allclose(param_leaf(cluster.actor_trainer.model), actor_before)
  assert np.all(np.isfinite(history(cluster, "actor", "loss")))
  logged = cluster._rl_metrics_logger  # nothing of a critic is logged
  assert logged.metric_exists("batch", "advantage/mean", "train")
  for prefix, name in [
    ("critic", "loss"),
    ("critic", "vf_loss"),
    ("learner", "explained_variance"),
    ("batch", "old_value/mean"),
  ]:
    assert not logged.metric_exists(prefix, name, "train"), (prefix, name)


def record_log_prob_passes(monkeypatch, cluster) -> list[tuple[str, np.ndarray, list]]:
  """Spies on the learner's log-prob passes, each still run as it is: per pass `(name, the
  whole batch's prompt rows, the prompt rows of each model call it made)`. A call is tunix's
  (the rollout engine's `get_per_token_logps`, the inference worker's reference pass) or the
  mask-aware `passes.compute_per_token_logps`, whichever path the pass takes."""
  seen = []

  def spy_pass(name):
    original = getattr(RolePasses, name)

    def recorded(self, inputs):
      seen.append((name, np.asarray(inputs.prompt), []))
      return original(self, inputs)

    monkeypatch.setattr(RolePasses, name, recorded)

  def spy_call(owner, attribute, prompt_arg):
    original = getattr(owner, attribute)

    def recorded(*args, **kwargs):
      assert seen, f"{attribute} called outside a log-prob pass"
      seen[-1][2].append(np.asarray(args[prompt_arg]))
      return original(*args, **kwargs)

    monkeypatch.setattr(owner, attribute, recorded)

  spy_pass("old_logps")
  spy_pass("ref_logps")
  spy_call(cluster.rollout, "get_per_token_logps", 0)
  spy_call(cluster.inference_worker, "get_ref_per_token_logps", 0)
  spy_call(passes, "compute_per_token_logps", 1)  # (model, prompt, completion, ...)
  return seen


def test_log_prob_passes_take_rows_of_whole_groups(monkeypatch):
  """tunix's `compute_logps_micro_batch_size` counts prompts; with groups a log-prob pass
  takes that many prompts' rows, `num_generations` each (as tunix's GRPO learner does)."""
  config = PpoExtConfig(advantage_estimator="grpo", num_generations=2, beta=0.04)
  cluster, learner, data = setup(
    config, with_critic=False, reward=spread_reward, num_generations=2, logps_micro_batch_size=1
  )
  assert learner._passes.micro_batch_size == 2  # 1 prompt x 2 generations
  seen = record_log_prob_passes(monkeypatch, cluster)
  learner.train(data)
  assert cluster.actor_trainer.train_steps == 2
  assert np.all(np.isfinite(history(cluster, "actor", "loss")))
  # each of the 2 steps: the old log-probs, then the reference's (beta > 0)
  assert [name for name, *_ in seen] == ["old_logps", "ref_logps"] * 2
  for name, batch, calls in seen:
    # the batch: BATCH // 2 prompts, each repeated on 2 consecutive rows (its group)
    assert len(batch) == BATCH
    np.testing.assert_array_equal(batch[0::2], batch[1::2])
    assert not np.array_equal(batch[0], batch[2])  # two groups, two prompts
    # one call per group, in order: 2 rows each, of one prompt, together the whole batch
    assert [len(rows) for rows in calls] == [2] * (BATCH // 2), name
    for rows in calls:
      np.testing.assert_array_equal(rows[0], rows[1])
    np.testing.assert_array_equal(np.concatenate(calls), batch)


def test_gae_without_a_critic_is_refused_and_an_unused_critic_warns():
  with pytest.raises(ValueError, match=r"advantage_estimator='gae' takes critic values.*no critic"):
    setup(PpoExtConfig(advantage_estimator="gae"), with_critic=False)
  with pytest.warns(UserWarning, match=r"'grpo' uses no critic, yet the cluster has one"):
    setup(PpoExtConfig(advantage_estimator="grpo", num_generations=2))


def multi_turn_source(learner, training_input, mode):
  """A fixed two-turn trajectory per prompt: agent, observation, agent, padding."""
  tokenizer = learner.rl_cluster.tokenizer
  rows = len(training_input["prompts"])
  prompt = np.array(
    [tokenizer.encode(p, add_bos=True)[-PROMPT_LEN:] for p in training_input["prompts"]]
  )
  rng = np.random.default_rng(len(training_input["prompts"][0]))
  completion = rng.integers(3, 40, size=(rows, 10))
  attention = np.ones((rows, 10), np.int32)
  attention[:, 8:] = 0
  completion[:, 8:] = tokenizer.pad_id()
  completion[:, 2] = tokenizer.pad_id()  # end-of-turn EOS spelled with the pad id
  loss = attention.copy()
  loss[:, 3:5] = 0  # observation tokens
  rewards = np.zeros((rows, 10), np.float32)
  rewards[:, 2] = 0.25  # turn reward on the last agent token of turn 1
  rewards[:, 7] = 1.0
  return TrajectoryBatch(
    prompt_ids=prompt,
    completion_ids=completion,
    attention_mask=attention,
    loss_mask=loss,
    token_rewards=rewards,
  )


def test_trajectory_source_uses_both_masks():
  config = PpoExtConfig(beta=0.0)
  seen = {}

  def metric_fn(prompts, completions, advantages, rewards, **_):
    seen.update(prompts=prompts, rewards=rewards)
    return {"custom/rows": (len(prompts), np.mean)}

  cluster, learner, data = setup(config, source=multi_turn_source, metric_fns=[metric_fn])
  example = learner._generate_and_compute_advantage(data[0])
  assert seen["prompts"] == list(data[0]["prompts"])  # user metrics get the real prompts
  np.testing.assert_allclose(seen["rewards"], 1.25)
  batch = multi_turn_source(learner, data[0], None)
  np.testing.assert_array_equal(example.attention_mask, batch.attention_mask)
  np.testing.assert_array_equal(example.loss_mask, batch.loss_mask)
  expected = passes.compute_per_token_logps(
    cluster.actor_trainer.model,
    batch.prompt_ids,
    batch.completion_ids,
    pad_id=0,
    eos_id=0,
    attention_mask=batch.attention_mask,
  )
  np.testing.assert_allclose(example.old_per_token_logps, expected, rtol=1e-6)
  outside = np.asarray(batch.loss_mask) == 0
  assert np.all(np.asarray(example.advantages)[outside] == 0)
  learner.train(data)
  assert cluster.actor_trainer.train_steps == 2


def test_bad_trajectory_is_rejected_with_the_field_name():
  def broken(learner, training_input, mode):
    batch = multi_turn_source(learner, training_input, mode)
    batch.loss_mask[:, 9] = 1  # a loss token on padding
    return batch

  cluster, learner, data = setup(PpoExtConfig(beta=0.0), source=broken)
  with pytest.raises(ValueError, match="loss_mask"):
    learner._generate_and_compute_advantage(data[0])


@pytest.mark.parametrize("returned", [None, {"loss_mask": 1}])
def test_a_source_that_returns_no_batch_is_named(returned):
  def source(learner, training_input, mode):
    return returned

  _, learner, data = setup(PpoExtConfig(beta=0.0), source=source)
  kind = type(returned).__name__
  with pytest.raises(TypeError, match=f"source function returned {kind}, not a TrajectoryBatch"):
    learner._generate_and_compute_advantage(data[0])


def test_a_source_is_handed_the_rollout_context_not_the_learner():
  handed = []

  def source(context, training_input, mode):
    handed.append(context)
    return multi_turn_source(context, training_input, mode)

  config = PpoExtConfig(beta=0.0)
  cluster, learner, data = setup(config, source=source)
  learner._generate_and_compute_advantage(data[0])
  assert handed == [RolloutContext(cluster, learner.algo_config)]
  assert handed[0].algo_config is config


def test_resume_restores_step_controller_and_data_position(tmp_path):
  config = PpoExtConfig(kl_ctrl="adaptive", kl_target=10.0, kl_horizon=10)
  cluster, learner, data = setup(config, steps=2, checkpoint_dir=str(tmp_path))
  learner.train(data)
  saved_coef = rollout_phase.kl_coef(config, learner.state)
  assert saved_coef != config.beta

  cluster2, learner2, data2 = setup(config, steps=3, checkpoint_dir=str(tmp_path))
  assert cluster2.actor_trainer.train_steps == 2
  assert rollout_phase.kl_coef(config, learner2.state) == pytest.approx(saved_coef)
  learner2.train(data2)
  assert cluster2.actor_trainer.train_steps == 3
  assert learner2._iter_steps == 3  # two batches skipped, one trained
  coef = history(cluster2, "learner", "kl_coef")
  np.testing.assert_allclose(coef, [saved_coef * 0.92], rtol=1e-6)


@pytest.mark.tunix_facing
def test_one_epoch_updates_skip_the_old_logp_pass_and_train_the_same(monkeypatch):
  """One epoch in one optimizer step, no KL, no rollout correction: no old-log-prob pass
  runs (as tunix's GRPO with one iteration), the update's ratio is exactly 1, and nothing
  logs a sampler-trainer gap; `recompute_old_logps` runs the pass again. The first
  update's loss is the same either way (same seed, same weights, same batch)."""
  losses = {}
  for recompute in (False, True):
    config = PpoExtConfig(
      advantage_estimator="grpo", num_generations=2, kl_penalty="none",
      recompute_old_logps=recompute,
    )  # fmt: skip
    cluster, learner, data = setup(
      config, with_critic=False, reward=spread_reward, num_generations=2
    )
    assert learner._old_logps_in_update is not recompute
    seen = record_log_prob_passes(monkeypatch, cluster)
    learner.train(data)
    monkeypatch.undo()
    assert [name for name, *_ in seen] == (["old_logps"] * 2 if recompute else [])
    assert cluster.actor_trainer.train_steps == 2
    losses[recompute] = history(cluster, "actor", "loss")
    if not recompute:
      np.testing.assert_array_equal(history(cluster, "actor", "ppo_kl"), 0.0)
      np.testing.assert_array_equal(history(cluster, "actor", "pg_clipfrac"), 0.0)
  assert np.all(np.isfinite(losses[False]))
  np.testing.assert_allclose(losses[False][0], losses[True][0], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
  "change",
  [
    {"num_iterations": 2},
    {"kl_penalty": "loss", "kl_loss_coef": 0.01},
    {"kl_penalty": "reward"},
    {"rollout_is": "token", "rollout_is_threshold": 2.0},
    {"recompute_old_logps": True},
  ],
)
def test_the_old_logp_pass_runs_whenever_something_reads_the_old_logps(change):
  """`old_logps_in_update` only for one epoch in one step with nothing before the update
  reading the old log-probs: each of these needs them (a later epoch's ratio, the KL's
  policy side and controller, the correction's weights) or asks for them."""

  class Training:
    mini_batch_size = None

  base = dict(advantage_estimator="grpo", num_generations=2, kl_penalty="none")
  assert old_logps_in_update(PpoExtConfig(**base), Training, tunix_loss=False)
  assert not old_logps_in_update(PpoExtConfig(**base), Training, tunix_loss=True)
  Training.mini_batch_size = 4  # several optimizer steps on one batch
  assert not old_logps_in_update(PpoExtConfig(**base), Training, tunix_loss=False)
  Training.mini_batch_size = None
  assert not old_logps_in_update(PpoExtConfig(**{**base, **change}), Training, tunix_loss=False)
