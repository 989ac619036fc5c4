"""NumPy references of the advantage estimators (GAE, whitening, per-turn GAE) written from their
definitions, with the random tests' shapes, seeds and tolerance.
"""

from __future__ import annotations

import numpy as np

B, T = 6, 12  # fixed shapes for the random tests (one compilation per function)


TOL = dict(rtol=1e-5, atol=1e-5)


def ref_whiten(x: np.ndarray, m: np.ndarray) -> np.ndarray:
  """(x - mean) / sqrt(var + 1e-8); mean/var over mask entries, var with n - 1 (0 if n < 2)."""
  n, total = 0, 0.0
  for b in range(x.shape[0]):
    for t in range(x.shape[1]):
      if m[b, t]:
        n += 1
        total += x[b, t]
  mean = total / max(n, 1)
  sq = 0.0
  for b in range(x.shape[0]):
    for t in range(x.shape[1]):
      if m[b, t]:
        sq += (x[b, t] - mean) ** 2
  var = sq / max(n - 1, 1)
  return (x - mean) / np.sqrt(var + 1e-8)


def ref_gae(r, v, m, gamma, lam, whiten=True):
  r, v, m = (np.asarray(a, np.float64) for a in (r, v, m))
  raw = np.zeros_like(r)
  for b in range(r.shape[0]):
    nextvalue, lastgaelam = 0.0, 0.0
    for t in reversed(range(r.shape[1])):
      if m[b, t]:
        delta = r[b, t] + gamma * nextvalue - v[b, t]
        lastgaelam = delta + gamma * lam * lastgaelam
        nextvalue = v[b, t]
      raw[b, t] = lastgaelam
  returns = np.where(m > 0, raw + v, 0.0)
  adv = ref_whiten(raw, m) if whiten else raw
  return adv * m, returns


def make_mask(rng: np.random.Generator, b: int = B, t: int = T) -> np.ndarray:
  """Row 0 all zero, row 1 all one, row 2 contiguous prefix, others multi-turn (interior 0s)."""
  m = np.zeros((b, t), np.float32)
  m[1] = 1.0
  m[2, : rng.integers(1, t)] = 1.0
  for i in range(3, b):
    row = (rng.random(t) < 0.6).astype(np.float32)
    row[rng.integers(1, t - 1)] = 0.0  # at least one interior observation token
    row[0] = 1.0
    row[rng.integers(t - 3, t) :] = 0.0  # trailing padding
    m[i] = row
  return m


SEEDS = [0, 1, 2]


def ref_turns(m_row: np.ndarray) -> list[list[int]]:
  """The agent turns of a row: maximal runs of positions with mask 1."""
  turns: list[list[int]] = []
  previous = False
  for t, on in enumerate(m_row > 0):
    if on and not previous:
      turns.append([])
    if on:
      turns[-1].append(t)
    previous = bool(on)
  return turns


def ref_gae_turn_discount(r, v, m, gamma, gamma_turn, lam):
  """Token GAE where the step from a turn's last token to the next turn's first token is
  discounted by gamma_turn (loops over the agent tokens of each row)."""
  r, v, m = (np.asarray(a, np.float64) for a in (r, v, m))
  raw = np.zeros_like(r)
  for b in range(r.shape[0]):
    turns = ref_turns(m[b])
    next_value, next_adv = 0.0, 0.0
    for k in reversed(range(len(turns))):
      for i, t in enumerate(reversed(turns[k])):
        g = gamma_turn if i == 0 and k < len(turns) - 1 else gamma
        delta = r[b, t] + g * next_value - v[b, t]
        next_adv = delta + g * lam * next_adv
        next_value = v[b, t]
        raw[b, t] = next_adv
  return raw * m, np.where(m > 0, raw + v, 0.0)
