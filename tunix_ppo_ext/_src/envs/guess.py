"""`GuessEnv`: guess a secret whole number over several turns, told "higher" or "lower"."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from tunix_ppo_ext._src.checks import ConfigError, check_integer, check_number
from tunix_ppo_ext._src.plugins.protocols import StepOutput

_NUMBER = re.compile(r"-?\d+")
_LARGEST = 2**62  # the largest number of the range: the secret is drawn as an int64
# the most numbers a range may hold: `max_return` is computed over every count up to it
# (seconds and hundreds of MB at 10^7)
MAX_NUMBERS = 10**7


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
  `1 - (1 - 1/high) ** max_turns` of episodes (34% for 10 and 4). The range holds at most
  `MAX_NUMBERS` (10^7) numbers.
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
    # whole numbers NumPy draws as int64
    self.low = check_integer("low", low, low=0, high=_LARGEST - 1)
    self.high = check_integer("high", high, low=self.low + 1, high=_LARGEST)
    if self.high - self.low + 1 > MAX_NUMBERS:
      raise ConfigError(
        f"high={high!r} is invalid with low={self.low}: the range may hold at most "
        f"{MAX_NUMBERS} numbers."
      )
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
    """The best episode's return: dynamic programming over the turns and how many numbers
    the feedback still allows (a secret at one end of the range lets a miss leave any
    smaller count). With `B_t(n)` the best return from turn `t` on with `n` numbers
    allowed, `p = valid_reward + consistent_reward` and `g = info_gain_reward`:

      B_T(n) = hit_T,  hit_t = 1 - turn_penalty * (t - 1) + p + g
      B_t(n) = max(hit_t, max_{1 <= l < n} p + g * (n - l) / n + B_{t+1}(l),
                   valid_reward + B_{t+1}(n))

    the three options being a hit, a miss the feedback allows leaving `l` numbers, and a
    miss it does not allow (in range: the count stays). Each turn's array over every count
    is vectorised (`_best_misses`: a running maximum, or a search narrowed by the
    maximisers' order), and the first turn is needed at the whole range only; every option
    is the same float as in the plain double loop, so the maximum is too (the tests compare
    with that loop). Range 1..10^6 with 5 turns: a fraction of a second.
    """
    count = self.high - self.low + 1
    per_guess = self.valid_reward + self.consistent_reward
    gain = self.info_gain_reward
    later: np.ndarray | None = None  # B_{t+1}(n) at index n (index 0 unused)
    for turn in range(self.max_turns, 0, -1):
      hit = 1.0 - self.turn_penalty * (turn - 1) + per_guess + gain
      if later is None:
        later = np.full(count + 1, hit)
      elif turn > 1:
        misses = _best_misses(later, per_guess, gain)
        later = np.maximum(np.maximum(hit, misses), self.valid_reward + later)
      else:  # the first turn: the whole range only
        left = np.arange(1, count)
        misses = per_guess + gain * (count - left) / count + later[left]
        return float(max(hit, misses.max(initial=-np.inf), self.valid_reward + later[count]))
    return float(later[count])

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

  @property
  def longest_reply(self) -> str:
    """The longest reply a game may need: the range's largest number (`high`; `low >= 0`).
    A turn of fewer tokens than it takes cannot type every number of the range (the run
    config's check of `env.max_tokens_per_turn`)."""
    return str(self.high)

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


def _best_misses(later: np.ndarray, per_guess: float, gain: float) -> np.ndarray:
  """`M[n] = max_{1 <= l < n} per_guess + gain * (n - l) / n + later[l]` for every count
  `n` of `later` (`M[0] = M[1] = -inf`: no miss the feedback allows), each option computed
  as `GuessEnv._best_return`'s recursion writes it.

  - `gain == 0`: `per_guess + max(later[1:n])`, a running maximum (adding `per_guess`
    rounds monotonically: the same float as the largest sum).
  - `later` constant: `l = 1` (the largest share at an equal continuation).
  - Otherwise the best `l` never decreases as `n` grows (`_monotone_best_misses`).
  """
  size = len(later) - 1
  misses = np.full(size + 1, -np.inf)
  if size < 2:
    return misses
  if gain == 0.0:
    misses[2:] = per_guess + np.maximum.accumulate(later[1:size])
    return misses
  counts = np.arange(2, size + 1)
  if np.all(later[1:size] == later[1]):
    misses[2:] = per_guess + gain * (counts - 1) / counts + later[1]
    return misses
  return _monotone_best_misses(later, per_guess, gain)


def _monotone_best_misses(later: np.ndarray, per_guess: float, gain: float) -> np.ndarray:
  """`_best_misses` for `gain > 0`, over a search the maximisers' order narrows.

  The maximisers are ordered: for counts `n1 < n2`, every best `l1` at `n1` is at most
  every best `l2` at `n2`. Were `l2 < l1`, both would be options at both counts
  (`l2 < l1 < n1 < n2`), and the options' cross difference
  `[v(l2, n1) + v(l1, n2)] - [v(l1, n1) + v(l2, n2)] = gain * (l1 - l2) * (1/n1 - 1/n2)`
  would be positive (`later` cancels), while `v(l1, n1) >= v(l2, n1)` and
  `v(l2, n2) >= v(l1, n2)` make it at most 0. So the best `l` of a count between two
  solved counts lies between theirs: counts 2 and `size` are solved by a full scan, then
  the midpoints of strides halving down to 1, each scanning only its neighbours' interval
  (one vectorised pass per stride). A pass scans at most `best(size) + its counts`
  options: `O(size + log(size) * best(size))` per turn.
  """
  size = len(later) - 1
  misses = np.full(size + 1, -np.inf)
  best = np.zeros(size + 1, dtype=np.int64)
  ends = np.unique([2, size])
  best[ends], misses[ends] = _window_maxima(
    later, per_guess, gain, ends, np.ones_like(ends), ends - 1
  )
  stride = 1 << max(0, (size - 3).bit_length())  # the first power of 2 >= size - 2
  while stride > 1:
    half = stride // 2
    counts = np.arange(2 + half, size, stride)
    if counts.size:
      low = best[counts - half]
      high = np.minimum(best[np.minimum(counts + half, size)], counts - 1)
      high = np.maximum(high, low)  # never an empty interval, even if rounding broke a tie
      best[counts], misses[counts] = _window_maxima(later, per_guess, gain, counts, low, high)
    stride = half
  return misses


def _window_maxima(
  later: np.ndarray,
  per_guess: float,
  gain: float,
  counts: np.ndarray,
  low: np.ndarray,
  high: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
  """For each `counts[i]`, the first best `l` in `low[i]..high[i]` and its option's value
  (one flat pass over every interval)."""
  width = high - low + 1
  starts = np.concatenate(([0], np.cumsum(width)[:-1]))
  owner = np.repeat(np.arange(counts.size), width)
  left = low[owner] + (np.arange(int(width.sum())) - starts[owner])
  count = counts[owner].astype(np.float64)
  values = per_guess + gain * (count - left) / count + later[left]
  top = np.maximum.reduceat(values, starts)
  first = np.minimum.reduceat(np.where(values == top[owner], left, len(later)), starts)
  return first, top
