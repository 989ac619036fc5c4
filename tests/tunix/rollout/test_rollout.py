"""MultiTurnRollout on a real tunix RLCluster (vanilla engine) with a toy Qwen3.

The tokenizer's alphabet is just MemoryEnv's characters (vocab 17, pad 0, bos 1, eos 2),
and an untrained policy ends about one turn in five (of up to G=4 tokens) with EOS: both
kinds of turn ends (EOS and the per-turn token limit) occur in every test batch.
"""

import dataclasses

import numpy as np
import pytest

from tests.helpers.clusters import (
  assert_training_moves_the_policy,
  multi_turn_learner,
  record_turns,
)
from tunix_ppo_ext import PpoExtConfig
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.data.trajectory import (
  MultiTurnBatch,
  TrajectoryBatch,
  episode_batches,
  episode_seeds,
  sampler_logprob_gap,
  spread_env_ids,
)
from tunix_ppo_ext._src.envs.base import EnvSpec
from tunix_ppo_ext._src.envs.memory import MemoryEnv
from tunix_ppo_ext._src.tunix.learner import passes
from tunix_ppo_ext._src.tunix.rollout.multi_turn import Mode, MultiTurnRollout

# tunix_facing: also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.tunix, pytest.mark.tunix_facing]

ALPHABET = "abcehikstw!.? "
PAD, EOS = 0, 2
P, T, G = 8, 28, 4  # max_prompt_length, max_completion_len, max_turn_tokens


@pytest.fixture(scope="module")
def world():
  """`(tokenizer, policy, learner)` on a cluster sized for T + G tokens per call."""
  tokenizer = CharTokenizer(ALPHABET, pad_id=PAD, eos_id=EOS)
  source = MultiTurnRollout(max_completion_len=T, max_turn_tokens=G)
  learner = multi_turn_learner(tokenizer, 0, source, prompt_len=P)
  return tokenizer, learner.rl_cluster.actor_trainer.model, learner


def repeated(batch, times):
  """What tunix does to a training input before the learner sees it."""
  return {key: np.repeat(value, times, axis=0) for key, value in batch.items()}


def replay(tokenizer, seed, outputs, row, env_kwargs):
  """The trajectory one row should have, rebuilt from the engine outputs and a fresh env.

  Returns `(tokens, loss, known, logps, rewards_at, contexts)`; `contexts[k]` is what the
  sampler should have been given for turn k.
  """
  env = MemoryEnv(**env_kwargs)
  observation, _ = env.reset(seed=int(seed))
  prompt = [tokenizer.bos_id(), *tokenizer.encode(observation)]
  tokens, loss, known, logps, rewards_at, contexts = [], [], [], [], {}, []
  for output in outputs:
    contexts.append(prompt + tokens)
    agent = output.tokens[row].tolist()
    tokens += agent + [EOS] * (len(agent) < G)
    loss += [1] * (len(tokens) - len(loss))
    known += [1] * len(agent) + [0] * (len(tokens) - len(known) - len(agent))
    logps += list(output.logprobs[row]) + [0.0] * (len(tokens) - len(logps) - len(agent))
    observation, reward, terminated, _, _ = env.step(tokenizer.decode(agent))
    rewards_at[len(tokens) - 1] = reward
    if terminated:
      break
    obs_ids = tokenizer.encode(observation)
    tokens += obs_ids
    loss += [0] * len(obs_ids)
    known += [0] * len(obs_ids)
    logps += [0.0] * len(obs_ids)
  return tokens, loss, known, logps, rewards_at, contexts


