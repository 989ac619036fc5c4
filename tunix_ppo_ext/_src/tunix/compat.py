"""Every use of a private tunix name, in one place, pinned to the tunix it was written for.

The rest of the package reaches tunix only through its public API and subclasses. What
tunix 0.1.7 offers no public way to do is here, each with its reason:

- `LearnerHooks`: the three private hook methods of `PPOLearner` that a learner must
  override (`_generate_and_compute_advantage`, `_num_generations`, `_run_global_step`),
  forwarded to public methods of the same meaning. `init_without_critic`: what
  `PPOLearner.__init__` does for the actor, for a cluster without critic (its constructor
  refuses one; tunix's training loop itself skips a missing critic trainer, as for GRPO);
  it sets the `_use_reward_model` flag tunix's constructor would have set.
- learner state: `compute_rewards`, `uses_reward_model`, `rollout_micro_batch_size`,
  `logps_micro_batch_size` (what tunix's learner set up in its constructor, read where
  its own hook would).
- cluster: `on_role` (the mesh, logical-axis rules and host offload `RLCluster` wraps
  around each role's pass; its public passes take no attention mask),
  `log_step_metrics_now` (tunix writes a step's metrics only after its checkpoint).
- trainers: `add_checkpoint_metadata` (tunix takes the metadata function only in the
  trainer's constructor), `restored_metadata` (the custom metadata tunix restored),
  `lora_enabled` (as tunix's own save call passes it), `write_pending_metrics` (tunix
  0.1.7 closes the shared metrics logger with the actor trainer, before the critic
  trainer writes its last step), `save_at_close` (tunix's trainers save their current
  step as they close, without the metadata a resume needs: the learner's training makes
  that save with it, `metadata_after_the_step`, and a run the disk guard stops closes
  without it, `close_without_a_last_save`), `silence_progress_bar` (tunix's trainer opens its own
  tqdm bar whenever it runs under IPython or a terminal, with no setting to turn it off;
  the actor's and critic's bars interleave with the run's own bar).
- rollout: `vanilla_sampler` (the vanilla engine's `Sampler`, whose model, weights and
  cache size the multi-turn rollout's `ContinuingSampler` shares).
- sampler: `sampler_step_functions` (tunix's `Sampler` jits its prefill and decode loop
  only inside `__call__`; `ContinuingSampler` jits the unjitted `_prefill_fn` itself to run
  it on a state it keeps between turns, and `tunix-ppo-ext plan` compiles that program
  ahead of time on abstract inputs to read its memory), `sample_next_token` (`_sample`:
  the next token from logits, which `ContinuingSampler`'s own prefill of a turn's new
  tokens and decode step call), `sample_without_remat` (`_transformer_graphdef`: the
  graph tunix's sampler merges inside its decode loop, where a remat'ed layer cannot run).
- models: `qwen3_activation_sharding` (tunix's `qwen3.shard()` skips its activation
  sharding constraints whenever `jax.devices()[0]` is a CPU, always the case when `plan`
  compiles for a TPU topology from a host without one: the module function is replaced
  while a piece is traced, under a lock).
- models: `use_rope_frequencies` (tunix 0.1.7's Llama 3 and Qwen3 `Attention.block` call
  their module's `apply_rope` without the config's `rope_theta`, so it is always 1e6, and
  know no RoPE scaling: each attention layer of a loaded model is made a subclass whose
  `block` runs tunix's own with that module's `apply_rope` replaced, under a lock, by a
  rotation with the inverse frequencies the config carries, `rope_inv_freq`).
- models: `qwen2_rope_tables` (the sin/cos tables tunix's Qwen2 computes once per forward
  pass and hands to every layer; a value model runs those layers without the logits,
  `models.backbone_hidden_states`).
- models: `final_hidden_states`, `head_weight` (the fused LM head, `model.fused_head`: tunix
  0.1.7's transformers offer no call that stops before the head, so `__call__` runs with its
  head module made, for that call only, a subclass that hands back its input: the final-norm
  hidden states; on tunix main, which has `skip_lm_head=`, that public keyword is used. The
  head's weight is the untied `lm_head.w` `[D, V]` or the tied `embedder.input_embedding`
  `[V, D]`; `PINNED_HEADS` and tests/tunix/test_fused_head.py).

Two tunix versions are tested (`TESTED_TUNIX`): 0.1.7 (PyPI) and tunix main at c7d8950f,
whose version string is 0.1.8 (`tunix_api()` tells them apart by the API: main has
`RLEngine`). Every pinned name above is on both. What differs between them, one place each:

- `RLLearner.__init__`'s first keyword (`rl_cluster` on 0.1.7, `rl_engine` on main):
  `init_without_critic` passes the cluster positionally (both versions).
- `PPOLearner.__init__`'s keywords (`rl_cluster`/`ppo_config` on 0.1.7, `rl_engine`/
  `algo_config` on main) and main's closure around the actor's loss: handled in
  `PpoExtLearner.__init__` with public API only (positional call, `with_loss_fn`).
- `compute_entropy_from_logits` (tunix's entropy of logits, the tests' reference):
  `tunix.rl.algo_core` on 0.1.7, `tunix.rl.common` on main; imported here from either.
- the rest (`LossOutput`, configs moved to `tunix.common`, `TrainExample`'s packing fields,
  `compute_per_token_logps(return_entropy, chunk_size)`) needs no code here: tuples are
  still accepted, the old module paths re-export, the new fields default to None, and
  this package's own log-prob path runs on both (docs/compatibility.md).

`PINNED` lists the private names by tunix object; `check_tunix()` runs at import: on a
tested tunix (version string with its API) it does nothing; on another version it fails
with one line naming what is missing, or warns once when everything is still there.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import functools
import importlib.metadata
import inspect
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from qwix._src.providers import lora as qwix_lora
from tunix.generate import sampler as sampler_lib
from tunix.models.gemma3 import model as gemma3_model
from tunix.models.llama3 import model as llama3_model
from tunix.models.qwen2 import model as qwen2_model
from tunix.models.qwen3 import model as qwen3_model
from tunix.rl import algo_core, rl_learner
from tunix.rl import common as tunix_common
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.ppo import ppo_learner
from tunix.rl.rollout import vanilla_rollout
from tunix.sft import peft_trainer

from tunix_ppo_ext._src.math.low_rank import lora_product

# tunix main (0.1.8) moved it from `tunix.rl.algo_core` (0.1.7) to `tunix.rl.common`.
compute_entropy_from_logits = (
  tunix_common.compute_entropy_from_logits
  if hasattr(tunix_common, "compute_entropy_from_logits")
  else algo_core.compute_entropy_from_logits
)

# The tunix versions this package is tested with, by version string, and the API each
# version string must show (`tunix_api()`); CI runs the suite's tunix-facing part on both.
TUNIX_0_1_7 = "0.1.7"  # PyPI
TUNIX_MAIN = "0.1.8"  # tunix main at c7d8950f (2026-08-21): its pyproject already says 0.1.8
TESTED_TUNIX = (TUNIX_0_1_7, TUNIX_MAIN)
API_0_1_7, API_MAIN = "0.1.7", "main"
EXPECTED_API = {TUNIX_0_1_7: API_0_1_7, TUNIX_MAIN: API_MAIN}
PINNED: dict[str, tuple[Any, tuple[str, ...]]] = {
  # object the names live on -> (the object, private names used here)
  "tunix.rl.ppo.ppo_learner.PPOLearner": (
    ppo_learner.PPOLearner,
    ("_generate_and_compute_advantage", "_num_generations", "_run_global_step"),
  ),
  "tunix.rl.rl_learner.RLLearner": (rl_learner.RLLearner, ("_compute_rewards",)),
  "tunix.rl.rl_cluster.RLCluster": (
    rl_cluster_lib.RLCluster,
    (
      "_get_mesh_and_logical_axis_rules_cm",
      "_maybe_load_model_from_cpu",
      "_maybe_offload_model_to_cpu",
      "_log_metrics",
    ),
  ),
  "tunix.sft.peft_trainer.PeftTrainer": (
    peft_trainer.PeftTrainer,
    ("_write_train_metrics", "_save_last_checkpoint"),
  ),
  # `shard`, and the module globals `Attention.block` looks up at trace time (`apply_rope`,
  # replaced by use_rope_frequencies) and the class it subclasses
  "tunix.models.qwen3.model": (qwen3_model, ("shard", "apply_rope", "Attention")),
  "tunix.generate.sampler.Sampler": (
    sampler_lib.Sampler,
    ("_prefill_fn", "_decode_fn", "_sample"),
  ),
  "tunix.models.qwen2.model": (qwen2_model, ("_generate_pos_embeddings",)),
  "tunix.models.llama3.model": (llama3_model, ("apply_rope", "Attention")),
}
# Instance attributes set in constructors (checked on live objects by the tests).
PINNED_INSTANCE_ATTRIBUTES = {
  "PPOLearner": (
    "_use_reward_model",
    "_rollout_micro_batch_size",
    "_compute_logps_micro_batch_size",
  ),
  "PeftTrainer": ("_lora_enabled", "_pbar", "_restored_custom_metadata"),
  "RLCluster": ("_buffered_train_metrics",),
  "VanillaRollout": ("_sampler",),
  "Sampler": ("_transformer_graphdef",),
}


def tunix_version() -> str:
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


check_tunix()


class LearnerHooks(ppo_learner.PPOLearner):
  """`PPOLearner` whose private hooks call public methods a subclass defines.

  - `generate_and_compute_advantage(training_input, mode)`: the rollout phase.
  - `num_generations()`: samples per prompt.
  - `after_global_step(seconds)`: after each of tunix's global steps, with its wall time.
  """

  def _generate_and_compute_advantage(self, training_input: Any, mode: Any = None) -> Any:
    mode = rl_cluster_lib.Mode.TRAIN if mode is None else mode
    return self.generate_and_compute_advantage(training_input, mode)

  def _num_generations(self) -> int:
    return self.num_generations()

  def _run_global_step(self, *args: Any, **kwargs: Any) -> None:
    start = time.perf_counter()
    super()._run_global_step(*args, **kwargs)
    self.after_global_step(time.perf_counter() - start)

  def generate_and_compute_advantage(self, training_input: Any, mode: Any) -> Any:
    raise NotImplementedError

  def num_generations(self) -> int:
    raise NotImplementedError

  def after_global_step(self, seconds: float) -> None:
    del seconds


def init_without_critic(
  learner: ppo_learner.PPOLearner,
  rl_cluster: rl_cluster_lib.RLCluster,
  ppo_config: Any,
  reward_fns: Any,
  metric_fns: Any,
  data_shuffle_seed: int | None,
) -> None:
  """Initialises `learner` as `PPOLearner.__init__` does, for a cluster without critic.

  tunix's `RLLearner.__init__` (public), then the reward check, as `PPOLearner.__init__`
  does; its critic check and critic-trainer setup are what is left out (`PpoExtLearner`
  installs the actor's loss itself, on every cluster).
  """
  rl_learner.RLLearner.__init__(
    learner,
    rl_cluster,  # positional: its keyword is `rl_cluster` on 0.1.7, `rl_engine` on main
    ppo_config,
    reward_fns=reward_fns,
    metric_fns=metric_fns,
    data_shuffle_seed=data_shuffle_seed,
  )
  try:
    reward_model = rl_cluster.inference_worker.get_model("reward")
  except ValueError:
    reward_model = None
  if bool(reward_fns) == bool(reward_model):
    raise ValueError("PPO needs exactly one of `reward_fns` or a reward model in the cluster")
  learner._use_reward_model = bool(reward_model)


def compute_rewards(learner: Any, **kwargs: Any) -> Any:
  """tunix's reward-function scores (`RLLearner._compute_rewards`: its reward manager)."""
  return learner._compute_rewards(**kwargs)


def uses_reward_model(learner: Any) -> bool:
  """Whether tunix's learner was built to score with the reward model (no reward fns)."""
  return bool(learner._use_reward_model)


def rollout_micro_batch_size(learner: Any) -> int | None:
  """The rollout micro-batch size tunix's learner derived from its cluster config."""
  return learner._rollout_micro_batch_size


def add_checkpoint_metadata(trainer: Any, extra: Callable[[], dict[str, Any]]) -> None:
  """Adds `extra()` to what the trainer saves as custom checkpoint metadata.

  tunix's `Trainer` takes its metadata function only in its constructor (which
  `RLCluster` calls), so the learner's state is chained onto the live trainer's.
  """
  base = trainer.custom_checkpoint_metadata_fn
  trainer.custom_checkpoint_metadata_fn = lambda: {**base(), **extra()}


def restored_metadata(trainer: Any) -> dict[str, Any]:
  """The custom checkpoint metadata tunix's trainer restored (empty on a fresh run).

  Read without a fallback: were tunix to rename the attribute, a resumed run must fail
  here (pinned by test_compat) rather than silently resume without its sampling state."""
  return trainer._restored_custom_metadata or {}


def lora_enabled(trainer: Any) -> bool:
  """Whether the trainer trains LoRA adapters (tunix saves only those then)."""
  return bool(trainer._lora_enabled)


def write_pending_metrics(trainer: Any) -> None:
  """Writes the trainer's buffered metrics (tunix writes them only at its next step)."""
  trainer._write_train_metrics()


@contextlib.contextmanager
def save_at_close(cluster: Any, save: Callable[[Any], None]) -> Iterator[None]:
  """Within the block, the save each trainer makes as it closes is `save(trainer)`.

  `PeftTrainer.close` saves the current step when it is newer than the last saved one
  (`_save_last_checkpoint`), without the custom metadata its scheduled saves carry (the
  global step, the learner's KL controller and sampler state): a run resumed from it would
  start its metrics at step 1 again with a fresh KL controller (found by the disk guard's
  test on CI). The trainers' own method is back after the block; nested blocks restore the
  outer block's `save`.
  """
  trainers = [cluster.actor_trainer, getattr(cluster, "critic_trainer", None)]
  trainers = [t for t in trainers if t is not None]
  outer = [t.__dict__.get("_save_last_checkpoint") for t in trainers]
  for trainer in trainers:  # an instance attribute over the method
    trainer._save_last_checkpoint = functools.partial(save, trainer)
  try:
    yield
  finally:
    for trainer, previous in zip(trainers, outer, strict=True):
      if previous is None:
        del trainer._save_last_checkpoint
      else:
        trainer._save_last_checkpoint = previous


def close_without_a_last_save(cluster: Any) -> None:
  """`cluster.close()` without the checkpoint tunix's trainers save as they close
  (`save_at_close`): a run stopped early (the disk guard) keeps a scheduled checkpoint as its
  newest, which resumes exactly. Metrics are flushed and the checkpoint in flight is
  finished as in `close`."""
  with save_at_close(cluster, lambda trainer: None):
    cluster.close()


def metadata_after_the_step(cluster: Any, trainer: Any) -> dict[str, Any]:
  """The trainer's custom checkpoint metadata for a save made once tunix has counted the
  global step (as it closes): tunix's metadata function adds 1 to `global_steps` for the
  saves made during a step, before the count."""
  return {**trainer.custom_checkpoint_metadata(), "global_step": cluster.global_steps}


class SilentProgressBar:
  """Stands in for tunix's `ProgressBar` on a trainer: takes its calls, shows nothing."""

  def update_metrics(self, metric_names: list[str], mode: Any, ndigits: int = 3) -> None:
    del metric_names, mode, ndigits

  def update(self, n: int = 1) -> None:
    del n

  def close(self) -> None:
    pass


def silence_progress_bar(trainer: Any) -> None:
  """Keeps tunix's trainer from opening its own tqdm bar (the run shows one bar of its own).

  tunix 0.1.7's `PeftTrainer.train` creates `tunix.sft.progress_bar.ProgressBar` when its
  `_pbar` is None (enabled under IPython or a terminal, no setting to disable it) and keeps
  it across `train` calls until `close()`; a bar already in place is used instead.
  """
  trainer._pbar = SilentProgressBar()


def vanilla_sampler(rollout: Any) -> Any | None:
  """The vanilla engine's `Sampler`, or None for any other engine."""
  if not isinstance(rollout, vanilla_rollout.VanillaRollout):
    return None
  return getattr(rollout, "_sampler", None)


def sample_without_remat(sampler: Any) -> None:
  """Makes `sampler` run its model without activation rematerialisation (`model.remat`).

  tunix's sampler merges its `_transformer_graphdef` with the weights inside its decode
  `while_loop`; a Qwen3 / Qwen2 / Llama 3 / Gemma 3 layer whose config asks for remat then
  wraps itself in `nnx.remat` there, which mutates the freshly merged `Param`s from an inner
  trace (flax's `TraceContextError`), so a remat'ed policy could not sample at all. Remat
  only matters for a backward pass, which sampling never takes: the sampler's graph gets
  the same modules with `remat_config` NONE; the trainers keep theirs.
  """
  model = sampler.transformer
  changed = False
  for _, module in nnx.iter_graph(model):
    config = getattr(module, "config", None) if isinstance(module, nnx.Module) else None
    remat = getattr(config, "remat_config", None)
    if isinstance(remat, enum.Enum) and remat.name != "NONE":
      module.config = dataclasses.replace(config, remat_config=type(remat).NONE)
      changed = True
  if changed:
    sampler._transformer_graphdef = nnx.graphdef(model)


def sampler_step_functions(
  sampler: Any, eos_ids: Sequence[int]
) -> tuple[Callable[..., Any], Callable[..., Any]]:
  """`(prefill, decode)`: the sampler's unjitted `(params, sampling_state) -> state`
  functions that tunix jits (state donated) and calls in `Sampler.__call__`, with the
  stop ids set as `__call__` sets them first (`eos_ids`)."""
  sampler.eos_ids = jnp.array(list(eos_ids))
  return sampler._prefill_fn, sampler._decode_fn


def sample_next_token(sampler: Any, logits: Any, cache: Any, state: Any) -> Any:
  """tunix's `Sampler._sample`: the token after `logits` `[B, L, V]` (its last position)
  drawn as the state's sampling mode says, written with its log-prob at slot
  `decoding_step + 1`; `done` set on the sampler's `eos_ids`; `decoding_step` advanced.
  `ContinuingSampler` prefills a turn's new tokens itself and samples with it."""
  return sampler._sample(logits=logits, eos=sampler.eos_ids, cache=cache, sampler_state=state)


_SHARD_LOCK = threading.Lock()


@contextlib.contextmanager
def qwen3_activation_sharding(mesh: Any) -> Iterator[None]:
  """tunix's Qwen3 applies its activation shardings (`ShardingConfig.act_*`) on `mesh`
  while this is open, whatever the host's devices (tracing only; restored on exit)."""

  def shard(x: Any, spec: tuple[str | None, ...]) -> Any:
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*spec)))

  with _SHARD_LOCK:
    original = qwen3_model.shard
    qwen3_model.shard = shard
    try:
      yield
    finally:
      qwen3_model.shard = original


