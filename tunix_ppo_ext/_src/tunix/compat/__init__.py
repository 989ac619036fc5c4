"""Every use of a private tunix name, in one place, pinned to the tunix it was written for.

The rest of the package reaches tunix only through its public API and subclasses. What
tunix 0.1.7 offers no public way to do is here, one module per tunix module it touches, each
with the reason for each private name it uses and its own pins (`PINNED`,
`PINNED_INSTANCE_ATTRIBUTES`):

- `learner_hooks`: tunix's PPO learner (`tunix.rl.ppo.ppo_learner`, `tunix.rl.rl_learner`,
  `tunix.rl.common`): its private hooks, a learner without critic, the learner's state.
- `cluster_hooks`: `RLCluster` (`tunix.rl.rl_cluster`) and its vanilla rollout engine: a
  role's mesh and host offload, the step's metrics, the engine's sampler.
- `trainer_hooks`: `PeftTrainer` (`tunix.sft.peft_trainer`): checkpoint metadata, the save
  at close, pending metrics, the progress bar, a loss's differentiated value.
- `sampler_internals`: the generate `Sampler` (`tunix.generate.sampler`): its step functions,
  its sampling, and the layout of its sampling state and KV cache.
- `model_internals`: tunix's transformers (`tunix.models.*`): RoPE, Qwen3's activation
  sharding, the fused LM head.
- `qwix_adapters`: qwix's LoRA product (the adapters of tunix's LoRA models).
- `agentic_hooks`: tunix's agentic learner (`tunix.rl.agentic.agentic_rl_learner`): its
  results hook, its packed-rows hook (tunix main), its reward manager, and the probe for
  tunix main that `AgenticPpoLearner` needs.
- `cli_hooks`: tunix main's command-line PPO pipeline (`tunix.cli.ppo_main`), for
  `tunix-ppo-ext tunix-agentic`; imported by that command alone (tunix 0.1.7 has no such
  pipeline), its pins checked on tunix main (`tests/tunix/compat/test_compat.py`).
- `patches`: `PATCHES`, the one table of every change this package makes to a tunix, qwix
  or metrax object (class or instance), each with its target, scope, the functions that
  make it, its reason and its pin; `install(entries=())` applies the process-wide ones
  (qwix's LoRA product, names in tunix's `function_registry`) and `prepare(cluster, ...)`
  one cluster's (its sampler, its trainers' progress bars and checkpoint metadata, its
  engine's sampling keys), explicitly (`install` idempotently); importing this package changes
  nothing, and a learner prepares only the cluster it is given. A model's layers are
  changed as it is built, and a few changes last one call (both listed in the table);
  nothing outside `compat` assigns to a foreign object (tests/tunix/compat/test_compat.py). The
  names tunix's registry holds (`tunix_names`, through its private category names).
- `tunix_versions`: the tested tunix versions, the parts' pins merged (`PINNED`) and
  `check_tunix()`, which runs as this package is imported: it only reads tunix (its
  version and whether the pinned names are there) and fails early, at the import that
  first reaches a private name, rather than deep in a run; it changes nothing, so it stays
  at import (under `install` a learner built without it would run unchecked).
  `SOURCE_PINS`: the tunix and qwix bodies compat copies or skips, pinned by their source
  hash on each tested tunix; `changed_bodies()` names a changed one and what to re-read.

The names the rest of the package uses are re-exported here (`compat.NAME`).
"""

from __future__ import annotations

