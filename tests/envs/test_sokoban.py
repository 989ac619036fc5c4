"""`sokoban`: generated rooms are solvable within the budget (an independent BFS solver over
the text), the reward and episode logic, and a uniform-random baseline."""

from __future__ import annotations

import collections
import json
import subprocess

import numpy as np
import pytest

from tests.helpers.runs import subprocess_env, train_command
from tunix_ppo_ext._src.envs.sokoban import MOVES, SOKOBAN_ALPHABET, SokobanEnv, generate_room
from tunix_ppo_ext._src.plugins import registry

pytestmark = pytest.mark.tunix


def parse(text: str):
  """`(rows, walls, goals, boxes, player)` read from the board text alone."""
  rows = text.split(" ")
  cells = {(r, c): x for r, row in enumerate(rows) for c, x in enumerate(row)}
  walls = {p for p, x in cells.items() if x == "#"}
  goals = {p for p, x in cells.items() if x in "gBP"}
  boxes = frozenset(p for p, x in cells.items() if x in "bB")
  (player,) = [p for p, x in cells.items() if x in "pP"]
  return rows, walls, goals, boxes, player


def solve(text: str, limit: int) -> str | None:
  """Shortest move sequence (letters) putting every box on a goal, by BFS over
  (player, boxes) written from the rules of Sokoban; None if none within `limit` moves."""
  rows, walls, goals, boxes, player = parse(text)

  def free(p):
    return 0 <= p[0] < len(rows) and 0 <= p[1] < len(rows[0]) and p not in walls

  start = (player, boxes)
  paths, queue = {start: ""}, collections.deque([start])
  while queue:
    state = queue.popleft()
    (r, c), bs = state
    if bs <= goals:
      return paths[state]
    if len(paths[state]) == limit:
      continue
    for letter, (dr, dc) in MOVES.items():
      ahead, beyond = (r + dr, c + dc), (r + 2 * dr, c + 2 * dc)
      if not free(ahead):
        continue
      if ahead in bs:
        if not free(beyond) or beyond in bs:
          continue
        nxt = (ahead, (bs - {ahead}) | {beyond})
      else:
        nxt = (ahead, bs)
      if nxt not in paths:
        paths[nxt] = paths[state] + letter
        queue.append(nxt)
  return None


@pytest.mark.parametrize(
  "kwargs", [{}, {"num_boxes": 2, "height": 5, "width": 5, "min_distance": 1}]
)
def test_generated_rooms_are_solvable_within_the_budget(kwargs):
  env = SokobanEnv(**kwargs)
  for seed in range(30):
    observation, _ = env.reset(seed)
    assert set(observation) <= set(SOKOBAN_ALPHABET)
    path = solve(observation, env.max_steps)
    assert path is not None, (seed, observation)
    total, info = 0.0, {}
    for n, letter in enumerate(path, 1):
      _, reward, terminated, truncated, info = env.step(letter)
      total += reward
      assert terminated == (n == len(path)) and not truncated
    assert info["success"] and total == pytest.approx(env.max_return)


def test_rooms_are_deterministic_in_the_seed_and_start_unsolved():
  assert generate_room(7) == generate_room(7)
  texts = {generate_room(s).text() for s in range(50)}
  assert len(texts) > 40
  assert all(not generate_room(s).solved for s in range(50))


def test_pushes_walls_goals_and_rewards():
  env = SokobanEnv(box_reward=0.1, step_penalty=0.01)
  # seed 0's room: `##.. g.bp .... ....` (box at (1, 2), goal at (1, 0), player at (1, 3))
  assert env.reset(0)[0] == "##.. g.bp .... ...."
  text, reward, terminated, truncated, info = env.step("u")  # a free move
  assert (text, reward) == ("##.p g.b. .... ....", pytest.approx(-0.01))
  assert env.step("u")[0] == "##.p g.b. .... ...."  # off the board: a wall, no move
  env.step("d")
  text, reward, *_ = env.step("l")  # push the box one cell
  assert text == "##.. gbp. .... ...." and reward == pytest.approx(-0.01)
  text, reward, terminated, truncated, info = env.step("l")  # onto the goal: solved
  assert (text, terminated, info["success"]) == ("", True, True)
  assert reward == pytest.approx(0.1 - 0.01 + 1.0)


def test_invalid_replies_and_the_step_budget():
  env = SokobanEnv(max_steps=3)
  board, _ = env.reset(0)
  for n in range(1, 4):
    text, reward, terminated, truncated, info = env.step("jump")
    assert (text, reward, terminated) == (f"bad {board}", 0.0, False)
    assert info == {"invalid_action": True, "success": False, "boxes_on_goals": 0}
    assert truncated == (n == 3)
  env.reset(0)
  env.step("d"), env.step("u")
  assert env.step("d")[3] is True  # valid moves count too


