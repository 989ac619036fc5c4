"""Toy prompts, answers and reward functions (NumPy only)."""

from __future__ import annotations

import string
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
  pass


TARGET_CHAR = "a"


def make_prompts(num: int, seed: int = 0, length: int = 2) -> tuple[list[str], list[str]]:
  """`num` prompts `"say <word>:"` and answers (`<word>`), random lowercase words.

  With BOS a prompt is `length + 6` tokens: keep it <= `max_prompt_length`, since the
  sampler does not truncate but pads longer prompts to the next power of two.
  """
  rng = np.random.default_rng(seed)
  letters = np.array(list(string.ascii_lowercase))
  words = ["".join(rng.choice(letters, size=length)) for _ in range(num)]
  return [f"say {w}:" for w in words], words


def make_prompts_dataset(
  num_batches: int, batch: int, seed: int = 0, word_length: int = 2
) -> list[dict[str, np.ndarray]]:
  """`num_batches` batches `{"prompts": [batch] str array, "answer": [batch] str array}`.

  Arrays, not lists: tunix's learner `np.repeat`s every leaf of a batch, which would turn
  each string of a Python list into its own array.
  """
  prompts, answers = make_prompts(num_batches * batch, seed, word_length)
  return [
    {"prompts": np.array(prompts[i : i + batch]), "answer": np.array(answers[i : i + batch])}
    for i in range(0, num_batches * batch, batch)
  ]


def iterate_forever(batches: Sequence[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
  """Cycles through `batches` (the learner stops at `max_steps`)."""
  while True:
    yield from batches


def target_char_reward(prompts: Sequence[str], completions: Sequence[str], **_) -> list[float]:
  """Fraction of each completion's characters that are `TARGET_CHAR` (0 for empty)."""
  return [c.count(TARGET_CHAR) / len(c) if c else 0.0 for c in completions]


def echo_answer_reward(
  prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str], **_
) -> list[float]:
  """Fraction of the answer's characters that the completion reproduces in place."""
  return [_matched_fraction(c, str(t)) for c, t in zip(completions, answer, strict=True)]


def _matched_fraction(completion: str, target: str) -> float:
  """Share of `target`'s positions where `completion` has the same character."""
  hits = sum(a == b for a, b in zip(completion, target, strict=False))
  return hits / max(len(target), 1)
