"""`StashEnv`: its rules against a reference formula, baselines, misuse and registration."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.envs import play
from tunix_ppo_ext._src.data.char_tokenizer import DEFAULT_ALPHABET
from tunix_ppo_ext._src.envs.base import make_env
from tunix_ppo_ext._src.envs.stash import StashEnv
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.plugins.protocols import Environment

pytestmark = pytest.mark.fast


def reference_rewards(replies, take=0.2, stash=0.5, cash=0.1):
  """Per-turn rewards from the rules as written: take pays now, stashes pay at cash-in."""
  choices, final = replies[:-1], replies[-1]
  rewards = [take if r == "t" else 0.0 for r in choices]
  return [*rewards, cash + stash * choices.count("s") if final == "c" else 0.0]


@given(st.integers(2, 6), st.data())
def test_rewards_match_the_reference(num_turns, data):
  replies = data.draw(
    st.lists(
      st.sampled_from(["t", "s", "c", "x", "ss", ""]), min_size=num_turns, max_size=num_turns
    )
  )
  env = StashEnv(num_turns=num_turns)
  turns = iter(replies)
  observations, rewards, infos = play(env, 0, lambda env, observation: next(turns))
  assert rewards == pytest.approx(reference_rewards(replies))
  assert observations == ["take?"] * (num_turns - 1) + ["cash?", ""]
  assert infos[-1] == {"stashed": replies[:-1].count("s"), "cashed": replies[-1] == "c"}


def test_stashing_is_best_and_taking_is_tempting():
  env = StashEnv()  # 3 turns: two choices, then cash in
  assert env.max_return == pytest.approx(1.1)
  _, best, _ = play(env, 0, lambda env, observation: env.optimal_action())
  assert best == pytest.approx([0.0, 0.0, 1.1])  # the best policy earns nothing until the end
  _, greedy, _ = play(env, 0, lambda env, observation: "t")
  assert sum(greedy) == pytest.approx(0.4)  # taking, then no cash-in reply
  _, take_cash, _ = play(
    env, 0, lambda env, observation: env.optimal_action() if observation == "cash?" else "t"
  )
  assert sum(take_cash) == pytest.approx(0.5)


def test_random_policies_score_low():
  env = StashEnv()
  rng = np.random.default_rng(0)
  alphabet, replies = list(DEFAULT_ALPHABET), ["t", "s", "c"]
  char_return = np.mean(
    [sum(play(env, s, lambda e, o: str(rng.choice(alphabet)))[1]) for s in range(2000)]
  )
  reply_return = np.mean(
    [sum(play(env, s, lambda e, o: str(rng.choice(replies)))[1]) for s in range(2000)]
  )
  # a random reply among the three: 2 * 0.2 / 3 + (1/3) * (0.1 + 0.5 * 2/3) = 0.278 of 1.1
  assert reply_return == pytest.approx(2 * 0.2 / 3 + (0.1 + 0.5 * 2 / 3) / 3, abs=0.03)
  assert char_return < 0.05 * env.max_return


def replaying(replies):
  """A policy that gives `replies` in order."""
  turns = iter(replies)
  return lambda env, observation: next(turns)


def test_noisy_payouts_are_bounded_reproducible_and_unbiased():
  """`reward_noise`: each take or stash pays its base reward plus a draw in [-noise, noise],
  the same on a rerun of the seed, different across seeds, and right on average."""
  noise, turns = 0.5, 9
  env = StashEnv(num_turns=turns, reward_noise=noise)
  assert env.max_return == pytest.approx(8 * 0.5 + 0.1)
  rng = np.random.default_rng(0)
  replies = [[str(r) for r in rng.choice(["t", "s"], turns - 1)] + ["c"] for _ in range(400)]
  totals, offsets = [], []
  for seed, episode in enumerate(replies):
    _, rewards, infos = play(env, seed, replaying(episode))
    assert play(env, seed, replaying(episode))[1] == rewards  # reproducible
    expected = reference_rewards(episode)
    per_turn = np.subtract(rewards[:-1], expected[:-1])  # the takes' draws
    offsets += [d for d, r in zip(per_turn, episode, strict=False) if r == "t"]
    stash_draws = rewards[-1] - expected[-1]  # the sum of the stashes' draws
    assert abs(stash_draws) <= noise * episode.count("s") + 1e-9
    assert infos[-1]["stashed"] == episode.count("s")
    totals.append(sum(rewards) - sum(expected))
  offsets = np.asarray(offsets)
  assert np.all(np.abs(offsets) <= noise) and offsets.std() > noise / 3  # uniform: noise/sqrt(3)
  assert offsets.mean() == pytest.approx(0.0, abs=4 * noise / np.sqrt(3 * offsets.size))
  assert abs(np.mean(totals)) < 4 * noise * np.sqrt(8 / 3 / len(totals))
  first = play(env, 1, lambda env, observation: env.optimal_action())[1]
  assert first != play(env, 2, lambda env, observation: env.optimal_action())[1]  # by chance
  assert play(StashEnv(num_turns=turns), 1, lambda e, o: e.optimal_action())[1][-1] == (
    pytest.approx(4.1)
  )


def test_misuse_raises_and_the_env_is_registered():
  env = StashEnv()
  with pytest.raises(RuntimeError, match="reset"):
    env.step("t")
  with pytest.raises(ValueError, match=r"num_turns=1 is invalid: must be an integer >= 2"):
    StashEnv(num_turns=1)
  with pytest.raises(ValueError, match="take_reward < stash_reward"):
    StashEnv(take_reward=0.6)
  with pytest.raises(ValueError, match=r"cash_reward=-0.1 is invalid"):
    StashEnv(cash_reward=-0.1)
  with pytest.raises(ValueError, match=r"cash_reward='x' is invalid"):
    StashEnv(cash_reward="x")
  with pytest.raises(ValueError, match=r"reward_noise=-0.5 is invalid"):
    StashEnv(reward_noise=-0.5)
  with pytest.raises(ValueError, match=r"num_turns='3' is invalid"):
    StashEnv(num_turns="3")
  assert registry.RegistryView(registry.ENVIRONMENTS)["stash"] is StashEnv
  made = make_env("stash", num_turns=4)
  assert isinstance(made, Environment) and made.max_return == pytest.approx(1.6)
