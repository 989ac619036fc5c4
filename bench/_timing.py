"""Shared timing helper of the benchmark scripts."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Iterator
from typing import Any

import jax
import jax.numpy as jnp


def timed(batches: Iterable[Any], stamps: list[float]) -> Iterator[Any]:
  """Yields `batches`, appending `time.perf_counter()` each time tunix draws one."""
  for batch in batches:
    stamps.append(time.perf_counter())
    yield batch


def machine_rates() -> tuple[float, float]:
  """(float32 matmul GFLOP/s, memory read GB/s) of this machine, medians of 5 timings."""
  a, w = jnp.ones((1280, 576)), jnp.ones((576, 4096))
  x = jnp.ones((64 * 1024 * 1024,), jnp.float32)
  matmul, total = jax.jit(lambda a, w: a @ w), jax.jit(jnp.sum)

  def seconds(fn, *args) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(5):
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times.append(time.perf_counter() - start)
    return statistics.median(times)

  return 2 * 1280 * 576 * 4096 / seconds(matmul, a, w) / 1e9, x.nbytes / seconds(total, x) / 1e9