from tunix_ppo_ext._src.tunix.compat.agentic_hooks import (
  PACKING_HOOKS,
  AgenticHooks,
  agentic_rewards,
  episode_turn,
  needs_main,
  sample_each_call_anew,
)
from tunix_ppo_ext._src.tunix.compat.cluster_hooks import (
  log_step_metrics_now,
  on_role,
  vanilla_sampler,
)
from tunix_ppo_ext._src.tunix.compat.learner_hooks import (
  LearnerHooks,
  compute_entropy_from_logits,
  compute_rewards,
  init_learner,
  logps_micro_batch_size,
  one_of,
  rollout_micro_batch_size,
  tunix_loss_metrics,
  uses_reward_model,
)
from tunix_ppo_ext._src.tunix.compat.model_internals import (
  CACHE_FAMILIES,
  FUSED_HEAD_KEY,
  PINNED_HEADS,
  ROPE_MODULES,
  final_hidden_states,
  has_pinned_head,
  head_weight,
  kv_cache_dtype,
  lm_head,
  qwen2_rope_tables,
  qwen3_activation_sharding,
  rotate,
  use_blockwise_attention,
  use_rope_frequencies,
)
from tunix_ppo_ext._src.tunix.compat.patches import (
  PATCHES,
  Patch,
  RegistryEntry,
  adjust_sampler,
  check_no_clash,
  install,
  prepare,
  tunix_entry,
  tunix_holds,
  tunix_names,
)
from tunix_ppo_ext._src.tunix.compat.qwix_adapters import (
  QWIX_LORA_DELTA,
  QWIX_LORA_METHODS,
  install_lora_product,
)
from tunix_ppo_ext._src.tunix.compat.sampler_internals import (
  CACHE_KEYS,
  PREFILL_STATIC_ARGNAMES,
  STATE_FIELDS,
  abstract_turn_state,
  after_prefill,
  buffered_tokens,
  cache_of_layers,
  cache_rows,
  cache_written_from,
  decode_inputs,
  empty_kv_cache,
  fresh_state,
  gather_cache_slots,
  keep_prompt_width_static,
  kv_rows,
  layer_caches,
  prefill_arguments,
  sample_next_token,
  sample_without_training_options,
  sampler_step_functions,
  set_up_turn,
  still_decoding,
  turn_buffers,
  turn_first_slot,
  with_buffers,
)
from tunix_ppo_ext._src.tunix.compat.trainer_hooks import (
  SilentProgressBar,
  add_checkpoint_metadata,
  close_without_a_last_save,
  lora_enabled,
  loss_and_aux,
  metadata_after_the_step,
  restored_metadata,
  save_at_close,
  silence_progress_bar,
  write_pending_metrics,
)
from tunix_ppo_ext._src.tunix.compat.tunix_versions import (
  API_0_1_7,
  API_MAIN,
  EXPECTED_API,
  PINNED,
  PINNED_INSTANCE_ATTRIBUTES,
  SOURCE_PINS,
  TESTED_TUNIX,
  TUNIX_0_1_7,
  TUNIX_MAIN,
  changed_bodies,
  check_tunix,
  defined_hash,
  missing_names,
  source_hash,
  tunix_api,
  tunix_version,
)

__all__ = [
  # tunix_versions
  "API_0_1_7",
  "API_MAIN",
  "EXPECTED_API",
  "PINNED",
  "PINNED_INSTANCE_ATTRIBUTES",
  "SOURCE_PINS",
  "TESTED_TUNIX",
  "TUNIX_0_1_7",
  "TUNIX_MAIN",
  "defined_hash",
  "changed_bodies",
  "check_tunix",
  "missing_names",
  "source_hash",
  "tunix_api",
  "tunix_version",
  # patches
  "PATCHES",
  "Patch",
  "RegistryEntry",
  "adjust_sampler",
  "check_no_clash",
  "install",
  "prepare",
  "tunix_entry",
  "tunix_holds",
  "tunix_names",
  # learner_hooks
  "LearnerHooks",
  "compute_entropy_from_logits",
  "compute_rewards",
  "init_learner",
  "one_of",
  "logps_micro_batch_size",
  "rollout_micro_batch_size",
  "tunix_loss_metrics",
  "uses_reward_model",
  # agentic_hooks
  "AgenticHooks",
  "PACKING_HOOKS",
  "agentic_rewards",
  "needs_main",
  "episode_turn",
  "sample_each_call_anew",
  # cluster_hooks
  "log_step_metrics_now",
  "on_role",
  "vanilla_sampler",
  # trainer_hooks
  "SilentProgressBar",
  "add_checkpoint_metadata",
  "close_without_a_last_save",
  "lora_enabled",
  "loss_and_aux",
  "metadata_after_the_step",
  "restored_metadata",
  "save_at_close",
  "silence_progress_bar",
  "write_pending_metrics",
  # sampler_internals
  "CACHE_KEYS",
  "PREFILL_STATIC_ARGNAMES",
  "STATE_FIELDS",
  "abstract_turn_state",
  "after_prefill",
  "buffered_tokens",
  "cache_of_layers",
  "cache_rows",
  "cache_written_from",
  "decode_inputs",
  "empty_kv_cache",
  "fresh_state",
  "gather_cache_slots",
  "prefill_arguments",
  "sample_next_token",
  "keep_prompt_width_static",
  "layer_caches",
  "kv_rows",
  "sample_without_training_options",
  "sampler_step_functions",
  "set_up_turn",
  "still_decoding",
  "turn_buffers",
  "turn_first_slot",
  "with_buffers",
  # model_internals
  "CACHE_FAMILIES",
  "FUSED_HEAD_KEY",
  "PINNED_HEADS",
  "ROPE_MODULES",
  "final_hidden_states",
  "has_pinned_head",
  "head_weight",
  "kv_cache_dtype",
  "lm_head",
  "qwen2_rope_tables",
  "qwen3_activation_sharding",
  "rotate",
  "use_blockwise_attention",
  "use_rope_frequencies",
  # qwix_adapters
  "QWIX_LORA_DELTA",
  "install_lora_product",
  "QWIX_LORA_METHODS",
]

check_tunix()