def test_trajectories_are_the_engine_tokens_exactly(world, monkeypatch):
  tokenizer, _, learner = world
  env_kwargs = {"num_turns": 3}
  source = MultiTurnRollout(
    "memory", env_kwargs, max_completion_len=T, max_turn_tokens=G, group_size=2
  )
  turns = record_turns(monkeypatch)
  data = repeated(next(episode_batches(1, 8, seed=0)), 2)
  batch = source(learner, data, Mode.TRAIN)
  outputs = [output for _, output in turns]

  assert isinstance(batch, MultiTurnBatch)
  batch.validate()
  assert len(outputs) == 3  # one sampler call per turn, all 16 rows each time
  assert outputs[0].reencoded and not outputs[1].reencoded  # turn 2 continues turn 1
  np.testing.assert_array_equal(batch.group_ids, np.arange(16) // 2)
  np.testing.assert_array_equal(batch.prompt_ids[0::2], batch.prompt_ids[1::2])
  eos_turns = 0
  for row, seed in enumerate(data["seed"]):
    tokens, loss, known, logps, rewards_at, contexts = replay(
      tokenizer, seed, outputs, row, env_kwargs
    )
    n = len(tokens)
    assert n <= T  # nothing is cut at this width
    np.testing.assert_array_equal(batch.prompt_ids[row][-len(contexts[0]) :], contexts[0])
    np.testing.assert_array_equal(batch.prompt_ids[row][: -len(contexts[0])], PAD)
    np.testing.assert_array_equal(batch.completion_ids[row], tokens + [PAD] * (T - n))
    np.testing.assert_array_equal(batch.attention_mask[row], [1] * n + [0] * (T - n))
    np.testing.assert_array_equal(batch.loss_mask[row], loss + [0] * (T - n))
    np.testing.assert_array_equal(batch.sampler_logp_mask[row], known + [0] * (T - n))
    np.testing.assert_allclose(batch.sampler_logps[row], logps + [0.0] * (T - n), rtol=0)
    expected_rewards = np.zeros(T, np.float32)
    for position, reward in rewards_at.items():
      expected_rewards[position] = reward
    np.testing.assert_array_equal(batch.token_rewards[row], expected_rewards)
    assert batch.token_rewards[row].sum() == pytest.approx(batch.episode_returns[row])
    eos_turns += sum(t == EOS for t, agent in zip(tokens, loss, strict=True) if agent)
    for turn, context in enumerate(contexts):  # the sampler saw the trajectory, EOS included
      assert turns[turn][0][row] == context
  assert 0 < eos_turns < 16 * 3  # both turn ends occur
  np.testing.assert_array_equal(batch.num_turns, 3)
  assert not batch.truncated.any()
  assert batch.texts[0] == tokenizer.decode(batch.completion_ids[0].tolist())


class CountingEnv:
  """Reward `turn` on every turn, fixed observations: makes moved rewards visible."""

  name = "counting"

  def __init__(self, num_turns=2):
    self.num_turns, self.max_return = num_turns, num_turns * (num_turns + 1) / 2

  def reset(self, seed):
    self.turn = 0
    return "see a!", {}

  def step(self, action):
    self.turn += 1
    return "wait.", float(self.turn), self.turn == self.num_turns, False, {}


@pytest.mark.parametrize("width", [8, 6])
def test_long_episodes_are_cut_and_counted(world, width):
  _, _, learner = world
  source = MultiTurnRollout(CountingEnv, max_completion_len=width, group_size=1)
  batch = source(learner, next(episode_batches(1, 16, seed=1)), Mode.TRAIN)
  batch.validate()
  assert batch.completion_ids.shape == (16, width)
  # Turn 1 is 1-2 tokens, "wait." 5: width 6 never fits turn 2 (out of room after turn 1);
  # width 8 cuts the rows whose two turns take 2 tokens each inside turn 2.
  lengths = batch.attention_mask.sum(-1)
  if width == 6:
    assert batch.truncated.all()
    np.testing.assert_array_equal(batch.num_turns, 1)
  else:
    assert 0 < batch.truncated.mean() < 1.0
    np.testing.assert_array_equal(batch.num_turns, 2)
  np.testing.assert_array_equal(batch.turn_limited, False)
  np.testing.assert_allclose(batch.token_rewards.sum(-1), batch.episode_returns)
  rewarded = batch.token_rewards != 0
  assert np.all(batch.loss_mask[rewarded] == 1)  # rewards sit on agent tokens only
  for row in np.flatnonzero(batch.truncated):  # the last turn's reward (= its number) kept
    last_agent = np.flatnonzero(batch.loss_mask[row])[-1]
    assert batch.token_rewards[row, last_agent] == batch.num_turns[row]
    assert lengths[row] == width or batch.num_turns[row] == 1


class ScriptedEnv:
  """An environment playing a script: `reset` shows `first` and restarts the turn count,
  `step` answers whatever the agent says with `reply(turn)` (turns from 1)."""

  first = "see a!"

  def reset(self, seed):
    self.turn = 0
    return self.first, {}

  def step(self, action):
    self.turn += 1
    return self.reply(self.turn)


class FlaggingEnv(ScriptedEnv):
  """Reward `2**turn` (so a token's reward says which turns landed on it); turns 1 and 2
  are malformed (`info["invalid_action"]`); three turns with the observation "wait."."""

  name = "flagging"
  max_return = 14.0
  first = "see b!"

  def reply(self, turn):
    return "wait.", float(2**turn), turn == 3, False, {"invalid_action": turn < 3}


@pytest.mark.parametrize("width", [T, 8])
def test_malformed_turns_sit_on_their_reward_tokens_in_a_mixed_batch(world, width):
  _, _, learner = world
  envs = [EnvSpec(MemoryEnv, tag="memory"), EnvSpec(FlaggingEnv, tag="flag")]
  source = MultiTurnRollout(envs=envs, max_completion_len=width, max_turns=3, group_size=1)
  data = next(episode_batches(1, 16, seed=3, env_ids=spread_env_ids([8, 8])))
  batch = source(learner, data, Mode.TRAIN)
  batch.validate()
  flagging = data["env"] == 1
  tokenizer = learner.rl_cluster.tokenizer
  starts = [tokenizer.decode([t for t in row if t > EOS]) for row in batch.prompt_ids]
  memory = [MemoryEnv().reset(int(s))[0] for s in data["seed"]]
  assert starts == [m if not f else "see b!" for f, m in zip(flagging, memory, strict=True)]
  # reference: the turns whose reward landed on a token, read from the reward's bits
  rewards = np.where(flagging[:, None], batch.token_rewards, 0).astype(np.int64)
  expected = ((rewards >> 1) & 1) + ((rewards >> 2) & 1)  # turns 1 and 2 are malformed
  np.testing.assert_array_equal(batch.malformed_turns, expected)
  assert expected[flagging].sum(-1).min() >= 1  # turn 1 is always played
  if width < T:  # episodes cut in turn 2: its reward (and count) moved to a kept token
    assert np.any(batch.truncated[flagging] & (batch.attention_mask[flagging].sum(-1) == width))
  with pytest.raises(ValueError, match=r"'env' must hold one index in \[0, 2\)"):
    source(learner, {**data, "env": data["env"] + 1}, Mode.TRAIN)


def test_turn_limit_is_counted(world):
  _, _, learner = world
  source = MultiTurnRollout(CountingEnv, {"num_turns": 5}, max_completion_len=T, max_turns=2)
  batch = source(learner, next(episode_batches(1, 4, seed=2)), Mode.TRAIN)
  np.testing.assert_array_equal(batch.num_turns, 2)
  assert batch.turn_limited.all()
  np.testing.assert_allclose(batch.token_rewards.sum(-1), 3.0)
  last = batch.attention_mask.sum(-1) - 1  # no dangling observation after the last turn
  np.testing.assert_array_equal(batch.loss_mask[np.arange(4), last], 1)
  np.testing.assert_array_equal(batch.token_rewards[np.arange(4), last], 2.0)


def trainer_logps(policy, batch):
  """The trainer's per-token log-probs of `batch`'s completions under `policy`."""
  return passes.compute_per_token_logps(
    policy,
    batch.prompt_ids,
    batch.completion_ids,
    pad_id=PAD,
    eos_id=EOS,
    attention_mask=batch.attention_mask,
  )


def sampled_pad_free(batch):
  """Agent tokens with no sampled pad-id token before them in their row.

  tunix's sampler masks every pad-id token it sees (attention; positions too in the
  prompt), while the trajectory's attention mask keeps a sampled one: past one, the
  sampler's and the trainer's contexts differ.
  """
  sampled_pad = (batch.completion_ids == PAD) & (batch.loss_mask > 0)
  before = np.cumsum(sampled_pad, axis=1) - sampled_pad
  return (batch.loss_mask > 0) & (before == 0)


def test_sampler_logps_match_the_trainer_only_with_exact_contexts(world):
  """At temperature 1 the sampler's log-probs equal the trainer's when the sampler saw the
  trajectory's own ids (EOS included), continued from the KV cache or re-encoded every turn;
  given text, later turns lack the EOS tokens."""
  tokenizer, policy, learner = world
  gaps = {}
  for context, kv_cache in (("tokens", "continue"), ("tokens", "reencode"), ("text", "continue")):
    source = MultiTurnRollout(
      "memory",
      {"num_turns": 3},
      max_completion_len=T,
      max_turn_tokens=G,
      group_size=1,
      context=context,
      kv_cache=kv_cache,
    )
    batch = source(learner, next(episode_batches(1, 16, seed=0)), Mode.TRAIN)
    old = trainer_logps(policy, batch)
    clean, known = sampled_pad_free(batch), batch.sampler_logp_mask > 0
    eos = (batch.completion_ids == EOS) & (batch.loss_mask > 0)
    after_eos = np.cumsum(eos, axis=1) > 0
    print(context, kv_cache, "clean known tokens after an EOS:", after_eos[clean & known].sum())
    print("turns that re-encoded:", batch.metrics.get("rollout/reencoded_turns"))
    assert after_eos[clean & known].sum() >= 5
    gaps[kv_cache if context == "tokens" else context] = (
      sampler_logprob_gap(batch, old, clean),
      sampler_logprob_gap(batch, old, clean & after_eos),
      sampler_logprob_gap(batch, old, batch.loss_mask),
    )
  print("logprob gaps (clean, clean after an EOS, all agent tokens):", gaps)
  for exact in ("continue", "reencode"):
    assert gaps[exact][0] < 1e-5 and gaps[exact][1] < 1e-5
  assert gaps["text"][1] > 1e-2


def test_logprob_gap_function():
  completion = np.zeros((2, 4), np.int32)
  batch = TrajectoryBatch(
    prompt_ids=np.zeros((2, 1), np.int32),
    completion_ids=completion,
    attention_mask=np.ones_like(completion),
    loss_mask=np.array([[1, 1, 0, 0], [1, 1, 1, 1]]),
    token_rewards=np.zeros((2, 4), np.float32),
    sampler_logps=np.array([[-1.0, -2.0, 0.0, 0.0], [-0.5, 0.0, -1.0, -3.0]]),
  )
  old = np.array([[-1.5, -2.0, -9.0, -9.0], [-0.5, -4.0, -1.25, -3.0]])
  assert sampler_logprob_gap(batch, old, batch.loss_mask) == pytest.approx((0.5 + 4 + 0.25) / 6)
  known = np.array([[1, 1, 0, 0], [1, 0, 1, 1]])
  multi = MultiTurnBatch(**vars(batch), sampler_logp_mask=known)
  assert sampler_logprob_gap(multi, old, multi.loss_mask) == pytest.approx(0.75 / 5)
  assert np.isnan(sampler_logprob_gap(multi, old, np.zeros((2, 4))))
  with pytest.raises(ValueError, match="return_logprobs"):
    sampler_logprob_gap(dataclasses.replace(batch, sampler_logps=None), old, batch.loss_mask)
  with pytest.raises(ValueError, match="sampler_logp_mask marks tokens outside loss_mask"):
    dataclasses.replace(multi, sampler_logp_mask=np.ones((2, 4))).validate()


def test_episode_inputs():
  first, second = list(episode_batches(2, 3, seed=5))
  assert first["prompts"].dtype.kind == "U" and first["seed"].dtype == np.int64
  np.testing.assert_array_equal(first["prompts"].astype(np.int64), first["seed"])
  assert not np.array_equal(first["seed"], second["seed"])
  np.testing.assert_array_equal(next(episode_batches(1, 3, seed=5))["seed"], first["seed"])
  np.testing.assert_array_equal(episode_seeds(repeated(first, 2)), np.repeat(first["seed"], 2))
  np.testing.assert_array_equal(episode_seeds({"prompts": np.array(["7", "9"])}), [7, 9])
  with pytest.raises(ValueError, match="not integer seeds"):
    episode_seeds({"prompts": np.array(["hello"])})


class BrokenEnv(ScriptedEnv):
  """Fine on turn 1, a 4-tuple on turn 2."""

  name = "broken"
  max_return = 1.0

  def reply(self, turn):
    return ("wait.", 0.0, False, False, {}) if turn == 1 else ("wait.", 0.0, False, False)


class UnspeakableEnv(BrokenEnv):
  name = "unspeakable"

  def step(self, action):
    return "WAIT!", 0.0, False, False, {}


def test_bad_environments_and_inputs_are_named(world):
  _, _, learner = world
  data = next(episode_batches(1, 2, seed=0))
  with pytest.raises(ValueError, match="environment 'broken', turn 2: step must return"):
    MultiTurnRollout(BrokenEnv, max_completion_len=T)(learner, data, Mode.TRAIN)
  with pytest.raises(ValueError, match=r"environment 'unspeakable', turn 1: .*'WAIT!'"):
    MultiTurnRollout(UnspeakableEnv, max_completion_len=T)(learner, data, Mode.TRAIN)
  with pytest.raises(ValueError, match="share one episode seed"):
    MultiTurnRollout(max_completion_len=T, group_size=2)(learner, data, Mode.TRAIN)
  with pytest.raises(ValueError, match="raise max_tokens_to_generate"):
    MultiTurnRollout(max_completion_len=T, max_turn_tokens=G + 1)(learner, data, Mode.TRAIN)


def test_ppo_trains_on_multi_turn_episodes():
  tokenizer = CharTokenizer(ALPHABET, pad_id=PAD, eos_id=EOS)
  source = MultiTurnRollout("memory", max_completion_len=12, max_turn_tokens=2)
  learner = multi_turn_learner(tokenizer, 1, source, PpoExtConfig(num_generations=2), prompt_len=P)
  cluster, policy = learner.rl_cluster, learner.rl_cluster.actor_trainer.model
  seen = []
  learner.trajectory_source = lambda *args: seen.append(source(*args)) or seen[-1]
  assert_training_moves_the_policy(learner)
  assert seen and len(seen[-1].episode_returns) == 4
  returns = cluster._rl_metrics_logger.get_metric_history("batch", "episode_return/mean", "train")
  assert len(returns) >= 1 and np.all(np.isfinite(returns))
  # after the updates, the sampler samples from the trained weights: its log-probs are the
  # trainer's on every agent token before a sampled pad id
  batch = source(learner, repeated(next(episode_batches(1, 2, seed=3)), 2), Mode.TRAIN)
  old = trainer_logps(policy, batch)
  assert sampler_logprob_gap(batch, old, sampled_pad_free(batch)) < 1e-5


def test_anchor_ids_number_each_distinct_key_once_and_pad_with_minus_one():
  from tunix_ppo_ext._src.tunix.rollout.multi_turn import anchor_ids

  got = anchor_ids([[("a",), (1, 2)], [("a",)], [(1, 2), ("b",), ("c",)]], turns=2)
  np.testing.assert_array_equal(got, [[0, 1], [0, -1], [1, 2]])
  assert got.dtype == np.int32
