"""The Countdown arithmetic task (TinyZero's, trained there with verl's PPO), as text environments.

A problem is a few integers and a target; the agent answers with an arithmetic expression
that must use every given number exactly once (integers, `+ - * /`, parentheses) and equal
the target. The reward is TinyZero's rule: `correct_reward` (1.0) for a correct equation,
`format_reward` (0.1) for a well-formed answer that is wrong, 0 otherwise. The two are not
added: a correct answer scores 1.0, the maximum return.

Answers are never `eval`ed: `parse_equation` is a small tokenizer and recursive-descent
parser that accepts only integer literals, the four binary operators, parentheses (and,
if asked, unary minus); `evaluate` computes the value exactly with `Fraction`s, so
non-integer intermediate results are allowed (as with TinyZero's float `eval`) and compared
without rounding error. Answers longer than `MAX_EQUATION_CHARS` are rejected before any
parsing; `**`, `^`, names, calls and decimals are malformed.

Styles:
  "short"     observation `use 3 5 7 to make 22`; the whole reply is the expression; it
              is well-formed when it parses. Every text fits `COUNTDOWN_ALPHABET`, the
              alphabet to give the built-in `CharTokenizer` (`model.alphabet`).
  "tinyzero"  TinyZero's prompt (its "base" template); the answer is the last
              `<answer>...</answer>` in the reply and is well-formed as soon as the tags
              are there (TinyZero's format rule). For Hugging Face tokenizers.
  "tinyzero_instruct"  the same in TinyZero's "qwen-instruct" chat template
              (`<|im_start|>` ... `<|im_end|>`), for Qwen chat models: their EOS
              `<|im_end|>` ends the agent's turn.

`CountdownEnv` ("countdown") is single-turn. `CountdownMultiTurnEnv` ("countdown_multiturn")
answers a wrong attempt with feedback (`too high`, `too low`, `bad numbers`, `bad format`,
`div by zero`) until the answer is correct or `max_attempts` are used; only the episode's
last attempt is rewarded, so returns are on the same scale as the single-turn form.

Problems are generated from the episode seed by drawing the numbers and combining them in a
random expression tree (positive integer intermediates, exact divisions), so every problem
is solvable; the expression is kept as `CountdownProblem.solution`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import string
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from tunix_ppo_ext._src.checks import check_choice, check_integer, check_number
from tunix_ppo_ext._src.plugins.protocols import StepOutput

MAX_EQUATION_CHARS = 200
OPERATORS = "+-*/"
# Every character of the "short" style's observations and answers (letters of the prompt
# and the feedback). Use it as `model.alphabet` for the built-in character tokenizer.
COUNTDOWN_ALPHABET = string.digits + OPERATORS + "() " + "abdefghiklmnorstuvwyz"

Style = Literal["short", "tinyzero", "tinyzero_instruct"]
STYLES = ("short", "tinyzero", "tinyzero_instruct")
FEEDBACK = {
  "too_high": "too high",
  "too_low": "too low",
  "bad_numbers": "bad numbers",
  "bad_format": "bad format",
  "no_answer": "bad format",
  "div_by_zero": "div by zero",
}
_ANSWER_TAGS = re.compile(r"<answer>(.*?)</answer>")
_TOKEN = re.compile(r"\s*(?:([0-9]+)|([-+*/()]))")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


class EquationError(ValueError):
  """The text is not an expression over integers with `+ - * /` and parentheses."""


# ----- parsing and evaluation (no eval) -----

# A parsed expression: an `int` literal, `("neg", node)` or `(op, left, right)`.
Node = int | tuple


def _tokens(text: str) -> list[str]:
  """Integer literals, operators and parentheses of `text` (spaces skipped)."""
  if len(text) > MAX_EQUATION_CHARS:
    raise EquationError(f"longer than {MAX_EQUATION_CHARS} characters")
  tokens, position = [], 0
  text = text.rstrip()
  while position < len(text):
    match = _TOKEN.match(text, position)
    if match is None:
      raise EquationError(f"unexpected {text[position:].lstrip()[:1]!r} at {position}")
    number, symbol = match.groups()
    if number is not None and len(number) > 1 and number[0] == "0":
      raise EquationError(f"number with a leading zero: {number!r}")
    tokens.append(number if number is not None else symbol)
    position = match.end()
  return tokens


class _Parser:
  """Recursive descent over `expr := term (+|- term)*`, `term := factor (*|/ factor)*`."""

  def __init__(self, tokens: list[str], allow_unary_minus: bool):
    self.tokens, self.position, self.unary = tokens, 0, allow_unary_minus

  def peek(self) -> str | None:
    return self.tokens[self.position] if self.position < len(self.tokens) else None

  def take(self) -> str:
    token = self.peek()
    if token is None:
      raise EquationError("unexpected end of the expression")
    self.position += 1
    return token

  def _left_assoc(self, ops: tuple[str, str], operand: Callable[[], Node]) -> Node:
    """`operand (op operand)*` for `op` in `ops`, folded to the left."""
    node = operand()
    while self.peek() in ops:
      op = self.take()
      node = (op, node, operand())
    return node

  def expr(self) -> Node:
    return self._left_assoc(("+", "-"), self.term)

  def term(self) -> Node:
    return self._left_assoc(("*", "/"), self.factor)

  def factor(self) -> Node:
    token = self.take()
    if token[0] in string.digits:
      return int(token)
    if token == "(":
      node = self.expr()
      if self.take() != ")":
        raise EquationError("missing ')'")
      return node
    if token == "-" and self.unary:
      return ("neg", self.factor())
    raise EquationError(f"unexpected {token!r}")


def parse_equation(text: str, allow_unary_minus: bool = False) -> Node:
  """The expression tree of `text`; raises `EquationError` if it is not a valid expression."""
  parser = _Parser(_tokens(text), allow_unary_minus)
  if not parser.tokens:
    raise EquationError("empty expression")
  node = parser.expr()
  if parser.peek() is not None:
    raise EquationError(f"unexpected {parser.peek()!r} after the expression")
  return node


def literals(node: Node) -> list[int]:
  """The integer literals of a parsed expression, left to right."""
  if isinstance(node, int):
    return [node]
  return [n for child in node[1:] for n in literals(child)]


def evaluate(node: Node) -> Fraction:
  """The exact value of a parsed expression; raises `ZeroDivisionError` on `x / 0`."""
  if isinstance(node, int):
    return Fraction(node)
  if node[0] == "neg":
    return -evaluate(node[1])
  op, left, right = node
  a, b = evaluate(left), evaluate(right)
  if op == "+":
    return a + b
  if op == "-":
    return a - b
  if op == "*":
    return a * b
  return a / b


# ----- the reward rule -----


@dataclasses.dataclass(frozen=True)
class Score:
  """One scored reply.

  Attributes:
    reward: `correct_reward`, `format_reward` or 0.
    outcome: "correct", "too_high", "too_low", "bad_numbers", "div_by_zero",
      "bad_format" (the expression does not parse) or "no_answer" (no answer tags).
    equation: the expression text that was scored (None when there was none).
    value: its exact value when it was evaluated.
  """

  reward: float
  outcome: str
  equation: str | None = None
  value: Fraction | None = None

  @property
  def correct(self) -> bool:
    return self.outcome == "correct"


def extract_answer(reply: str, style: Style) -> str | None:
  """The expression in `reply`: all of it ("short"), else the last `<answer>` tag's text."""
  if style == "short":
    return reply.strip()
  matches = _ANSWER_TAGS.findall(reply)
  return matches[-1].strip() if matches else None


