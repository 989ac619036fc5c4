"""`MemoryEnv`: the embedded default task (acknowledge a symbol, then recall it)."""

from __future__ import annotations

import string
from typing import Any

import numpy as np

from tunix_ppo_ext._src.checks import check_integer, check_number
from tunix_ppo_ext._src.plugins.protocols import StepOutput


class MemoryEnv:
  """Remember a symbol across turns: acknowledge it, then recall it when asked.

  Episode (`num_turns=2`, the symbol drawn from the first `num_symbols` lowercase letters):
    reset -> "see b!"   agent "k" (acknowledge; `ack_reward`)
    step  -> "what?"    agent "b" (recall the symbol; `recall_reward`), terminated.
  With `num_turns=n`, the first `n - 1` turns are acknowledgements (observations between
  them are "wait.") and the last asks for the symbol, which by then is only in the
  history. Each observation ends in its own character, so even a model that mostly reads
  the last token can tell the turns apart.

  Replies are compared exactly (one character, so the agent must stop with EOS); a wrong
  one scores 0 and the episode goes on. `partial_credit` pays that fraction of a turn's
  reward for a reply that starts right but goes on (an easier curriculum).
  `max_return = (n - 1) * ack_reward + recall_reward`; a uniformly random one-character
  reply from a 96-character alphabet scores about 1% of it.
  """

  name = "memory"
  ACK = "k"
  SYMBOLS = string.ascii_lowercase.replace(ACK, "")

  def __init__(
    self,
    num_symbols: int = 3,
    num_turns: int = 2,
    ack_reward: float = 0.25,
    recall_reward: float = 1.0,
    partial_credit: float = 0.0,
  ):
    num_symbols = check_integer("num_symbols", num_symbols, low=2)
    if num_symbols > len(self.SYMBOLS):
      raise ValueError(
        f"num_symbols={num_symbols!r} is invalid: must be an integer in [2, {len(self.SYMBOLS)}]."
      )
    self.symbols = self.SYMBOLS[:num_symbols]
    self.num_turns = check_integer("num_turns", num_turns, low=2)  # acknowledge, then recall
    self.ack_reward = check_number("ack_reward", ack_reward)
    self.recall_reward = check_number("recall_reward", recall_reward)
    self.partial_credit = check_number("partial_credit", partial_credit, 0.0, 1.0)
    self.max_return = (num_turns - 1) * self.ack_reward + self.recall_reward
    self._symbol: str | None = None
    self._turn = 0

  def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
    """Draws the symbol from `seed`; observation `"see <symbol>!"`."""
    rng = np.random.default_rng(seed)
    self._symbol = self.symbols[int(rng.integers(len(self.symbols)))]
    self._turn = 0
    return f"see {self._symbol}!", {}

  def step(self, action: str) -> StepOutput:
    """Scores `action` for the current turn; terminates after the recall turn."""
    if self._symbol is None:
      raise RuntimeError("call reset() before step()")
    self._turn += 1
    recall = self._turn == self.num_turns
    expected = self._symbol if recall else self.ACK
    correct = action == expected
    full = self.recall_reward if recall else self.ack_reward
    reward = full if correct else full * self.partial_credit * action.startswith(expected)
    info = {"correct": correct, "expected": expected}
    if recall:
      info["success"] = correct  # recalled: the success rate's source (`metrics.episodes`)
      self._symbol = None
      return "", reward, True, False, info
    observation = "what?" if self._turn == self.num_turns - 1 else "wait."
    return observation, reward, False, False, info

  def optimal_action(self) -> str:
    """The reply that earns the current turn's reward (for scripted baselines and tests)."""
    if self._symbol is None:
      raise RuntimeError("no episode in progress")
    return self._symbol if self._turn + 1 == self.num_turns else self.ACK