_ROPE_LOCK = threading.RLock()
ROPE_MODULES = (llama3_model, qwen3_model)  # the families whose attention ignores the theta


def rotate(inputs: Any, positions: Any, inv_freq: Any) -> Any:
  """RoPE as Hugging Face's Llama applies it: angles `position * inv_freq` in float32, the
  two halves of each head rotated, sin and cos cast to the inputs' dtype."""
  angle = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq, jnp.float32)
  angle = angle[..., None, :]  # [B, L, 1, head_dim // 2]: one table for every head
  sin, cos = jnp.sin(angle).astype(inputs.dtype), jnp.cos(angle).astype(inputs.dtype)
  first, second = jnp.split(inputs, 2, axis=-1)
  out = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
  return out.astype(inputs.dtype)


def _configured_block(attention_class: type, module: Any) -> Callable[..., Any]:
  """`attention_class.block` run with `module.apply_rope` rotating by `config.rope_inv_freq`."""

  def block(self: Any, *args: Any, **kwargs: Any) -> Any:
    inv_freq = self.config.rope_inv_freq

    def apply_rope(inputs: Any, positions: Any, head_dim: int, rope_theta: Any = None) -> Any:
      del head_dim, rope_theta  # what tunix passes (or not): the config decides
      return rotate(inputs, positions, inv_freq)

    with _ROPE_LOCK:
      original = module.apply_rope
      module.apply_rope = apply_rope
      try:
        return attention_class.block(self, *args, **kwargs)
      finally:
        module.apply_rope = original

  return block


