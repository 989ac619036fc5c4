"""Bad inputs, one table: each gets a clear error or a handled outcome, never a NaN or a crash.

A case with an `error` must raise it with a message naming the field (or episode), the
value and what is allowed; a case without one is handled and asserts its own outcome
(finite numbers, the episode dropped and counted, ...). Cheap cases come first; the ones
that need a model share one module-scoped toy cluster (tunix's real `RLCluster`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers.clusters import toy_cluster
from tunix_ppo_ext import PpoExtConfig, envs
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.data.rewards import DROPPED_METRIC
from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch
from tunix_ppo_ext._src.ops import advantages
from tunix_ppo_ext._src.ops import kl_methods as names
from tunix_ppo_ext._src.ops import ppo_losses as losses
from tunix_ppo_ext._src.run.run_config import load_run_config
from tunix_ppo_ext._src.tunix.learner.ppo_learner import PpoExtLearner
from tunix_ppo_ext._src.tunix.rollout.multi_turn import MultiTurnRollout

pytestmark = pytest.mark.tunix

B, P, T = 4, 8, 8  # rows, prompt width, completion width of the multi-turn cases
NAN, INF = float("nan"), float("inf")


@dataclasses.dataclass(frozen=True)
class Case:
  """`run(tiny)`; `error`/`match`: what it must raise (None: handled, `run` asserts)."""

  run: Callable[[Any], Any]
  error: type[Exception] | None = ValueError
  match: str | None = None
  model: bool = False


def config(**fields: Any) -> Callable[[Any], Any]:
  return lambda _: PpoExtConfig(**fields)


def run_config(*overrides: str) -> Callable[[Any], Any]:
  return lambda _: load_run_config(None, list(overrides))


# ----- trajectories without a model -----


def trajectory(**changes: Any) -> TrajectoryBatch:
  """A valid `[B, T]` two-turn batch (agent, observation, agent, padding), then `changes`."""
  attention = np.ones((B, T), np.int32)
  attention[:, 6:] = 0
  loss = attention.copy()
  loss[:, 2:4] = 0  # observation tokens
  rewards = np.zeros((B, T), np.float32)
  rewards[:, 5] = 1.0
  rng = np.random.default_rng(0)
  batch = TrajectoryBatch(
    prompt_ids=np.full((B, P), 5, np.int32),
    completion_ids=np.where(attention > 0, rng.integers(3, 30, (B, T)), 0).astype(np.int32),
    attention_mask=attention,
    loss_mask=loss,
    token_rewards=rewards,
  )
  return dataclasses.replace(batch, **changes)


def with_cell(name: str, row: int, col: int, value: float) -> Callable[[Any], None]:
  def run(_):
    value_array = np.array(getattr(trajectory(), name), np.float32)
    value_array[row, col] = value
    trajectory(**{name: value_array}).validate()

  return run


# ----- numerical functions (handled: finite, no gradient where nothing is trained) -----


def all_zero_mask_gives_zero_losses_and_gradients(_):
  rng = np.random.default_rng(1)
  logp, old = (jnp.asarray(rng.normal(size=(B, T)) - 2, jnp.float32) for _ in range(2))
  adv = jnp.asarray(rng.normal(size=(B, T)), jnp.float32)
  mask = jnp.zeros((B, T), jnp.float32)
  for mode in losses.LOSS_AGG_MODES:

    def policy(lp, mode=mode):
      return losses.policy_loss(
        lp, old, adv, mask, epsilon_c=3.0, loss_agg_mode=mode, entropy=-lp, entropy_coef=0.01
      )[0]

    loss, grad = jax.value_and_grad(policy)(logp)
    assert float(loss) == 0.0 and not np.any(np.asarray(grad)), mode
    value, grad = jax.value_and_grad(
      lambda v, mode=mode: losses.value_loss(
        v, old, adv, mask, clip_range_value=0.2, loss_agg_mode=mode
      )[0]
    )(logp)
    assert float(value) == 0.0 and not np.any(np.asarray(grad)), mode


def all_zero_mask_gives_zero_advantages(_):
  rewards = jnp.ones((B, T), jnp.float32)
  mask = jnp.zeros((B, T), jnp.float32)
  group_ids = jnp.arange(B) // 2
  outputs = [
    *advantages.compute_gae_advantages(rewards, rewards, mask, 1.0, 0.95, whiten=True),
    *advantages.compute_reinforce_plus_plus_advantages(rewards, mask, 1.0),
    advantages.compute_grpo_advantages(jnp.zeros(B), group_ids, mask),
    advantages.compute_rloo_advantages(jnp.zeros(B), group_ids, mask),
  ]
  for out in outputs:
    assert np.all(np.isfinite(np.asarray(out)))
  assert not np.any(np.asarray(outputs[0]))  # GAE advantages, whitened over no token


def logprob_gaps_of_1e4_stay_finite(_):
  old = jnp.full((B, T), -3.0, jnp.float32)
  gap = jnp.where(jnp.arange(T) % 2 == 0, 1e4, -1e4)
  logp = old + gap
  adv = jnp.where(jnp.arange(B)[:, None] % 2 == 0, 1.0, -1.0) * jnp.ones((B, T))
  mask = jnp.ones((B, T))
  for method in names.kl_method_names():
    assert np.all(np.isfinite(np.asarray(names.compute_kl_divergence(logp, old, method)))), method

    def policy(lp, method=method):
      return losses.policy_loss(
        lp,
        old,
        adv,
        mask,
        epsilon_c=3.0,
        entropy=-lp,
        entropy_coef=0.01,
        ref_per_token_logps=old,
        kl_loss_coef=0.1,
        kl_estimator=names.resolve_kl_method(method).estimator,
        kl_straight_through=names.resolve_kl_method(method).straight_through,
      )[0]

    loss, grad = jax.value_and_grad(policy)(logp)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(grad))), method


def step_output(reward: Any) -> Callable[[Any], Any]:
  return lambda _: envs.validate_step_output("grid", 2, ("", reward, True, False, {}))


# ----- the tiny cluster (module-scoped) and what runs on it -----


class FlakyEnv:
  """Two turns: acknowledge (0.25), then a last turn that misbehaves on odd seeds.

  `fault`: `nan` / `inf` reward, `huge` (3e38 on both turns: finite, but the return
  overflows float32), `raise` (the environment crashes), or `none`.
  """

  name = "flaky"
  max_return = 1.25

  def __init__(self, fault: str = "none", first: str = "see a!", reply: str = "what?"):
    self.fault, self.first, self.reply = fault, first, reply

  def reset(self, seed: int):
    self.seed, self.turn = seed, 0
    return self.first, {}

  def step(self, action: str):
    self.turn += 1
    if self.turn == 1:
      huge = self.fault == "huge" and self.seed % 2
      return self.reply, 3e38 if huge else 0.25, False, False, {}
    if self.seed % 2 and self.fault == "raise":
      raise ZeroDivisionError("scoring an empty answer")
    bad = {"nan": NAN, "inf": INF, "huge": 3e38}.get(self.fault, 1.0) if self.seed % 2 else 1.0
    return "", bad, True, False, {}


@dataclasses.dataclass
class Tiny:
  """A toy tunix cluster; `example(...)` runs the learner's whole rollout/advantage phase.

  What the cluster logs reaches `logged` through tunix's `with_external_metrics_logger`.
  """

  cluster: Any
  logged: list[Any] = dataclasses.field(default_factory=list)

  def __post_init__(self):
    self.cluster.with_external_metrics_logger(self.logged.append)

  def learner(self, reward=None, source=None, **fields: Any) -> PpoExtLearner:
    if source is not None:
      return PpoExtLearner(self.cluster, PpoExtConfig(**fields), trajectory_source=source)
    return PpoExtLearner(self.cluster, PpoExtConfig(**fields), reward_fns=reward or constant_reward)

  def example(self, training_input, reward=None, source=None, **fields: Any):
    learner = self.learner(reward, source, **fields)
    return learner._generate_and_compute_advantage(training_input)

  def learner_metrics(self) -> dict[str, list]:
    """Every value the learner logged (or still buffers) in train mode, by internal name."""
    buffers = [*self.logged, *self.cluster._buffered_train_metrics]
    own = ("batch", "learner", "rollout")
    values: dict[str, list] = {}
    for buffer in buffers:
      if str(buffer.mode) == "train":
        for name, (logged, _) in buffer.metrics.items():
          if name.split("/")[0] in own:
            values.setdefault(name, []).extend(logged)
    return values

  def dropped(self) -> float:
    """The last `learner/dropped_episodes` value logged (published `train/dropped_episodes`)."""
    return self.learner_metrics()[DROPPED_METRIC][-1]

  def example_with_finite_metrics(self, training_input, **kwargs: Any):
    """`example(...)`, checking that every statistic the learner buffered for it is finite."""
    before = self.learner_metrics()
    example = self.example(training_input, **kwargs)
    new = {k: v[len(before.get(k, [])) :] for k, v in self.learner_metrics().items()}
    assert any(new.values())
    for name, values in new.items():
      assert np.all(np.isfinite(np.asarray(values, np.float64))), name
    assert_finite(example)
    return example


@pytest.fixture(scope="module")
def tiny() -> Tiny:
  tokenizer = CharTokenizer()  # pad 0, bos 1, eos 2
  # room per engine call for the multi-turn cases' turns
  return Tiny(toy_cluster(tokenizer, prompt_len=P, tokens_per_call=T + 2, max_steps=1, batch=B))


def constant_reward(prompts, completions, **_):
  return [0.5] * len(completions)


def reward_with(value: float, row: int):
  def odd_reward(prompts, completions, **_):
    return [value if i == row else 0.5 for i in range(len(completions))]

  return odd_reward


PROMPTS = {"prompts": np.array(["say ab:", "say cd:", "say ef:", "say gh:"])}
SEEDS = np.array([2, 3, 4, 6])  # the flaky environment misbehaves on seed 3 (row 1)
EPISODES = {"prompts": SEEDS.astype(str), "seed": SEEDS}


def assert_finite(example) -> None:
  for name in ("advantages", "returns", "old_values", "old_per_token_logps"):
    value = getattr(example, name)
    assert np.all(np.isfinite(np.asarray(value))), name


def rollout(**env_kwargs: Any) -> MultiTurnRollout:
  return MultiTurnRollout(
    FlakyEnv, env_kwargs, max_completion_len=T, max_turns=2, max_turn_tokens=2, group_size=1
  )


def reward_fn_nan_is_rejected(tiny):
  tiny.example(PROMPTS, reward=reward_with(NAN, 1))


def reward_fn_inf_is_dropped_and_counted(tiny):
  example = tiny.example_with_finite_metrics(
    PROMPTS, reward=reward_with(INF, 2), nonfinite_rewards="drop"
  )
  loss, attention = np.asarray(example.loss_mask), np.asarray(example.attention_mask)
  assert not loss[2].any() and not np.asarray(example.advantages)[2].any()
  np.testing.assert_array_equal(loss[[0, 1, 3]], attention[[0, 1, 3]])  # the others train
  assert tiny.dropped() == 1


def reward_fn_inf_everywhere_is_dropped_with_a_warning(tiny):
  everywhere = lambda prompts, completions, **_: [INF] * len(completions)  # noqa: E731
  with pytest.warns(RuntimeWarning, match=r"every episode of the batch \(4\) has a non-finite"):
    example = tiny.example_with_finite_metrics(PROMPTS, reward=everywhere, nonfinite_rewards="drop")
  assert not np.asarray(example.loss_mask).any() and tiny.dropped() == 4


def env_nan_reward_is_rejected(tiny):
  tiny.example(EPISODES, source=rollout(fault="nan"))


def env_inf_reward_is_dropped_and_counted(tiny):
  example = tiny.example_with_finite_metrics(
    EPISODES, source=rollout(fault="inf"), nonfinite_rewards="drop"
  )
  loss = np.asarray(example.loss_mask)
  assert not loss[1].any() and (loss[[0, 2, 3]].sum(axis=1) > 0).all()
  assert tiny.dropped() == 1


def env_overflowing_return_is_rejected(tiny):
  tiny.example(EPISODES, source=rollout(fault="huge"))


def env_overflowing_return_is_dropped_and_counted(tiny):
  example = tiny.example_with_finite_metrics(
    EPISODES, source=rollout(fault="huge"), nonfinite_rewards="drop"
  )
  assert not np.asarray(example.loss_mask)[1].any() and tiny.dropped() == 1


def env_raising_mid_episode(tiny):
  tiny.example(EPISODES, source=rollout(fault="raise"))


def source_nan_reward_is_rejected(tiny):
  rewards = trajectory().token_rewards.copy()
  rewards[3, 5] = NAN
  tiny.example(PROMPTS, source=lambda *_: trajectory(token_rewards=rewards))


def all_zero_loss_mask_through_the_learner_and_trainers(tiny):
  zero = np.zeros((B, T), np.int32)
  example = tiny.example_with_finite_metrics(PROMPTS, source=lambda *_: trajectory(loss_mask=zero))
  assert not np.asarray(example.advantages).any()
  for trainer in (tiny.cluster.actor_trainer, tiny.cluster.critic_trainer):
    (loss, _), grads = loss_and_grads(trainer, example)
    assert float(loss) == 0.0
    assert not any(np.any(np.asarray(g)) for g in jax.tree.leaves(grads))


def loss_and_grads(trainer, example):
  """The trainer's loss and gradients on `example`, computed as tunix's jitted train step does."""

  @nnx.jit
  def step(model, example):
    inputs = trainer.gen_model_input_fn(example)
    return nnx.value_and_grad(trainer.loss_fn, has_aux=True)(model, **inputs)

  return step(trainer.model, example)


def empty_prompts_are_handled(tiny):
  prompts = {"prompts": np.array(["", "say ab:", "", "x"])}
  example = tiny.example_with_finite_metrics(prompts)
  pad = tiny.cluster.rollout.pad_id()
  assert (np.asarray(example.prompt_ids)[[0, 2]] != pad).sum(axis=1).tolist() == [1, 1]  # BOS


def empty_first_observation_is_handled(tiny):
  example = tiny.example(EPISODES, source=rollout(first=""))
  assert_finite(example)


def prompt_longer_than_the_context(tiny):
  tiny.example({"prompts": np.array(["say a very long prompt:", "a", "b", "c"])})


def first_observation_longer_than_the_context(tiny):
  tiny.example(EPISODES, source=rollout(first="see a very long observation!"))


def episodes_longer_than_the_width_are_cut_and_counted(tiny):
  source = MultiTurnRollout(
    FlakyEnv, {"reply": "keep going."}, max_completion_len=T, max_turns=2, group_size=1
  )
  seen = []
  example = tiny.example(EPISODES, source=lambda *args: seen.append(source(*args)) or seen[-1])
  assert_finite(example)
  assert np.asarray(example.completion_ids).shape == (B, T)
  assert seen[-1].truncated.all()


CASES: dict[str, Case] = {
  # PpoExtConfig fields: out of range, wrong type, unknown names
  "config_epsilon_out_of_range": Case(config(epsilon=1.5), match=r"epsilon=1.5 .*\(0.0, 1.0\)"),
  "config_epsilon_is_a_string": Case(config(epsilon="0.2"), match=r"epsilon='0.2' .*number"),
  "config_gamma_nan": Case(config(gamma=NAN), match=r"gamma=nan .*\[0.0, 1.0\]"),
  "config_entropy_coef_negative": Case(config(entropy_coef=-0.1), match="entropy_coef=-0.1"),
  "config_num_generations_zero": Case(
    config(num_generations=0), match=r"num_generations=0 .*integer >= 1"
  ),
  "config_num_iterations_float": Case(config(num_iterations=1.5), match="num_iterations=1.5"),
  "config_kl_penalty_typo": Case(config(kl_penalty="rewards"), match="did you mean 'reward'"),
  "config_kl_method_unknown": Case(config(kl_method="k4"), match="kl_method"),
  "config_full_kl_in_reward": Case(
    config(kl_method="full", kl_penalty="reward"), match="kl_penalty='loss'"
  ),
  "config_dual_clip_below_one": Case(config(epsilon_c=0.5), match=r"epsilon_c=0.5 .*\(1.0"),
  "config_whiten_not_bool": Case(config(whiten_advantages="yes"), match="True or False"),
  "config_loss_agg_mode_unknown": Case(config(loss_agg_mode="mean"), match="loss_agg_mode"),
  "config_max_nonfinite_steps_zero": Case(
    config(max_nonfinite_steps=0), match=r"max_nonfinite_steps=0 .*integer >= 1"
  ),
  "config_max_nonfinite_steps_bool": Case(
    config(max_nonfinite_steps=True), match="max_nonfinite_steps=True"
  ),
  "config_nonfinite_rewards_unknown": Case(
    config(nonfinite_rewards="ignore"), match=r"nonfinite_rewards='ignore' .*'error', 'drop'"
  ),
  # run-config keys (the CLI's KEY=VALUE overrides)
  "run_unknown_ppo_key": Case(
    run_config("ppo.epsilonn=0.2"), match="unknown config key 'ppo.epsilonn'.*'epsilon'"
  ),
  "run_lr_not_a_number": Case(run_config("train.lr=fast"), match="'train.lr' must be float"),
  "run_steps_negative": Case(run_config("train.steps=-1"), match="'train.steps'=-1 is invalid"),
  "run_temperature_zero": Case(run_config("train.temperature=0"), match="train.temperature"),
  "run_temperature_inf": Case(
    run_config("train.temperature=.inf"), match="'train.temperature'=inf"
  ),
  "run_lr_inf": Case(run_config("train.lr=.inf"), match=r"'train.lr'=inf is invalid: .*finite"),
  # finite but absurd: one applied update leaves ~1e30 weights, every later one is NaN
  "run_lr_1e30": Case(
    run_config("train.lr=1e30"), match=r"'train.lr'=1e\+30 is invalid: .*\(0.0, 1.0\]"
  ),
  "run_critic_lr_2": Case(
    run_config("train.critic_lr=2"), match=r"'train.critic_lr'=2.0 is invalid: .*\(0.0, 1.0\]"
  ),
  "run_temperature_1e-30": Case(
    run_config("train.temperature=1e-30"), match=r"'train.temperature'=1e-30 is invalid"
  ),
  "run_seed_negative": Case(run_config("seed=-1"), match=r"'seed'=-1 is invalid"),
  "run_eval_batches_negative": Case(
    run_config("train.eval_batches=-1"), match=r"'train.eval_batches'=-1 is invalid"
  ),
  "run_num_heads_zero": Case(run_config("model.num_heads=0"), match=r"'model.num_heads'=0"),
  "run_kv_heads_do_not_divide": Case(
    run_config("model.num_kv_heads=3"), match=r"'model.num_kv_heads'=3 must divide"
  ),
  "run_alphabet_repeated": Case(
    run_config("model.alphabet=abca"), match=r"'model.alphabet'.*repeated: \['a'\]"
  ),
  "run_output_dir_empty": Case(run_config("output_dir=''"), match="'output_dir'"),
  # a group estimator's groups of one: no baseline, each advantage the episode's own score
  "run_grpo_groups_of_one": Case(
    run_config("ppo.advantage_estimator=grpo", "ppo.num_generations=1"),
    match=r"'ppo.num_generations'=1 is invalid: must be at least 2 with advantage_estimator='grpo'",
  ),
  "run_rloo_groups_of_one": Case(
    run_config("ppo.advantage_estimator=rloo", "ppo.num_generations=1"),
    match=r"'ppo.num_generations'=1 is invalid: must be at least 2 with advantage_estimator='rloo'",
  ),
  # the game's own max_turns above the rollout's: every episode cut before its last guess
  "run_guess_cut_by_env_max_turns": Case(
    run_config(
      "env.name=guess",
      "model.alphabet=null",
      "train.max_prompt_length=128",
      "env.kwargs.max_turns=6",
      "env.kwargs.turn_penalty=0.1",
    ),
    match=r"'env.max_turns'=4 is below the 'guess' environment's own max_turns=6",
  ),
  # the built-in tokenizer's alphabet without the game's letters: refused when the first
  # rollout encoded it, after the models were built (exit 1)
  "run_guess_letters_outside_the_alphabet": Case(
    run_config("env.name=guess", "train.max_prompt_length=128"),
    match=r"'model.alphabet': the 'guess' environment's first observation cannot be tokenised",
  ),
  "run_lora_rank_zero": Case(
    run_config("model.lora={rank: 0}"), match=r"'model.lora.rank'=0 is invalid"
  ),
  "run_lora_rank_float": Case(
    run_config("model.lora={rank: 1.5}"), match=r"'model.lora.rank' must be int, got 1.5"
  ),
  "run_lora_alpha_zero": Case(
    run_config("model.lora={alpha: 0}"), match=r"'model.lora.alpha'=0.0 is invalid"
  ),
  "run_lora_alpha_inf": Case(
    run_config("model.lora={alpha: .inf}"), match=r"'model.lora.alpha'=inf is invalid"
  ),
  "run_lora_unknown_key": Case(
    run_config("model.lora={rnak: 4}"), match=r"'model.lora.rnak'.*did you mean 'rank'"
  ),
  "run_lora_targets_empty": Case(
    run_config("model.lora={target_modules: ''}"), match=r"'model.lora.target_modules'='' is empty"
  ),
  "run_lora_targets_not_a_regex": Case(
    run_config("model.lora={target_modules: 'q_proj('}"),
    match=r"'model.lora.target_modules'='q_proj\(' is not a regular expression",
  ),
  "run_lora_targets_match_nothing": Case(
    run_config("model.lora={target_modules: 'q_proj'}"),
    match=r"'model.lora.target_modules'='q_proj' matches no module of the Qwen3 policy .*"
    r"'layers/N/attn/q_proj'",
  ),
  "run_lora_critic_targets_match_nothing": Case(
    run_config("model.lora={target_modules: 'layers/.*', critic: true}"),
    match=r"'model.lora.target_modules'='layers/.\*' matches no module of the Qwen3 policy's "
    r"critic \(lora.critic\)",
  ),
  "run_prompt_length_below_first_observation": Case(
    run_config("train.max_prompt_length=3"), match=r"'train.max_prompt_length'=3 is below"
  ),
  "run_completion_needing_terabytes": Case(
    run_config("env.max_completion_len=10000000000"), match=r"needs a KV cache of .* GiB"
  ),
  "run_override_bad_yaml": Case(
    run_config("train.steps=[1"), match=r"override 'train.steps=\[1': invalid YAML"
  ),
  "run_rename_onto_a_published_key": Case(
    run_config("metrics.rename={actor/pg_loss: actor/kl}"), match="already published"
  ),
  "run_echo_trap_fraction": Case(
    run_config("metrics.echo_trap.return_frac=2"),
    match=r"^config key 'metrics.echo_trap.return_frac'=2.0 is invalid: must be a finite",
  ),
  "run_echo_trap_not_a_mapping": Case(
    run_config("metrics.echo_trap=5"), match=r"^metrics.echo_trap must be a mapping, got 5$"
  ),
  "run_unknown_environment": Case(run_config("env.name=mazee"), match="env.name"),
  "run_wandb_mode": Case(run_config("wandb=sometimes"), match="'wandb'='sometimes' unknown"),
  "run_kv_cache": Case(
    run_config("env.kv_cache=reencod"),
    match="'env.kv_cache'='reencod' unknown; did you mean 'reencode'",
  ),
  "run_batch_not_multiple_of_group": Case(
    run_config("ppo.num_generations=4", "train.batch_size=6"),
    match="multiple of ppo.num_generations=4",
  ),
  "run_nonfinite_rewards_unknown": Case(
    run_config("ppo.nonfinite_rewards=skip"), match="config key 'ppo.nonfinite_rewards'='skip'"
  ),
  "run_max_nonfinite_steps_negative": Case(
    run_config("ppo.max_nonfinite_steps=-3"), match="config key 'ppo.max_nonfinite_steps'=-3"
  ),
  # built-in environments' kwargs: one check for every one (floats and strings refused at
  # load, by key), and generators that cannot meet their kwargs named at load
  "run_memory_num_turns_float": Case(
    run_config("env.kwargs.num_turns=2.5"),
    match=r"'env.kwargs'.*num_turns=2.5 is invalid: must be an integer >= 2",
  ),
  "run_countdown_min_numbers_float": Case(
    run_config("env.name=countdown", "env.kwargs.min_numbers=2.5"),
    match=r"'env.kwargs'.*min_numbers=2.5 is invalid: must be an integer >= 2",
  ),
  "run_countdown_unreachable_targets": Case(
    run_config(
      "env.name=countdown",
      "env.kwargs={max_value: 9, max_numbers: 3, min_target: 5000, max_target: 5001}",
    ),
    match=r"countdown: no problem with a target in \[min_target=5000, max_target=5001\]",
  ),
  "run_sokoban_max_steps_string": Case(
    run_config("env.name=sokoban", "env.kwargs.max_steps='3'"),
    match=r"'env.kwargs'.*max_steps='3' is invalid: must be an integer >= 1",
  ),
  "run_sokoban_unreachable_distance": Case(
    run_config("env.name=sokoban", "env.kwargs.min_distance=9"),
    match=r"sokoban: no room with every box at least min_distance .*min_distance=9",
  ),
  "run_frozenlake_map_name_unknown": Case(
    run_config("env.name=frozenlake", "env.kwargs.map_name=9x9"),
    match=r"'env.kwargs'.*map_name='9x9' is invalid: must be one of \['4x4', '8x8'\]",
  ),
  "run_frozenlake_lowercase_desc": Case(
    run_config("env.name=frozenlake", "env.kwargs.desc=[sfff, fhfh, fffh, hffg]"),
    match=r"desc=.* is invalid: must be only the cells S, F, H, G \(uppercase",
  ),
  "run_frozenlake_max_steps_string": Case(
    run_config("env.name=frozenlake", "env.kwargs.max_steps='3'"),
    match=r"max_steps='3' is invalid",
  ),
  # trajectories: shapes, mask values, rewards
  "trajectory_completion_1d": Case(
    lambda _: trajectory(completion_ids=np.zeros(T, np.int32)).validate(),
    match=r"completion_ids shape \(8,\) must be \[B, T\]",
  ),
  "trajectory_prompt_rows_differ": Case(
    lambda _: trajectory(prompt_ids=np.ones((B + 1, P), np.int32)).validate(),
    match=r"prompt_ids shape \(5, 8\) must be \[B=4, P\]",
  ),
  "trajectory_loss_mask_wrong_shape": Case(
    lambda _: trajectory(loss_mask=np.ones((B, T + 1), np.int32)).validate(),
    match=r"loss_mask shape \(4, 9\) must equal completion_ids' \(4, 8\)",
  ),
  "trajectory_attention_mask_holds_2": Case(
    with_cell("attention_mask", 1, 0, 2), match=r"attention_mask must hold only 0 and 1; row 1"
  ),
  "trajectory_loss_mask_holds_half": Case(
    with_cell("loss_mask", 2, 0, 0.5), match=r"loss_mask must hold only 0 and 1; row 2 .*0.5"
  ),
  "trajectory_loss_mask_nan": Case(
    with_cell("loss_mask", 0, 1, NAN), match=r"loss_mask must hold only 0 and 1; row 0 .*nan"
  ),
  "trajectory_loss_on_padding": Case(
    with_cell("loss_mask", 0, 7, 1), match="loss_mask marks tokens that attention_mask"
  ),
  "trajectory_reward_inf": Case(
    with_cell("token_rewards", 3, 5, INF), match=r"NaN or inf in episode row\(s\) \[3\]"
  ),
  "trajectory_group_ids_wrong_shape": Case(
    lambda _: trajectory(group_ids=np.zeros(B + 1, np.int32)).validate(),
    match=r"group_ids shape \(5,\) must be \[B=4\]",
  ),
  # numerical functions
  "numerics_all_zero_mask_losses": Case(all_zero_mask_gives_zero_losses_and_gradients, None),
  "numerics_all_zero_mask_advantages": Case(all_zero_mask_gives_zero_advantages, None),
  "numerics_logprob_gap_1e4": Case(logprob_gaps_of_1e4_stay_finite, None),
  # environment outputs
  "env_reward_nan": Case(step_output(NAN), match="environment 'grid', turn 2: reward must be"),
  "env_reward_not_a_number": Case(step_output("1"), match="turn 2: reward must be a real number"),
  "rollout_max_turns_zero": Case(
    lambda _: MultiTurnRollout(max_completion_len=T, max_turns=0), match="max_turns must be >= 1"
  ),
  # with a model: rewards, environments, masks, prompts and lengths end to end
  "reward_fn_nan": Case(
    reward_fn_nan_is_rejected,
    match=r"reward function 'odd_reward' returned nan for episode row 1 \(prompt 'say cd:'",
    model=True,
  ),
  "reward_fn_inf_dropped": Case(reward_fn_inf_is_dropped_and_counted, None, model=True),
  "env_overflowing_return_rejected": Case(
    env_overflowing_return_is_rejected,
    match=r"non-finite reward \(or a return past float32's range\) in 1 episode\(s\): row 1",
    model=True,
  ),
  "env_overflowing_return_dropped": Case(
    env_overflowing_return_is_dropped_and_counted, None, model=True
  ),
  "env_nan_reward_rejected": Case(
    env_nan_reward_is_rejected,
    match=r"environment 'flaky', turn 2: reward must be finite, got nan .*\(episode row 1\)",
    model=True,
  ),
  "reward_fn_inf_everywhere": Case(
    reward_fn_inf_everywhere_is_dropped_with_a_warning, None, model=True
  ),
  "env_inf_reward_dropped": Case(env_inf_reward_is_dropped_and_counted, None, model=True),
  "env_raises_mid_episode": Case(
    env_raising_mid_episode,
    RuntimeError,
    r"environment 'flaky', turn 2, episode row 1: step\(.*\) raised ZeroDivisionError",
    model=True,
  ),
  "source_nan_reward_rejected": Case(
    source_nan_reward_is_rejected,
    match=r"non-finite reward \(or a return .*\) in 1 episode\(s\): row 3 \(reward nan\)",
    model=True,
  ),
  "all_zero_loss_mask_batch": Case(
    all_zero_loss_mask_through_the_learner_and_trainers, None, model=True
  ),
  "empty_prompts": Case(empty_prompts_are_handled, None, model=True),
  "empty_first_observation": Case(empty_first_observation_is_handled, None, model=True),
  "prompt_longer_than_context": Case(
    prompt_longer_than_the_context,
    match=r"prompt of episode row 0 is 24 tokens .* max_prompt_length=8",
    model=True,
  ),
  "observation_longer_than_context": Case(
    first_observation_longer_than_the_context,
    match=r"environment 'flaky': first observation is 29 tokens, longer than .* 8",
    model=True,
  ),
  "episode_longer_than_width": Case(
    episodes_longer_than_the_width_are_cut_and_counted, None, model=True
  ),
}


def test_the_table_is_large_enough():
  assert len(CASES) >= 25
  assert [case.model for case in CASES.values()] == sorted(c.model for c in CASES.values())


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name, request):
  case = CASES[name]
  model = request.getfixturevalue("tiny") if case.model else None
  if case.error is None:
    case.run(model)  # handled: the case asserts its outcome
    return
  with pytest.raises(case.error, match=case.match):
    case.run(model)


def test_exponent_floats_without_a_dot_are_floats(tmp_path):
  """PyYAML reads `1e-4` as a string; config files, overrides and a run's config.json
  (which writes `1e-08`) give floats."""
  file = tmp_path / "run.yaml"
  file.write_text("train:\n  lr: 1e-4\noptim:\n  actor:\n    eps: 1e-08\n")
  run = load_run_config(str(file), ["train.critic_lr=2E-3"])
  assert (run.train.lr, run.train.critic_lr) == (1e-4, 2e-3)
  assert run.optim.actor.eps == 1e-8


@pytest.mark.parametrize("loss", ["policy_loss", "sapo_loss", "cispo_loss"])
def test_ppo_kl_clamps_the_log_ratio_like_verl(loss):
  """`actor/ppo_kl` is the masked mean of `old - logp` after the ±20 clamp verl applies
  before averaging (PPO, SAPO, CISPO): a log-ratio of 30 counts as 20."""
  from tunix_ppo_ext import ops

  logp = np.array([[-1.0, -2.0, -0.5]], np.float32)
  old = logp - np.array([[30.0, 0.1, -0.2]], np.float32)
  mask = np.ones_like(logp)
  reference = np.mean(-np.clip(logp - old, -20.0, 20.0))  # verl: -6.633 (unclamped -9.967)
  _, metrics = getattr(ops, loss)(
    jnp.asarray(logp), jnp.asarray(old), jnp.ones(1), jnp.asarray(mask)
  )
  np.testing.assert_allclose(float(metrics["ppo_kl"]), reference, rtol=1e-5)
  assert abs(float(metrics["ppo_kl"]) - -6.6333) < 1e-3
