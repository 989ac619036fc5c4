"""The Gymnasium adapter (`gym:<id>`) and the built-in `frozenlake`: episode logic against a
BFS solver, invalid replies, the install hint, and PPO on FrozenLake with masks checked
token by token against a replay of the engine's outputs."""

from __future__ import annotations

import collections
import sys

import numpy as np
import pytest

from tests.helpers.clusters import (
  assert_row_is,
  assert_training_moves_the_policy,
  multi_turn_learner,
  replayed_group,
)
from tunix_ppo_ext import PpoExtConfig
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.envs.base import make_env
from tunix_ppo_ext._src.envs.frozenlake import ACTIONS, FROZENLAKE_ALPHABET, FrozenLakeEnv
from tunix_ppo_ext._src.envs.gym_adapter import GymEnv
from tunix_ppo_ext._src.metrics import episodes
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.run.run_config import load_run_config
from tunix_ppo_ext._src.tunix.rollout.multi_turn import MultiTurnRollout

pytestmark = pytest.mark.tunix

MOVES = {"l": (0, -1), "d": (1, 0), "r": (0, 1), "u": (-1, 0)}


def solve(rows: list[str]) -> str | None:
  """Shortest sequence of letters from S to G avoiding holes (BFS; moves off the board
  stay in place, as in Gymnasium); None when unsolvable."""
  start = next((r, c) for r, row in enumerate(rows) for c, x in enumerate(row) if x == "S")
  paths, queue = {start: ""}, collections.deque([start])
  while queue:
    r, c = queue.popleft()
    if rows[r][c] == "G":
      return paths[(r, c)]
    if rows[r][c] == "H":
      continue
    for letter, (dr, dc) in MOVES.items():
      nr = min(max(r + dr, 0), len(rows) - 1)
      nc = min(max(c + dc, 0), len(rows[0]) - 1)
      if (nr, nc) not in paths:
        paths[(nr, nc)] = paths[(r, c)] + letter
        queue.append((nr, nc))
  return None


def play(env, seed: int, letters: str):
  """Steps `letters` until the episode ends; returns `(return, steps, last info, ended)`."""
  env.reset(seed)
  total, info, ended = 0.0, {}, (False, False)
  for n, letter in enumerate(letters, 1):
    _, reward, terminated, truncated, info = env.step(letter)
    total += reward
    if terminated or truncated:
      return total, n, info, (terminated, truncated)
  return total, len(letters), info, ended


def test_the_solver_s_path_wins_and_is_a_success():
  env = FrozenLakeEnv()
  rows = [bytes(r).decode() for r in env.env.unwrapped.desc]
  path = solve(rows)
  assert path is not None and len(path) == 6 <= env.max_steps
  total, steps, info, (terminated, truncated) = play(env, 0, path)
  assert (total, steps, terminated, truncated) == (1.0, 6, True, False)
  assert info["success"] is True and info["invalid_action"] is False


def test_board_text_holes_budget_and_invalid_replies():
  env = FrozenLakeEnv(max_steps=3)
  observation, _ = env.reset(0)
  assert observation == "pfff fhfh fffh hffg"
  assert env.step("d")[0] == "sfff phfh fffh hffg"
  text, reward, terminated, truncated, info = env.step("jump")  # no crash: feedback
  assert (text, reward, terminated, truncated) == ("bad sfff phfh fffh hffg", 0.0, False, False)
  assert info == {"invalid_action": True, "success": False}
  assert env.step("u")[3] is True  # third step: the budget is spent, truncated
  env.reset(0)
  _, reward, terminated, _, info = env.step("r") and env.step("d")  # into the hole at (1, 1)
  assert (reward, terminated, info["success"]) == (0.0, True, False)
  assert set(env.reset(0)[0]) <= set(FROZENLAKE_ALPHABET)


def random_win_probability(rows: list[str], steps: int) -> float:
  """Exact chance that uniform random moves reach G within `steps` (a Markov chain)."""
  cells = [(r, c) for r in range(len(rows)) for c in range(len(rows[0]))]
  mass = {cell: float(rows[cell[0]][cell[1]] == "S") for cell in cells}
  won = 0.0
  for _ in range(steps):
    moved = dict.fromkeys(cells, 0.0)
    for (r, c), p in mass.items():
      if p == 0 or rows[r][c] in "HG":
        continue
      for dr, dc in MOVES.values():
        nr, nc = min(max(r + dr, 0), len(rows) - 1), min(max(c + dc, 0), len(rows[0]) - 1)
        moved[(nr, nc)] += p / 4
    won += sum(p for (r, c), p in moved.items() if rows[r][c] == "G")
    mass = {cell: p for cell, p in moved.items() if rows[cell[0]][cell[1]] != "G"}
  return won


