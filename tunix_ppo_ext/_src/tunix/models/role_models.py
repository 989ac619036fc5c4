"""The run's models in their roles (actor, critic, reference), built in one place from a
`ModelPlan` worked out when the run config is loaded.

A `ModelPlan` says where the base policy comes from (a checkpoint with a `config.json`:
its family and tunix config, the file read once; else a Qwen3 of a named or the toy
sizes, loaded from the checkpoint's safetensors or randomly initialised), how it is built
(`ModelSpec`: remat, attention, dtype) and what is built around it (LoRA adapters, the
critic's value head). `build_roles` builds the three roles from it; `roles_around` builds
them around a given base policy (`tunix-ppo-ext plan` calls it under `nnx.eval_shape`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import nnx

from tunix_ppo_ext._src.config.model_spec import ModelSpec
from tunix_ppo_ext._src.tunix.models import hf_models, lora, toy_models
from tunix_ppo_ext._src.tunix.models import qwen3_safetensors as checkpoints


@dataclasses.dataclass(frozen=True)
class ModelPlan:
  """The run's models as its config describes them, resolved before anything is built.

  `config`: the base policy's tunix `ModelConfig`, configured by `spec` (`hf_models.
  configured`); `family`: a checkpoint's own family, from its `config.json` (None: tunix's
  Qwen3 of `config`); `checkpoint`: where its weights are (None: random init from
  `seed`); `toy_vocab`: the toy sizes, whose vocabulary is the tokenizer's (set when
  built). `lora`: the adapters (None: full fine-tuning), on the critic too with
  `critic_lora`; `head_init`: the value head's start (`toy_models.VALUE_HEAD_INITS`).
  """

  spec: ModelSpec
  config: Any
  family: hf_models.Family | None = None
  checkpoint: str | None = None
  toy_vocab: bool = False
  seed: int = 0
  lora: lora.LoraSpec | None = None
  critic_lora: bool = False
  head_init: str = "normal"

  def vocab_size(self, tokenizer_vocab: int) -> int:
    """The policy's vocabulary with a tokenizer of `tokenizer_vocab` ids."""
    return tokenizer_vocab if self.toy_vocab else hf_models.config_vocab_size(self.config)


def build_roles(
  plan: ModelPlan, tokenizer_vocab: int, mesh: jax.sharding.Mesh | None = None
) -> tuple[nnx.Module, nnx.Module, nnx.Module]:
  """`(actor, critic, reference)`: the base policy (`base_policy`) and the roles around it
  (`roles_around`).

  Args:
    plan: the run's `ModelPlan`.
    tokenizer_vocab: the tokenizer's ids (`len(tokenizer)`).
    mesh: the mesh a checkpoint's weights are sharded onto; None: the first device.

  Returns:
    `(actor, critic, reference)`.
  """
  return roles_around(plan, base_policy(plan, tokenizer_vocab, mesh))


def base_policy(
  plan: ModelPlan, tokenizer_vocab: int, mesh: jax.sharding.Mesh | None = None
) -> nnx.Module:
  """The policy's base model, its weights in `plan.spec.dtype` if given: a checkpoint with
  a `config.json` loaded by its family's loader straight onto `mesh`, sharded (a real model
  never sits whole on one chip); else tunix's Qwen3 of `plan.config`, from the checkpoint's
  safetensors or randomly initialised (`plan.seed`)."""
  policy = _stored_policy(plan, tokenizer_vocab, mesh)
  if plan.spec.dtype is None:
    return policy
  return hf_models.cast_params(policy, hf_models.DTYPES[plan.spec.dtype])


def _stored_policy(plan: ModelPlan, tokenizer_vocab: int, mesh: Any) -> nnx.Module:
  """`base_policy` before its cast."""
  if plan.family is not None:
    policy = hf_models.load_family_model(
      plan.checkpoint, plan.family, plan.config, mesh, plan.spec.dtype
    )
    hf_models.check_vocabulary(hf_models.vocab_size(policy), tokenizer_vocab)
    return policy
  config = plan.config
  if plan.toy_vocab:
    config = dataclasses.replace(config, vocab_size=tokenizer_vocab)
  if plan.checkpoint is not None:
    return checkpoints.load_qwen3_checkpoint(plan.checkpoint, config, mesh)
  return toy_models.make_policy(config, plan.seed)


def roles_around(plan: ModelPlan, policy: nnx.Module) -> tuple[nnx.Module, nnx.Module, nnx.Module]:
  """`(actor, critic, reference)` around a base `policy`: with `plan.lora` the adapted
  actor, its critic and the base itself as the reference (`lora_roles`: one copy of the
  base weights); else the policy, a critic from its backbone and a copy; with
  `attention: blockwise` each attends blockwise on its cache-free passes, and with a
  `dtype` what the actor and critic train stays float32.

  Args:
    plan: the run's `ModelPlan`.
    policy: the base policy.

  Returns:
    `(actor, critic, reference)`.
  """
  if plan.lora is not None:
    roles = lora_roles(
      policy, plan.lora, plan.seed, critic_lora=plan.critic_lora, head_init=plan.head_init
    )
  else:
    roles = toy_models.with_critic_and_reference(policy, plan.seed, head_init=plan.head_init)
  if plan.spec.attention == "blockwise":
    hf_models.attend_blockwise(roles, plan.spec.block_size)
  if plan.spec.dtype is not None:
    hf_models.train_in_float32(*roles[:2])
  return roles


def lora_roles(
  policy: nnx.Module,
  spec: lora.LoraSpec,
  seed: int = 0,
  critic_lora: bool = False,
  head_init: str = "normal",
) -> tuple[nnx.Module, nnx.Module, nnx.Module]:
  """`(actor, critic, reference)` for LoRA training of a base `policy`, as tunix's own CLI
  builds them: the reference is `policy` itself (frozen), the actor `policy` with adapters
  holding the very same base arrays, so tunix's cluster shares one copy of the base weights
  between actor, rollout and reference.

  Args:
    policy: the base policy (left unchanged).
    spec: the adapters (`lora.apply_lora`).
    seed: seeds the actor's adapters; `seed + 1` the critic's value head and adapters.
    critic_lora: the critic holds the base's own arrays plus adapters, its value head
      trainable (`LoRAParam`); else a full copy of the backbone with a value head.
    head_init: the value head's initialisation (`toy_models.ValueModel`).

  Returns:
    `(actor, critic, reference)`.
  """
  critic = toy_models.critic_from_policy(
    policy, seed + 1, share_weights=critic_lora, trainable_head=critic_lora, head_init=head_init
  )
  actor = lora.apply_lora(policy, spec, seed)
  if critic_lora:
    critic = lora.apply_lora(critic, spec, seed + 1)
  return actor, critic, policy