_ROPE_CLASSES: dict[type, type] = {}


def _rope_class(attention_class: type, module: Any) -> type:
  """The subclass of a tunix `Attention` whose `block` rotates with the config's
  frequencies (defined in the class itself: a mixin base would change the instance layout,
  and `__class__` could not be reassigned)."""
  if attention_class not in _ROPE_CLASSES:
    body = {"block": _configured_block(attention_class, module), "__module__": __name__}
    name = f"ConfiguredRope{attention_class.__name__}"
    _ROPE_CLASSES[attention_class] = type(attention_class)(name, (attention_class,), body)
  return _ROPE_CLASSES[attention_class]


def use_rope_frequencies(model: Any) -> Any:
  """Makes every attention layer of a tunix Llama 3 or Qwen3 `model` rotate with its
  config's `rope_inv_freq` (a tuple of `head_dim // 2` floats); returns the model. A model
  whose config has none, or of another family, is left as it is."""
  if getattr(model.config, "rope_inv_freq", None) is None:
    return model
  for module in ROPE_MODULES:
    for layer in getattr(model, "layers", ()):
      attention = getattr(layer, "attn", None)
      if type(attention) is module.Attention:
        attention.__class__ = _rope_class(module.Attention, module)
  return model


def qwen2_rope_tables(positions: Any, head_dim: int, rope_theta: float) -> tuple[Any, Any]:
  """tunix's Qwen2 rotary `(sin, cos)` tables `[B, L, head_dim // 2]` for positions `[B, L]`."""
  return qwen2_model._generate_pos_embeddings(positions, head_dim, rope_theta)


