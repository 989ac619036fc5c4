"""Building a real tunix `RLCluster` for tunix-ppo-ext runs: mesh, trainer and rollout configs.

Every role shares one mesh by default (actor and rollout then share weights), the
rollout engine is tunix's "vanilla" sampler, and both trainers use optax Adam.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import optax
import orbax.checkpoint as ocp
from flax import nnx
from metrax import logging as metrax_logging
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.rollout import base_rollout
from tunix.sft import metrics_logger

from tunix_ppo_ext import models

Role = rl_cluster_lib.Role


def make_mesh() -> jax.sharding.Mesh:
  """A 1x1 mesh with the axis names tunix's Qwen3 shardings use (`fsdp`, `tp`).

  Axis types must be Auto: `jax.make_mesh` defaults to Explicit, under which tunix's
  embedding lookup fails with a `ShardingTypeError`.
  """
  auto = jax.sharding.AxisType.Auto
  return jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(auto, auto), devices=jax.devices()[:1])


def shard_to_mesh(model: nnx.Module, mesh: jax.sharding.Mesh) -> nnx.Module:
  """Places `model`'s variables on `mesh` in place (per their partition specs).

  Doing it before `RLCluster` keeps the caller's object the one tunix trains: RLCluster
  only re-creates models that are not on the role's mesh yet.
  """
  state = nnx.state(model)
  specs = nnx.get_partition_spec(state)
  shardings = jax.tree.map(
    lambda s: jax.sharding.NamedSharding(mesh, s or jax.sharding.PartitionSpec()),
    specs,
    is_leaf=lambda s: s is None or isinstance(s, jax.sharding.PartitionSpec),
  )
  nnx.update(model, jax.device_put(state, shardings))
  return model


def make_models(
  tokenizer, seed: int = 0, num_layers: int = 1, embed_dim: int = 32
) -> tuple[nnx.Module, nnx.Module, nnx.Module]:
  """`(policy, critic, reference)` toy Qwen3s: the reference copies the policy and the
  critic's backbone is initialised from it (common PPO practice)."""
  config = models.tiny_qwen3_config(
    tokenizer.vocab_size,
    num_layers=num_layers,
    embed_dim=embed_dim,
    hidden_dim=2 * embed_dim,
    num_heads=2,
    head_dim=16,
    num_kv_heads=1,
  )
  policy = models.make_policy(config, seed)
  return policy, models.critic_from_policy(policy, seed + 1), models.copy_model(policy)


def _metrics_options(
  metrics_dir: str | None, extra_backends: Sequence[Callable[[], Any]] = ()
) -> metrics_logger.MetricsLoggerOptions | None:
  """TensorBoard event files in `metrics_dir` plus `extra_backends` (metrax backend factories).

  tunix's default set would also start W&B; here every backend is chosen explicitly.
  """
  if metrics_dir is None:
    return None

  def tensorboard() -> metrax_logging.TensorboardBackend:
    return metrax_logging.TensorboardBackend(log_dir=metrics_dir, flush_every_n_steps=1)

  return metrics_logger.MetricsLoggerOptions(
    log_dir=metrics_dir,
    flush_every_n_steps=1,
    backend_kwargs={"custom_backend": [tensorboard, *extra_backends]},
  )


def _checkpoint_options(
  checkpoint_dir: str | None, every: int = 1
) -> ocp.CheckpointManagerOptions | None:
  """Save every `every` steps, keep two (in `<dir>/actor` and `<dir>/critic`)."""
  if checkpoint_dir is None:
    return None
  return ocp.CheckpointManagerOptions(save_interval_steps=every, max_to_keep=2)


