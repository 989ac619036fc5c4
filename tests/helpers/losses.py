"""NumPy references of the loss aggregations and random batches of log-probs and advantages."""

from __future__ import annotations

import numpy as np

RTOL = 1e-5


def np_aggregate(x, mask, mode):
  x = np.asarray(x, np.float64)
  mask = np.asarray(mask, np.float64)
  if mode == "token-mean":
    return (x * mask).sum() / max(mask.sum(), 1.0)
  if mode == "seq-mean-token-sum-norm":
    return (x * mask).sum() / mask.shape[-1]
  rows = [r for r in range(x.shape[0]) if mask[r].sum() > 0]
  if not rows:
    return 0.0
  if mode == "seq-mean-token-sum":
    per_row = [(x[r] * mask[r]).sum() for r in rows]
  else:
    per_row = [(x[r] * mask[r]).sum() / mask[r].sum() for r in rows]
  return float(np.mean(per_row))


def np_masked_mean(x, mask):
  mask = np.asarray(mask, np.float64)
  return float((np.asarray(x, np.float64) * mask).sum() / max(mask.sum(), 1.0))


def random_batch(seed, b=5, t=8, log_ratio_scale=0.3):
  rng = np.random.default_rng(seed)
  old = -np.abs(rng.normal(size=(b, t))) - 0.1
  logp = old + rng.normal(scale=log_ratio_scale, size=(b, t))
  adv = rng.normal(size=(b, t))
  mask = (rng.random((b, t)) > 0.3).astype(np.float32)
  mask[1] = 0.0  # an empty row
  ent = np.abs(rng.normal(size=(b, t)))
  ref = old + rng.normal(scale=0.2, size=(b, t))
  f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
  return f32(logp), f32(old), f32(adv), mask, f32(ent), f32(ref)


def random_logps(seed, shape=(4, 9), scale=2.0):
  rng = np.random.default_rng(seed)
  logp = -np.abs(rng.normal(size=shape)) * scale
  ref = -np.abs(rng.normal(size=shape)) * scale
  return logp.astype(np.float32), ref.astype(np.float32)
