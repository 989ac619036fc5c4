"""`sokoban`: push every box onto a goal in a small generated room, as a text game.

Rooms are generated from the episode seed: a `height` x `width` floor (the outside is wall)
with a few inner walls, goals with their boxes on them and the player on a free cell;
then the player walks `scramble` random steps backwards, pulling a box it walks away from
(the reverse of a push). Every push is undone that way, so the reversed walk solves the
room in at most `scramble` moves, within the default step budget; rooms with a box closer
than `min_distance` (2) cells to the nearest goal are drawn again.

Text (4x4, one box): `#p.. .b.. ..g. ....`: rows separated by spaces; `.` floor, `#`
wall, `g` goal, `b` box, `B` box on a goal, `p` player (`P` on a goal). Replies are one
letter, `l d r u`; anything else gets `bad`, the board (`info["invalid_action"]`) and
`invalid_reward` (0; RAGEN's format penalty is -0.1).
Rewards per move (turn rewards, gym-sokoban's shape, scaled): `box_reward` (0.1) for a box
pushed onto a goal, minus that for one pushed off, `solve_reward` (1.0) when every box is
on a goal (the episode ends; `info["success"]`), `step_penalty` (0) on every move.
`max_steps` (10) is the step budget. `max_return = num_boxes * box_reward + solve_reward`.
Every text fits `SOKOBAN_ALPHABET` (the built-in tokenizer's `model.alphabet`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from tunix_ppo_ext._src.checks import check_integer, check_number
from tunix_ppo_ext._src.plugins.protocols import StepOutput

MOVES = {"l": (0, -1), "d": (1, 0), "r": (0, 1), "u": (-1, 0)}
INVALID = "bad"
SOKOBAN_ALPHABET = ".#gbBpP " + "ldru" + "a"

Cell = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Room:
  """A room: its size, walls, goals, boxes and the player (cells as `(row, col)`)."""

  height: int
  width: int
  walls: frozenset[Cell]
  goals: frozenset[Cell]
  boxes: frozenset[Cell]
  player: Cell

  def free(self, cell: Cell) -> bool:
    """Inside the room and not a wall."""
    r, c = cell
    return 0 <= r < self.height and 0 <= c < self.width and cell not in self.walls

  def move(self, letter: str) -> tuple[Room, int]:
    """The room after the player moves (pushing a box ahead if the cell behind it is free);
    also the change in boxes on goals (-1, 0, 1). A blocked move leaves the room as it is."""
    dr, dc = MOVES[letter]
    r, c = self.player
    ahead, behind = (r + dr, c + dc), (r + 2 * dr, c + 2 * dc)
    if not self.free(ahead):
      return self, 0
    if ahead not in self.boxes:
      return dataclasses.replace(self, player=ahead), 0
    if not self.free(behind) or behind in self.boxes:
      return self, 0
    boxes = (self.boxes - {ahead}) | {behind}
    change = int(behind in self.goals) - int(ahead in self.goals)
    return dataclasses.replace(self, boxes=frozenset(boxes), player=ahead), change

  @property
  def solved(self) -> bool:
    return self.boxes <= self.goals

  def text(self) -> str:
    """Rows of cell symbols, separated by spaces (see the module docstring)."""
    rows = []
    for r in range(self.height):
      row = ""
      for c in range(self.width):
        cell, goal = (r, c), (r, c) in self.goals
        if cell in self.walls:
          row += "#"
        elif cell == self.player:
          row += "P" if goal else "p"
        elif cell in self.boxes:
          row += "B" if goal else "b"
        else:
          row += "g" if goal else "."
      rows.append(row)
    return " ".join(rows)


def _pull(room: Room, letter: str) -> Room:
  """The reverse of a push: the player steps `letter`, pulling a box from behind it."""
  dr, dc = MOVES[letter]
  r, c = room.player
  ahead, behind = (r + dr, c + dc), (r - dr, c - dc)
  if not room.free(ahead) or ahead in room.boxes:
    return room
  if behind in room.boxes:
    boxes = frozenset((room.boxes - {behind}) | {room.player})
    return dataclasses.replace(room, boxes=boxes, player=ahead)
  return dataclasses.replace(room, player=ahead)


def generate_room(
  seed: int,
  height: int = 4,
  width: int = 4,
  num_boxes: int = 1,
  num_walls: int = 2,
  scramble: int = 10,
  min_distance: int = 2,
  max_tries: int = 1000,
) -> Room:
  """A room solvable in at most `scramble` moves, deterministic given `seed` (module doc)."""
  rng = np.random.default_rng(seed)
  cells = [(r, c) for r in range(height) for c in range(width)]
  for _ in range(max_tries):
    picks = rng.choice(len(cells), size=num_walls + num_boxes + 1, replace=False)
    chosen = [cells[i] for i in picks]
    walls, goals = frozenset(chosen[:num_walls]), frozenset(chosen[num_walls:-1])
    room = Room(height, width, walls, goals, goals, chosen[-1])
    for letter in rng.choice(list(MOVES), size=scramble):
      room = _pull(room, str(letter))
    if all(_distance(box, room.goals) >= min_distance for box in room.boxes):
      return room
  kwargs = f"height={height}, width={width}, num_boxes={num_boxes}, num_walls={num_walls}, "
  kwargs += f"scramble={scramble}, min_distance={min_distance}"
  raise ValueError(
    f"sokoban: no room with every box at least min_distance from a goal in {max_tries} tries "
    f"(seed {seed}; {kwargs}): lower min_distance or raise scramble"
  )


@functools.lru_cache(maxsize=64)
def _feasible(layout: tuple[tuple[str, int], ...]) -> None:
  """Generates seed 0's room once per layout (a ValueError naming the kwargs if none)."""
  generate_room(0, **dict(layout))


