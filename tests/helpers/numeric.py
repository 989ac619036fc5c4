"""Comparisons of arrays as XLA computes them on CPU."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
  pass


def flush_subnormals(x: Any) -> np.ndarray:
  """`x` as float32 with subnormals set to (signed) zero, as XLA computes on CPU.

  A comparison that means "unchanged" holds up to this; normal values are untouched.
  """
  x = np.asarray(x, np.float32)
  return np.where(np.abs(x) < np.finfo(np.float32).tiny, np.float32(0) * x, x)
