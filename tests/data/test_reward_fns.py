"""A reward function's output checked where the learner wraps it (`NonFiniteRewards.check`):
one number per completion, or one line naming the function."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tunix_ppo_ext._src.data.rewards import NonFiniteRewards

pytestmark = pytest.mark.fast

PROMPTS, COMPLETIONS = ["p1", "p2", "p3"], ["a", "bb", "ccc"]


def length_table(prompts, completions, **_):
  return np.ones((len(completions), 2))  # one column too many


def constant(prompts, completions, **_):
  return 1.0


def one_short(prompts, completions, **_):
  return [1.0] * (len(completions) - 1)


def words(prompts, completions, **_):
  return ["good"] * len(completions)


@pytest.mark.parametrize(
  ("fn", "returned"),
  [
    (length_table, r"an array of shape \(3, 2\)"),
    (constant, r"a float \(1.0\)"),
    (one_short, r"a list of 2"),
    (words, r"a list of 3 that is not numbers \('good'"),
  ],
)
def test_a_reward_function_of_the_wrong_shape_is_named(fn, returned):
  """A 2-D array failed in tunix's reward manager naming no function; a scalar was
  broadcast to every completion silently."""
  checked = NonFiniteRewards("error").check(fn)
  with pytest.raises(ValueError) as caught:
    checked(prompts=PROMPTS, completions=COMPLETIONS)
  message = str(caught.value)
  assert message.startswith(f"reward function {fn.__name__!r} returned "), message
  assert "must return one number per completion (3 here)" in message
  assert re.search(returned, message), message


@pytest.mark.parametrize(
  "scores", [[0.5, 1.0, 0.0], np.array([1, 2, 3]), (0.1, 0.2, 0.3), np.ones((3, 1))[:, 0]]
)
def test_one_number_per_completion_passes_as_returned(scores):
  checked = NonFiniteRewards("error").check(lambda prompts, completions: scores)
  assert checked(prompts=PROMPTS, completions=COMPLETIONS) is scores
