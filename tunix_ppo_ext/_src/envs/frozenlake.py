"""`frozenlake`: Gymnasium's FrozenLake through the Gymnasium adapter, as a short text game.

The board is rendered in one line of lowercase cells with the player as `p`, rows
separated by spaces (4x4: `pfff fhfh fffh hffg`; `s` start, `f` frozen, `h` hole, `g`
goal). The agent answers one letter: `l`, `d`, `r`, `u` (Gymnasium's actions 0-3); any
other reply gets `bad` and the board again (`info["invalid_action"]`). Reaching the goal
pays 1.0 (Gymnasium's reward, the turn's reward) and is a success; falling into a hole
ends the episode with 0; `max_steps` (default 8) is the step budget. `is_slippery`
defaults to False (deterministic moves). Every text fits `FROZENLAKE_ALPHABET`, the
`model.alphabet` for the built-in character tokenizer.
"""

from __future__ import annotations

from typing import Any

from tunix_ppo_ext._src.envs.gym_adapter import GymEnv

ACTIONS = ("l", "d", "r", "u")  # Gymnasium's order: left, down, right, up
INVALID = "bad"
FROZENLAKE_ALPHABET = "sfhgp " + "ldru" + "ab"


def render_board(env: Any, observation: Any) -> str:
  """The board as one line, `p` where the player stands (`observation` = row * ncol + col)."""
  desc = env.unwrapped.desc
  cells = [[c.decode().lower() for c in row] for row in desc]
  row, col = divmod(int(observation), len(cells[0]))
  cells[row][col] = "p"
  return " ".join("".join(r) for r in cells)


def parse_letter(text: str, env: Any) -> int | None:
  """`l`, `d`, `r`, `u` -> 0..3 (surrounding spaces allowed); anything else -> None."""
  del env
  reply = text.strip()
  return ACTIONS.index(reply) if reply in ACTIONS else None


class FrozenLakeEnv(GymEnv):
  """FrozenLake as a text game (see the module docstring); kwargs: `map_name`,
  `is_slippery`, `max_steps`, `desc` (a custom map as a list of row strings)."""

  def __init__(
    self,
    *,
    map_name: str = "4x4",
    is_slippery: bool = False,
    max_steps: int = 8,
    desc: list[str] | None = None,
  ):
    make_kwargs: dict[str, Any] = {"map_name": map_name, "is_slippery": bool(is_slippery)}
    if desc is not None:
      make_kwargs["desc"] = list(desc)
    super().__init__(
      "FrozenLake-v1",
      max_return=1.0,
      max_steps=max_steps,
      render=render_board,
      parse_action=parse_letter,
      invalid_feedback=INVALID,
      success_reward=1.0,
      make_kwargs=make_kwargs,
    )
    self.name = "frozenlake"

  def step(self, action: str):
    """The adapter's step, the invalid feedback on the same line as the board."""
    text, reward, terminated, truncated, info = super().step(action)
    return text.replace("\n", " "), reward, terminated, truncated, info
