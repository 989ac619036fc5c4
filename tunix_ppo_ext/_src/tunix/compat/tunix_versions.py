"""The tunix versions this package is tested with, and the check of the installed one against
the private names every part of `compat` pins.

Two tunix versions are tested (`TESTED_TUNIX`): 0.1.7 (PyPI) and tunix main at c7d8950f,
whose version string is 0.1.8 (`tunix_api()` tells them apart by the API: main has
`RLEngine`). Every pinned name is on both. What differs between them is handled where it is
used (`learner_hooks`: the learner's constructor keywords, `compute_entropy_from_logits`,
the loss metrics' reducer; `trainer_hooks.loss_and_aux`; `model_internals.final_hidden_states`;
`agentic_hooks.needs_main`: `AgenticPpoLearner` runs on main only); the rest (`LossOutput`,
configs moved to `tunix.common`, `TrainExample`'s packing fields,
`compute_per_token_logps(return_entropy, chunk_size)`) needs no code: tuples are still
accepted, the old module paths re-export, the new fields default to None, and this
package's own log-prob path runs on both (docs/compatibility.md).

`PINNED` lists the private names by tunix object, merged from the parts' own `PINNED`
(`PINNED_INSTANCE_ATTRIBUTES` likewise); `check_tunix()` runs at import of `compat`: on a
tested tunix (version string with its API) it does nothing; on another version it fails
with one line naming what is missing, or warns once when everything is still there.
"""

from __future__ import annotations

import importlib.metadata
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from tunix.rl import rl_cluster as rl_cluster_lib

from tunix_ppo_ext._src.tunix.compat import (
  agentic_hooks,
  cluster_hooks,
  learner_hooks,
  model_internals,
  patches,
  sampler_internals,
  trainer_hooks,
)

# The tunix versions this package is tested with, by version string, and the API each
# version string must show (`tunix_api()`); CI runs the suite's tunix-facing part on both.
TUNIX_0_1_7 = "0.1.7"  # PyPI
TUNIX_MAIN = "0.1.8"  # tunix main at c7d8950f (2026-08-21): its pyproject already says 0.1.8
TESTED_TUNIX = (TUNIX_0_1_7, TUNIX_MAIN)
API_0_1_7, API_MAIN = "0.1.7", "main"
EXPECTED_API = {TUNIX_0_1_7: API_0_1_7, TUNIX_MAIN: API_MAIN}

PARTS = (learner_hooks, cluster_hooks, trainer_hooks, sampler_internals, model_internals)
PARTS += (agentic_hooks, patches)


def _merged_pins(parts: Sequence[ModuleType]) -> dict[str, tuple[Any, tuple[str, ...]]]:
  """The parts' `PINNED` in one table; an owner two parts pin gets both name lists."""
  merged: dict[str, tuple[Any, tuple[str, ...]]] = {}
  for part in parts:
    for owner, (obj, names) in part.PINNED.items():
      _, before = merged.get(owner, (obj, ()))
      merged[owner] = (obj, (*before, *names))
  return merged


def _merged_attributes(parts: Sequence[ModuleType]) -> dict[str, tuple[str, ...]]:
  """The parts' `PINNED_INSTANCE_ATTRIBUTES` in one table, as `_merged_pins`."""
  merged: dict[str, tuple[str, ...]] = {}
  for part in parts:
    for owner, names in part.PINNED_INSTANCE_ATTRIBUTES.items():
      merged[owner] = (*merged.get(owner, ()), *names)
  return merged


# object the names live on -> (the object, private names used by the parts)
PINNED = _merged_pins(PARTS)
# Instance attributes set in constructors (checked on live objects by the tests).
PINNED_INSTANCE_ATTRIBUTES = _merged_attributes(PARTS)


def tunix_version() -> str:
  """The installed google-tunix's version string."""
  return importlib.metadata.version("google-tunix")


def tunix_api() -> str:
  """`API_MAIN` where tunix's cluster class is `RLEngine` (tunix main, released as 0.1.8;
  `RLCluster` stays as an alias there), else `API_0_1_7`. Read from the API, not the
  version string, so a build of main under another version string is recognised."""
  return API_MAIN if hasattr(rl_cluster_lib, "RLEngine") else API_0_1_7


def missing_names() -> list[str]:
  """`owner.name` of every pinned private name this tunix lacks."""
  return [
    f"{owner}.{name}"
    for owner, (obj, names) in PINNED.items()
    for name in names
    if not hasattr(obj, name)
  ]


def check_tunix() -> None:
  """Nothing on a tested tunix; else RuntimeError naming missing names, or one warning."""
  version, api = tunix_version(), tunix_api()
  if EXPECTED_API.get(version) == api:
    return
  missing = missing_names()
  if missing:
    raise RuntimeError(
      f"tunix-ppo-ext was tested with google-tunix {', '.join(TESTED_TUNIX)}; the installed "
      f"{version} lacks {missing}: install google-tunix=={TESTED_TUNIX[-1]}"
    )
  warnings.warn(
    f"tunix-ppo-ext is untested with google-tunix {version} (tested: {TESTED_TUNIX}; "
    f"this one has the {api} API)",
    stacklevel=2,
  )
