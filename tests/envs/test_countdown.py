"""Countdown: the reward rule against an `ast` reference, solvable problems, episodes, a CLI run."""

import ast
import itertools
import json
import math
import pathlib
import re
import time
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.helpers.runs import train_argv
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.envs.base import make_env, validate_reset_output, validate_step_output
from tunix_ppo_ext._src.envs.countdown import (
  COUNTDOWN_ALPHABET,
  FEEDBACK,
  MAX_EQUATION_CHARS,
  CountdownEnv,
  CountdownMultiTurnEnv,
  generate_problem,
  score_answer,
)
from tunix_ppo_ext._src.metrics.sinks import read_jsonl
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.plugins.protocols import Environment
from tunix_ppo_ext._src.run import cli
from tunix_ppo_ext._src.run.run_config import load_run_config

pytestmark = pytest.mark.tunix

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
FMT, OK = 0.1, 1.0


# ----- an independent reference: Python's own parser, a whitelist of nodes, Fractions -----


def reference_value(text: str, unary: bool = False) -> tuple[Fraction | None, list[int]] | None:
  """`(value, literals)` of `text` via `ast`; None if malformed, value None on division by 0."""
  try:
    tree = ast.parse(text.strip(), mode="eval").body
  except SyntaxError:
    return None
  ops = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__, ast.Mult: Fraction.__mul__}
  ops[ast.Div] = Fraction.__truediv__
  found: list[int] = []

  def walk(node):
    if isinstance(node, ast.Constant) and type(node.value) is int:
      found.append(node.value)
      return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in ops:
      return ops[type(node.op)](walk(node.left), walk(node.right))
    if unary and isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
      return -walk(node.operand)
    raise SyntaxError(f"not allowed: {ast.dump(node)}")

  try:
    return walk(tree), found
  except SyntaxError:
    return None
  except ZeroDivisionError:
    return None, [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]


def reference_score(text: str, numbers, target: int, unary: bool = False) -> float:
  """TinyZero's rule for the whole-reply ("short") style, from the reference evaluator."""
  parsed = reference_value(text, unary)
  if parsed is None:
    return 0.0
  value, found = parsed
  if sorted(found) != sorted(numbers) or value is None:
    return FMT
  return OK if abs(value - target) < 1e-6 else FMT


# ----- the reward rule on hand-written cases -----

N = (3, 5, 7)  # target 22 = 3*5+7

CASES = [
  # reply, numbers, target, outcome, reward
  ("3*5+7", N, 22, "correct", OK),
  ("  3 * 5 +\t7 ", N, 22, "correct", OK),
  ("7+5*3", N, 22, "correct", OK),
  ("((3*5))+(7)", N, 22, "correct", OK),
  ("3*5-7", N, 22, "too_low", FMT),
  ("3*7+5", N, 22, "too_high", FMT),
  ("3*5+7+3", N, 22, "bad_numbers", FMT),  # 3 reused
  ("3*5", N, 22, "bad_numbers", FMT),  # 7 missing
  ("3*5+8", N, 22, "bad_numbers", FMT),  # a number not given
  ("35+7", N, 22, "bad_numbers", FMT),  # digits glued together
  ("7/(5-5)", (5, 5, 7), 1, "div_by_zero", FMT),
  ("6/4*2", (6, 4, 2), 3, "correct", OK),  # non-integer intermediate, allowed as in TinyZero
  ("1/3", (1, 3), 1, "too_low", FMT),  # exact: 1/3 is not rounded to 0
  ("3*5+7=22", N, 22, "bad_format", 0.0),  # the answer is an expression, not an equation
  ("answer: 3*5+7", N, 22, "bad_format", 0.0),  # extra text around it
  ("3*5+7.", N, 22, "bad_format", 0.0),
  ("hello", N, 22, "bad_format", 0.0),
  ("", N, 22, "bad_format", 0.0),
  ("3*5+", N, 22, "bad_format", 0.0),
  ("(3*5+7", N, 22, "bad_format", 0.0),
  ("3*5+7)", N, 22, "bad_format", 0.0),
  ("()", N, 22, "bad_format", 0.0),
  ("3 5 7", N, 22, "bad_format", 0.0),
  ("3**5+7", N, 22, "bad_format", 0.0),
  ("3^5+7", N, 22, "bad_format", 0.0),
  ("3.0*5+7", N, 22, "bad_format", 0.0),
  ("03*5+7", N, 22, "bad_format", 0.0),  # leading zero
  ("\u0663*5+7", N, 22, "bad_format", 0.0),  # Arabic-Indic digit three
  ("__import__('os').getcwd()", N, 22, "bad_format", 0.0),
  ("-3+5*7", N, 32, "bad_format", 0.0),  # unary minus is off by default
  ("+3*5+7", N, 22, "bad_format", 0.0),
  ("3--5*7", N, 38, "bad_format", 0.0),
]