def _distance(cell: Cell, goals: frozenset[Cell]) -> int:
  """Manhattan distance from `cell` to the nearest goal."""
  return min(abs(cell[0] - g[0]) + abs(cell[1] - g[1]) for g in goals)


def _check_layout(**layout: Any) -> dict[str, int]:
  """The room kwargs, checked: integers, sides in [2, 8], at most half the cells used."""
  lows = {"height": 2, "width": 2, "num_boxes": 1, "num_walls": 0, "scramble": 1}
  checked = {k: check_integer(k, v, low=lows.get(k, 0)) for k, v in layout.items()}
  for side in ("height", "width"):
    if checked[side] > 8:
      raise ValueError(f"{side}={checked[side]!r} is invalid: must be an integer in [2, 8].")
  cells = checked["height"] * checked["width"]
  if checked["num_walls"] + checked["num_boxes"] + 1 > cells // 2:
    raise ValueError(
      f"num_walls={checked['num_walls']} and num_boxes={checked['num_boxes']} are invalid: "
      f"with the player they must use at most half the {cells} cells ({cells // 2})."
    )
  return checked


class SokobanEnv:
  """Sokoban in small generated rooms (see the module docstring for text and rewards)."""

  name = "sokoban"

  def __init__(
    self,
    *,
    height: int = 4,
    width: int = 4,
    num_boxes: int = 1,
    num_walls: int = 2,
    scramble: int = 10,
    min_distance: int = 2,
    max_steps: int = 10,
    box_reward: float = 0.1,
    solve_reward: float = 1.0,
    step_penalty: float = 0.0,
    invalid_reward: float = 0.0,
  ):
    self.layout = _check_layout(
      height=height,
      width=width,
      num_boxes=num_boxes,
      num_walls=num_walls,
      scramble=scramble,
      min_distance=min_distance,
    )
    max_steps = check_integer("max_steps", max_steps, low=1)
    box_reward = check_number("box_reward", box_reward)
    solve_reward = check_number("solve_reward", solve_reward)
    step_penalty = check_number("step_penalty", step_penalty)
    self.invalid_reward = float(check_number("invalid_reward", invalid_reward, high=0.0))
    _feasible(tuple(self.layout.items()))  # kwargs no room can meet fail here, not at a reset
    self.max_steps = max_steps
    self.box_reward, self.solve_reward = float(box_reward), float(solve_reward)
    self.step_penalty = float(step_penalty)
    self.max_return = num_boxes * self.box_reward + self.solve_reward
    self.room: Room | None = None
    self._steps = 0

  def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
    """Generates the room of `seed`; the observation is its text."""
    self.room = generate_room(int(seed), **self.layout)
    self._steps = 0
    return self.room.text(), {}

  def anchor(self) -> tuple[str, int]:
    """The state the agent acts in (GiGPO's anchor): the room and the steps taken."""
    if self.room is None:
      raise RuntimeError("call reset() before anchor()")
    return self.room.text(), self._steps

  def step(self, action: str) -> StepOutput:
    """Moves (or not, for an invalid reply); rewards as in the module docstring."""
    if self.room is None:
      raise RuntimeError("call reset() before step()")
    self._steps += 1
    letter = action.strip()
    info: dict[str, Any] = {"invalid_action": letter not in MOVES, "success": False}
    if info["invalid_action"]:  # the room as it was: unsolved
      info["boxes_on_goals"] = len(self.room.boxes & self.room.goals)
      truncated = self._steps >= self.max_steps
      return f"{INVALID} {self.room.text()}", self.invalid_reward, False, truncated, info
    self.room, change = self.room.move(letter)
    reward = change * self.box_reward - self.step_penalty
    info["success"] = self.room.solved
    info["boxes_on_goals"] = len(self.room.boxes & self.room.goals)
    if self.room.solved:
      return "", reward + self.solve_reward, True, False, info
    return self.room.text(), reward, False, self._steps >= self.max_steps, info