def test_uniform_random_baseline_is_far_below_the_maximum():
  """Uniform random letters `l d r u`, 2000 episodes, the default 8-step budget, against
  the exact probability of the Markov chain (within 4 binomial standard deviations)."""
  env, rng = FrozenLakeEnv(), np.random.default_rng(0)
  finals = []
  for seed in range(2000):
    letters = "".join(rng.choice(list(ACTIONS), size=env.max_steps))
    finals.append(play(env, seed, letters)[0])
  rate = float(np.mean(finals))
  exact = random_win_probability([bytes(r).decode() for r in env.env.unwrapped.desc], 8)
  print(f"frozenlake uniform-random success: {rate:.4f} (exact {exact:.5f})")
  assert abs(rate - exact) <= 4 * np.sqrt(exact * (1 - exact) / len(finals))
  assert exact < 0.01  # a random policy almost never wins


def test_generic_adapter_parses_integers_and_names_and_reports_success():
  env = make_env(
    "gym:FrozenLake-v1",
    make_kwargs={"is_slippery": False},
    action_names=["left", "down", "right", "up"],
    success_reward=1.0,
    max_steps=10,
  )
  assert env.name == "gym:FrozenLake-v1" and env.max_return == pytest.approx(0.7)  # the spec's
  env.reset(0)
  for reply in ["1", " down ", "2", "DOWN", "right"]:
    _, reward, terminated, _, info = env.step(reply)
    assert not info["invalid_action"] and not terminated
  _, reward, terminated, _, info = env.step("2")
  assert (reward, terminated, info["success"]) == (1.0, True, True)
  env.reset(0)
  for reply in ["4", "-1", "jump", ""]:  # out of the space or not an action
    text, _, _, _, info = env.step(reply)
    assert info["invalid_action"] and text.startswith("invalid action\n")


def test_user_renderer_and_parser_from_module_strings():
  env = GymEnv(
    "FrozenLake-v1",
    render="tunix_ppo_ext._src.envs.frozenlake:render_board",
    parse_action="tunix_ppo_ext._src.envs.frozenlake:parse_letter",
    make_kwargs={"is_slippery": False},
  )
  assert env.reset(0)[0] == "pfff fhfh fffh hffg"
  assert env.step("r")[0] == "spff fhfh fffh hffg"
  with pytest.raises(
    ValueError, match="parse_action 'tunix_ppo_ext._src.envs.gym_adapter:nothing' cannot"
  ):
    GymEnv("FrozenLake-v1", parse_action="tunix_ppo_ext._src.envs.gym_adapter:nothing")


@pytest.mark.parametrize(
  "overrides, message",
  [
    (["env.name=gym:FrozenLak-v1"], r"Did you mean: `FrozenLake`"),
    (
      ["env.name=gym:FrozenLake-v1", "env.kwargs={max_steps: 0}"],
      r"max_steps=0 is invalid: must be an integer >= 1",
    ),
    (["env.name=gym:CartPole-v1", "env.kwargs={render: 'nope:fn'}"], r"render 'nope:fn' cannot"),
  ],
)
def test_bad_gym_settings_are_one_line_naming_the_key(overrides, message):
  with pytest.raises(ValueError, match=message) as error:
    load_run_config(None, overrides)
  assert "\n" not in str(error.value)


def test_missing_gymnasium_says_how_to_install_it(monkeypatch):
  monkeypatch.setitem(sys.modules, "gymnasium", None)  # what a missing package looks like
  with pytest.raises(ValueError) as error:
    load_run_config(None, ["env.name=gym:FrozenLake-v1"])
  message = str(error.value)
  assert "config keys 'env.name'/'env.kwargs'" in message and "\n" not in message
  assert "pip install 'tunix-ppo-ext[gym]'" in message


def test_frozenlake_is_a_registered_environment():
  assert isinstance(registry.build(registry.ENVIRONMENTS, "frozenlake"), FrozenLakeEnv)


# ----- PPO on FrozenLake, masks token by token -----

PAD, EOS = 0, 2
P, T, TURN = 24, 40, 2  # prompt (BOS + 19 characters), completion width, tokens per turn
TURNS = 3  # agent turns at most


