"""The persistent XLA compilation cache of `train` runs.

A run's first step compiles the rollout's and the updates' programs: about a minute for
SmolLM2 on a 2-core CPU, and half of a 64-update run's wall time on an H200
(docs/measurements.md). JAX can keep compiled programs on disk, keyed by the program,
the JAX and XLA versions, the flags and the device, so a later run of the same shapes (the
next seed, a resume, a rerun) loads them instead of compiling; a stale or unreadable entry
is compiled again. `train` turns that cache on in `$TUNIX_PPO_EXT_CACHE/xla` (default
`~/.cache/tunix_ppo_ext/xla`) for every program however fast it compiled, capped at
`MAX_BYTES` (least recently used entries go first), unless the user chose for JAX: a
directory of their own (`JAX_COMPILATION_CACHE_DIR`, kept as set, with JAX's own
settings; one that cannot be made or written turns the cache off, and `train` says it is
not kept) or no cache (`JAX_ENABLE_COMPILATION_CACHE=false`).
"""

from __future__ import annotations

import os
import pathlib

import jax

from tunix_ppo_ext._src.data.gguf_files import cache_base

MAX_BYTES = 4 * 1024**3


def use_compile_cache() -> tuple[pathlib.Path | None, str]:
  """Points JAX's persistent compilation cache at the package's `xla/` directory unless
  the user chose one or turned it off. Returns the directory in use (None: off) and, when
  the package's directory cannot be made, why (the cache is then off: JAX would warn once
  per program). Call before the first compilation."""
  if not jax.config.jax_enable_compilation_cache:
    return None, ""
  if jax.config.jax_compilation_cache_dir:
    own = jax.config.jax_compilation_cache_dir
    problem = "" if "://" in own else _unusable(pathlib.Path(own))  # gs://...: JAX's to open
    if problem:  # off, as for the package's own directory: JAX would warn
      jax.config.update("jax_enable_compilation_cache", False)
      jax.config.update("jax_compilation_cache_dir", None)
      return None, f"JAX_COMPILATION_CACHE_DIR={own!r} cannot be used ({problem})"
    return pathlib.Path(own), ""
  directory = cache_base() / "xla"
  problem = _unusable(directory)
  if problem:
    jax.config.update("jax_enable_compilation_cache", False)
    return None, f"cannot create {directory} ({problem})"
  jax.config.update("jax_compilation_cache_dir", str(directory))
  jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
  # every program: a real model's first step compiles ~180, most under JAX's 1 s default,
  # and together they are most of its compiling (SmolLM2 on a 2-core CPU: 64 s to compile
  # them all, 21 s to load them all from this cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  return directory, ""


def _unusable(directory: pathlib.Path) -> str:
  """Why `directory` cannot hold the cache (it is made if missing); "" when it can."""
  if directory.exists() and not directory.is_dir():
    return "not a directory"
  try:
    directory.mkdir(parents=True, exist_ok=True)
  except OSError as err:
    return str(err.strerror or err)
  if not os.access(directory, os.W_OK | os.X_OK):
    return "not writable"
  return ""
