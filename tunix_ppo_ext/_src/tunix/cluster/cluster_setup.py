"""Building a real tunix `RLCluster` for tunix-ppo-ext runs: mesh, trainer and rollout configs.

Every role shares one mesh by default (actor and rollout then share weights), the
rollout engine is tunix's "vanilla" sampler, and both trainers use optax Adam.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import optax
import orbax.checkpoint as ocp
from flax import nnx
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.rollout import base_rollout
from tunix.sft import metrics_logger

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.config.cluster_spec import ClusterSpec
from tunix_ppo_ext._src.metrics.keys import MetricKeys
from tunix_ppo_ext._src.metrics.sinks import KeyedBackend, TensorboardBackend
from tunix_ppo_ext._src.optim.guards import guarded_adam
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.cluster.mesh import make_mesh, quiet_cpu_notices
from tunix_ppo_ext._src.tunix.models import toy_models

Role = rl_cluster_lib.Role


def shard_to_mesh(
  model: nnx.Module, mesh: jax.sharding.Mesh, placed: dict[Any, Any] | None = None
) -> nnx.Module:
  """Places `model`'s variables on `mesh` in place (per their partition specs).

  Doing it before `RLCluster` keeps the caller's object the one tunix trains: RLCluster
  only re-creates models that are not on the role's mesh yet. `placed` (shared over the
  models of one cluster) places an array several models hold once, so they still share it
  (a LoRA actor holds its reference's base arrays: one copy on the mesh, not two).
  """
  check_shardable(model, mesh)
  placed = {} if placed is None else placed
  state = nnx.state(model)
  specs = nnx.get_partition_spec(state)
  shardings = jax.tree.map(
    lambda s: jax.sharding.NamedSharding(mesh, s or jax.sharding.PartitionSpec()),
    specs,
    is_leaf=_is_spec,
  )

  def put(array: Any, sharding: jax.sharding.NamedSharding) -> Any:
    key = (id(array), sharding)
    if key not in placed:  # the source is kept alive with its copy, so its id stays unique
      placed[key] = (array, jax.device_put(array, sharding))
    return placed[key][1]

  nnx.update(model, jax.tree.map(put, state, shardings))
  return model


def check_shardable(model: nnx.Module, mesh: jax.sharding.Mesh) -> None:
  """Raises ValueError naming the first parameter whose dimensions do not divide by the
  sizes of the `mesh` axes its partition spec puts them on (JAX would fail deep inside)."""
  state = nnx.state(model)
  named_specs = jax.tree_util.tree_leaves_with_path(nnx.get_partition_spec(state), is_leaf=_is_spec)
  for (path, spec), array in zip(named_specs, jax.tree.leaves(state), strict=True):
    _check_divisible(jax.tree_util.keystr(path), array.shape, spec, mesh)


def _is_spec(leaf: Any) -> bool:
  return leaf is None or isinstance(leaf, jax.sharding.PartitionSpec)


def _check_divisible(
  name: str, shape: Sequence[int], spec: jax.sharding.PartitionSpec | None, mesh
) -> None:
  """ValueError naming the parameter when a dimension does not divide by its mesh axes."""
  for dim, axes in zip(shape, spec or (), strict=False):
    names = axes if isinstance(axes, tuple) else (axes,)
    parts = math.prod(mesh.shape[a] for a in names if a is not None)
    if dim % parts:
      raise ConfigError(
        f"parameter {name} of shape {tuple(shape)} has a dimension of {dim} sharded on mesh "
        f"axes {names} of total size {parts}: not divisible. Choose a mesh.shape or model "
        "sizes (heads, kv heads, widths, vocabulary) that divide."
      )


def make_models(
  tokenizer, seed: int = 0, num_layers: int = 1, embed_dim: int = 32
) -> tuple[nnx.Module, nnx.Module, nnx.Module]:
  """`(policy, critic, reference)` toy Qwen3s: the reference copies the policy and the
  critic's backbone is initialised from it (common PPO practice).

  Args:
    tokenizer: gives the vocabulary size (`vocab_size`).
    seed: the initialisation seed.
    num_layers: decoder layers.
    embed_dim: the model width (the MLP is twice as wide).

  Returns:
    `(policy, critic, reference)`.
  """
  config = toy_models.tiny_qwen3_config(
    tokenizer.vocab_size,
    num_layers=num_layers,
    embed_dim=embed_dim,
    hidden_dim=2 * embed_dim,
    num_heads=2,
    head_dim=16,
    num_kv_heads=1,
  )
  policy = toy_models.make_policy(config, seed)
  return toy_models.with_critic_and_reference(policy, seed)


def _metrics_options(
  metrics_dir: str | None,
  extra_backends: Sequence[Callable[[], Any]] = (),
  keys: MetricKeys | None = None,
  opened: list[KeyedBackend] | None = None,
) -> metrics_logger.MetricsLoggerOptions | None:
  """TensorBoard event files in `metrics_dir` plus `extra_backends` (metrax backend factories).

  Every backend sits behind the metrics taxonomy (`keys`, default: the standard keys).
  tunix's default set would also start W&B; here every backend is chosen explicitly. Each
  one built is appended to `opened` (when given).
  """
  if metrics_dir is None:
    return None
  keys = keys or MetricKeys()

  def tensorboard() -> TensorboardBackend:  # written by process 0, as metrax's backend
    return TensorboardBackend(metrics_dir if jax.process_index() == 0 else None)

  def keyed(factory: Callable[[], Any]) -> Callable[[], KeyedBackend]:
    def build() -> KeyedBackend:
      backend = KeyedBackend(factory(), keys)
      if opened is not None:
        opened.append(backend)
      return backend

    return build

  return metrics_logger.MetricsLoggerOptions(
    log_dir=metrics_dir,
    flush_every_n_steps=1,
    backend_kwargs={"custom_backend": [keyed(f) for f in (tensorboard, *extra_backends)]},
  )


def _checkpoint_options(
  checkpoint_dir: str | None, every: int = 1
) -> ocp.CheckpointManagerOptions | None:
  """Save every `every` steps, keep two (in `<dir>/actor` and `<dir>/critic`)."""
  if checkpoint_dir is None:
    return None
  return ocp.CheckpointManagerOptions(save_interval_steps=every, max_to_keep=2)


def training_config(
  spec: ClusterSpec,
  *,
  optimizers: tuple[optax.GradientTransformation, optax.GradientTransformation] | None = None,
  checkpoint_dir: str | None = None,
  metrics_options: metrics_logger.MetricsLoggerOptions | None = None,
) -> rl_cluster_lib.RLTrainingConfig:
  """`RLTrainingConfig` from `spec`, with optax Adam for actor and critic; data sharded on
  `fsdp`; checkpoints in `checkpoint_dir` (None: none) and tunix's metrics logger
  configured by `metrics_options` (`build_cluster` makes them).

  Both optimizers skip updates with a NaN/inf gradient (`optim.guards.guarded_adam`; the
  learner counts them and stops a run that keeps skipping). `optimizers`: `(actor,
  critic)` instead (e.g. `optimizers.build_optimizer`, also guarded). Batch sizes count
  prompts, as tunix's do.
  """
  actor, critic = optimizers or (
    guarded_adam(spec.lr),
    guarded_adam(spec.critic_lr if spec.critic_lr is not None else spec.lr),
  )
  return rl_cluster_lib.RLTrainingConfig(
    actor_optimizer=actor,
    critic_optimizer=critic,
    eval_every_n_steps=spec.eval_every,
    max_steps=spec.max_steps,
    mini_batch_size=spec.mini_batch_size,
    train_micro_batch_size=spec.train_micro_batch_size,
    rollout_micro_batch_size=spec.rollout_micro_batch_size,
    compute_logps_micro_batch_size=spec.logps_micro_batch_size,
    checkpoint_root_directory=checkpoint_dir,
    checkpointing_options=_checkpoint_options(checkpoint_dir, spec.checkpoint_every),
    metrics_logging_options=metrics_options,
    data_sharding_axis=("fsdp",),
    pbar_description=None,
  )


def rollout_config(
  *,
  max_prompt_length: int,
  max_tokens_to_generate: int,
  temperature: float = 1.0,
  seed: int = 0,
  return_logprobs: bool = False,
  top_p: float | None = 1.0,
  top_k: int | None = None,
) -> base_rollout.RolloutConfig:
  """Vanilla-engine `RolloutConfig`; the KV cache fits prompt + completion exactly.

  `seed` stays an int: the sampler donates its state, so a `jax.random.PRNGKey` here is
  deleted after the first `generate` call (an int means every call samples with the
  same key). `temperature=0` is greedy, which needs `top_p=None`: with `top_p` set the
  sampler divides the logits by 0 (NaN logprobs, arbitrary tokens), so `top_p` and
  `top_k` apply only when `temperature > 0`.
  """
  return base_rollout.RolloutConfig(
    max_tokens_to_generate=max_tokens_to_generate,
    max_prompt_length=max_prompt_length,
    kv_cache_size=max_prompt_length + max_tokens_to_generate,
    temperature=temperature,
    top_p=top_p if temperature > 0 else None,
    top_k=top_k if temperature > 0 else None,
    seed=seed,
    return_logprobs=return_logprobs,
  )


def _mode_rollout_configs(
  spec: ClusterSpec,
) -> base_rollout.RolloutConfig | dict[rl_cluster_lib.Mode, base_rollout.RolloutConfig]:
  """One `RolloutConfig` for both modes, or tunix's per-mode dict when evaluation samples
  differently (`spec.eval_sampling` overrides training's `temperature`, `top_p`, `top_k`)."""
  common = ("max_prompt_length", "max_tokens_to_generate", "temperature", "seed", "return_logprobs")
  train = {name: getattr(spec, name) for name in common} | dict(spec.sampling or {})
  if not spec.eval_sampling:
    return rollout_config(**train)
  mode = rl_cluster_lib.Mode
  evaluation = rollout_config(**train | dict(spec.eval_sampling))
  return {mode.TRAIN: rollout_config(**train), mode.EVAL: evaluation}


def _place_on_meshes(
  policy: nnx.Module,
  critic: nnx.Module | None,
  reference: nnx.Module | None,
  mesh: jax.sharding.Mesh,
  role_meshes: dict[Role, jax.sharding.Mesh] | None,
) -> dict[Role, jax.sharding.Mesh]:
  """Every role's mesh (`mesh` unless `role_meshes` names another), with each model sharded
  onto its role's in place; arrays the models share stay shared."""
  meshes = {role: mesh for role in (Role.ACTOR, Role.CRITIC, Role.REFERENCE, Role.ROLLOUT)}
  meshes.update(role_meshes or {})
  placed: dict[Any, Any] = {}
  for model, role in ((policy, Role.ACTOR), (critic, Role.CRITIC), (reference, Role.REFERENCE)):
    if model is not None:
      shard_to_mesh(model, meshes[role], placed)
  if meshes[Role.ROLLOUT] != meshes[Role.ACTOR]:  # tunix reshards a copy of the policy there
    check_shardable(policy, meshes[Role.ROLLOUT])
  return meshes


def _close_sinks(backends: Sequence[Any]) -> None:
  """Stops and closes the metric sinks of a cluster that failed to build: tunix's metrics
  logger had registered them as JAX listeners, so they went on receiving the next cluster's
  metrics (a second bar, a second TensorBoard file, a second W&B run), and a bar left open
  raised from tqdm's `__del__` at interpreter exit."""
  for backend in backends:
    with contextlib.suppress(AssertionError, ValueError):  # not registered (other processes)
      jax.monitoring.unregister_scalar_listener(backend.log_scalar)
    backend.close()


def build_cluster(
  policy: nnx.Module,
  critic: nnx.Module | None,
  tokenizer,
  spec: ClusterSpec,
  *,
  reference: nnx.Module | None = None,
  mesh: jax.sharding.Mesh | None = None,
  role_meshes: dict[Role, jax.sharding.Mesh] | None = None,
  optimizers: tuple[optax.GradientTransformation, optax.GradientTransformation] | None = None,
  checkpoint_dir: str | None = None,
  metrics_dir: str | None = None,
  metric_backends: Sequence[Callable[[], Any]] = (),
  metric_keys: MetricKeys | None = None,
) -> rl_cluster_lib.RLCluster:
  """A real tunix `RLCluster` (vanilla rollout) with the settings of `spec` (a run's
  `ResolvedRun.cluster`, or a `ClusterSpec` written directly).

  `reference=None` means no reference model (PPO then needs `beta=0`). `role_meshes`
  (tunix's `role_to_mesh`, e.g. from `tunix_ppo_ext.models.role_meshes`) overrides `mesh`
  (default 1x1) per role. The models are placed on their role's mesh in place, so
  `policy is cluster.actor_trainer.model`; with a rollout mesh that differs from the
  actor's, tunix samples from a resharded copy that it syncs after every step.
  `optimizers`: `(actor, critic)` optax transformations (default: guarded Adam at
  `spec.lr` / `spec.critic_lr`). Checkpoints go to `checkpoint_dir` (none when None), metrics
  to TensorBoard files in `metrics_dir` and to `metric_backends` (sink factories, keyed by
  `metric_keys`). tunix's trainers open no tqdm bars of their own (the actor's and critic's
  would interleave with the run's: `metrics.sinks.ProgressBackend`). When tunix's cluster
  fails to build (a checkpoint it cannot restore), the sinks it opened are closed. qwix's
  LoRA product is installed (`compat.install`) and the cluster prepared (`compat.prepare`:
  its sampler's adjustments, its trainers' silent progress bars).

  Args:
    policy: the actor's model.
    critic: the critic's model, or None (no critic: a group estimator).
    tokenizer: the tokenizer the rollout decodes with.
    spec: the cluster's settings.
    reference: the reference model, or None.
    mesh: the one mesh of every role; None: 1x1.
    role_meshes: a mesh per role, overriding `mesh`.
    optimizers: `(actor, critic)` optax transformations; None: guarded Adam.
    checkpoint_dir: where checkpoints go; None: no checkpoints.
    metrics_dir: where TensorBoard files go; None: none.
    metric_backends: extra metric sink factories.
    metric_keys: how metric names are published to `metric_backends`.

  Returns:
    The tunix `RLCluster`.
  """
  meshes = _place_on_meshes(policy, critic, reference, mesh or make_mesh(), role_meshes)
  opened: list[KeyedBackend] = []
  cluster_config = rl_cluster_lib.ClusterConfig(
    role_to_mesh=meshes,
    rollout_engine="vanilla",
    offload_to_cpu=False,
    training_config=training_config(
      spec,
      optimizers=optimizers,
      checkpoint_dir=checkpoint_dir,
      metrics_options=_metrics_options(metrics_dir, metric_backends, metric_keys, opened),
    ),
    rollout_config=_mode_rollout_configs(spec),
  )
  try:
    cluster = rl_cluster_lib.RLCluster(
      actor=policy,
      critic=critic,
      reference=reference,
      tokenizer=tokenizer,
      cluster_config=cluster_config,
    )
  except BaseException:
    _close_sinks(opened)  # e.g. a checkpoint that cannot be restored, and the run retries
    raise
  compat.install()  # qwix's LoRA product
  compat.prepare(cluster, quiet_trainers=True)  # its sampler's adjustments, no tqdm bars
  quiet_cpu_notices()  # tunix's TPU notices, on a CPU-only process
  return cluster