@pytest.mark.parametrize("reply, numbers, target, outcome, reward", CASES)
def test_reward_rule_on_hand_written_cases(reply, numbers, target, outcome, reward):
  score = score_answer(reply, numbers, target)
  assert (score.outcome, score.reward) == (outcome, reward)
  assert reference_score(reply, numbers, target) == reward


@pytest.mark.parametrize(
  "reply, target, outcome",
  [("-3+5*7", 32, "correct"), ("3--5*7", 38, "correct"), ("-(3-5)*7", 14, "correct")],
)
def test_unary_minus_when_allowed(reply, target, outcome):
  score = score_answer(reply, N, target, allow_unary_minus=True)
  assert score.outcome == outcome and score.reward == OK
  assert reference_score(reply, N, target, unary=True) == OK


@pytest.mark.parametrize(
  "reply, outcome, reward",
  [
    ("<think>3*7=21</think> <answer> 3*5+7 </answer>", "correct", OK),
    ("<answer>3*7+5</answer> no, <answer>3*5+7</answer>", "correct", OK),  # the last counts
    ("<answer>3*5+7</answer> no: <answer>3*7+5</answer>", "too_high", FMT),
    ("<answer>what</answer>", "bad_format", FMT),  # tags present: TinyZero's format score
    ("3*5+7", "no_answer", 0.0),
    ("<answer>3*5+7", "no_answer", 0.0),
  ],
)
def test_tinyzero_styles_take_the_last_answer_tag(reply, outcome, reward):
  for style in ("tinyzero", "tinyzero_instruct"):
    score = score_answer(reply, N, 22, style=style)
    assert (score.outcome, score.reward) == (outcome, reward)


@pytest.mark.parametrize(
  "reply",
  [
    "9**9**9**9**9",
    "1+" * 1_000_000 + "1",
    "(" * 100_000 + "3" + ")" * 100_000,
    "9" * 10_000_000,
    "<answer>" + "(" * 1_000_000 + "</answer>",
  ],
)
def test_hostile_input_is_rejected_cheaply(reply):
  start = time.perf_counter()
  for style in ("short", "tinyzero"):
    assert score_answer(reply, N, 22, style=style).reward in (0.0, FMT)
  assert time.perf_counter() - start < 0.5


def test_longest_accepted_input_is_evaluated():
  nested = "(" * 60 + "3*5" + ")" * 60 + "+7"
  assert score_answer(nested, N, 22).correct
  spaced = "3*5+" + " " * (MAX_EQUATION_CHARS - 5) + "7"
  assert len(spaced) == MAX_EQUATION_CHARS and score_answer(spaced, N, 22).correct
  assert score_answer(spaced.replace("+", "+ "), N, 22).outcome == "bad_format"
  assert score_answer("  3*5+7  " + " " * MAX_EQUATION_CHARS, N, 22).correct  # reply stripped


# ----- hypothesis: the parser against the reference -----

ALPHABET = "0123456789+-*/() "


