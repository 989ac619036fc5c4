"""A reference of the learning-rate schedules written from their definitions."""

from __future__ import annotations

import math


def reference_lr(schedule, lr, total, warmup, min_ratio, step):
  """The schedule at optimizer update `step` (0-based), from the module's formulas."""
  warm = min((step + 1) / warmup, 1.0) if warmup else 1.0
  progress = min(max((step - warmup) / max(total - warmup, 1), 0.0), 1.0)
  if schedule == "cosine":
    factor = min_ratio + (1 - min_ratio) * (1 + math.cos(math.pi * progress)) / 2
  elif schedule == "linear":
    factor = 1 - (1 - min_ratio) * progress
  else:
    factor = 1.0
  return lr * warm * factor
