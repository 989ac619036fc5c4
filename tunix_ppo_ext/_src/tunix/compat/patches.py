"""Every change this package makes to a tunix, qwix or metrax object, in one table.

`PATCHES` lists each change (`Patch`): the foreign object it changes, its scope, the compat
functions that make it, its reason and its pin. Nothing outside `compat` assigns to a
foreign object (tests/tunix/compat/test_compat.py checks the package's source for it). By scope:

- `PROCESS` (qwix's LoRA product, names in tunix's `function_registry`): applied by
  `install(entries=())`, explicitly and idempotently; importing `tunix_ppo_ext` changes
  nothing.
- `CLUSTER` (one cluster's sampler, trainers and rollout engine): applied by
  `prepare(cluster, ...)`, which the learners call on the cluster they are given and
  `build_cluster` on the one it builds; nothing process-wide.
- `MODEL` (the layers of a model this package loads): applied as the model is built
  (`hf_models`, `local_checkpoints`), before any cluster exists.
- `CALL` (a module global, a method or a class swapped for one call or `with` block and
  restored at its end; a step's buffered metrics emptied once logged), and `OWN` (tunix's
  attribute set on an instance of this package's subclass of a tunix class, as tunix's
  constructor would): applied by the function named.

`install(rl_cluster)` is `install()` then `prepare(rl_cluster)` (the public
`tunix_ppo_ext.install(cluster)`). Where a compat function copies or skips a tunix body,
its pin is that body's source hash on each tested tunix (`tunix_versions.SOURCE_PINS`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from tunix.rl import function_registry

from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.tunix.compat.agentic_hooks import sample_each_call_anew
from tunix_ppo_ext._src.tunix.compat.cluster_hooks import vanilla_sampler
from tunix_ppo_ext._src.tunix.compat.qwix_adapters import install_lora_product
from tunix_ppo_ext._src.tunix.compat.sampler_internals import (
  keep_prompt_width_static,
  sample_without_training_options,
)
from tunix_ppo_ext._src.tunix.compat.trainer_hooks import (
  add_checkpoint_metadata,
  silence_progress_bar,
)

PROCESS, CLUSTER, MODEL, CALL, OWN = "process", "cluster", "model", "call", "own"
SCOPES = (PROCESS, CLUSTER, MODEL, CALL, OWN)


@dataclasses.dataclass(frozen=True)
class Patch:
  """One change to a tunix, qwix or metrax object.

  Attributes:
    target: the foreign object changed (dotted; `<cluster>` for one cluster's).
    scope: `SCOPES` (module docstring): who applies it and how long it lasts.
    functions: the compat functions that make the change (`module.function`); for
      `PROCESS` and `CLUSTER` only `install` and `prepare` call them.
    reason: why (what tunix, qwix or metrax offers no public way to do).
    pin: what fails when the patched object changes (a test, or `SOURCE_PINS`).
  """

  target: str
  scope: str
  functions: tuple[str, ...]
  reason: str
  pin: str


_LORA_TEST, _COMPAT_TEST = "tests/tunix/models/test_lora.py", "tests/tunix/compat/test_compat.py"
PATCHES: dict[str, Patch] = {
  "qwix_lora_product": Patch(
    "qwix._src.providers.lora._compute_lora_delta",
    PROCESS,
    ("qwix_adapters.install_lora_product",),
    "qwix's adapter product `x A B`, by `lora_product` (a VJP that transposes no activation)",
    f"{_LORA_TEST}; SOURCE_PINS (the body replaced)",
  ),
  "qwix_lora_dtype": Patch(
    "qwix._src.providers.lora.LoraProvider.einsum, .dot_general",
    PROCESS,
    ("qwix_adapters.install_lora_product",),
    "an adapted projection in its inputs' dtype (tunix's KV-cache update refuses float32)",
    _LORA_TEST,
  ),
  "function_registry_names": Patch(
    "tunix.rl.function_registry.default_registry",
    PROCESS,
    ("patches._register",),
    "this package's and the plugins' losses and estimators by name, for tunix's learners",
    "tests/tunix/compat/test_patches.py; PINNED (its category names)",
  ),
  "sampler_without_training_options": Patch(
    "<cluster>.rollout._sampler (its model's configs, `_transformer_graphdef`)",
    CLUSTER,
    ("sampler_internals.sample_without_training_options", "patches.adjust_sampler"),
    "remat and splash attention are for the trainers' passes; remat breaks the decode loop",
    "tests/tunix/compat/test_patches.py; PINNED_INSTANCE_ATTRIBUTES",
  ),
  "sampler_static_prompt_width": Patch(
    "<cluster>.rollout._sampler.init_sample_state",
    CLUSTER,
    ("sampler_internals.keep_prompt_width_static", "patches.adjust_sampler"),
    "an int prompt width: tunix's array width breaks a later jit cache lookup",
    "tests/tunix/compat/test_static_prompt_width.py",
  ),
  "trainer_progress_bar": Patch(
    "<cluster>.actor_trainer._pbar, <cluster>.critic_trainer._pbar",
    CLUSTER,
    ("trainer_hooks.silence_progress_bar",),
    "tunix's trainers open their own tqdm bars (no setting), interleaved with the run's",
    f"{_COMPAT_TEST}::test_tunix_opens_its_progress_bar_only_where_none_is_in_place",
  ),
  "trainer_checkpoint_metadata": Patch(
    "<cluster>.actor_trainer.custom_checkpoint_metadata_fn",
    CLUSTER,
    ("trainer_hooks.add_checkpoint_metadata",),
    "the learner's state in each checkpoint (tunix takes it in the constructor only)",
    "tests/tunix/learner/test_learner.py (a resumed run's state)",
  ),
  "rollout_sample_anew": Patch(
    "<cluster>.rollout.generate, <cluster>.rollout._calls",
    CLUSTER,
    ("agentic_hooks.sample_each_call_anew",),
    "tunix's agentic loop samples every call with one seed: a group's episodes were copies",
    "tests/tunix/learner/test_agentic_ppo.py",
  ),
  "trainer_save_at_close": Patch(
    "<cluster>.actor_trainer._save_last_checkpoint (and the critic's)",
    CALL,
    ("trainer_hooks.save_at_close",),
    "the save tunix's trainers make as they close carries no learner state",
    "PINNED (`PeftTrainer._save_last_checkpoint`); tests/run/test_disk_full.py",
  ),
  "qwen3_activation_sharding": Patch(
    "tunix.models.qwen3.model.shard",
    CALL,
    ("model_internals.qwen3_activation_sharding",),
    "tunix's Qwen3 skips its activation shardings on a CPU host compiling for a TPU",
    "PINNED (`qwen3.model.shard`)",
  ),
  "rope_frequencies_in_block": Patch(
    "tunix.models.{llama3,qwen3}.model.apply_rope",
    CALL,
    ("model_internals._configured_block",),
    "tunix 0.1.7's Llama 3 and Qwen3 rotate with theta 1e6 whatever the config says",
    "PINNED (`apply_rope`); tests/tunix/models/test_rope.py",
  ),
  "rope_frequencies_class": Patch(
    "<model>.layers[*].attn.__class__ (tunix's Llama 3 / Qwen3 `Attention`)",
    MODEL,
    ("model_internals.use_rope_frequencies",),
    "each attention layer rotates with the checkpoint's inverse frequencies",
    "tests/tunix/models/test_rope.py",
  ),
  "blockwise_attention_class": Patch(
    "<model>'s Qwen3 `Attention` layers' `__class__`",
    MODEL,
    ("model_internals.use_blockwise_attention",),
    "tunix's Qwen3 forms `[T, T]` scores off TPU (`model.attention: blockwise`)",
    "SOURCE_PINS (`qwen3.model.Attention.block`, re-implemented); "
    "tests/tunix/models/test_attention_option.py",
  ),
  "fused_head_pass_through": Patch(
    "<model>'s LM head module's `__class__`",
    CALL,
    ("model_internals.final_hidden_states",),
    "tunix 0.1.7's transformers have no call that stops before the LM head",
    "tests/tunix/learner/test_fused_head.py",
  ),
  "cli_create_model": Patch(
    "tunix.cli.utils.model.create_model (tunix main)",
    CALL,
    ("cli_models.local_models_in",),
    "tunix main's pipeline reaches the Hub for a local checkpoint",
    "tests/tunix/learner/test_agentic_local_checkpoint.py",
  ),
  "cli_llama3_hidden_states": Patch(
    "<model>.__class__ (tunix main's Llama 3, `hidden_states_of`)",
    MODEL,
    ("cli_models.hidden_states_of",),
    "tunix's critic with a score head asks for hidden states Llama 3 does not sow",
    "tests/tunix/learner/test_agentic_local_checkpoint.py",
  ),
  "step_metrics_logged_now": Patch(
    "<cluster>._buffered_train_metrics[-1].metrics (emptied once logged)",
    CALL,
    ("cluster_hooks.log_step_metrics_now",),
    "tunix logs a step's metrics only after its checkpoint; a killed run lost them",
    "PINNED (`RLCluster._log_metrics`); PINNED_INSTANCE_ATTRIBUTES",
  ),
  "learner_reward_model_flag": Patch(
    "<learner>._use_reward_model (tunix's `PPOLearner` attribute)",
    OWN,
    ("learner_hooks.init_learner",),
    "`PPOLearner.__init__` is skipped (it refuses a cluster without critic); this is what "
    "it sets before its trainers",
    "SOURCE_PINS (`PPOLearner.__init__`); PINNED_INSTANCE_ATTRIBUTES",
  ),
  "sampler_stop_ids": Patch(
    "<sampler>.eos_ids (`ContinuingSampler`: a tunix `Sampler`)",
    OWN,
    ("sampler_internals.sampler_step_functions",),
    "tunix's `Sampler.__call__` sets its stop ids before its step functions run",
    "SOURCE_PINS (`Sampler.__call__`); tests/tunix/compat/test_sampler_layout.py",
  ),
}

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
  """Applies the `PROCESS` patches: qwix's LoRA product and `entries` in tunix's registry;
  given a cluster, `prepare(rl_cluster)` too. Idempotent: a second call changes nothing.

  Args:
    rl_cluster: tunix's `RLCluster` to `prepare`, or None.
    entries: names to put into tunix's `function_registry`.

  Raises:
    ValueError: a loss name is taken in tunix's registry by another function.
  """
  install_lora_product()
  for entry in entries:
    _register(entry)
  if rl_cluster is not None:
    prepare(rl_cluster)


def prepare(
  rl_cluster: Any,
  *,
  checkpoint_metadata: Callable[[], dict[str, Any]] | None = None,
  quiet_trainers: bool = False,
  sample_anew: bool = False,
) -> None:
  """Applies the `CLUSTER` patches to `rl_cluster`'s own objects (nothing process-wide).

  Args:
    rl_cluster: tunix's `RLCluster` (or `RLEngine`).
    checkpoint_metadata: the learner's state, added to what its actor trainer saves
      (`trainer_checkpoint_metadata`; chained onto what is there).
    quiet_trainers: its trainers open no progress bar (`trainer_progress_bar`).
    sample_anew: its vanilla engine samples each call with a key of its own
      (`rollout_sample_anew`; the agentic learner).
  """
  adjust_sampler(rl_cluster)
  if quiet_trainers:
    for trainer in (rl_cluster.actor_trainer, getattr(rl_cluster, "critic_trainer", None)):
      if trainer is not None:  # no critic trainer without a critic
        silence_progress_bar(trainer)
  if checkpoint_metadata is not None:
    add_checkpoint_metadata(rl_cluster.actor_trainer, checkpoint_metadata)
  if sample_anew:
    sample_each_call_anew(rl_cluster)


def adjust_sampler(rl_cluster: Any) -> None:
  """The cluster's own vanilla sampler, adjusted (that object only, nothing process-wide):
  no remat or splash attention in its graph (`model.remat` and splash are for the trainers'
  passes) and an int prompt width (tunix's array width breaks a later jit lookup). `prepare`
  applies it to the cluster a learner is given, so a cluster built by hand trains as one
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
