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
with one line naming what is missing, or warns once when everything is still there (naming
the copied or skipped bodies that changed).

`SOURCE_PINS`: the tunix (and qwix) bodies that compat copies, re-implements or skips, each
with what of ours to re-read when it changes and its source hash on each tested tunix
(`body_hash`: the AST of its source, docstrings dropped, so formatting and comments do not
count); `changed_bodies()` names every body whose hash is not the installed tunix's pin
(tests/tunix/compat/test_compat.py runs it on both tested versions).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import importlib.metadata
import inspect
import textwrap
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
  qwix_adapters,
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
PARTS += (agentic_hooks, patches, qwix_adapters)


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


@dataclasses.dataclass(frozen=True)
class SourcePin:
  """A foreign body compat copies, re-implements or skips.

  Attributes:
    ours: what to re-read against it when it changes (file and function of this package).
    hashes: `body_hash` of the body by tested tunix version string (the lane's qwix for
      a qwix body); None: the body is not on that version.
  """

  ours: str
  hashes: dict[str, str | None]


SOURCE_PINS: dict[str, SourcePin] = {
  "tunix.rl.rl_learner.RLLearner._process_accumulated_batches": SourcePin(
    "compat/learner_hooks.py: LearnerHooks._process_accumulated_batches (tunix's body, the "
    "sizes passed to the rollout-phase hook)",
    {TUNIX_0_1_7: "f1b5dc5e1016a940", TUNIX_MAIN: "f92f04fc82d0a0ba"},
  ),
  "tunix.rl.ppo.ppo_learner.PPOLearner.__init__": SourcePin(
    "compat/learner_hooks.py: init_learner (what it does before the trainers, which the "
    "learner sets up itself: `trainer_setup`)",
    {TUNIX_0_1_7: "58fa9fc305d2977d", TUNIX_MAIN: "1d07cf69aefb6482"},
  ),
  "tunix.models.qwen3.model.Attention.block": SourcePin(
    "compat/model_internals.py: _blockwise_block (its projections, norms and RoPE)",
    {TUNIX_0_1_7: "71c054f46dc7430b", TUNIX_MAIN: "71c054f46dc7430b"},
  ),
  "tunix.generate.tokenizer_adapter.Tokenizer.__init__": SourcePin(
    "compat/cli_models.py: LocalTokenizer.__init__ (what tunix's sets)",
    {TUNIX_0_1_7: "dd22c474490eeb94", TUNIX_MAIN: "67a746c5874278d8"},
  ),
  "tunix.generate.sampler.Sampler.__call__": SourcePin(
    "rollout/continuing_sampler.py and compat/sampler_internals.py (its stop ids, state, "
    "prefill and decode loop, as `ContinuingSampler` runs them)",
    {TUNIX_0_1_7: "edb4b3f646459251", TUNIX_MAIN: "9a6a2ab71fcf2fc2"},
  ),
  "qwix._src.providers.lora._compute_lora_delta": SourcePin(
    "compat/qwix_adapters.py: _lora_delta (the same product for tunix's projections)",
    {TUNIX_0_1_7: "e109c5626b28b024", TUNIX_MAIN: "e109c5626b28b024"},
  ),
}


def source_hash(source: str) -> str:
  """sha256 (16 hex digits) of the AST of `source`, docstrings dropped: the same for a body
  reformatted or recommented, another for any change to what it does."""
  return _tree_hash(ast.parse(textwrap.dedent(source)))


def _tree_hash(tree: ast.Module) -> str:
  """`source_hash` of a parsed module (its definitions' docstrings dropped)."""
  for node in ast.walk(tree):
    body = getattr(node, "body", None)
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and body:
      first = body[0]
      if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        node.body = body[1:] or [ast.Pass()]
  return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


def defined_hash(path: str) -> str | None:
  """`source_hash` of the definition at dotted `path` as its module's file defines it (a
  module, then classes and functions); None where it is missing. Read from the file, not
  from the live attribute: the body pinned is tunix's (or qwix's) own even where `install`
  has replaced the attribute with ours (`qwix_lora_product`)."""
  parts = path.split(".")
  for split in range(len(parts), 0, -1):
    try:
      module = importlib.import_module(".".join(parts[:split]))
    except ImportError:
      continue
    nodes: list[ast.stmt] = ast.parse(inspect.getsource(module)).body
    for name in parts[split:]:
      found = [n for n in nodes if getattr(n, "name", None) == name]
      if not found:
        return None
      node, nodes = found[-1], getattr(found[-1], "body", [])
    return _tree_hash(ast.Module(body=[node], type_ignores=[]))
  return None


def changed_bodies(version: str | None = None) -> list[str]:
  """One line per `SOURCE_PINS` body whose hash is not `version`'s pin (default: the
  installed tunix's version; an untested version: not any tested version's pin), naming
  the body and what of ours to re-read."""
  version = tunix_version() if version is None else version
  changed = []
  for path, pin in SOURCE_PINS.items():
    try:
      found = defined_hash(path)
    except (OSError, TypeError):  # no source to read (a compiled or zipped install)
      found = "no source"
    expected = {pin.hashes[version]} if version in pin.hashes else set(pin.hashes.values())
    if found not in expected:
      changed.append(
        f"{path} changed on google-tunix {version} (hash {found}, pinned "
        f"{' or '.join(sorted(map(str, expected)))}): re-read {pin.ours}"
      )
  return changed


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
  changed = changed_bodies(version)
  warnings.warn(
    f"tunix-ppo-ext is untested with google-tunix {version} (tested: {TESTED_TUNIX}; "
    f"this one has the {api} API)" + (f"; changed: {changed}" if changed else ""),
    stacklevel=2,
  )
