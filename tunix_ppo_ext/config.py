"""Configuration: run configs read, checked and resolved once, and configured names.

- `load_resolved(path, overrides)`: a YAML run config (the embedded default when `path`
  is None) with dotted `KEY=VALUE` overrides, every key and value checked, worked out once
  into a frozen `ResolvedRun` (`.run` the `RunConfig`, `.ppo` the `PpoExtConfig`, batch
  sizes, rollout chunk, environment and validation entries, episode budget, checkpointed
  roles); `resolve(run)` does the second half for a `RunConfig` built in Python, and
  `load_run_config(path, overrides)` is its `RunConfig`. `read_run_config(path,
  overrides)` reads and checks what the file alone can tell (keys, types, bounds,
  choices) without importing JAX, tunix or transformers.
- `ConfigError`: every bad key, value, option or file, in one line naming it (a
  `ValueError`; the command line exits 2 for it).
- KL method names (`resolve_kl_method`, `kl_method_names`, `canonical_kl_method`; the
  by-name KL itself is `tunix_ppo_ext.compute_kl_divergence`, tunix's signature).

`read_run_config` loads neither JAX nor tunix; the other run-config names load tunix on
first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunix_ppo_ext import _lazy_attributes
from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.ops.kl_methods import (
  FULL_KL,
  KL_METHOD_ALIASES,
  KlMethod,
  canonical_kl_method,
  kl_method_names,
  resolve_kl_method,
)

if TYPE_CHECKING:
  from tunix_ppo_ext._src.config.loader import read_run_config
  from tunix_ppo_ext._src.run.run_config import (
    ResolvedRun,
    RunConfig,
    load_resolved,
    load_run_config,
    resolve,
  )

_RUN_CONFIG = "tunix_ppo_ext._src.run.run_config"  # imports tunix (PpoExtConfig)
_RUN_NAMES = ("ResolvedRun", "RunConfig", "load_resolved", "load_run_config", "resolve")
_LAZY = dict.fromkeys(_RUN_NAMES, _RUN_CONFIG) | {
  "read_run_config": "tunix_ppo_ext._src.config.loader"
}

__all__ = [
  "FULL_KL",
  "KL_METHOD_ALIASES",
  "ConfigError",
  "KlMethod",
  "ResolvedRun",
  "RunConfig",
  "canonical_kl_method",
  "kl_method_names",
  "load_resolved",
  "load_run_config",
  "read_run_config",
  "resolve",
  "resolve_kl_method",
]

__getattr__, __dir__ = _lazy_attributes(_LAZY, globals(), __name__)
