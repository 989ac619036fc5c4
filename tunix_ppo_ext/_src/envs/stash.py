"""`StashEnv`: a multi-turn task where an early choice pays only at the last turn."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from tunix_ppo_ext._src.checks import check_integer, check_number
from tunix_ppo_ext._src.plugins.protocols import StepOutput


class StashEnv:
  """Take a small reward now, or stash it for a larger one that only the last turn pays.

  Episode (`num_turns=3`):
    reset -> "take?"   agent "t" (take: `take_reward` now) or "s" (stash: 0 now)
    step  -> "take?"   agent "t" or "s" again
    step  -> "cash?"   agent "c": `cash_reward` plus `stash_reward` per stash so far;
                       terminated.
  The first `num_turns - 1` turns choose; the last cashes in. The last turn's reward
  depends on the earlier turns' replies, which by then are only in the history, and the
  earlier turns' best reply earns nothing when it is made: credit has to cross turns.
  Cashing in pays `cash_reward` even with nothing stashed, so the last turn's reply can be
  learned from its own reward (without it a policy that always takes never sees `c` pay
  and never finds out what a stash is worth). Always taking and cashing in returns `(n - 1)
  * take_reward + cash_reward` (0.5 of the maximum 1.1 by default), always stashing and
  cashing in `max_return = (n - 1) * stash_reward + cash_reward`. Replies are compared
  exactly (one character, then EOS); any other reply earns nothing and changes nothing.

  `reward_noise > 0` makes the payouts stochastic: each take pays `take_reward + u` and
  each stash adds `stash_reward + u` to the cash-in, `u` drawn uniformly from
  `[-reward_noise, reward_noise]` for that turn, so the same reply pays differently by
  chance and one episode's score ranks its choices only noisily (the expected returns, and
  `max_return`, are the noiseless ones). A draw is fixed by the episode's seed, the turn
  and the replies so far (this turn's included), so a rerun sees the same payouts; the
  episodes of one group share a seed, and a draw only while their replies agree.
  """

  name = "stash"
  TAKE, STASH, CASH = "t", "s", "c"

  def __init__(
    self,
    num_turns: int = 3,
    take_reward: float = 0.2,
    stash_reward: float = 0.5,
    cash_reward: float = 0.1,
    reward_noise: float = 0.0,
  ):
    num_turns = check_integer("num_turns", num_turns, low=2)  # choose, then cash in
    take_reward = check_number("take_reward", take_reward, low=0.0)
    stash_reward = check_number("stash_reward", stash_reward, low=0.0)
    cash_reward = check_number("cash_reward", cash_reward, low=0.0)
    self.reward_noise = check_number("reward_noise", reward_noise, low=0.0)
    if not take_reward < stash_reward:
      raise ValueError(
        f"need 0 <= take_reward < stash_reward, got take_reward={take_reward}, "
        f"stash_reward={stash_reward}"
      )
    self.num_turns = num_turns
    self.take_reward, self.stash_reward, self.cash_reward = take_reward, stash_reward, cash_reward
    self.max_return = (num_turns - 1) * self.stash_reward + self.cash_reward
    self._turn: int | None = None
    self._stashed = 0
    self._bank = 0.0  # what cashing in pays on top of cash_reward
    self._seed = 0
    self._replies: list[str] = []

  def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
    """Starts an episode (without `reward_noise` the same for every seed); `"take?"`."""
    self._turn, self._stashed, self._bank = 0, 0, 0.0
    self._seed, self._replies = int(seed) & 0xFFFFFFFF, []
    return "take?", {}

  def _draw(self) -> float:
    """This turn's payout noise in `[-reward_noise, reward_noise]` (0.0 without noise), fixed
    by the seed, the turn and the replies so far, this turn's included."""
    if not self.reward_noise:
      return 0.0
    history = zlib.crc32("\x00".join(self._replies).encode())
    rng = np.random.default_rng([self._seed, self._turn, history])
    return self.reward_noise * float(rng.uniform(-1.0, 1.0))

  def step(self, action: str) -> StepOutput:
    """Applies one reply; terminates after the cash-in turn."""
    if self._turn is None:
      raise RuntimeError("call reset() before step()")
    self._turn += 1
    if self._turn == self.num_turns:
      cashed = action == self.CASH
      reward = self.cash_reward + self._bank if cashed else 0.0
      info = {"stashed": self._stashed, "cashed": cashed}
      self._turn = None
      return "", reward, True, False, info
    self._replies.append(action)
    noise = self._draw()
    reward = 0.0
    if action == self.STASH:
      self._stashed += 1
      self._bank += self.stash_reward + noise
    elif action == self.TAKE:
      reward = self.take_reward + noise
    observation = "cash?" if self._turn == self.num_turns - 1 else "take?"
    return observation, reward, False, False, {"stashed": self._stashed}

  def optimal_action(self) -> str:
    """The reply of the best policy at the current turn (stash, then cash in)."""
    if self._turn is None:
      raise RuntimeError("no episode in progress")
    return self.CASH if self._turn + 1 == self.num_turns else self.STASH