def score_answer(
  reply: str,
  numbers: list[int] | tuple[int, ...],
  target: int,
  *,
  style: Style = "short",
  format_reward: float = 0.1,
  correct_reward: float = 1.0,
  allow_unary_minus: bool = False,
) -> Score:
  """TinyZero's Countdown reward for `reply`: correct, merely well-formed, or neither.

  Checks in TinyZero's order: an answer present, every given number used exactly once
  (as a multiset), then the exact value equal to `target` (within 1e-6).
  """
  check_choice("style", style, STYLES)
  equation = extract_answer(reply, style)
  if equation is None:
    return Score(0.0, "no_answer")
  try:
    node = parse_equation(equation, allow_unary_minus)
  except EquationError:
    return Score(format_reward if style != "short" else 0.0, "bad_format", equation)
  if Counter(literals(node)) != Counter(int(n) for n in numbers):
    return Score(format_reward, "bad_numbers", equation)
  try:
    value = evaluate(node)
  except ZeroDivisionError:
    return Score(format_reward, "div_by_zero", equation)
  if abs(value - target) < 1e-6:
    return Score(correct_reward, "correct", equation, value)
  return Score(format_reward, "too_high" if value > target else "too_low", equation, value)


# ----- problems -----


@dataclasses.dataclass(frozen=True)
class CountdownProblem:
  """Numbers (in shown order), the target, and the expression the target was built from."""

  numbers: tuple[int, ...]
  target: int
  solution: str


def _render(op: str, left: tuple[str, int], right: tuple[str, int]) -> tuple[str, int]:
  """`(text, precedence)` of `left op right` with only the parentheses it needs."""
  precedence = _PRECEDENCE[op]
  left_text = f"({left[0]})" if left[1] < precedence else left[0]
  right_needs = right[1] < precedence or (right[1] == precedence and op in "-/")
  right_text = f"({right[0]})" if right_needs else right[0]
  return f"{left_text}{op}{right_text}", precedence


