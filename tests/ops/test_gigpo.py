"""`compute_gigpo_advantages` against an independent float64 NumPy reference written from
the GiGPO paper (arXiv:2505.10978, eqs. 3, 5-8) with explicit loops and dictionaries."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.ops.advantages import compute_gigpo_advantages

pytestmark = pytest.mark.fast

B, T, K = 8, 14, 4
TOL = dict(rtol=2e-5, atol=2e-5)


def ref_turns(mask_row: np.ndarray) -> list[list[int]]:
  """The token positions of each agent turn: maximal runs of 1."""
  turns, current = [], []
  for t, m in enumerate(mask_row):
    if m:
      current.append(t)
    elif current:
      turns.append(current)
      current = []
  if current:
    turns.append(current)
  return turns


def _normalize(values: list[float], own: float, norm: bool, eps: float) -> float:
  mean = sum(values) / len(values)
  if not norm:
    return own - mean
  std = np.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
  return (own - mean) / (std + eps)


def ref_gigpo(rewards, mask, groups, anchors, gamma, weight, norm, eps=1e-6):
  """Eq. 3 (episode), eqs. 5-7 (step groups by anchor within an episode group), eq. 8."""
  r, m = np.asarray(rewards, np.float64), np.asarray(mask)
  batch = r.shape[0]
  turns = [ref_turns(m[b]) for b in range(batch)]
  score = [sum(r[b, t] for turn in turns[b] for t in turn) for b in range(batch)]
  by_group: dict[int, list[int]] = {}
  for b in range(batch):
    by_group.setdefault(int(groups[b]), []).append(b)
  episode = {}
  for members in by_group.values():
    for b in members:
      if len(members) == 1:
        episode[b] = score[b] / (1.0 + eps) if norm else score[b]
      else:
        episode[b] = _normalize([score[i] for i in members], score[b], norm, eps)
  returns = {}
  for b in range(batch):
    turn_r = [sum(r[b, t] for t in turn) for turn in turns[b]]
    for k in range(len(turn_r)):
      returns[b, k] = sum(gamma ** (j - k) * turn_r[j] for j in range(k, len(turn_r)))
  step_groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
  for b in range(batch):
    for k in range(min(len(turns[b]), anchors.shape[1])):
      step_groups.setdefault((int(groups[b]), int(anchors[b, k])), []).append((b, k))
  step = {}
  for members in step_groups.values():
    values = [returns[x] for x in members]
    for x in members:
      step[x] = 0.0 if len(members) == 1 else _normalize(values, returns[x], norm, eps)
  out = np.zeros_like(r)
  for b in range(batch):
    for k, turn in enumerate(turns[b]):
      for t in turn:
        out[b, t] = episode[b] + weight * step.get((b, k), 0.0)
  return out


def random_batch(rng: np.random.Generator, batch: int = B, width: int = T):
  """Multi-turn rows (1-4 turns, observation gaps, padding, one empty row), groups of 4, 2,
  1 and 1, and anchors from a small alphabet so that step groups collide."""
  mask = np.zeros((batch, width), np.int32)
  for b in range(1, batch):
    t = 0
    for _ in range(rng.integers(1, K + 1)):
      length = int(rng.integers(1, 3))
      if t + length > width:
        break
      mask[b, t : t + length] = 1
      t += length + int(rng.integers(1, 3))
  sparse = rng.random((batch, width)) < 0.5
  rewards = (rng.normal(size=(batch, width)) * sparse).astype(np.float32)
  groups = np.array([9, 9, 9, 9, -3, -3, 40, 2], np.int32)[rng.permutation(batch)]
  anchors = rng.integers(0, 3, size=(batch, K)).astype(np.int32)
  return rewards, mask, groups, anchors


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("gamma,weight", [(1.0, 1.0), (0.9, 0.5), (0.0, 2.0)])
def test_gigpo_matches_reference(seed, norm, gamma, weight):
  rewards, mask, groups, anchors = random_batch(np.random.default_rng(seed))
  got = compute_gigpo_advantages(
    rewards, mask, groups, anchors, gamma_turn=gamma, step_weight=weight, norm_by_std=norm
  )
  assert got.dtype == jnp.float32 and got.shape == (B, T)
  expected = ref_gigpo(rewards, mask, groups, anchors, gamma, weight, norm)
  np.testing.assert_allclose(got, expected, **TOL)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), norm=st.booleans())
def test_gigpo_matches_reference_property(seed, norm):
  rewards, mask, groups, anchors = random_batch(np.random.default_rng(seed))
  got = compute_gigpo_advantages(rewards, mask, groups, anchors, 0.8, 1.0, norm)
  expected = ref_gigpo(rewards, mask, groups, anchors, 0.8, 1.0, norm)
  np.testing.assert_allclose(got, expected, **TOL)
  assert np.all(np.asarray(got)[mask == 0] == 0.0)


def test_gigpo_hand_computed():
  """Two rows of one group: the first turn's anchor is shared, the second's is not."""
  rewards = np.array([[0.0, 0.0, 2.0], [0.0, 0.0, 0.0]], np.float32)
  mask = np.array([[1, 0, 1], [1, 0, 1]])
  anchors = np.array([[4, 1], [4, 2]])
  got = np.asarray(compute_gigpo_advantages(rewards, mask, np.array([0, 0]), anchors))
  # episode: scores 2, 0 -> +1, -1; turn 0 shares anchor 4: returns 2, 0 -> +1, -1;
  # turn 1's anchors differ: singletons -> 0
  np.testing.assert_allclose(got, [[2.0, 0.0, 1.0], [-2.0, 0.0, -1.0]], atol=1e-6)


def test_gigpo_singletons_constant_groups_and_bfloat16():
  """A group of one keeps its score; a constant step group gives exactly 0; bfloat16 rewards
  are computed in float32; nothing is NaN with an all-zero mask."""
  rewards = jnp.asarray([[1.5, 0.0], [0.5, 0.5], [0.5, 0.5]], jnp.bfloat16)
  mask = np.array([[1, 1], [1, 1], [1, 1]])
  groups = np.array([5, 6, 6])
  anchors = np.array([[0], [0], [0]])
  got = np.asarray(compute_gigpo_advantages(rewards, mask, groups, anchors, norm_by_std=True))
  np.testing.assert_allclose(got[0], [1.5 / (1 + 1e-6)] * 2, rtol=1e-6)
  assert np.all(got[1:] == 0.0)
  empty = compute_gigpo_advantages(rewards, np.zeros((3, 2)), groups, anchors, norm_by_std=True)
  assert np.all(np.asarray(empty) == 0.0)


def test_gigpo_turns_past_the_anchors_get_the_episode_part():
  rewards = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]], np.float32)
  mask = np.array([[1, 0, 1], [1, 0, 1]])
  got = np.asarray(compute_gigpo_advantages(rewards, mask, np.array([1, 1]), np.array([[3], [3]])))
  # episode +-1; turn 0 (shared anchor): returns 2, 0 -> +-1; turn 1 has no anchor column
  np.testing.assert_allclose(got, [[2.0, 0.0, 1.0], [-2.0, 0.0, -1.0]], atol=1e-6)


@pytest.mark.parametrize("key,value", [("gamma_turn", 1.5), ("step_weight", -1.0)])
def test_gigpo_refuses_bad_numbers(key, value):
  rewards, mask, groups, anchors = random_batch(np.random.default_rng(0))
  with pytest.raises((ValueError, ConfigError), match=key):
    compute_gigpo_advantages(rewards, mask, groups, anchors, **{key: value})
