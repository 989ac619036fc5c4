"""Toy-size tunix Qwen3 policies and a value model (critic / reward model) on any family's backbone.

Everything here is tunix's real model code (`tunix.models.qwen3.model`) at a size that
trains in seconds on CPU; only the scalar value head is ours.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from tunix.models.gemma3 import model as gemma3
from tunix.models.llama3 import model as llama3
from tunix.models.qwen2 import model as qwen2
from tunix.models.qwen3 import model as qwen3

from tunix_ppo_ext._src.config.run_sections import VALUE_HEAD_INITS
from tunix_ppo_ext._src.tunix import compat


def tiny_qwen3_config(
  vocab_size: int,
  num_layers: int = 2,
  embed_dim: int = 64,
  hidden_dim: int = 128,
  num_heads: int = 4,
  head_dim: int = 16,
  num_kv_heads: int = 2,
  rope_theta: int = 10_000,
  norm_eps: float = 1e-6,
  use_tied_embedding: bool = False,
) -> qwen3.ModelConfig:
  """A float32 `qwen3.ModelConfig` at toy size (default sharding axes `fsdp`/`tp`).

  Args:
    vocab_size: the vocabulary size (the tokenizer's).
    num_layers: decoder layers.
    embed_dim: the model width.
    hidden_dim: the MLP's hidden width.
    num_heads: query heads.
    head_dim: the width of each head.
    num_kv_heads: key/value heads (grouped-query attention), dividing `num_heads`.
    rope_theta: the rotary embedding's base.
    norm_eps: the RMS norms' epsilon.
    use_tied_embedding: share the embedding with the LM head (no `lm_head`).

  Returns:
    The `qwen3.ModelConfig`.
  """
  return qwen3.ModelConfig(
    num_layers=num_layers,
    vocab_size=vocab_size,
    embed_dim=embed_dim,
    hidden_dim=hidden_dim,
    num_heads=num_heads,
    head_dim=head_dim,
    num_kv_heads=num_kv_heads,
    rope_theta=rope_theta,
    norm_eps=norm_eps,
    use_tied_embedding=use_tied_embedding,
    dtype=jnp.float32,
    param_dtype=jnp.float32,
  )


def qwen3_config_names() -> list[str]:
  """The named sizes of tunix's Qwen3 (`qwen3_0p6b`, `qwen3_1p7b`, ...)."""
  return sorted(n for n in vars(qwen3.ModelConfig) if n.startswith("qwen3_"))


def named_qwen3_config(name: str) -> qwen3.ModelConfig:
  """tunix's `qwen3.ModelConfig.<name>()`, one of `qwen3_config_names()`."""
  return getattr(qwen3.ModelConfig, name)()


def make_policy(config: qwen3.ModelConfig, seed: int = 0) -> qwen3.Qwen3:
  """Randomly initialised tunix `Qwen3`; the same `(config, seed)` gives identical weights.

  Args:
    config: the model config (e.g. `tiny_qwen3_config`).
    seed: the initialisation seed.

  Returns:
    The `Qwen3` model.
  """
  return qwen3.Qwen3(config, rngs=nnx.Rngs(seed))


def abstract_model(config: Any, model_class: type = qwen3.Qwen3) -> nnx.Module:
  """`model_class(config)` with shapes and no weights (`nnx.eval_shape`): its module tree."""
  return nnx.eval_shape(lambda: model_class(config, rngs=nnx.Rngs(0)))


def causal_mask(batch: int, length: int) -> jax.Array:
  """`[B, L, L]` boolean lower-triangular attention mask (no padding)."""
  return jnp.broadcast_to(jnp.tril(jnp.ones((length, length), jnp.bool_)), (batch, length, length))


class ValueModel(nnx.Module):
  """A tunix transformer's backbone (embedder, decoder layers, final norm) plus a
  `Linear(embed_dim, 1)` head: the critic / reward model for any family in `BACKBONE_FAMILIES`.

  Called like a tunix transformer, it returns per-token scores `[B, L, 1]` (float32), the
  shape `tunix.rl.common.compute_score` expects. The backbone carries no `lm_head`. The
  head's kernel starts `normal` (stddev `1 / sqrt(embed_dim + 1)`) or `zero` (`head_init`);
  its bias at 0.
  """

  def __init__(
    self,
    backbone: nnx.Module,
    *,
    rngs: nnx.Rngs,
    trainable_head: bool = False,
    head_init: str = "normal",
  ):
    if hasattr(backbone, "lm_head"):
      raise ValueError("ValueModel's backbone must have no lm_head (see critic_from_policy)")
    self.config = backbone.config
    self.backbone = backbone
    embed_dim = backbone.config.embed_dim
    if head_init not in VALUE_HEAD_INITS:
      raise ValueError(f"head_init={head_init!r} is not one of {VALUE_HEAD_INITS}")
    kernel_init = nnx.initializers.normal(stddev=1.0 / math.sqrt(embed_dim + 1))
    if head_init == "zero":
      kernel_init = nnx.initializers.zeros_init()
    self.value_head = nnx.Linear(
      embed_dim,
      1,
      kernel_init=kernel_init,
      bias_init=nnx.initializers.zeros_init(),
      param_dtype=jnp.float32,
      # on fsdp, where XLA leaves it after an update; declared replicated (or not at all),
      # the critic's train step compiled a second time at step 2 on a multi-device mesh
      kernel_metadata={"sharding": ("fsdp", None)},
      bias_metadata={"sharding": (None,)},
      rngs=rngs,
    )
    if trainable_head:  # next to frozen LoRA-adapted weights: trained as the adapters are
      for name in ("kernel", "bias"):  # an `nnx.LoRAParam`: what a LoRA trainer trains
        weight = getattr(self.value_head, name)
        setattr(self.value_head, name, nnx.LoRAParam(weight[...], **weight.get_metadata()))

  def hidden_states(
    self,
    input_tokens: jax.Array,
    positions: jax.Array,
    attention_mask: jax.Array,
    segment_ids: jax.Array | None = None,
  ) -> jax.Array:
    """Final-norm hidden states `[B, L, embed_dim]` of the backbone (no KV cache)."""
    return backbone_hidden_states(
      self.backbone, input_tokens, positions, attention_mask, segment_ids
    )

  def __call__(
    self,
    input_tokens: jax.Array,
    positions: jax.Array,
    cache: Any = None,
    attention_mask: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    **_,
  ) -> jax.Array | tuple[jax.Array, Any]:
    """Scores `[B, L, 1]` for tokens `[B, L]`; a missing mask means causal, unpadded. With a
    KV `cache` (as tunix's transformers take one; not for Gemma 3), `(scores, the cache
    with these tokens' keys and values written)`: the shared-prompt training pass runs a
    prompt once and its rows' completions through its cache."""
    if attention_mask is None:
      attention_mask = causal_mask(*input_tokens.shape)
    if cache is not None:
      hidden, cache = backbone_hidden_states(
        self.backbone, input_tokens, positions, attention_mask, cache=cache
      )
      return self.value_head(hidden.astype(jnp.float32)), cache
    hidden = self.hidden_states(input_tokens, positions, attention_mask, segment_ids)
    return self.value_head(hidden.astype(jnp.float32))


def backbone_hidden_states(
  model: nnx.Module,
  tokens: jax.Array,
  positions: jax.Array,
  attention_mask: jax.Array,
  segment_ids: jax.Array | None = None,
  cache: Any = None,
) -> jax.Array | tuple[jax.Array, Any]:
  """`[B, L, embed_dim]` final-norm hidden states of a tunix Qwen2 / Qwen3 / Llama 3 /
  Gemma 3 transformer for tokens `[B, L]`, positions `[B, L]`, mask `[B, L, L]` (`[B, L,
  S]` with a cache): its own embedder, layers and final norm, called as its `__call__`
  calls them (no logits). With a KV `cache` (Qwen2, Qwen3, Llama 3: `compat.layer_caches`)
  each layer writes its keys and values there: `(hidden, the new cache)`."""
  x = model.embedder.encode(tokens)
  if cache is not None and isinstance(model, gemma3.Gemma3):
    raise TypeError("Gemma 3's value model takes no KV cache")
  layers = compat.layer_caches(cache, len(model.layers))
  if isinstance(model, qwen2.Qwen2):  # rotary tables made once by the model, not per layer
    sin, cos = compat.qwen2_rope_tables(positions, model.config.head_dim, model.config.rope_theta)
    sin, cos = sin.astype(x.dtype), cos.astype(x.dtype)
    for i, layer in enumerate(model.layers):
      layers[i], x = layer(x, layers[i], attention_mask, sin, cos, segment_ids=segment_ids)
  elif isinstance(model, qwen3.Qwen3):
    for i, layer in enumerate(model.layers):
      layers[i], x = layer(x, positions, layers[i], attention_mask, segment_ids=segment_ids)
  elif isinstance(model, BACKBONE_FAMILIES):
    for i, layer in enumerate(model.layers):
      layers[i], x = layer(x, positions, layers[i], attention_mask)
  else:
    raise TypeError(f"no value model for {type(model).__name__}: use one of {BACKBONE_FAMILIES}")
  hidden = model.final_norm(x)
  return hidden if cache is None else (hidden, compat.cache_of_layers(layers))


BACKBONE_FAMILIES = (qwen2.Qwen2, qwen3.Qwen3, llama3.Llama3, gemma3.Gemma3)


def make_critic(config: qwen3.ModelConfig, seed: int = 0) -> ValueModel:
  """Randomly initialised `ValueModel` with a Qwen3 backbone for a policy `config` (the
  backbone built with tied embeddings, so it has no `lm_head`).

  Args:
    config: the policy's model config.
    seed: the initialisation seed.

  Returns:
    The `ValueModel`, output `[B, L, 1]`.
  """
  rngs = nnx.Rngs(seed)
  backbone = qwen3.Qwen3(dataclasses.replace(config, use_tied_embedding=True), rngs=rngs)
  return ValueModel(backbone, rngs=rngs)


def critic_from_policy(
  policy: nnx.Module,
  seed: int = 0,
  share_weights: bool = False,
  trainable_head: bool = False,
  head_init: str = "normal",
) -> ValueModel:
  """`ValueModel` whose backbone is a copy of `policy`'s (embedder, layers, final norm), for
  any family in `BACKBONE_FAMILIES`; the copy keeps each array's sharding, so a sharded
  policy gives a sharded critic. Only the value head is new (from `seed`); the policy's
  `lm_head`, if any, is not copied. `share_weights`: the backbone holds the policy's own
  arrays instead of copies (for a critic that trains only adapters, `role_models.lora_roles`), and
  `trainable_head` makes the head `LoRAParam`s, what a LoRA-enabled tunix trainer trains;
  `head_init` is `ValueModel`'s.

  Args:
    policy: the policy model whose backbone is copied (or shared).
    seed: seeds the value head.
    share_weights: share the policy's backbone arrays instead of copying them.
    trainable_head: make the value head's weights `LoRAParam`s.
    head_init: the value head's initialisation, `"normal"` or `"zero"`.

  Returns:
    The `ValueModel`.
  """
  backbone = nnx.clone(policy) if share_weights else copy_model(policy)
  if hasattr(backbone, "lm_head"):
    del backbone.lm_head
  # the head's key is the one `make_critic(config, seed)` draws after initialising its
  # backbone (one draw per parameter), so a Qwen3 critic starts as it always did
  rngs = nnx.Rngs(seed)
  rngs.default.count[...] = len(jax.tree.leaves(nnx.state(backbone, nnx.Param)))
  return ValueModel(backbone, rngs=rngs, trainable_head=trainable_head, head_init=head_init)


def copy_model(model: nnx.Module) -> nnx.Module:
  """An independent copy of `model` (same graph, params copied), e.g. a frozen reference."""
  graphdef, state = nnx.split(model)
  return nnx.merge(graphdef, jax.tree.map(jnp.copy, state))


def with_critic_and_reference(policy: nnx.Module, seed: int = 0, head_init: str = "normal"):
  """`(policy, critic, reference)`: the critic's backbone initialised from the policy (common
  PPO practice, seed `seed + 1` for its head, `head_init` as `ValueModel`'s) and the
  reference a copy of the policy."""
  return policy, critic_from_policy(policy, seed + 1, head_init=head_init), copy_model(policy)