def test_an_invalid_reply_pays_invalid_reward_and_a_move_pays_none_of_it():
  replies = ["jump", "l", "x", "d", "r", "u", "", "l"]
  penalised, plain = SokobanEnv(invalid_reward=-0.1), SokobanEnv()
  for seed in range(5):
    penalised.reset(seed), plain.reset(seed)
    for reply in replies:
      with_penalty, without = penalised.step(reply), plain.step(reply)
      assert with_penalty[0] == without[0]  # the same rooms
      assert with_penalty[1] == without[1] + (-0.1 if reply not in MOVES else 0.0)
      if with_penalty[2]:
        break


def test_a_box_pushed_off_its_goal_costs_its_reward():
  """Every move's reward, from the board texts alone (`B`: a box on a goal): `box_reward`
  per box pushed onto a goal, minus that per box pushed off, minus `step_penalty`, plus
  `solve_reward` when every box ends on a goal; a push off a goal gets -0.1 - 0.01."""
  box_reward, step_penalty, solve_reward, boxes = 0.1, 0.01, 1.0, 2
  walk = "ldrurdlu" * 2
  env = SokobanEnv(
    num_boxes=boxes,
    height=5,
    width=5,
    min_distance=1,
    max_steps=len(walk),
    box_reward=box_reward,
    step_penalty=step_penalty,
    solve_reward=solve_reward,
  )
  pushed_off = 0
  for seed in range(200):
    board, _ = env.reset(seed)
    for letter in walk:
      text, reward, terminated, *_ = env.step(letter)
      if terminated:  # solved: the board is gone, every box is on a goal
        onto = boxes - board.count("B")
        assert reward == pytest.approx(onto * box_reward - step_penalty + solve_reward)
        break
      change = text.count("B") - board.count("B")  # one push moves one box: -1, 0 or 1
      assert reward == pytest.approx(change * box_reward - step_penalty), (seed, board, text)
      if change == -1:
        pushed_off += 1
        assert reward == pytest.approx(-0.11)
      board = text
  assert pushed_off > 0, "no push off a goal in 200 rooms"


def test_uniform_random_baseline():
  """Uniform random letters `l d r u` over 2000 episodes with the default budget."""
  env, rng, wins = SokobanEnv(), np.random.default_rng(0), 0
  for seed in range(2000):
    env.reset(seed)
    for letter in rng.choice(list(MOVES), size=env.max_steps):
      *_, terminated, truncated, info = env.step(str(letter))
      if terminated or truncated:
        wins += info["success"]
        break
  rate = wins / 2000
  print(f"sokoban uniform-random success rate: {rate:.4f}")
  assert 0 < rate < 0.2


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"height": 1}, r"height=1 is invalid: must be an integer >= 2"),
    ({"width": 9}, r"width=9 is invalid: must be an integer in \[2, 8\]"),
    ({"num_boxes": 0}, r"num_boxes=0 is invalid: must be an integer >= 1"),
    ({"num_walls": 7}, r"num_walls=7 and num_boxes=1 are invalid: .* half the 16 cells"),
    ({"max_steps": 0}, r"max_steps=0 is invalid: must be an integer >= 1"),
    ({"max_steps": "3"}, r"max_steps='3' is invalid"),  # refused here, not at the first step
    ({"scramble": 2.5}, r"scramble=2.5 is invalid"),
    ({"box_reward": "x"}, r"box_reward='x' is invalid: must be a finite number"),
    ({"invalid_reward": 1.0}, r"invalid_reward=1.0 is invalid: must be a finite number in"),
    ({"min_distance": 9}, r"sokoban: no room .* min_distance=9\): lower min_distance"),
  ],
)
def test_bad_kwargs_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    SokobanEnv(**kwargs)


def test_sokoban_is_a_registered_environment():
  assert isinstance(registry.build(registry.ENVIRONMENTS, "sokoban"), SokobanEnv)


def test_cli_trains_two_steps_on_sokoban(tmp_path):
  """`tunix-ppo-ext train env.name=sokoban` with configs/sokoban.yaml's text settings."""
  out = tmp_path / "run"
  overrides = ["env.name=sokoban", "model.alphabet=.#gbBpP ldrua", "train.max_prompt_length=24"]
  overrides += ["train.steps=2", "env.max_turns=3", "env.max_completion_len=40"]
  command = train_command(out, *overrides)
  result = subprocess.run(command, env=subprocess_env(tmp_path), capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "train/success_rate" in r] == [1, 2]
  assert all(0 <= r["train/env/invalid_action"] <= 1 for r in rows if r["step"] > 0)
  assert json.loads((out / "summary.json").read_text())["max_return"] == pytest.approx(1.1)