def expressions(max_leaves: int = 5):
  """Random well-formed expression texts over small integers (operator-precedence soup)."""
  leaf = st.integers(0, 30).map(str)

  def extend(children):
    binary = st.tuples(children, st.sampled_from("+-*/"), children).map(lambda t: "".join(t))
    return binary | children.map(lambda s: f"({s})")

  return st.recursive(leaf, extend, max_leaves=max_leaves)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(expressions(), st.text(ALPHABET, max_size=20)), target=st.integers(-5, 60))
def test_parser_agrees_with_the_ast_reference(text, target):
  assume(not re.search(r"(?<![0-9])0[0-9]", text))  # Python reads "00" as 0; we reject it
  parsed = reference_value(text)
  numbers = parsed[1] if parsed is not None else [1, 2]
  score = score_answer(text, numbers, target)
  assert score.reward == reference_score(text, numbers, target)
  if parsed is None:
    assert score.outcome == "bad_format"
  elif parsed[0] is None:
    assert score.outcome == "div_by_zero"
  else:
    assert score.value == parsed[0]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), size=st.integers(2, 5), max_value=st.integers(1, 200))
def test_a_generated_problem_s_own_expression_always_scores_the_maximum(seed, size, max_value):
  problem = generate_problem(seed, min_numbers=size, max_numbers=size, max_value=max_value)
  assert len(problem.numbers) == size and all(1 <= n <= max_value for n in problem.numbers)
  assert 1 <= problem.target <= 100
  assert score_answer(problem.solution, problem.numbers, problem.target).reward == OK
  assert reference_score(problem.solution, problem.numbers, problem.target) == OK
  env = CountdownEnv(min_numbers=size, max_numbers=size, max_value=max_value)
  env.reset(seed)
  assert env.step(env.optimal_action())[1:3] == (env.max_return, True)


# ----- generated problems: solvable, deterministic, in range -----


def brute_force(numbers: tuple[int, ...], target: int) -> str | None:
  """Some expression using each number once that equals `target` (exhaustive search)."""
  items = [(Fraction(n), str(n)) for n in numbers]

  def search(pool):
    if len(pool) == 1:
      return pool[0][1] if pool[0][0] == target else None
    for i, j in itertools.permutations(range(len(pool)), 2):
      (a, a_text), (b, b_text) = pool[i], pool[j]
      rest = [p for k, p in enumerate(pool) if k not in (i, j)]
      results = [(a + b, "+"), (a - b, "-"), (a * b, "*")]
      results += [(a / b, "/")] if b else []
      for value, op in results:
        found = search([*rest, (value, f"({a_text}{op}{b_text})")])
        if found:
          return found
    return None

  return search(items)


def test_generated_problems_are_solvable_and_in_range():
  sizes = Counter()
  for seed in range(150):
    problem = generate_problem(seed)
    sizes[len(problem.numbers)] += 1
    assert all(1 <= n <= 99 for n in problem.numbers) and 1 <= problem.target <= 100
    solution = brute_force(problem.numbers, problem.target)
    assert solution is not None, problem
    assert score_answer(solution, problem.numbers, problem.target).correct
  assert set(sizes) == {3, 4}


def test_problems_are_deterministic_in_the_seed():
  assert generate_problem(12) == generate_problem(12)
  assert len({generate_problem(s) for s in range(50)}) == 50
  env_a, env_b = make_env("countdown"), make_env("countdown")
  assert env_a.reset(seed=5) == env_b.reset(seed=5)


# ----- environments -----


def test_registered_environments_follow_the_protocol():
  for name, cls in [("countdown", CountdownEnv), ("countdown_multiturn", CountdownMultiTurnEnv)]:
    env = make_env(name)
    assert (
      registry.RegistryView(registry.ENVIRONMENTS)[name] is cls
      and isinstance(env, Environment)
      and env.name == name
    )
    assert env.max_return == OK


