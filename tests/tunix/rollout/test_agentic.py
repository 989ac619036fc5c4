"""tunix's agentic environments through `TunixEnv`: tunix's `ToolEnvironment` with its
calculator tool and its Qwen tool parser, a user's `BaseTaskEnv` subclass, and PPO on a
`ToolEnvironment` with the masks checked token by token against a replay."""

from __future__ import annotations

import numpy as np
import pytest
from tunix.rl.agentic.environments import base_environment
from tunix.rl.agentic.environments.tool_environment import ToolEnvironment
from tunix.rl.agentic.parser.tool_parser import tool_parser_base
from tunix.rl.agentic.rewards import reward as tunix_rewards
from tunix.rl.agentic.tools import base_tool
from tunix.rl.agentic.tools.calculator_tool import CalculatorTool

from tests.helpers.clusters import (
  assert_row_is,
  assert_training_moves_the_policy,
  multi_turn_learner,
  replayed_group,
)
from tunix_ppo_ext import PpoExtConfig
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.envs.base import validate_reset_output, validate_step_output
from tunix_ppo_ext._src.tunix.rollout.agentic_envs import TunixEnv
from tunix_ppo_ext._src.tunix.rollout.multi_turn import MultiTurnRollout

pytestmark = pytest.mark.tunix

CALL = '<tool_call>{"name": "calculator", "arguments": {"a": 3, "b": 4, "op": "*"}}</tool_call>'


def calculator_env(seed: int) -> ToolEnvironment:
  """tunix's ToolEnvironment: `a*b=?` from the seed, tunix's calculator, exact match."""
  a, b = np.random.default_rng(seed).integers(2, 10, size=2)
  task = {"question": f"{a}*{b}=?", "ground_truth": str(a * b)}
  return ToolEnvironment(
    task,
    tool_map={"calculator": CalculatorTool},
    reward_fn=tunix_rewards.exact_match,
    max_steps=3,
  )


def make_tool_env(**kwargs) -> TunixEnv:
  return TunixEnv(calculator_env, name="calculator", success_reward=1.0, **kwargs)


def test_tool_calls_run_the_tool_and_the_answer_finishes():
  env = make_tool_env(tool_prompt=False)
  assert validate_reset_output(env.name, env.reset(0)) == ("8*7=?", {})
  env.reset(1)
  question = env.env.task["question"]
  observation, reward, terminated, truncated, info = validate_step_output(
    env.name, 1, env.step(CALL)
  )
  assert observation == "<tool_response>12</tool_response>"  # the tool ran: 3*4
  assert (reward, terminated, truncated) == (0.0, False, False)
  assert info == {"tool_calls": 1, "success": False}
  answer = env.env.task["ground_truth"]
  _, reward, terminated, _, info = env.step(answer)  # no tool call: tunix's finish
  assert (reward, terminated, info) == (1.0, True, {"tool_calls": 0, "success": True})
  assert question.endswith("=?")


def test_the_tool_prompt_is_tunix_s_and_bad_calls_do_not_crash():
  env = make_tool_env()
  prompt, _ = env.reset(0)
  assert "<tools>" in prompt and '"name": "calculator"' in prompt and prompt.endswith("8*7=?")
  _, reward, terminated, _, info = env.step("<tool_call>{not json</tool_call>")
  assert (reward, terminated, info["success"]) == (0.0, True, False)  # finishes, wrong
  env.reset(0)
  observation, *_ = env.step(CALL.replace('"*"', '"/"').replace('"b": 4', '"b": 0'))
  assert "Division by zero" in observation  # the tool's own error, as its observation
  env.reset(0)
  for _ in range(2):
    *_, terminated, _, _ = env.step(CALL)
  assert env.step(CALL)[2] is True  # tunix's max_steps=3 ends the episode


class BracketParser(tool_parser_base.ToolParser):
  """A user's own call format, `[calculator a b op]`, as a tunix `ToolParser` subclass."""

  def parse(self, model_response):
    inside = model_response.strip()
    if not (inside.startswith("[calculator ") and inside.endswith("]")):
      return []
    a, b, op = inside[len("[calculator ") : -1].split()
    return [base_tool.ToolCall(name="calculator", arguments={"a": int(a), "b": int(b), "op": op})]

  def get_tool_prompt(self, tools, *, schema_style="openai"):
    return "call: [calculator A B OP]"