def expected_row(tokenizer, seed: int, agent_turns: list[list[int]]):
  """`(tokens, loss_mask, rewards, infos)` rebuilt by replaying the agent's turns on a
  fresh environment: agent ids (+ EOS when the turn stopped early) under the loss mask,
  each board observation tokenised and outside it, the reward on the turn's last token."""
  env = FrozenLakeEnv()
  env.reset(seed)
  tokens, loss, rewards, infos = [], [], {}, []
  for turn, agent in enumerate(agent_turns, 1):
    tokens += agent + [EOS] * (len(agent) < TURN)
    loss += [1] * (len(tokens) - len(loss))
    observation, reward, terminated, truncated, info = env.step(tokenizer.decode(agent))
    rewards[len(tokens) - 1], infos = reward, [*infos, info]
    if terminated or truncated or turn == TURNS:  # no agent turn answers a last board
      break
    board = tokenizer.encode(observation)
    tokens += board
    loss += [0] * len(board)
  return tokens, loss, rewards, infos


def test_ppo_trains_on_frozenlake_with_exact_masks(monkeypatch):
  tokenizer = CharTokenizer(FROZENLAKE_ALPHABET, pad_id=PAD, eos_id=EOS)
  source = MultiTurnRollout(
    "frozenlake", max_completion_len=T, max_turns=TURNS, max_turn_tokens=TURN
  )
  learner = multi_turn_learner(tokenizer, 3, source, PpoExtConfig(num_generations=2), prompt_len=P)
  batch, rows = replayed_group(monkeypatch, learner, seed=5)
  for row, (seed, agent_turns) in enumerate(rows):
    tokens, loss, rewards, infos = expected_row(tokenizer, seed, agent_turns)
    assert_row_is(batch, row, tokens, loss)
    assert batch.token_rewards[row].sum() == pytest.approx(sum(rewards.values()))
    board = tokenizer.decode([t for t, m in zip(tokens, loss, strict=True) if not m][:19])
    assert len(agent_turns) == 1 or board.count("p") == 1  # what the agent saw next is a board
    assert episodes.last_values(infos).keys() >= {"invalid_action", "success"}
  assert_training_moves_the_policy(learner)
  logger = learner.rl_cluster._rl_metrics_logger
  success = logger.get_metric_history("batch", "success_rate", "train")
  invalid = logger.get_metric_history("env", "invalid_action", "train")
  assert len(success) >= 1 and np.all((0 <= np.asarray(success)) & (np.asarray(success) <= 1))
  assert len(invalid) >= 1 and np.all(np.isfinite(invalid))


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"map_name": "9x9"}, r"map_name='9x9' is invalid: must be one of \['4x4', '8x8'\]"),
    ({"map_name": "4X4"}, r"map_name='4X4' is invalid: .*did you mean '4x4'"),
    (  # Gymnasium finds no start, hole or goal in lowercase cells: refused, not trained
      {"desc": ["sfff", "fhfh", "fffh", "hffg"]},
      r"desc=\['sfff', .*\] is invalid: must be only the cells S, F, H, G \(uppercase",
    ),
    ({"desc": ["SFF", "FG"]}, r"desc=.* is invalid: must be rows of one length"),
    ({"desc": ["SFFF", "FFFF"]}, r"desc=.* is invalid: must be one start S and at least one goal"),
    ({"desc": "SFFG"}, r"desc='SFFG' is invalid: must be a list of rows"),
    ({"max_steps": "3"}, r"max_steps='3' is invalid: must be an integer >= 1"),
    ({"max_steps": 2.5}, r"max_steps=2.5 is invalid"),
    ({"is_slippery": "yes"}, r"is_slippery='yes' is invalid: must be true or false"),
    ({"invalid_reward": 0.5}, r"invalid_reward=0.5 is invalid: must be a finite number in"),
    ({"invalid_reward": "x"}, r"invalid_reward='x' is invalid"),
  ],
)
def test_bad_frozenlake_kwargs_are_one_line_naming_the_key(kwargs, message):
  with pytest.raises(ValueError, match=message):
    FrozenLakeEnv(**kwargs)


def test_an_invalid_reply_pays_invalid_reward_and_a_move_pays_none_of_it():
  env = FrozenLakeEnv(desc=["SF", "FG"], invalid_reward=-0.1)
  env.reset(0)
  assert env.step("jump")[1:4] == (-0.1, False, False)
  assert env.step("r")[1] == 0.0  # a move: Gymnasium's reward only
  assert env.step("d")[1:3] == (1.0, True)


