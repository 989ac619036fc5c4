"""`EchoEnv`: repeat the symbol just shown, for a few turns (a tiny multi-turn task)."""

from typing import Any

import numpy as np


class EchoEnv:
  """Each turn shows a symbol (`"b!"`); the agent earns `reward` for replying exactly `"b"`.

  An episode has `num_turns` turns with symbols drawn from `symbols` by the reset seed;
  `max_return = num_turns * reward`. Texts use only characters of tunix-ppo-ext's default
  toy alphabet (`abcehikstw!?. `).
  """

  name = "echo"

  def __init__(self, num_turns: int = 2, symbols: str = "abc", reward: float = 0.5):
    if num_turns < 1 or not symbols:
      raise ValueError(f"need num_turns >= 1 and some symbols, got {num_turns}, {symbols!r}")
    self.num_turns, self.symbols, self.reward = num_turns, symbols, float(reward)
    self.max_return = num_turns * self.reward
    self._episode: list[str] = []
    self._turn = 0

  def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
    """Draws the episode's symbols from `seed`; shows the first."""
    rng = np.random.default_rng(seed)
    self._episode = [
      self.symbols[int(i)] for i in rng.integers(len(self.symbols), size=self.num_turns)
    ]
    self._turn = 0
    return f"{self._episode[0]}!", {}

  def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
    """Scores the reply against the shown symbol; shows the next one or terminates."""
    expected = self._episode[self._turn]
    self._turn += 1
    reward = self.reward if action == expected else 0.0
    done = self._turn == self.num_turns
    observation = "" if done else f"{self._episode[self._turn]}!"
    return observation, reward, done, False, {"expected": expected}