def logps_micro_batch_size(learner: Any) -> int | None:
  """The micro-batch size tunix's learner uses for its log-prob passes."""
  return learner._compute_logps_micro_batch_size


@contextlib.contextmanager
def on_role(cluster: Any, role: Any, model: Any) -> Iterator[None]:
  """`RLCluster`'s setting for a pass of `role`: its mesh and logical-axis rules, the model
  loaded from host memory first and offloaded after (with `offload_to_cpu`)."""
  with cluster._get_mesh_and_logical_axis_rules_cm(role):
    cluster._maybe_load_model_from_cpu(model, role)
    try:
      yield
    finally:
      cluster._maybe_offload_model_to_cpu(model, role)


def log_step_metrics_now(cluster: Any) -> None:
  """Logs the train metrics buffered for the current global step now.

  tunix logs a step's buffered metrics only when the next step buffers its first one,
  after the step's checkpoint; a run killed in between would lose them for good.
  """
  buffers = cluster._buffered_train_metrics
  if buffers and buffers[-1].global_steps == cluster.global_steps:
    snapshot = copy.copy(buffers[-1])
    snapshot.metrics = dict(buffers[-1].metrics)  # what was logged stays intact for listeners
    cluster._log_metrics(snapshot)
    buffers[-1].metrics.clear()  # the buffer stays: tunix's bookkeeping expects one