def test_a_user_s_own_tool_parser_is_used_and_a_bad_name_is_named():
  for parser in (BracketParser, BracketParser()):
    env = make_tool_env(parser=parser)
    prompt, _ = env.reset(0)
    assert prompt == "call: [calculator A B OP]\n8*7=?"
    observation, _, terminated, _, info = env.step("[calculator 3 4 *]")
    assert observation == "<tool_response>12</tool_response>" and info["tool_calls"] == 1
    assert not terminated
  with pytest.raises(ValueError, match=r"parser='qwn' is not a tool parser in tunix's registry"):
    make_tool_env(parser="qwn")


class CountdownToZero(base_environment.BaseTaskEnv):
  """A user's tunix environment: say the number one less than shown, until 0."""

  def _initial_observation(self):
    self.current = self.task["start"]
    return {"question": str(self.current)}

  def _step_impl(self, action):
    right = action.strip() == str(self.current - 1)
    self.current -= right
    return base_environment.EnvStepResult(
      observation=str(self.current),
      reward=1.0 if right else 0.0,
      done=self.current == 0,
      info={"right": right},
    )


def test_a_user_s_base_task_env_plays_multi_turn():
  env = TunixEnv(lambda seed: CountdownToZero({"start": 2}, max_steps=4), max_return=2.0)
  assert env.reset(0)[0] == "2"
  assert env.step("1") == ("1", 1.0, False, False, {"right": True, "tool_calls": 0})
  assert env.step("x")[1:3] == (0.0, False)
  assert env.step("0")[1:3] == (1.0, True)


# ----- PPO on a ToolEnvironment -----

PAD, EOS = 0, 2
P, T, TURN = 8, 24, 6  # prompt (BOS + `a*b=?`), completion width, tokens per turn


def expected_row(tokenizer, seed: int, agent_turns: list[list[int]], max_turns: int):
  """`(tokens, loss_mask, reward sum)` by replaying the agent's turns on a fresh adapter."""
  env = make_tool_env(tool_prompt=False)
  env.reset(seed)
  tokens, loss, total = [], [], 0.0
  for turn, agent in enumerate(agent_turns, 1):
    tokens += agent + [EOS] * (len(agent) < TURN)
    loss += [1] * (len(tokens) - len(loss))
    observation, reward, terminated, truncated, _ = env.step(tokenizer.decode(agent))
    total += reward
    if terminated or truncated or turn == max_turns:
      break
    observed = tokenizer.encode(observation)
    tokens += observed
    loss += [0] * len(observed)
  return tokens, loss, total


def test_ppo_trains_on_a_tool_environment_with_exact_masks(monkeypatch):
  tokenizer = CharTokenizer(pad_id=PAD, eos_id=EOS)  # every printable character
  env_kwargs = {"tool_prompt": False}
  source = MultiTurnRollout(
    make_tool_env, env_kwargs, max_completion_len=T, max_turns=3, max_turn_tokens=TURN
  )
  learner = multi_turn_learner(tokenizer, 2, source, PpoExtConfig(num_generations=2), prompt_len=P)
  batch, rows = replayed_group(monkeypatch, learner, seed=4)
  for row, (seed, agent_turns) in enumerate(rows):
    tokens, loss, total = expected_row(tokenizer, seed, agent_turns, 3)
    assert_row_is(batch, row, tokens, loss)
    assert batch.token_rewards[row].sum() == pytest.approx(total)
    prompt = tokenizer.decode(batch.prompt_ids[row].tolist())
    assert prompt == calculator_env(seed).task["question"]
  assert_training_moves_the_policy(learner)
  success = learner.rl_cluster._rl_metrics_logger.get_metric_history(
    "batch", "success_rate", "train"
  )
  assert len(success) >= 1 and np.all(np.isfinite(success))