def _slippery_walks(env: FrozenLakeEnv, seed: int, resets: int) -> list[tuple[str, ...]]:
  walks = []
  for _ in range(resets):
    texts = [env.reset(seed)[0]]
    for letter in "rrddrrddrrdd":
      text, _, terminated, truncated, _ = env.step(letter)
      texts.append(text)
      if terminated or truncated:
        break
    walks.append(tuple(texts))
  return walks


def test_a_groups_episodes_share_their_chance_unless_it_is_independent():
  """Same seed, same moves: the same slips (common random numbers); with
  `independent_chance` the same start but each reset its own slips."""
  kwargs = dict(desc=["SFF", "FHF", "FFG"], is_slippery=True, max_steps=12)
  shared = _slippery_walks(FrozenLakeEnv(**kwargs), seed=424242, resets=8)
  assert len(set(shared)) == 1
  independent = _slippery_walks(FrozenLakeEnv(**kwargs, independent_chance=True), 424243, 8)
  assert {walk[0] for walk in independent} == {"pff fhf ffg"}
  assert len(set(independent)) > 1  # 8 walks of up to 12 slippery moves: not all alike
  with pytest.raises(ValueError, match=r"independent_chance='yes' is invalid: must be true"):
    FrozenLakeEnv(**kwargs, independent_chance="yes")


def test_a_custom_frozenlake_map_plays():
  env = FrozenLakeEnv(desc=["SF", "HG"])
  assert env.reset(0)[0] == "pf hg"
  assert env.step("r")[0] == "sp hg"
  _, reward, terminated, _, info = env.step("d")
  assert reward == 1.0 and terminated and info["success"]


def test_a_gymnasium_factory_error_names_the_id_and_kwargs():
  with pytest.raises(
    ValueError, match=r"gym:FrozenLake-v1 with make_kwargs .*'map_name': '9x9'.*KeyError"
  ):
    GymEnv("FrozenLake-v1", max_return=1.0, make_kwargs={"map_name": "9x9"})


GAME = """
import gymnasium
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

gymnasium.register("{id}", entry_point=FrozenLakeEnv, kwargs={{"is_slippery": False}})


def render(env, observation):
  return f"at {{int(observation)}}"
"""


@pytest.mark.parametrize("route", ["module:id", "render module"])
def test_a_user_s_own_gymnasium_environment_works_from_the_run_config(route, tmp_path, monkeypatch):
  """The README's routes: `gym:<module>:<id>` imports the module that registers the id; a
  `render` from that module is imported before the id is looked up."""
  module, env_id = f"my_game_{route[0]}", f"MyGame{route[0].upper()}-v0"
  (tmp_path / f"{module}.py").write_text(GAME.format(id=env_id))
  monkeypatch.syspath_prepend(str(tmp_path))
  name = f"gym:{module}:{env_id}" if route == "module:id" else f"gym:{env_id}"
  kwargs = f"{{max_return: 1.0, render: '{module}:render'}}"
  # the default alphabet has no digits: the built-in tokenizer's letters, digits, punctuation
  run = load_run_config(None, [f"env.name={name}", f"env.kwargs={kwargs}", "model.alphabet=null"])
  env = make_env(run.env.name, **run.env.kwargs)
  assert env.reset(0)[0] == "at 0" and env.step("2")[0] == "at 1"


def test_a_module_that_cannot_be_imported_is_named():
  with pytest.raises(ValueError, match=r"module 'no_such_game' .* cannot be imported"):
    load_run_config(None, ["env.name=gym:no_such_game:Game-v0", "env.kwargs={max_return: 1}"])


def test_a_renderer_of_the_wrong_signature_is_named_at_load(tmp_path, monkeypatch):
  (tmp_path / "one_argument_render.py").write_text("def render(observation):\n  return ''\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  kwargs = "{render: 'one_argument_render:render'}"
  with pytest.raises(ValueError, match=r"render 'one_argument_render:render' must take \(env, ob"):
    load_run_config(None, ["env.name=gym:FrozenLake-v1", f"env.kwargs={kwargs}"])
  with pytest.raises(ValueError, match=r"parse_action .* must take \(text, env\) -> action"):
    GymEnv("FrozenLake-v1", parse_action=lambda text: 0)
