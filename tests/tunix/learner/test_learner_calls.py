"""`PpoExtLearner.train` called as a Python user may call it: with no batch, twice, with a
reward function that returns the wrong shape. Each was tunix's error naming nothing (or a
silent extra step, a silently broadcast reward); each is now one line naming the culprit."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.clusters import toy_cluster
from tunix_ppo_ext import PpoExtConfig
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.tunix.learner.ppo_learner import PpoExtLearner

pytestmark = pytest.mark.tunix

TOKENIZER = CharTokenizer()
STEPS, BATCH = 2, 2


def reward(prompts, completions, **_):
  return [c.count("a") / max(len(c), 1) for c in completions]


def batches(count: int) -> list[dict[str, np.ndarray]]:
  return [{"prompts": np.array(["say ab:"] * BATCH)} for _ in range(count)]


@pytest.fixture(scope="module")
def learner() -> PpoExtLearner:
  cluster = toy_cluster(TOKENIZER, prompt_len=8, tokens_per_call=4, max_steps=STEPS, batch=BATCH)
  return PpoExtLearner(cluster, PpoExtConfig(), reward_fns=reward)


def test_train_with_no_batch_is_one_line_naming_train_ds(learner):
  """It was a bare `StopIteration` from inside tunix's loop."""
  with pytest.raises(ValueError, match=r"^PpoExtLearner.train: train_ds holds no batch"):
    learner.train([])
  assert learner.rl_cluster.actor_trainer.train_steps == 0


def test_a_second_train_call_stops_at_max_steps(learner):
  """tunix's loop runs one global step before it checks `max_steps`: a second `train` on
  a learner that reached it trained one step past it."""
  learner.train(batches(STEPS))
  assert learner.rl_cluster.actor_trainer.train_steps == STEPS
  with pytest.warns(UserWarning, match=r"already at max_steps=2 .*nothing to train"):
    learner.train(batches(STEPS))
  assert learner.rl_cluster.actor_trainer.train_steps == STEPS
  assert learner.rl_cluster.global_steps == STEPS
