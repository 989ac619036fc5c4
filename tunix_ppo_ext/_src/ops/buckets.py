"""Shape buckets: a few static sizes for sizes that vary from batch to batch.

Each size is rounded up to the least bucket that holds it, `1, 2, 3, 4, 6, 8, 12, 16, 24,
...` (the powers of two and one and a half times them): at most a third of a bucket is
padding, and a run meets few distinct shapes (few compilations). Pure Python.
"""

from __future__ import annotations

__all__ = ["bucket", "bucket_below"]


def bucket(size: int) -> int:
  """The least bucket at least `size` (1 for 0)."""
  power = 1 << max(size - 1, 0).bit_length()
  three_quarters = power * 3 // 4
  return three_quarters if power >= 4 and three_quarters >= size else power


def bucket_below(size: int) -> int:
  """The largest bucket under `size` (> 1)."""
  power = 1 << (size - 1).bit_length() - 1
  return power * 3 // 2 if power >= 2 and power * 3 // 2 < size else power