def loss_and_aux(out: Any) -> tuple[Any, Any]:
  """`(the value tunix's trainer differentiates, aux)` of a policy or value loss's output.

  tunix main's own losses return an `sft.utils.LossOutput`, which its `PeftTrainer`
  differentiates through `primary_loss.unreduced_sum` (keeping the whole output as aux);
  ours, and tunix 0.1.7's, return the `(loss, aux)` pair.
  """
  primary = getattr(out, "primary_loss", None)
  return (primary.unreduced_sum, out) if primary is not None else out


def tunix_loss_metrics(algo_config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
  """`(actor, critic)` metrics to log of tunix's own `ppo` losses, as tunix's `PPOLearner`
  asks its trainers for them, with the reducer of the installed tunix (tunix main's losses
  return weighted metrics, reduced by its `mean_of_means`; 0.1.7's plain arrays, `np.mean`).
  """
  mean = getattr(tunix_common, "mean_of_means", np.mean)
  actor = {"pg_clipfrac": mean}
  if algo_config.epsilon_c is not None:
    actor["pg_clipfrac_lower"] = mean
  if algo_config.entropy_coef is not None and algo_config.entropy_coef > 0.0:
    actor["loss/entropy"] = mean
  return actor, {"vpred_mean": mean, "vf_clipfrac": mean}


# ----------------------------------------------------------------------------
# The fused LM head: final hidden states and head weights of tunix's transformers
# ----------------------------------------------------------------------------

# Each family's head as its `__call__` applies it to the final-norm hidden states `x`, last:
# `(head module attribute, its method that takes x, its weight attribute, the weight's layout)`
# for an untied head, then for a tied one (the input embedding, transposed).
PINNED_HEADS: dict[type, tuple[tuple[str, str, str, str], ...]] = {
  family: (("lm_head", "__call__", "w", "DV"), ("embedder", "decode", "input_embedding", "VD"))
  for family in (qwen2_model.Qwen2, qwen3_model.Qwen3, llama3_model.Llama3)
}
PINNED_HEADS[gemma3_model.Gemma3] = (("embedder", "decode", "input_embedding", "VD"),)
FUSED_HEAD_KEY = "model.fused_head"

_HEAD_LOCK = threading.Lock()
_PASS_THROUGH: dict[tuple[type, str], type] = {}
_CAPTURED = threading.local()


def _family(model: Any) -> type:
  """The tunix family class of `model` (qwix's LoRA class is a subclass); a one-line
  ValueError naming `model.fused_head` and the model's class for any other model."""
  family = next((f for f in PINNED_HEADS if isinstance(model, f)), None)
  if family is None:
    names = ", ".join(f.__name__ for f in PINNED_HEADS)
    raise ValueError(
      f"{FUSED_HEAD_KEY}: no fused head for {type(model).__name__} (its final hidden states "
      f"are known for tunix's {names} only); set {FUSED_HEAD_KEY}=false"
    )
  return family


def _head(model: Any, adapters_ok: bool = False) -> tuple[Any, str, str, str]:
  """`(head module, method, weight attribute, layout)` of a tunix transformer; a one-line
  ValueError naming `model.fused_head` and the family for any other model, or (unless
  `adapters_ok`) for a head carrying LoRA adapters (the fused head reads the weight itself,
  past qwix's adapter)."""
  family = _family(model)
  for attribute, method, weight, layout in PINNED_HEADS[family]:
    module = getattr(model, attribute, None)
    if module is not None and (attribute != "embedder" or not hasattr(model, "lm_head")):
      adapters = sorted(n for n in vars(module) if n.endswith("_lora_a"))
      if adapters and not adapters_ok:
        raise ValueError(
          f"{FUSED_HEAD_KEY}: the {family.__name__}'s LM head {attribute!r} carries LoRA "
          f"adapters {adapters}, which the fused head would skip; keep it out of "
          "model.lora.target_modules or set model.fused_head=false"
        )
      return module, method, weight, layout
  raise ValueError(f"{FUSED_HEAD_KEY}: the {family.__name__} has no LM head")


def _pass_through_class(cls: type, method: str) -> type:
  """The subclass of a head module's class whose `method` records its input and returns it."""
  if (cls, method) not in _PASS_THROUGH:

    def through(self: Any, x: Any) -> Any:
      del self
      _CAPTURED.hidden = x
      return x

    body = {method: through, "__module__": __name__}
    _PASS_THROUGH[cls, method] = type(cls)(f"HiddenOut{cls.__name__}", (cls,), body)
  return _PASS_THROUGH[cls, method]


def final_hidden_states(model: Any, *args: Any, **kwargs: Any) -> Any:
  """`model(*args, **kwargs)`'s final-norm hidden states `[B, L, D]`, the input of its LM
  head, in the model's dtype; no logits are computed (what the model then returns in their
  place is its hidden states again, unused). The call is tunix's own `__call__`, so qwix's
  LoRA interception, remat and the RoPE override (`use_rope_frequencies`) all apply."""
  module, method, _, _ = _head(model)
  if "skip_lm_head" in inspect.signature(_family(model).__call__).parameters:  # tunix main
    return model(*args, skip_lm_head=True, **kwargs)[0]
  original = type(module)
  with _HEAD_LOCK:
    module.__class__ = _pass_through_class(original, method)
    _CAPTURED.hidden = None
    try:
      model(*args, **kwargs)
      hidden = _CAPTURED.hidden
    finally:
      module.__class__ = original
      _CAPTURED.hidden = None
  if hidden is None:
    raise ValueError(f"{FUSED_HEAD_KEY}: {type(model).__name__}.__call__ never called its head")
  return hidden


def has_pinned_head(model: Any) -> bool:
  """Whether `model` is of a family whose `__call__` ends in its LM head (`PINNED_HEADS`:
  logits = head(final-norm hidden states), nothing after), so the head may run on a slice
  of the hidden states (`lm_head`) with the same logits at those positions."""
  return any(isinstance(model, family) for family in PINNED_HEADS)


def lm_head(model: Any, hidden: Any) -> Any:
  """The model's own LM head (its module and method, LoRA adapters included) on final
  hidden states `[B, L, D]`: logits `[B, L, V]` exactly as `model(...)` makes them there."""
  module, method, _, _ = _head(model, adapters_ok=True)
  return getattr(module, method)(hidden)


def head_weight(model: Any) -> Any:
  """The LM head's weight `[D, V]` of a tunix transformer (a tied embedding transposed)."""
  module, _, weight, layout = _head(model)
  value = getattr(module, weight)[...]
  return value if layout == "DV" else value.T


# ----- qwix's LoRA product (the adapters tunix's LoRA and `model.lora` use) -----

# qwix computes each adapter's `x A B` in its private `_compute_lora_delta(lhs, lora_a,
# lora_b, lhs_ca, lhs_ba, contract_shape, batch_shape, remain_shape, rank, precision)`,
# looked up at trace time. `install_lora_product` replaces it, for the calls of tunix's
# projections (one contracting axis, the input's last; no batch axes; one output axis;
# default precision), by `math.low_rank.lora_product`: the same product, with a VJP that
# transposes no activation (a faster LoRA update on XLA:CPU); every other call goes
# to qwix's own. Pinned by tests/tunix/test_lora.py.
QWIX_LORA_DELTA = qwix_lora._compute_lora_delta


def install_lora_product() -> None:
  """Routes qwix's adapter products through `lora_product` (idempotent; process-wide, the
  values unchanged)."""
  qwix_lora._compute_lora_delta = _lora_delta


def _lora_delta(
  lhs, lora_a, lora_b, lhs_ca, lhs_ba, contract_shape, batch_shape, remain_shape, rank,
  precision=None,
):  # fmt: skip
  args = (lhs, lora_a, lora_b, lhs_ca, lhs_ba, contract_shape, batch_shape, remain_shape, rank)
  plain = tuple(lhs_ca) == (lhs.ndim - 1,) and not batch_shape and not lhs_ba
  if not plain or len(contract_shape) != 1 or len(remain_shape) != 1 or precision is not None:
    return QWIX_LORA_DELTA(*args, precision=precision)
  a = jnp.reshape(lora_a, (contract_shape[0], rank))
  b = jnp.reshape(lora_b, (rank, remain_shape[0]))
  return lora_product(lhs, a, b)
