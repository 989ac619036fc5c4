"""`GuessEnv`: guess a secret whole number over several turns, told "higher" or "lower"."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from tunix_ppo_ext._src.checks import ConfigError, check_integer, check_number
from tunix_ppo_ext._src.plugins.protocols import StepOutput

_NUMBER = re.compile(r"-?\d+")


class GuessEnv:
  """A number-guessing game in natural language, for instruct models through their chat
  template.

  Episode (`high=10`, `max_turns=4`, secret 7):
    reset -> "I am thinking of a whole number from 1 to 10. Guess it! Reply with just
              the number."
    agent "5"  -> "Higher. Guess again."  (reward 0)
    agent "8"  -> "Lower. Guess again."   (reward 0)
    agent "7"  -> "" terminated           (reward `1 - turn_penalty * 2`, success)
  The first integer in the reply is the guess; a reply without one is answered "Reply
  with just a number from 1 to 10." (reward 0). The episode ends on the right number or
  after `max_turns` guesses (`success` False). The reward is deterministic: `1.0` for a
  first-turn hit, `turn_penalty` less for each guess before it, plus `valid_reward` for
  every reply whose guess is in range (a format reward: an instruct model at temperature 1
  mostly answers out of range or with words, and a group estimator needs some spread), plus
  `consistent_reward` for every guess the feedback so far allows and not guessed before (a
  shaping reward for using the feedback; a hit always earns it), plus `info_gain_reward`
  times the share of the numbers the feedback still allowed that the guess rules out (an
  information-gain reward, so halving is paid directly: a guess in the middle of 10
  allowed numbers earns 0.5 or 0.6 of it, one at an end 0.1, a hit 1, a guess outside
  them 0). `info["allowed_share"]`:
  the share of the episode's replies so far that were such guesses (1 for a binary
  search; logged as `train/env/allowed_share`). `max_return` is the best
  episode's return: `1.0 + valid_reward + consistent_reward + info_gain_reward` (a
  first-turn hit) unless the per-guess rewards outweigh `turn_penalty`, when a hit on the
  last turn pays more (with `info_gain_reward`, the best run of misses that each rule out
  a share before the hit);
  guessing uniformly at random, ignoring the feedback, succeeds in about
  `1 - (1 - 1/high) ** max_turns` of episodes (34% for 10 and 4).
  """

  name = "guess"

  def __init__(
    self,
    low: int = 1,
    high: int = 10,
    max_turns: int = 4,
    turn_penalty: float = 0.2,
    valid_reward: float = 0.0,
    consistent_reward: float = 0.0,
    info_gain_reward: float = 0.0,
  ) -> None:
    self.low = check_integer("low", low, low=0)  # whole numbers
    self.high = check_integer("high", high, low=self.low + 1)
    self.max_turns = check_integer("max_turns", max_turns, low=1)
    # every reward stays in [0, 1 + valid_reward]: a later hit never pays less than 0
    last = 1.0 / (self.max_turns - 1) if self.max_turns > 1 else None
    self.turn_penalty = check_number("turn_penalty", turn_penalty, low=0.0)
    if last is not None and self.turn_penalty >= last:
      raise ConfigError(
        f"turn_penalty={turn_penalty!r} is invalid with max_turns={self.max_turns}: must be "
        f"below 1 / (max_turns - 1) = {last:.4g}, so that a hit on the last turn pays more than 0."
      )
    self.valid_reward = check_number("valid_reward", valid_reward, low=0.0)
    self.consistent_reward = check_number("consistent_reward", consistent_reward, low=0.0)
    self.info_gain_reward = check_number("info_gain_reward", info_gain_reward, low=0.0)
    self.max_return = self._best_return()
    self._secret: int | None = None
    self._turn = 0
    self._allowed = (self.low, self.high)  # what the feedback so far leaves
    self._guessed: set[int] = set()
    self._allowed_count = 0  # guesses the feedback allowed, this episode

  def _best_return(self) -> float:
    """The best episode's return, by dynamic programming over how many numbers are still
    allowed (a secret at one end of the range lets a miss leave any smaller count)."""
    per_guess = self.valid_reward + self.consistent_reward
    best: dict[int, float] = {}  # allowed count -> best return from the current turn on
    for turn in range(self.max_turns, 0, -1):
      hit = 1.0 - self.turn_penalty * (turn - 1) + per_guess + self.info_gain_reward
      later = best
      best = {}
      for count in range(1, self.high - self.low + 2):
        options = [hit]
        if later:  # a miss the feedback allows (leaves 1..count-1), or one it does not
          options += [
            per_guess + self.info_gain_reward * (count - left) / count + later[left]
            for left in range(1, count)
          ]
          options.append(self.valid_reward + later[count])
        best[count] = max(options)
    return best[self.high - self.low + 1]

  def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
    """Draws the secret from `seed`."""
    rng = np.random.default_rng(seed)
    self._secret = int(rng.integers(self.low, self.high + 1))
    self._turn = 0
    self._allowed, self._guessed, self._allowed_count = (self.low, self.high), set(), 0
    return (
      f"I am thinking of a whole number from {self.low} to {self.high}. Guess it! "
      "Reply with just the number."
    ), {}

  def step(self, action: str) -> StepOutput:
    """Scores one guess; terminates on the secret or after `max_turns` guesses."""
    if self._secret is None:
      raise RuntimeError("call reset() before step()")
    self._turn += 1
    match = _NUMBER.search(action)
    guess = int(match.group()) if match else None
    hit = guess == self._secret
    last = hit or self._turn >= self.max_turns
    info: dict[str, Any] = {"guess": guess, "secret": self._secret}
    reward = 1.0 - self.turn_penalty * (self._turn - 1) if hit else 0.0
    if guess is not None and self.low <= guess <= self.high:
      reward += self.valid_reward
    before = self._allowed
    allowed = guess is not None and self._note_feedback(guess)
    reward += self.consistent_reward * allowed
    if allowed and self.info_gain_reward:
      reward += self.info_gain_reward * ruled_out_share(before, self._allowed, hit)
    self._allowed_count += allowed
    info["allowed_share"] = self._allowed_count / self._turn  # `train/env/allowed_share`
    if last:
      info["success"] = hit  # the success rate's source (`metrics.episodes`)
      self._secret = None
      return "", reward, True, False, info
    if guess is None:
      observation = f"Reply with just a number from {self.low} to {self.high}."
    else:
      observation = f"{'Higher' if guess < self._secret else 'Lower'}. Guess again."
    return observation, reward, False, False, info

  def _note_feedback(self, guess: int) -> bool:
    """Whether `guess` is one the feedback so far allows, never guessed before; then
    narrows what is allowed by the answer it gets."""
    low, high = self._allowed
    allowed = low <= guess <= high and guess not in self._guessed
    self._guessed.add(guess)
    if guess < self._secret:
      self._allowed = (max(low, guess + 1), high)
    elif guess > self._secret:
      self._allowed = (low, min(high, guess - 1))
    return allowed

  def anchor(self) -> tuple[int, int, int]:
    """The state the agent acts in (GiGPO's anchor): the interval the feedback still allows
    and the guesses made (with the group's shared secret, all that decides what follows)."""
    return (*self._allowed, self._turn)

  def optimal_action(self) -> str:
    """The secret (for scripted baselines and tests)."""
    if self._secret is None:
      raise RuntimeError("no episode in progress")
    return str(self._secret)


def ruled_out_share(before: tuple[int, int], after: tuple[int, int], hit: bool) -> float:
  """The share of the numbers `before` allowed (`(low, high)`, inclusive) that a guess's
  answer rules out, `after` being what it leaves: 1 on a hit."""
  if hit:
    return 1.0
  count = before[1] - before[0] + 1
  left = max(0, after[1] - after[0] + 1)
  return (count - left) / count
