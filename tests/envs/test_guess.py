"""`GuessEnv`: the number game's feedback, rewards, success flag and random baseline."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tunix_ppo_ext._src.envs.base import validate_reset_output, validate_step_output
from tunix_ppo_ext._src.envs.guess import MAX_NUMBERS, GuessEnv

pytestmark = pytest.mark.fast


def _play(env: GuessEnv, seed: int, guesses: list[str]):
  validate_reset_output("guess", env.reset(seed))
  return [validate_step_output("guess", t, env.step(g)) for t, g in enumerate(guesses, 1)]


def test_feedback_rewards_and_success_follow_the_secret():
  env = GuessEnv(high=10, max_turns=4, turn_penalty=0.2)
  env.reset(3)
  secret = int(env.optimal_action())
  below, above = str(secret - 1) if secret > 1 else "0", str(secret + 1)
  steps = _play(env, 3, [f"I guess {below}.", above, "no idea", str(secret)])
  assert [s[0] for s in steps[:3]] == [
    "Higher. Guess again.",
    "Lower. Guess again.",
    "Reply with just a number from 1 to 10.",
  ]
  assert [s[1] for s in steps] == [0.0, 0.0, 0.0, pytest.approx(1.0 - 0.2 * 3)]
  assert steps[-1][2] and steps[-1][4]["success"] is True
  assert all("success" not in s[4] for s in steps[:3])


def test_a_first_guess_hit_earns_the_maximum_and_running_out_fails():
  env = GuessEnv()
  env.reset(0)
  hit = _play(env, 0, [env.optimal_action()])
  assert hit[0][1] == env.max_return == 1.0 and hit[0][4]["success"]
  env.reset(0)
  wrong = "1" if env.optimal_action() != "1" else "2"
  steps = _play(env, 0, [wrong] * 4)
  assert steps[-1][2] and steps[-1][4]["success"] is False and sum(s[1] for s in steps) == 0


def test_random_guessing_succeeds_about_as_computed():
  """Uniform guesses ignoring the feedback: `1 - 0.9**4` = 34% over 2000 episodes."""
  rng, env, wins = np.random.default_rng(0), GuessEnv(), 0
  for seed in range(2000):
    env.reset(seed)
    for _ in range(4):
      observation, _, done, _, info = env.step(str(int(rng.integers(1, 11))))
      if done:
        wins += info["success"]
        break
  assert abs(wins / 2000 - (1 - 0.9**4)) < 0.03


def test_the_format_reward_pays_each_guess_in_range():
  env = GuessEnv(valid_reward=0.1)
  env.reset(1)
  secret = int(env.optimal_action())
  wrong = 1 if secret != 1 else 2
  steps = _play(env, 1, ["42", "seven", str(wrong), str(secret)])
  assert [s[1] for s in steps] == pytest.approx([0.0, 0.0, 0.1, 1.0 - 0.2 * 3 + 0.1])
  assert env.max_return == pytest.approx(1.1)


def test_bad_settings_are_refused_in_one_line_naming_the_setting():
  nan = float("nan")
  for kwargs, culprit in [
    ({"low": 5, "high": 5}, "high=5"),
    ({"low": "a"}, "low='a'"),
    ({"low": -1}, "low=-1"),
    ({"high": 9.5}, "high=9.5"),
    ({"max_turns": 0}, "max_turns=0"),
    ({"max_turns": True}, "max_turns=True"),
    # the 6th guess would pay 0: the message names the max_turns that caps it
    ({"max_turns": 6, "turn_penalty": 0.2}, "turn_penalty=0.2 is invalid with max_turns=6"),
    ({"turn_penalty": -0.1}, "turn_penalty=-0.1"),
    ({"turn_penalty": nan}, "turn_penalty=nan"),
    ({"valid_reward": -1}, "valid_reward=-1"),
    ({"valid_reward": nan}, "valid_reward=nan"),
    ({"valid_reward": float("inf")}, "valid_reward=inf"),
  ]:
    with pytest.raises(ValueError, match="is invalid") as raised:
      GuessEnv(**kwargs)
    assert str(raised.value).startswith(culprit) and "\n" not in str(raised.value)
  assert GuessEnv(max_turns=1, turn_penalty=5.0).max_return == 1.0  # one guess: no penalty


def test_the_shaping_reward_pays_each_guess_the_feedback_allows_once():
  env = GuessEnv(high=10, max_turns=4, turn_penalty=0.2, consistent_reward=0.05)
  seed = next(s for s in range(50) if env.reset(s) and env.optimal_action() != "1")
  secret = int(env.optimal_action())
  # 1 (below the secret: allowed, nothing said yet), 1 again (a repeat), 42 (out of range),
  # then the secret (a hit is always allowed)
  steps = _play(env, seed, ["1", "1", "42", str(secret)])
  assert [s[1] for s in steps] == pytest.approx([0.05, 0.0, 0.0, 1.0 - 0.2 * 3 + 0.05])
  assert [s[4]["allowed_share"] for s in steps] == pytest.approx([1.0, 0.5, 1 / 3, 0.5])


def test_a_guess_the_feedback_ruled_out_earns_no_shaping_reward():
  env = GuessEnv(high=10, max_turns=4, consistent_reward=0.05)
  for seed in range(50):  # a secret with room on both sides
    env.reset(seed)
    secret = int(env.optimal_action())
    if 3 <= secret <= 8:
      break
  steps = _play(env, seed, [str(secret - 1), str(secret - 2), str(secret + 2), str(secret)])
  # secret - 1: "Higher", so secret - 2 is ruled out; secret + 2 is still allowed
  assert [s[1] for s in steps] == pytest.approx([0.05, 0.0, 0.05, 1.0 - 0.6 + 0.05])


def test_max_return_is_the_best_episode_whatever_the_per_guess_rewards():
  # reference: every n-turn episode that hits on turn n with every guess paid
  for valid, consistent, penalty, turns in [
    (0.1, 0.0, 0.2, 4),
    (0.1, 0.05, 0.2, 4),
    (0.3, 0.0, 0.2, 4),
    (0.2, 0.2, 0.1, 5),
    (0.0, 0.0, 0.0, 1),
  ]:
    env = GuessEnv(
      max_turns=turns, turn_penalty=penalty, valid_reward=valid, consistent_reward=consistent
    )
    best = max(1 - penalty * (n - 1) + (valid + consistent) * n for n in range(1, turns + 1))
    assert env.max_return == pytest.approx(best)
  # reached: valid 0.3 over 4 turns, the hit on the last (binary search over 1..10 from 1)
  env = GuessEnv(valid_reward=0.3)
  for seed in range(200):
    env.reset(seed)
    if env.optimal_action() == "4":
      break
  steps = _play(env, seed, ["1", "2", "3", "4"])
  assert sum(s[1] for s in steps) == pytest.approx(env.max_return) == pytest.approx(1.6)


def test_a_bad_shaping_reward_is_refused_naming_it():
  for value in (-0.1, float("nan"), "x"):
    with pytest.raises(ValueError, match="consistent_reward=") as raised:
      GuessEnv(consistent_reward=value)
    assert "\n" not in str(raised.value)


def _reference_info_gain(low: int, high: int, secret: int, guesses: list[int]) -> list[float]:
  """From the definition, over explicit sets: each guess's share of the numbers still
  possible that its answer removes (a guess outside them, or made before: 0)."""
  possible, shares = set(range(low, high + 1)), []
  for guess in guesses:
    if guess not in possible:
      shares.append(0.0)
      continue
    if guess == secret:
      left = set()
    elif guess < secret:
      left = {n for n in possible if n > guess}
    else:
      left = {n for n in possible if n < guess}
    shares.append((len(possible) - len(left)) / len(possible))
    possible = left or possible
  return shares


@pytest.mark.parametrize("seed", range(6))
def test_the_information_gain_reward_pays_the_share_of_allowed_numbers_ruled_out(seed):
  rng = np.random.default_rng(seed)
  env = GuessEnv(low=3, high=32, max_turns=6, turn_penalty=0.1, info_gain_reward=0.5)
  env.reset(seed)
  secret = int(env.optimal_action())
  guesses = [int(g) for g in rng.integers(1, 35, size=5)] + [secret]  # some out of range
  guesses = guesses[: guesses.index(secret) + 1]
  steps = _play(env, seed, [str(g) for g in guesses])
  expected = [0.5 * share for share in _reference_info_gain(3, 32, secret, guesses)]
  expected[-1] += 1.0 - 0.1 * (len(guesses) - 1) if guesses[-1] == secret else 0.0
  assert [s[1] for s in steps] == pytest.approx(expected)


def test_halving_earns_half_the_information_gain_reward_and_it_is_off_by_default():
  env = GuessEnv(high=10, max_turns=4, info_gain_reward=1.0)
  seed = next(s for s in range(200) if env.reset(s) and env.optimal_action() == "8")
  steps = _play(env, seed, ["5", "8"])  # 5: "Higher", rules out 1..5 of 1..10
  assert [s[1] for s in steps] == pytest.approx([0.5, 0.8 + 1.0])
  plain = GuessEnv(high=10, max_turns=4)
  plain.reset(seed)
  assert plain.step("5")[1] == 0.0 and plain.info_gain_reward == 0.0


def test_a_bad_information_gain_reward_is_refused_naming_it():
  for value in (-0.1, float("nan"), float("inf"), "x"):
    with pytest.raises(ValueError, match="info_gain_reward=") as raised:
      GuessEnv(info_gain_reward=value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
  "kwargs",
  [
    {"high": 6, "max_turns": 4, "info_gain_reward": 1.0},
    {"high": 5, "max_turns": 3, "info_gain_reward": 0.3, "valid_reward": 0.1},
    {"low": 2, "high": 7, "max_turns": 4, "consistent_reward": 0.2, "turn_penalty": 0.1},
    {"high": 3, "max_turns": 5, "valid_reward": 0.2, "turn_penalty": 0.1},  # repeats pay
  ],
)
def test_max_return_is_the_best_of_every_episode_played_out(kwargs):
  """Brute force: every secret (every seed until each was drawn) and every guess
  sequence in the range, played through the environment."""
  env = GuessEnv(**kwargs)
  numbers = range(env.low, env.high + 1)
  seeds = {}
  for seed in range(500):
    env.reset(seed)
    seeds.setdefault(int(env.optimal_action()), seed)
  assert len(seeds) == len(numbers)
  best = 0.0
  for seed in seeds.values():
    for guesses in itertools.product(numbers, repeat=env.max_turns):
      env.reset(seed)
      total = 0.0
      for guess in guesses:
        _, reward, done, _, _ = env.step(str(guess))
        total += reward
        if done:
          break
      best = max(best, total)
  assert env.max_return == pytest.approx(best)


def test_anchor_is_the_allowed_interval_and_the_guesses_made():
  """Two episodes of one secret that reach the same interval after as many guesses share
  an anchor; another route to another interval does not."""
  first, second = GuessEnv(high=32, max_turns=5), GuessEnv(high=32, max_turns=5)
  first.reset(seed=3)
  second.reset(seed=3)
  secret = first.optimal_action()
  assert first.anchor() == second.anchor() == (1, 32, 0)
  low = int(secret) - 1 if int(secret) > 1 else int(secret) + 1
  first.step(str(low))
  second.step("oops")  # no number: the interval stays, one guess is made
  assert first.anchor() != second.anchor()
  assert second.anchor() == (1, 32, 1)


def _reference_best_return(
  low: int, high: int, max_turns: int, penalty: float, valid: float, consistent: float, gain: float
) -> float:
  """The plain double loop over turns and allowed counts, in Python floats: a hit, every miss
  the feedback allows (leaving `left` of `count`), or a miss it does not (the count stays)."""
  per_guess, count, later = valid + consistent, high - low + 1, None
  for turn in range(max_turns, 0, -1):
    hit = 1.0 - penalty * (turn - 1) + per_guess + gain
    best = [0.0]  # index: the allowed count
    for n in range(1, count + 1):
      options = [hit]
      if later is not None:
        options += [per_guess + gain * (n - left) / n + later[left] for left in range(1, n)]
        options.append(valid + later[n])
      best.append(max(options))
    later = best
  return later[count]


_REWARDS = (0.0, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 1 / 3)


@pytest.mark.parametrize("gain", [0.0, 0.1, 0.2, 0.5, 1.0, 2.5])
@pytest.mark.parametrize("turns", [1, 2, 3, 5, 7])
def test_max_return_equals_the_double_loop_s_on_small_ranges(gain, turns):
  """The same float: every option is computed as the loop computes it."""
  penalty = 0.1  # below 1 / (turns - 1) for every `turns` here
  for (low, high), valid, consistent in itertools.product(
    [(1, 2), (1, 3), (0, 9), (3, 20), (1, 40)], (0.0, 0.1, 0.3), (0.0, 0.05, 0.25)
  ):
    env = GuessEnv(low, high, turns, penalty, valid, consistent, gain)
    expected = _reference_best_return(low, high, turns, penalty, valid, consistent, gain)
    assert env.max_return == expected, (low, high, turns, valid, consistent, gain)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
  low=st.integers(0, 5),
  numbers=st.integers(2, 60),
  turns=st.integers(1, 8),
  penalty_share=st.sampled_from([0.0, 0.3, 0.5, 0.99]),
  valid=st.sampled_from(_REWARDS),
  consistent=st.sampled_from(_REWARDS),
  gain=st.one_of(st.sampled_from(_REWARDS), st.floats(0.0, 3.0)),
)
def test_max_return_equals_the_double_loop_s_for_any_rewards(
  low, numbers, turns, penalty_share, valid, consistent, gain
):
  penalty = penalty_share / (turns - 1) if turns > 1 else penalty_share
  high = low + numbers - 1
  env = GuessEnv(low, high, turns, penalty, valid, consistent, gain)
  assert env.max_return == _reference_best_return(
    low, high, turns, penalty, valid, consistent, gain
  )


def test_a_range_of_a_million_numbers_constructs_in_well_under_a_second():
  """The double loop, O(turns x range^2) in Python, ran in every construction: 8.4 s at
  1..3000, about 6 minutes at 1..20000."""
  start = time.process_time()
  env = GuessEnv(
    high=10**6, max_turns=5, info_gain_reward=0.2, valid_reward=0.1, consistent_reward=0.1
  )
  assert time.process_time() - start < 1.0
  # misses that each rule out most of what is left, then the hit on the last turn
  assert 2.0 < env.max_return < 1.0 - 0.2 * 4 + 0.2 * 5 + 0.2 * 5


def test_a_range_beyond_the_limit_is_refused_naming_high():
  GuessEnv(low=1, high=MAX_NUMBERS, max_turns=1)  # one turn: no count but the range's
  with pytest.raises(
    ValueError, match=rf"^high={MAX_NUMBERS + 1} is invalid with low=1: "
  ) as raised:
    GuessEnv(low=1, high=MAX_NUMBERS + 1)
  assert "\n" not in str(raised.value)


def test_the_longest_reply_is_the_range_s_largest_number():
  """What `env.max_tokens_per_turn` must hold (the run config's check, tests/run)."""
  assert GuessEnv(high=1000).longest_reply == "1000"
  assert GuessEnv(low=5, high=9).longest_reply == "9"
