"""`frozenlake`: Gymnasium's FrozenLake through the Gymnasium adapter, as a short text game.

The board is rendered in one line of lowercase cells with the player as `p`, rows
separated by spaces (4x4: `pfff fhfh fffh hffg`; `s` start, `f` frozen, `h` hole, `g`
goal). The agent answers one letter: `l`, `d`, `r`, `u` (Gymnasium's actions 0-3); any
other reply gets `bad` and the board again (`info["invalid_action"]`) and `invalid_reward`
(default 0.0; RAGEN's format penalty is -0.1). Reaching the goal
pays 1.0 (Gymnasium's reward, the turn's reward) and is a success; falling into a hole
ends the episode with 0; `max_steps` (default 8) is the step budget. `is_slippery`
defaults to False (deterministic moves). Every text fits `FROZENLAKE_ALPHABET`, the
`model.alphabet` for the built-in character tokenizer.
"""

from __future__ import annotations

from typing import Any

from tunix_ppo_ext._src.checks import check_integer, check_number, did_you_mean
from tunix_ppo_ext._src.envs.gym_adapter import GymEnv, import_gymnasium

ACTIONS = ("l", "d", "r", "u")  # Gymnasium's order: left, down, right, up
INVALID = "bad"
FROZENLAKE_ALPHABET = "sfhgp " + "ldru" + "ab"
MAP_CELLS = ("S", "F", "H", "G")  # a `desc` map's cells: start, frozen, hole, goal


def render_board(env: Any, observation: Any) -> str:
  """The board as one line, `p` where the player stands (`observation` = row * ncol + col).

  Args:
    env: a Gymnasium FrozenLake environment (its `unwrapped.desc` is the map).
    observation: the player's cell, `row * ncol + col`.

  Returns:
    The rows of lower-case cells (`s`, `f`, `h`, `g`, and `p`), joined by spaces.
  """
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


def check_map_name(map_name: object) -> str:
  """`map_name`, one of Gymnasium's FrozenLake maps (`4x4`, `8x8`); ValueError naming it."""
  maps = _gym_maps()
  if not isinstance(map_name, str) or map_name not in maps:
    raise ValueError(
      f"map_name={map_name!r} is invalid: must be one of {sorted(maps)}, or give desc (a custom "
      f"map){did_you_mean(map_name, maps)}"
    )
  return map_name


def _gym_maps() -> list[str]:
  import_gymnasium()  # one line saying how to install it when missing
  from gymnasium.envs.toy_text.frozen_lake import MAPS

  return list(MAPS)


def check_desc(desc: object) -> list[str]:
  """A custom map: rows of equal length of Gymnasium's cells `S F H G` (uppercase), one
  start and at least one goal; ValueError naming `desc` and the problem."""
  rows = list(desc) if isinstance(desc, list | tuple) else []
  problem = "" if rows and all(isinstance(r, str) and r for r in rows) else "a list of rows"
  cells = "".join(rows) if not problem else ""
  if not problem and len({len(r) for r in rows}) != 1:
    problem = "rows of one length"
  elif not problem and set(cells) - set(MAP_CELLS):
    bad = sorted(set(cells) - set(MAP_CELLS))
    problem = f"only the cells {', '.join(MAP_CELLS)} (uppercase; got {', '.join(map(repr, bad))})"
  elif not problem and (cells.count("S") != 1 or "G" not in cells):
    problem = "one start S and at least one goal G"
  if problem:
    raise ValueError(
      f"desc={desc!r} is invalid: must be {problem}, e.g. ['SFFF', 'FHFH', 'FFFH', 'HFFG']."
    )
  return rows


class FrozenLakeEnv(GymEnv):
  """FrozenLake as a text game (see the module docstring); kwargs: `map_name`,
  `is_slippery`, `max_steps`, `desc` (a custom map as a list of row strings),
  `invalid_reward` (the reward of a reply that is not a move), `independent_chance` (the
  episodes of a group slip independently; `tunix_ppo_ext._src.envs.gym_adapter`)."""

  def __init__(
    self,
    *,
    map_name: str = "4x4",
    is_slippery: bool = False,
    max_steps: int = 8,
    desc: list[str] | None = None,
    invalid_reward: float = 0.0,
    independent_chance: bool = False,
  ):
    if not isinstance(is_slippery, bool):
      raise ValueError(f"is_slippery={is_slippery!r} is invalid: must be true or false.")
    max_steps = check_integer("max_steps", max_steps, low=1)
    invalid_reward = check_number("invalid_reward", invalid_reward, high=0.0)
    make_kwargs: dict[str, Any] = {"map_name": map_name, "is_slippery": is_slippery}
    if desc is not None:
      make_kwargs["desc"] = check_desc(desc)
    else:
      check_map_name(map_name)
    super().__init__(
      "FrozenLake-v1",
      max_return=1.0,
      max_steps=max_steps,
      render=render_board,
      parse_action=parse_letter,
      invalid_feedback=INVALID,
      invalid_reward=invalid_reward,
      independent_chance=independent_chance,
      success_reward=1.0,
      make_kwargs=make_kwargs,
    )
    self.name = "frozenlake"

  def step(self, action: str):
    """The adapter's step, the invalid feedback on the same line as the board."""
    text, reward, terminated, truncated, info = super().step(action)
    return text.replace("\n", " "), reward, terminated, truncated, info