def _random_expression(rng: np.random.Generator, numbers: list[int]) -> tuple[int, str]:
  """Combines all `numbers` pairwise at random (positive integer intermediates only)."""
  pool: list[tuple[int, tuple[str, int]]] = [(n, (str(n), 3)) for n in numbers]
  while len(pool) > 1:
    i, j = rng.choice(len(pool), size=2, replace=False)
    (a, a_text), (b, b_text) = pool[i], pool[j]
    options = [("+", a + b), ("*", a * b)]
    if a > b:
      options.append(("-", a - b))
    if a % b == 0:
      options.append(("/", a // b))
    op, value = options[int(rng.integers(len(options)))]
    pool = [item for k, item in enumerate(pool) if k not in (i, j)]
    pool.append((value, _render(op, a_text, b_text)))
  value, (text, _) = pool[0]
  return value, text


def generate_problem(
  seed: int,
  *,
  min_numbers: int = 3,
  max_numbers: int = 4,
  min_value: int = 1,
  max_value: int = 99,
  min_target: int = 1,
  max_target: int = 100,
  max_tries: int = 10_000,
) -> CountdownProblem:
  """A solvable problem, deterministic given `seed`: random numbers, a random expression.

  The count is uniform in `[min_numbers, max_numbers]`, each number uniform in
  `[min_value, max_value]`; expressions are drawn until one's value lies in
  `[min_target, max_target]` (its numbers are then shown shuffled).
  """
  rng = np.random.default_rng(seed)
  for _ in range(max_tries):
    count = int(rng.integers(min_numbers, max_numbers + 1))
    numbers = [int(n) for n in rng.integers(min_value, max_value + 1, size=count)]
    target, solution = _random_expression(rng, numbers)
    if min_target <= target <= max_target:
      shown = tuple(int(n) for n in rng.permutation(numbers))
      return CountdownProblem(shown, int(target), solution)
  raise ValueError(
    f"countdown: no problem with a target in [min_target={min_target}, max_target={max_target}] "
    f"from min_numbers={min_numbers}, max_numbers={max_numbers} numbers in [min_value="
    f"{min_value}, max_value={max_value}] in {max_tries} tries (seed {seed}): widen the target "
    "range or the numbers"
  )


def check_ranges(**ranges: Any) -> dict[str, int]:
  """The `generate_problem` ranges, checked: integers, `2 <= min_numbers <= max_numbers`,
  `1 <= min_value <= max_value`, `1 <= min_target <= max_target` (ValueError naming them)."""
  for kind, low in (("numbers", 2), ("value", 1), ("target", 1)):
    lo = check_integer(f"min_{kind}", ranges[f"min_{kind}"], low=low)
    hi = check_integer(f"max_{kind}", ranges[f"max_{kind}"], low=low)
    if lo > hi:
      raise ValueError(
        f"need {low} <= min_{kind} <= max_{kind}, got min_{kind}={lo}, max_{kind}={hi}"
      )
  return {key: int(value) for key, value in ranges.items()}


@functools.lru_cache(maxsize=64)
def _feasible(ranges: tuple[tuple[str, int], ...]) -> None:
  """Generates seed 0's problem once per set of ranges (a ValueError naming them if none)."""
  generate_problem(0, **dict(ranges))


# ----- the environments -----

_TINYZERO_TASK = (
  "Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
  "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work "
  "in <think> </think> tags. And return the final answer in <answer> </answer> tags, for "
  "example <answer> (1 + 2) / 3 </answer>."
)
_PROMPTS = {  # TinyZero's "base" and "qwen-instruct" templates
  "tinyzero": (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    f"provides the user with the answer.\nUser: {_TINYZERO_TASK}\n"
    "Assistant: Let me solve this step by step.\n<think>"
  ),
  "tinyzero_instruct": (
    "<|im_start|>system\nYou are a helpful assistant. You first thinks about the reasoning "
    "process in the mind and then provides the user with the answer.<|im_end|>\n"
    f"<|im_start|>user\n {_TINYZERO_TASK}<|im_end|>\n"
    "<|im_start|>assistant\nLet me solve this step by step.\n<think>"
  ),
}
_FEEDBACK_TEMPLATES = {
  "short": "{feedback}",
  "tinyzero": "\nUser: {feedback}. Try again.\nAssistant: <think>",
  # the agent's turn ended with the EOS `<|im_end|>`, which the rollout puts back
  "tinyzero_instruct": "\n<|im_start|>user\n{feedback}. Try again.<|im_end|>\n"
  "<|im_start|>assistant\n<think>",
}


class CountdownEnv:
  """Single-turn Countdown: one answer per episode, scored by `score_answer`.

  Episode ("short" style):  reset -> "use 3 5 7 to make 22"   agent "3*5+7"  -> 1.0, done.
  `max_return` is `correct_reward`. kwargs: the `generate_problem` ranges, `style`,
  `format_reward`, `correct_reward`, `allow_unary_minus`.
  """

  name = "countdown"

  def __init__(
    self,
    *,
    min_numbers: int = 3,
    max_numbers: int = 4,
    min_value: int = 1,
    max_value: int = 99,
    min_target: int = 1,
    max_target: int = 100,
    style: Style = "short",
    format_reward: float = 0.1,
    correct_reward: float = 1.0,
    allow_unary_minus: bool = False,
  ):
    check_choice("style", style, STYLES)
    self.ranges = check_ranges(
      min_numbers=min_numbers,
      max_numbers=max_numbers,
      min_value=min_value,
      max_value=max_value,
      min_target=min_target,
      max_target=max_target,
    )
    format_reward = check_number("format_reward", format_reward, low=0.0)
    correct_reward = check_number("correct_reward", correct_reward, low=0.0)
    if not format_reward <= correct_reward:
      raise ValueError(
        f"need 0 <= format_reward <= correct_reward, got format_reward={format_reward}, "
        f"correct_reward={correct_reward}"
      )
    if not isinstance(allow_unary_minus, bool):
      raise ValueError(
        f"allow_unary_minus={allow_unary_minus!r} is invalid: must be true or false."
      )
    _feasible(tuple(self.ranges.items()))  # kwargs no problem can meet fail here, not at a reset
    self.style: Style = style
    self.format_reward = float(format_reward)
    self.correct_reward = float(correct_reward)
    self.allow_unary_minus = allow_unary_minus
    self.max_attempts = 1
    self.max_return = self.correct_reward
    self.problem: CountdownProblem | None = None
    self._attempt = 0

  def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
    """Generates the problem of `seed`; the observation states the numbers and the target."""
    self.problem = generate_problem(seed, **self.ranges)
    self._attempt = 0
    info = {"numbers": list(self.problem.numbers), "target": self.problem.target}
    return self._prompt(self.problem), info

  def _prompt(self, problem: CountdownProblem) -> str:
    if self.style != "short":
      return _PROMPTS[self.style].format(numbers=list(problem.numbers), target=problem.target)
    return f"use {' '.join(map(str, problem.numbers))} to make {problem.target}"

  def score(self, reply: str) -> Score:
    """`score_answer` of `reply` for the current problem with this environment's settings."""
    if self.problem is None:
      raise RuntimeError("call reset() before step()")
    return score_answer(
      reply,
      self.problem.numbers,
      self.problem.target,
      style=self.style,
      format_reward=self.format_reward,
      correct_reward=self.correct_reward,
      allow_unary_minus=self.allow_unary_minus,
    )

  def step(self, action: str) -> StepOutput:
    """Scores the attempt; ends on success or at `max_attempts`, else gives feedback.

    Only the last attempt is rewarded (earlier wrong attempts get 0), so an episode's
    return is that of its final answer.
    """
    result = self.score(action)
    self._attempt += 1
    info = {"outcome": result.outcome, "attempt": self._attempt, "correct": result.correct}
    info["success"] = result.correct  # the success rate's source (`metrics.episodes`)
    if result.correct or self._attempt >= self.max_attempts:
      self.problem = None
      return "", result.reward, True, False, info
    return self._feedback(result.outcome), 0.0, False, False, info

  def _feedback(self, outcome: str) -> str:
    return _FEEDBACK_TEMPLATES[self.style].format(feedback=FEEDBACK[outcome])

  def optimal_action(self) -> str:
    """A correct answer to the current problem (for scripted baselines and tests)."""
    if self.problem is None:
      raise RuntimeError("no episode in progress")
    solution = self.problem.solution
    return solution if self.style == "short" else f"</think> <answer>{solution}</answer>"


class CountdownMultiTurnEnv(CountdownEnv):
  """Countdown with retries: a wrong attempt gets feedback until `max_attempts` are used.

  Episode ("short" style, target 22):  "use 3 5 7 to make 22"  agent "3*5*7" (0)
    -> "too high"  agent "3+5+7" (0) -> "too low"  agent "3*5+7" (1.0), done.
  Feedback: `too high` / `too low` (the value), `bad numbers` (not each number exactly
  once), `bad format` (no parseable expression), `div by zero`. Same kwargs as
  `CountdownEnv` plus `max_attempts`.
  """

  name = "countdown_multiturn"

  def __init__(self, *, max_attempts: int = 4, **kwargs: Any):
    super().__init__(**kwargs)
    self.max_attempts = check_integer("max_attempts", max_attempts, low=1)