def training_config(
  *,
  max_steps: int,
  lr: float = 1e-3,
  critic_lr: float | None = None,
  mini_batch_size: int | None = None,
  train_micro_batch_size: int | None = None,
  checkpoint_dir: str | None = None,
  metrics_dir: str | None = None,
  metric_backends: Sequence[Callable[[], Any]] = (),
  checkpoint_every: int = 1,
  eval_every: int = 10**9,
) -> rl_cluster_lib.RLTrainingConfig:
  """`RLTrainingConfig` with optax Adam for actor and critic; data sharded on `fsdp`."""
  return rl_cluster_lib.RLTrainingConfig(
    actor_optimizer=optax.adam(lr),
    critic_optimizer=optax.adam(critic_lr if critic_lr is not None else lr),
    eval_every_n_steps=eval_every,
    max_steps=max_steps,
    mini_batch_size=mini_batch_size,
    train_micro_batch_size=train_micro_batch_size,
    checkpoint_root_directory=checkpoint_dir,
    checkpointing_options=_checkpoint_options(checkpoint_dir, checkpoint_every),
    metrics_logging_options=_metrics_options(metrics_dir, metric_backends),
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
) -> base_rollout.RolloutConfig:
  """Vanilla-engine `RolloutConfig`; the KV cache fits prompt + completion exactly.

  `seed` stays an int: the sampler donates its state, so a `jax.random.PRNGKey` here is
  deleted after the first `generate` call (an int means every call samples with the
  same key). `temperature=0` is greedy, which needs `top_p=None`: with `top_p` set the
  sampler divides the logits by 0 (NaN logprobs, arbitrary tokens).
  """
  return base_rollout.RolloutConfig(
    max_tokens_to_generate=max_tokens_to_generate,
    max_prompt_length=max_prompt_length,
    kv_cache_size=max_prompt_length + max_tokens_to_generate,
    temperature=temperature,
    top_p=1.0 if temperature > 0 else None,
    top_k=None,
    seed=seed,
    return_logprobs=return_logprobs,
  )


def build_cluster(
  policy: nnx.Module,
  critic: nnx.Module | None,
  tokenizer,
  *,
  reference: nnx.Module | None = None,
  mesh: jax.sharding.Mesh | None = None,
  max_steps: int,
  batch: int,
  max_prompt_length: int,
  max_tokens_to_generate: int,
  lr: float = 1e-3,
  critic_lr: float | None = None,
  mini_batch_size: int | None = None,
  train_micro_batch_size: int | None = None,
  checkpoint_dir: str | None = None,
  metrics_dir: str | None = None,
  metric_backends: Sequence[Callable[[], Any]] = (),
  checkpoint_every: int = 1,
  eval_every: int = 10**9,
  temperature: float = 1.0,
  seed: int = 0,
  return_logprobs: bool = False,
) -> rl_cluster_lib.RLCluster:
  """A real tunix `RLCluster` (vanilla rollout) with every role on one mesh.

  `batch` is the prompts per global step (used only to check the mini-batch sizes);
  `reference=None` means no reference model (PPO then needs `beta=0`). The models are
  placed on the mesh in place, so `policy is cluster.actor_trainer.model`.
  """
  mesh = mesh or make_mesh()
  if mini_batch_size is not None and batch % mini_batch_size:
    raise ValueError(f"batch={batch} is not a multiple of mini_batch_size={mini_batch_size}")
  for model in (policy, critic, reference):
    if model is not None:
      shard_to_mesh(model, mesh)
  cluster_config = rl_cluster_lib.ClusterConfig(
    role_to_mesh={role: mesh for role in (Role.ACTOR, Role.CRITIC, Role.REFERENCE, Role.ROLLOUT)},
    rollout_engine="vanilla",
    offload_to_cpu=False,
    training_config=training_config(
      max_steps=max_steps,
      lr=lr,
      critic_lr=critic_lr,
      mini_batch_size=mini_batch_size,
      train_micro_batch_size=train_micro_batch_size,
      checkpoint_dir=checkpoint_dir,
      metrics_dir=metrics_dir,
      metric_backends=metric_backends,
      checkpoint_every=checkpoint_every,
      eval_every=eval_every,
    ),
    rollout_config=rollout_config(
      max_prompt_length=max_prompt_length,
      max_tokens_to_generate=max_tokens_to_generate,
      temperature=temperature,
      seed=seed,
      return_logprobs=return_logprobs,
    ),
  )
  return rl_cluster_lib.RLCluster(
    actor=policy,
    critic=critic,
    reference=reference,
    tokenizer=tokenizer,
    cluster_config=cluster_config,
  )