def test_single_turn_episode():
  env = CountdownEnv()
  observation, info = validate_reset_output("countdown", env.reset(seed=0))
  numbers, target = info["numbers"], info["target"]
  assert observation == f"use {' '.join(map(str, numbers))} to make {target}"
  output = validate_step_output("countdown", 1, env.step("1+"))
  assert output == (
    "",
    0.0,
    True,
    False,
    {"outcome": "bad_format", "attempt": 1, "correct": False, "success": False},
  )
  with pytest.raises(RuntimeError, match="reset"):
    env.step("1")
  env.reset(seed=0)
  assert env.step("+".join(map(str, numbers)))[1] in (FMT, OK)


def test_multi_turn_feedback_until_success():
  env = CountdownMultiTurnEnv(max_attempts=6)
  _, info = env.reset(seed=0)
  numbers, target = info["numbers"], info["target"]
  product = "*".join(map(str, numbers))
  assert math.prod(numbers) != target
  high = math.prod(numbers) > target
  replies_and_feedback = [
    ("nonsense", "bad format"),
    ("+".join(map(str, numbers + [1])), "bad numbers"),
    (product, "too high" if high else "too low"),
  ]
  for attempt, (reply, feedback) in enumerate(replies_and_feedback, 1):
    observation, reward, terminated, truncated, step_info = validate_step_output(
      env.name, attempt, env.step(reply)
    )
    assert (observation, reward, terminated, truncated) == (feedback, 0.0, False, False)
    assert step_info["attempt"] == attempt
  assert env.step(env.optimal_action()) == (
    "",
    OK,
    True,
    False,
    {"outcome": "correct", "attempt": 4, "correct": True, "success": True},
  )


def test_multi_turn_division_by_zero_feedback():
  env = CountdownMultiTurnEnv(max_attempts=2)
  seed = next(s for s in range(100) if len(set(generate_problem(s).numbers)) < 3)
  numbers = env.reset(seed)[1]["numbers"]
  twin = next(n for n in numbers if numbers.count(n) >= 2)
  rest = list(numbers)
  rest.remove(twin)
  rest.remove(twin)
  reply = f"{rest[0]}/({twin}-{twin})" + "".join(f"+{n}" for n in rest[1:])
  assert env.step(reply) == (
    "div by zero",
    0.0,
    False,
    False,
    {"outcome": "div_by_zero", "attempt": 1, "correct": False, "success": False},
  )


@pytest.mark.parametrize(
  "last_reply, reward", [("1+2", FMT), ("oops", 0.0)], ids=["well-formed", "malformed"]
)
def test_multi_turn_ends_at_max_attempts_with_the_last_attempt_s_reward(last_reply, reward):
  env = CountdownMultiTurnEnv(max_attempts=3)
  env.reset(seed=2)
  rewards = []
  for reply in ["x", "1+2", last_reply]:
    _, r, terminated, truncated, info = env.step(reply)
    rewards.append(r)
  assert rewards == [0.0, 0.0, reward] and terminated and not truncated and info["attempt"] == 3
  with pytest.raises(RuntimeError):
    env.step("1")


def test_multi_turn_success_on_the_first_attempt_returns_the_maximum():
  env = CountdownMultiTurnEnv()
  env.reset(seed=3)
  _, reward, terminated, _, info = env.step(env.optimal_action())
  assert reward == env.max_return and terminated and info["attempt"] == 1


@pytest.mark.parametrize(
  "style, ending, feedback",
  [
    ("tinyzero", "Assistant: Let me solve this step by step.\n<think>", "\nUser: bad format."),
    (
      "tinyzero_instruct",
      "<|im_end|>\n<|im_start|>assistant\nLet me solve this step by step.\n<think>",
      "\n<|im_start|>user\nbad format. Try again.<|im_end|>\n<|im_start|>assistant\n",
    ),
  ],
)
def test_tinyzero_prompts_and_feedback(style, ending, feedback):
  env = CountdownMultiTurnEnv(style=style, max_attempts=2)
  observation, info = env.reset(seed=4)
  assert f"Using the numbers {info['numbers']}, create an equation that equals" in observation
  assert observation.endswith(ending)
  assert env.step("I give up")[0].startswith(feedback)
  assert env.step(env.optimal_action())[1] == OK


