"""The learner's model passes through `RLCluster`, role by role.

Each pass runs where tunix runs it: the role's mesh and logical-axis rules, inputs
sharded on the data axis, the model loaded from host memory and offloaded after
(`offload_to_cpu`), micro-batches of the learner's log-prob micro-batch size.

- When the attention mask is tunix's own (every non-pad completion token) and the
  temperature is tunix's (`logps_temperature=None`, or 1 for the policy and the train
  rollout temperature for the reference), each pass is `RLCluster`'s public method:
  `get_old_per_token_logps` (the rollout engine's own `get_per_token_logps`),
  `get_ref_per_token_logps`, `get_values`, `get_rewards`. A multi-turn trajectory whose
  tokens are all non-pad takes
  this path too: its loss mask never enters a pass.
- Otherwise (a real token equal to the pad id, e.g. EOS when `eos_id == pad_id`; another
  temperature, which tunix's old-log-prob pass cannot take; the fused head,
  `PpoExtConfig.fused_head`, which tunix's passes do not have) the same steps run around
  this package's mask-aware passes (`passes`).
- Where rows of a micro-batch share a prompt (a GRPO group's) and the model takes a KV cache,
  the pass is also this package's, and runs each distinct prompt once
  (`passes.SharedPrompts`: the same outputs to float32 rounding, `U x P + B x T`
  positions instead of `B x (P + T)`); `RolePasses.share_prompts` turns it off. A role
  whose `RLCluster` method a subclass of tunix's overrides keeps that method
  (`CLUSTER_PASSES`): tunix's learner calls it, so this one does too, unless the run asks
  for what only this package's pass does (the fused head, packing).

All passes return `[B, T]` for the completion (values and scores: `[B, P+T]`, as tunix).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl import utils as rl_utils
from tunix.sft import sharding_utils

from tunix_ppo_ext._src.ops.shared_prompts import plan_shared_prompts
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.learner import passes

Role = rl_cluster_lib.Role
# each role's pass on tunix's `RLCluster`: a subclass's own method is called, never replaced
CLUSTER_PASSES = {
  Role.ROLLOUT: "get_old_per_token_logps",
  Role.REFERENCE: "get_ref_per_token_logps",
  Role.CRITIC: "get_values",
  Role.REWARD: "get_rewards",
}


@dataclasses.dataclass(frozen=True)
class ModelInputs:
  """A batch as model inputs: `[B, P]` prompt, `[B, T]` completion and its two masks."""

  prompt: jax.Array
  completion: jax.Array
  attention_mask: jax.Array  # int32, every real completion token
  loss_mask: jax.Array  # float32, the agent's tokens
  pad_id: int
  eos_id: int
  temperature: float | None  # `PpoExtConfig.logps_temperature` (None: tunix's convention)

  @functools.cached_property
  def tunix_mask(self) -> bool:
    """Whether the attention mask is what tunix derives (`completion != pad_id`)."""
    derived = (self.completion != self.pad_id).astype(jnp.int32)
    return bool(jnp.array_equal(derived, self.attention_mask))

  @property
  def passes(self) -> dict[str, Any]:
    """Keywords of the `passes` model passes (the attention mask, never the loss mask)."""
    return {"pad_id": self.pad_id, "eos_id": self.eos_id, "attention_mask": self.attention_mask}


class RolePasses:
  """Old and reference log-probs, values and reward-model scores of one cluster.

  Every result is replicated on the actor's mesh, where the learner combines them (the
  roles' meshes may hold different devices).
  """

  def __init__(
    self,
    cluster: rl_cluster_lib.RLCluster,
    micro_batch_size: int | None,
    fused_head: bool = False,
    chunk_size: int = 0,
    packing: bool = False,
  ):
    self.cluster = cluster
    self.micro_batch_size = micro_batch_size
    self.packing = packing  # every pass on packed rows (`math.packing`): never tunix's own
    # the log-prob passes' head: fused (`chunk_size` positions of logits at a time) or not
    self.head = {"fused_head": fused_head, "chunk_size": chunk_size if fused_head else 0}
    # Several hosts: every pass keeps this host's rows. (tunix 0.1.7's reference pass
    # shards its inputs into the global batch, which its PPO learner then mixes with
    # host-local log-probs; so the reference takes the mask-aware path there.)
    self.multi_process = jax.process_count() > 1
    # each distinct prompt of a micro-batch run once where rows share it (one host, no packing)
    self.share_prompts = not packing and not self.multi_process
    meshes = cluster.cluster_config.role_to_mesh
    actor_mesh = meshes[Role.ACTOR]
    separate = any(mesh != actor_mesh for mesh in meshes.values())
    self._home = None  # one shared mesh (or tunix's empty default mesh): nothing to move
    if separate and not actor_mesh.empty and not self.multi_process:
      self._home = jax.sharding.NamedSharding(actor_mesh, jax.sharding.PartitionSpec())

  def _at_home(self, x: jax.Array) -> jax.Array:
    return x if self._home is None else jax.device_put(x, self._home)

  def _train_temperature(self) -> float:
    temperature = self.cluster.get_rollout_config(rl_cluster_lib.Mode.TRAIN).temperature
    return float(temperature) if temperature else 1.0

  def old_logps(self, inputs: ModelInputs) -> jax.Array:
    """log pi_old(a_t) `[B, T]` of the rollout policy (the model the engine samples from)."""
    cluster = self.cluster
    model = cluster.rollout.model()
    stock = inputs.temperature in (None, 1.0) and inputs.tunix_mask
    if stock and not self._own_passes(inputs, model, Role.ROLLOUT):
      return self._at_home(
        cluster.get_old_per_token_logps(
          inputs.prompt, inputs.completion, micro_batch_size=self.micro_batch_size
        )
      )
    with compat.on_role(cluster, Role.ROLLOUT, model):
      return self._at_home(
        self._chunked(
          inputs,
          Role.ROLLOUT,
          lambda *chunk: self._logps(model, inputs, *chunk, temperature=inputs.temperature),
        )
      )

  def ref_logps(self, inputs: ModelInputs) -> jax.Array:
    """log pi_ref(a_t) `[B, T]` of the reference model."""
    cluster, tunix_temperature = self.cluster, self._train_temperature()
    temperature = tunix_temperature if inputs.temperature is None else inputs.temperature
    stock = temperature == tunix_temperature and inputs.tunix_mask  # tunix's pass uses it
    model = cluster.inference_worker.get_model("reference")
    stock = stock and not self._own_passes(inputs, model, Role.REFERENCE)
    if stock and not self.multi_process:
      return self._at_home(
        cluster.get_ref_per_token_logps(
          inputs.prompt,
          inputs.completion,
          inputs.pad_id,
          inputs.eos_id,
          micro_batch_size=self.micro_batch_size,
        )
      )
    with compat.on_role(cluster, Role.REFERENCE, model):
      return self._at_home(
        self._chunked(
          inputs,
          Role.REFERENCE,
          lambda *chunk: self._logps(model, inputs, *chunk, temperature=temperature),
          shard=True,
        )
      )

  def values(self, inputs: ModelInputs) -> jax.Array:
    """Critic values `[B, P+T]`."""
    model = self.cluster.critic_trainer.model
    if inputs.tunix_mask and not self._own_passes(inputs, model, Role.CRITIC):
      return self._stock_scores(inputs, Role.CRITIC, model, self.cluster.get_values)
    return self._at_home(self._scores(inputs, Role.CRITIC, model))

  def rewards(self, inputs: ModelInputs) -> jax.Array:
    """Reward-model scores `[B, P+T]`."""
    model = self.cluster.inference_worker.get_model("reward")
    if inputs.tunix_mask and not self._own_passes(inputs, model, Role.REWARD):
      return self._stock_scores(inputs, Role.REWARD, model, self.cluster.get_rewards)
    return self._at_home(self._scores(inputs, Role.REWARD, model))

  def kl_inputs(self, inputs: ModelInputs, role: Any) -> Any:
    """What the exact KL (`passes.exact_kl`) takes of the rollout policy or the reference:
    completion logits `[B, T, V]`, or with the fused head `(hidden [B, T, D], weight
    [D, V])` (no `[B, T, V]` logits)."""
    cluster = self.cluster
    if role == Role.ROLLOUT:
      model = cluster.rollout.model()
    else:
      model = cluster.inference_worker.get_model("reference")
    kw = {"pad_id": inputs.pad_id, "eos_id": inputs.eos_id}
    head_pass = passes.compute_completion_logits
    if self.head["fused_head"]:
      head_pass = passes.compute_completion_hidden
    with compat.on_role(cluster, role, model):
      out = self._at_home(
        self._chunked(
          inputs,
          role,
          lambda p, c, m, packing: head_pass(model, p, c, attention_mask=m, packing=packing, **kw),
        )
      )
      if not self.head["fused_head"]:
        return out
      return out, self._at_home(passes.head_weight(model, out.dtype))

  def _stock_scores(self, inputs: ModelInputs, role: Any, model: Any, tunix_pass: Callable):
    """tunix's `get_values` / `get_rewards`, with the model loaded from host memory first.

    tunix 0.1.7 offloads the critic and reward model at start-up with `offload_to_cpu` but
    its two score passes never load them back, so stock `PPOLearner` fails there on a GPU
    (gather across memory spaces); `on_role` loads and offloads as tunix's other passes do.
    """
    with compat.on_role(self.cluster, role, model):
      scores = tunix_pass(inputs.prompt, inputs.completion, inputs.pad_id, inputs.eos_id)
    return self._at_home(scores)

  def _own_passes(self, inputs: ModelInputs, model: Any, role: Any) -> bool:
    """Whether `model`'s pass on `inputs` in `role` is this package's: tunix's have no fused
    head, no packing and no shared prompts (`_shares`)."""
    return self.head["fused_head"] or self.packing or self._shares(inputs, model, role)

  def _shares(self, inputs: ModelInputs, model: Any, role: Any) -> bool:
    """Whether `model` (it takes a KV cache, `compat.kv_cache_dtype`) runs a shared prompt
    once in some micro-batch of `inputs` (`_layout`, as the pass will); never where the
    cluster's method for `role` is a subclass's own (`_users_pass`)."""
    if not self.share_prompts or self._users_pass(role) or compat.kv_cache_dtype(model) is None:
      return False
    size = inputs.prompt.shape[0]
    chunks = rl_utils.chunk_slices_by_size(stop=size, step=self.micro_batch_size or size)
    prompt = np.asarray(inputs.prompt)
    return any(self._layout(prompt[piece], None, inputs.pad_id, role) for piece in chunks)

  def _users_pass(self, role: Any) -> bool:
    """Whether the cluster's method for `role`'s pass is a subclass's own, not tunix's."""
    name = CLUSTER_PASSES[role]
    return getattr(type(self.cluster), name) is not getattr(rl_cluster_lib.RLCluster, name)

  def _layout(self, prompt: Any, mask: Any, pad_id: int, role: Any) -> Any:
    """One chunk's rows' layout in `role`'s pass: packed (`model.packing`), each distinct
    prompt once (`passes.SharedPrompts`, as many as a multiple of the role's devices, which
    split them), or None: padded."""
    if self.packing:
      return passes.packing_of(prompt, mask, pad_id)
    if not self.share_prompts:
      return None
    mesh = self.cluster.cluster_config.role_to_mesh[role]
    groups = plan_shared_prompts(np.asarray(prompt), None, 1 if mesh.empty else mesh.size)
    return None if groups is None else passes.SharedPrompts(jnp.asarray(groups))

  def _scores(self, inputs: ModelInputs, role: Any, model: Any) -> jax.Array:
    packing = self._layout(inputs.prompt, inputs.attention_mask, inputs.pad_id, role)
    with compat.on_role(self.cluster, role, model):
      return passes.compute_score(
        model, inputs.prompt, inputs.completion, packing=packing, **inputs.passes
      )

  def _logps(
    self, model: Any, inputs: ModelInputs, prompt, completion, mask, packing, *, temperature
  ) -> jax.Array:
    return passes.compute_per_token_logps(
      model,
      prompt,
      completion,
      pad_id=inputs.pad_id,
      eos_id=inputs.eos_id,
      attention_mask=mask,
      temperature=temperature or 1.0,
      packing=packing,
      **self.head,
    )

  def _chunked(
    self, inputs: ModelInputs, role: Any, fn: Callable, shard: bool = False
  ) -> jax.Array:
    """`fn(prompt, completion, attention_mask, layout)` over micro-batches, concatenated
    (`layout` each chunk's own in `role`'s pass, `_layout`); with `shard`, the inputs on
    the data axis first."""
    arrays = (inputs.prompt, inputs.completion, inputs.attention_mask)
    if shard and not self.multi_process:  # as tunix's reference pass: on the data axis
      axis = self.cluster.cluster_config.training_config.data_sharding_axis
      arrays = tuple(sharding_utils.shard_input(a, axis) for a in arrays)
    size = arrays[0].shape[0]
    outs = []
    for piece in rl_utils.chunk_slices_by_size(stop=size, step=self.micro_batch_size or size):
      prompt, completion, mask = (a[piece] for a in arrays)
      outs.append(fn(prompt, completion, mask, self._layout(prompt, mask, inputs.pad_id, role)))
    return jnp.concatenate(outs, axis=0)
