"""Sampling knobs reach tunix's sampler through the multi-turn rollout, per mode: training
with top-k 1 plays every copy of an episode identically, evaluation with its own settings
(no top-k, its own temperature) does not; real cluster, vanilla engine, toy Qwen3."""

import numpy as np
import pytest

from tests.helpers.clusters import multi_turn_learner
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.data.trajectory import episode_batches
from tunix_ppo_ext._src.tunix.rollout.continuing_sampler import Conversation
from tunix_ppo_ext._src.tunix.rollout.multi_turn import Mode, MultiTurnRollout

pytestmark = pytest.mark.tunix

ALPHABET = "abcehikstw!.? "
P, T, G = 8, 16, 4  # max_prompt_length, max_completion_len, max_turn_tokens
COPIES = 4  # rows playing the same episode seed


def test_train_and_eval_rollouts_sample_with_their_own_settings(monkeypatch):
  tokenizer = CharTokenizer(ALPHABET, pad_id=0, eos_id=2)
  source = MultiTurnRollout(max_completion_len=T, max_turn_tokens=G)
  learner = multi_turn_learner(
    tokenizer,
    0,
    source,
    prompt_len=P,
    max_steps=1,
    batch=8,
    sampling={"top_p": 1.0, "top_k": 1},
    eval_sampling={"temperature": 0.7, "top_k": None},
  )
  seen = []
  original = Conversation.turn

  def turn(self, contexts, active, sampling, fresh_width):  # the real sampler, recording
    seen.append((sampling.temperature, sampling.top_p, sampling.top_k))
    return original(self, contexts, active, sampling, fresh_width)

  monkeypatch.setattr(Conversation, "turn", turn)
  data = {k: np.repeat(v, COPIES, axis=0) for k, v in next(episode_batches(1, 2)).items()}
  rows = {}
  for mode in (Mode.TRAIN, Mode.EVAL):
    seen.clear()
    batch = source(learner, data, mode)
    rows[mode] = np.asarray(batch.completion_ids).reshape(2, COPIES, -1)
    assert seen and len(set(seen)) == 1, seen  # every turn of the mode samples alike
    rows[mode, "config"] = seen[0]
  assert rows[Mode.TRAIN, "config"] == (1.0, 1.0, 1)
  assert rows[Mode.EVAL, "config"] == (0.7, 1.0, None)
  # top-k 1: the copies of an episode are identical; evaluation samples: they differ
  assert all((group == group[:1]).all() for group in rows[Mode.TRAIN])
  assert any((group != group[:1]).any() for group in rows[Mode.EVAL])