def test_every_short_style_text_fits_the_countdown_alphabet():
  tokenizer = CharTokenizer(COUNTDOWN_ALPHABET)
  for feedback in FEEDBACK.values():
    tokenizer.encode(feedback)
  run = load_run_config(str(CONFIGS / "countdown.yaml"))
  assert run.model.alphabet == COUNTDOWN_ALPHABET
  env = make_env(run.env.name, **run.env.kwargs)
  for seed in range(300):
    observation, _ = env.reset(seed)
    assert len(tokenizer.encode(observation, add_bos=True)) <= run.train.max_prompt_length
    answer = tokenizer.encode(env.optimal_action())
    assert len(answer) <= run.env.max_tokens_per_turn


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"style": "long"}, "style='long' unknown"),
    ({"min_numbers": 1}, "min_numbers"),
    ({"min_numbers": 5, "max_numbers": 4}, "min_numbers=5, max_numbers=4"),
    ({"min_value": 0}, "min_value=0"),
    ({"min_target": 50, "max_target": 10}, "min_target=50, max_target=10"),
    ({"format_reward": 2.0}, "format_reward=2.0"),
    ({"max_attempts": 0}, "max_attempts=0 is invalid: must be an integer >= 1"),
    ({"min_numbers": 2.5}, r"min_numbers=2.5 is invalid: must be an integer >= 2"),
    ({"max_value": "9"}, r"max_value='9' is invalid"),
    ({"correct_reward": float("nan")}, r"correct_reward=nan is invalid"),
    ({"allow_unary_minus": "no"}, r"allow_unary_minus='no' is invalid: must be true or false"),
    (  # no expression of three numbers up to 9 reaches 5000: named at once, not at a reset
      {"max_numbers": 3, "max_value": 9, "min_target": 5000, "max_target": 5001},
      r"countdown: no problem with a target in \[min_target=5000, max_target=5001\] from "
      r"min_numbers=3, max_numbers=3 numbers in \[min_value=1, max_value=9\]",
    ),
  ],
)
def test_bad_kwargs_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    CountdownMultiTurnEnv(**kwargs)


def test_cli_names_bad_countdown_kwargs(capsys):
  config = str(CONFIGS / "countdown.yaml")
  assert cli.main(["train", "--config", config, "env.kwargs.min_value=0"]) == 2
  err = capsys.readouterr().err
  assert "'env.name'/'env.kwargs'" in err and "min_value=0" in err


# ----- the main job on Countdown -----


def test_cli_trains_the_tiny_model_on_multi_turn_countdown(tmp_path):
  out = tmp_path / "run"
  code = cli.main(
    train_argv(
      CONFIGS / "countdown.yaml",
      out,
      "env.name=countdown_multiturn",
      "env.kwargs.max_attempts=2",
      "env.max_turns=2",
      "env.max_completion_len=32",
      "env.max_tokens_per_turn=8",
      "train.steps=2",
      "train.batch_size=8",
      "train.eval_every=100",
      "model.num_layers=1",
      "model.embed_dim=32",
      "model.hidden_dim=64",
    )
  )
  assert code == 0
  summary = json.loads((out / "summary.json").read_text())
  assert summary["steps"] == 2 and summary["max_return"] == OK
  assert 0.0 <= summary["first_return"] <= OK
  rows = read_jsonl(out / "metrics.jsonl")
  assert {0, 1} <= {row["step"] for row in rows}
  turns = [v for row in rows for k, v in row.items() if "num_turns" in k and k.endswith("mean")]
  assert turns and max(turns) > 1.0  # a random policy's first answers fail: feedback turns
