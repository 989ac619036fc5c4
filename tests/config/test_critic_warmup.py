"""`CriticWarmup`: the warm-up's steps, its early ends (a target, a plateau), its metrics and
its checkpointed state."""

from __future__ import annotations

import json

import pytest

from tunix_ppo_ext._src.config.critic_warmup import CriticWarmup

pytestmark = pytest.mark.fast


def _run(warmup: CriticWarmup, variances: list[float]) -> list[bool]:
  active = []
  for step, variance in enumerate(variances):
    active.append(warmup.active(step))
    warmup.after_rollout(step, variance)
  return active


def test_the_cap_alone_warms_up_that_many_steps():
  assert _run(CriticWarmup(3, None), [0.9] * 5) == [True, True, True, False, False]
  assert _run(CriticWarmup(0, None), [0.9] * 2) == [False, False]


def test_the_target_ends_it_after_the_step_that_reaches_it():
  assert _run(CriticWarmup(10, 0.5), [0.1, 0.6, 0.2, 0.9]) == [True, True, False, False]


def test_a_plateau_ends_it_after_patience_steps_without_a_new_best():
  # bests at steps 0 and 2; steps 3 and 4 do not beat 0.3: patience 2 ends it after step 4
  warmup = CriticWarmup(10, None, patience=2)
  assert _run(warmup, [0.1, 0.0, 0.3, 0.2, 0.3, 0.9, 0.9]) == [True] * 5 + [False] * 2
  assert warmup.ended_at == 5
  assert warmup.metrics(6) == {"learner/critic_warmup": 0.0, "learner/critic_warmup_steps": 5}


def test_none_variance_counts_nothing_and_state_round_trips_through_json():
  warmup = CriticWarmup(10, None, patience=2)
  _run(warmup, [0.4, None, 0.1])
  assert warmup.ended_at is None and (warmup.best, warmup.since_best) == (0.4, 1)
  state = json.loads(json.dumps(warmup.state_dict(), allow_nan=False))
  restored = CriticWarmup(10, None, patience=2)
  restored.load_state_dict(state)
  assert (restored.best, restored.since_best, restored.ended_at) == (0.4, 1, None)
  restored.after_rollout(3, 0.2)  # a second step without a new best: ended
  assert restored.ended_at == 4
  fresh = CriticWarmup(10, None)
  fresh.load_state_dict(CriticWarmup(10, None).state_dict())
  assert fresh.best is None and fresh.ended_at is None
  fresh.load_state_dict({"ended_at": 3})  # a checkpoint of the first version
  assert fresh.ended_at == 3 and fresh.best is None
