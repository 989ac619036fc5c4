"""`math.buckets`: the least of 1, 2, 3, 4, 6, 8, 12, ... (written out here) that holds a
size, at most a third of it padding, and one bucket down at a time."""

import pytest

from tunix_ppo_ext._src.ops.buckets import bucket, bucket_below

pytestmark = pytest.mark.fast

LISTED = sorted({1, 2, 3} | {m << k for k in range(1, 12) for m in (2, 3)})


def test_every_size_gets_the_least_listed_bucket_that_holds_it():
  for size in range(0, 3000):
    least = next(b for b in LISTED if b >= size)
    assert bucket(size) == least
    if size >= 4:
      assert least - size < least / 3


def test_bucket_below_steps_down_the_list_one_bucket_at_a_time():
  for below, above in zip(LISTED[:-1], LISTED[1:], strict=True):
    assert bucket_below(above) == below
