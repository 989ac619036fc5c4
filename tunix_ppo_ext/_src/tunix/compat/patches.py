"""`install`: every change this package makes outside its own objects, in one function.

Importing `tunix_ppo_ext` or building a learner changes nothing in tunix, qwix or a
cluster built elsewhere; `install` does, explicitly and idempotently:

- qwix (process-wide): its LoRA products through `math.low_rank.lora_product`, an adapted
  projection in its inputs' dtype (`qwix_adapters.install_lora_product`);
- tunix's `function_registry` (process-wide), for `entries` given: this package's and the
  plugins' losses and estimators under their names, for tunix's own learners
  (`tunix_ppo_ext.register_builtins()` passes this package's; a name tunix holds for
  another loss is refused);
- `rl_cluster`'s vanilla sampler (that cluster only): no remat and no splash attention in
  its graph, the prompt width static in its states (`sampler_internals`).

`build_cluster` and `apply_lora` call it; a cluster built by hand runs as tunix's own until
`tunix_ppo_ext.install(cluster)` is called on it (the learners run either way).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from tunix.rl import function_registry

from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.tunix.compat.cluster_hooks import vanilla_sampler
from tunix_ppo_ext._src.tunix.compat.qwix_adapters import install_lora_product
from tunix_ppo_ext._src.tunix.compat.sampler_internals import (
  keep_prompt_width_static,
  sample_without_training_options,
)

_REGISTRY = {  # tunix's public registration decorators and lookups, per kind
  registry.POLICY_LOSSES: (
    function_registry.register_policy_loss_fn,
    function_registry.get_policy_loss_fn,
  ),
  registry.VALUE_LOSSES: (
    function_registry.register_value_loss_fn,
    function_registry.get_value_loss_fn,
  ),
  registry.ADVANTAGE_ESTIMATORS: (
    function_registry.register_advantage_estimator,
    function_registry.get_advantage_estimator,
  ),
}
_PUT_BY_US: dict[tuple[str, str], Any] = {}  # (kind, name) -> the object we registered
# `function_registry`'s category names: its public `default_registry.list_functions(category)`
# lists a kind's names (for an error that names every choice), but the categories that its
# public `register_*`/`get_*` pass are module-private constants.
_CATEGORIES = {
  registry.POLICY_LOSSES: "_POLICY_LOSS_FN_CATEGORY",
  registry.VALUE_LOSSES: "_VALUE_LOSS_FN_CATEGORY",
  registry.ADVANTAGE_ESTIMATORS: "_ADVANTAGE_ESTIMATOR_CATEGORY",
}
PINNED: dict[str, tuple[Any, tuple[str, ...]]] = {
  "tunix.rl.function_registry": (function_registry, tuple(_CATEGORIES.values())),
}
PINNED_INSTANCE_ATTRIBUTES: dict[str, tuple[str, ...]] = {}


@dataclasses.dataclass(frozen=True)
class RegistryEntry:
  """A name for tunix's `function_registry`: `obj` (ours, a plugin-registry object) goes
  in as `value` (the same loss; an estimator behind tunix's signature)."""

  kind: str
  name: str
  obj: Any
  value: Any


def install(rl_cluster: Any = None, entries: Iterable[RegistryEntry] = ()) -> None:
  """Installs qwix's adjustments, `entries` in tunix's registry and, given a cluster, its
  sampler's adjustments (module docstring). Idempotent: a second call changes nothing.

  Args:
    rl_cluster: tunix's `RLCluster` whose vanilla sampler to adjust, or None.
    entries: names to put into tunix's `function_registry`.

  Raises:
    ValueError: a loss name is taken in tunix's registry by another function.
  """
  install_lora_product()
  for entry in entries:
    _register(entry)
  if rl_cluster is not None:
    adjust_sampler(rl_cluster)


def adjust_sampler(rl_cluster: Any) -> None:
  """The cluster's own vanilla sampler, adjusted (that object only, nothing process-wide):
  no remat or splash attention in its graph (`model.remat` and splash are for the trainers'
  passes) and an int prompt width (tunix's array width breaks a later jit lookup). The
  learners call it on the cluster they are given, so a cluster built by hand trains as one
  `models.build_cluster` built; idempotent.

  Args:
    rl_cluster: tunix's `RLCluster` (any other engine than the vanilla one is left alone).
  """
  sampler = vanilla_sampler(rl_cluster.rollout)
  if sampler is not None:
    sample_without_training_options(sampler)
    keep_prompt_width_static(sampler)


def _register(entry: RegistryEntry) -> None:
  """`entry` into tunix's registry unless there: tunix keeps an estimator of its own name
  (`PpoExtLearner` calls ours), a loss name it holds for another function is refused."""
  key = (entry.kind, entry.name)
  check_no_clash(entry.kind, entry.name, entry.obj)
  if tunix_holds(entry.kind, entry.name) and key not in _PUT_BY_US:
    return
  if _PUT_BY_US.get(key) is not entry.obj:
    _REGISTRY[entry.kind][0](entry.name)(entry.value)
    _PUT_BY_US[key] = entry.obj


def tunix_holds(kind: str, name: str) -> bool:
  """Whether tunix's `function_registry` has `name` for the kind (its public lookups)."""
  try:
    _REGISTRY[kind][1](name)
  except LookupError:
    return False
  return True


def tunix_names(kind: str) -> list[str]:
  """The names tunix's `function_registry` holds for the kind (its own and every user's
  registration), sorted; [] for a kind it has no category of yet."""
  category = getattr(function_registry, _CATEGORIES[kind])
  try:
    return sorted(function_registry.default_registry.list_functions(category))
  except LookupError:  # nothing registered under the category yet
    return []


def tunix_entry(kind: str, name: str) -> Any:
  """What tunix's `function_registry` holds under `name` (LookupError if nothing)."""
  return _REGISTRY[kind][1](name)


def check_no_clash(kind: str, name: str, obj: Any) -> None:
  """ValueError if tunix's registry holds another loss under `name` (tunix would use it)."""
  if kind == registry.ADVANTAGE_ESTIMATORS or (kind, name) in _PUT_BY_US:
    return
  if tunix_holds(kind, name) and tunix_entry(kind, name) is not obj:
    held = tunix_entry(kind, name)
    raise ValueError(
      f"tunix's function_registry already holds {registry.LABELS[kind]} {name!r} "
      f"({getattr(held, '__module__', '?')}.{getattr(held, '__qualname__', held)}), which "
      "tunix's trainers would use instead: choose another name"
    )
