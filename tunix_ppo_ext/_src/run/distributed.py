"""Multi-host runs: when to call `jax.distributed.initialize()`, and which process writes.

Every host of a TPU pod runs the same `tunix-ppo-ext train` command. The CLI joins them
into one JAX runtime when `--multi-host` is given, or, without the flag, when the
environment says there are several hosts (`JAX_COORDINATOR_ADDRESS`, read by
`jax.distributed.initialize` itself, or a `TPU_WORKER_HOSTNAMES` / `TPU_PROCESS_ADDRESSES`
list naming more than one host); `--no-multi-host` turns the detection off. Only process 0
writes the run's files (`config.json`, `metrics.jsonl`, `summary.json`), the progress bar,
TensorBoard and W&B; orbax checkpoints are written by all processes together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import jax

from tunix_ppo_ext._src.checks import ConfigError

T = TypeVar("T")
COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"
TPU_HOSTS_ENV = ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES")


def multi_host_reason(flag: bool | None, env: Mapping[str, str]) -> str | None:
  """Why this process joins a multi-host run, or None for a single-host run.

  `flag`: `--multi-host` (True) / `--no-multi-host` (False) decide; None detects from
  `env` (a coordinator address, or a TPU host list with more than one entry).
  """
  if flag is not None:
    return "--multi-host" if flag else None
  if env.get(COORDINATOR_ENV, "").strip():
    return f"{COORDINATOR_ENV} is set"
  for name in TPU_HOSTS_ENV:
    hosts = [h for h in env.get(name, "").split(",") if h.strip()]
    if len(hosts) > 1:
      return f"{name} lists {len(hosts)} hosts"
  return None


def initialize_kwargs(env: Mapping[str, str]) -> dict[str, int]:
  """`num_processes` / `process_id` for `jax.distributed.initialize` from `JAX_NUM_PROCESSES`
  / `JAX_PROCESS_ID` when set (JAX itself detects them on TPU pods, Slurm, Open MPI)."""
  kwargs = {}
  for name, key in (("JAX_NUM_PROCESSES", "num_processes"), ("JAX_PROCESS_ID", "process_id")):
    if env.get(name, "").strip():
      try:
        kwargs[key] = int(env[name])
      except ValueError:
        raise ConfigError(f"environment variable {name}={env[name]!r} must be an int") from None
  return kwargs


def initialize(reason: str | None, env: Mapping[str, str]) -> None:
  """Calls `jax.distributed.initialize()` when `reason` is given (else nothing).

  JAX reads the coordinator address (`JAX_COORDINATOR_ADDRESS`) or detects the cluster;
  `initialize_kwargs(env)` adds the process count and index. Must run before anything
  touches a JAX device.
  """
  if reason is None:
    return
  kwargs = initialize_kwargs(env)
  print(f"tunix-ppo-ext: multi-host run ({reason}): jax.distributed.initialize()", flush=True)
  jax.distributed.initialize(**kwargs)


def is_primary(process_index: int) -> bool:
  """Whether process `process_index` writes the run's files and sinks (only process 0)."""
  return process_index == 0


def primary_only(process_index: int, items: Sequence[T]) -> list[T]:
  """`items` (e.g. metric sink factories) on process 0, nothing on the other processes."""
  return list(items) if is_primary(process_index) else []


def barrier(name: str) -> None:
  """Waits for every process (a no-op on a single host)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)
