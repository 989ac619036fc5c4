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


def matmul_rate(dtype: Any = jnp.float32, shape: tuple[int, int, int] = (1280, 576, 4096)) -> float:
  """GFLOP/s of one `[m, k] @ [k, n]` product in `dtype` on the default device, median of
  5 timings (random operands: zeros can run faster on accelerators)."""
  m, k, n = shape
  a = jax.random.normal(jax.random.key(0), (m, k), dtype)
  w = jax.random.normal(jax.random.key(1), (k, n), dtype)
  return 2 * m * k * n / _seconds(jax.jit(lambda a, w: a @ w), a, w) / 1e9


def read_rate(floats: int = 64 * 1024 * 1024) -> float:
  """GB/s of one reduction over `floats` float32 values, median of 5 timings."""
  x = jax.random.normal(jax.random.key(2), (floats,), jnp.float32)
  return x.nbytes / _seconds(jax.jit(jnp.sum), x) / 1e9


def machine_rates() -> tuple[float, float]:
  """(float32 matmul GFLOP/s, memory read GB/s) of this machine, medians of 5 timings."""
  return matmul_rate(), read_rate()


DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def device_rates() -> dict[str, float]:
  """The default device's rates the benches read floors against: GFLOP/s per weight dtype
  (`float32`, `bfloat16`) and `read` GB/s. On CPU at the real model's layer shapes
  (`[1280, 576] @ [576, 4096]`); on an accelerator at sizes that fill it (8192-cubed
  products, a 1 GiB read): its peak, which small products do not reach."""
  cpu = jax.default_backend() == "cpu"
  shape = (1280, 576, 4096) if cpu else (8192, 8192, 8192)
  rates = {name: matmul_rate(dtype, shape) for name, dtype in DTYPES.items()}
  rates["read"] = read_rate(64 * 1024 * 1024 if cpu else 256 * 1024 * 1024)
  return rates


def _seconds(fn: Any, *args: Any) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(5):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)
