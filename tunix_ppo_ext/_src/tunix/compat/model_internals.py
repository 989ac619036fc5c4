"""tunix's transformers (`tunix.models.{qwen3,qwen2,llama3,gemma3}.model`): their RoPE, their
activation sharding and their LM head.

What tunix 0.1.7 offers no public way to do, each with its reason:

- `qwen3_activation_sharding`: tunix's `qwen3.shard()` skips its activation sharding
  constraints whenever `jax.devices()[0]` is a CPU, always the case when `plan` compiles for
  a TPU topology from a host without one: the module function is replaced while a piece is
  traced, under a lock.
- `use_rope_frequencies`: tunix 0.1.7's Llama 3 and Qwen3 `Attention.block` call their
  module's `apply_rope` without the config's `rope_theta`, so it is always 1e6, and know no
  RoPE scaling: each attention layer of a loaded model is made a subclass whose `block` runs
  tunix's own with that module's `apply_rope` replaced, under a lock, by a rotation with the
  inverse frequencies the config carries, `rope_inv_freq`.
- `use_blockwise_attention`: tunix's Qwen3 `Attention.block` forms `[T, T]` scores unless
  its TPU-only splash kernel is on (`model.attention: blockwise`): each attention layer is
  made a subclass whose `block`, on a pass without KV cache that carries segment ids (the
  trainers' and log-prob passes), projects, normalises and rotates as tunix's does (its
  `q_proj`, `k_proj`, `v_proj`, `q_norm`, `k_norm`, `o_proj`, `scale`, `head_dim`, and
  `rope`: the config's frequencies as the RoPE subclass above rotates, else the module's
  `apply_rope`) and attends with `ops.segment_attention`; with a cache (the sampler) it is
  tunix's own.
- `qwen2_rope_tables`: the sin/cos tables tunix's Qwen2 computes once per forward pass and
  hands to every layer; a value model runs those layers without the logits,
  `models.backbone_hidden_states`.
- `final_hidden_states`, `head_weight`: the fused LM head, `model.fused_head`. tunix 0.1.7's
  transformers offer no call that stops before the head, so `__call__` runs with its head
  module made, for that call only, a subclass that hands back its input: the final-norm
  hidden states; on tunix main, which has `skip_lm_head=`, that public keyword is used. The
  head's weight is the untied `lm_head.w` `[D, V]` or the tied `embedder.input_embedding`
  `[V, D]`; `PINNED_HEADS` and tests/tunix/learner/test_fused_head.py.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from tunix.models.gemma3 import model as gemma3_model
from tunix.models.llama3 import model as llama3_model
from tunix.models.qwen2 import model as qwen2_model
from tunix.models.qwen3 import model as qwen3_model

from tunix_ppo_ext._src.config.run_sections import FUSED_HEAD_KEY
from tunix_ppo_ext._src.ops.attention import segment_attention

PINNED: dict[str, tuple[Any, tuple[str, ...]]] = {
  # object the names live on -> (the object, private names used here)
  # `shard`, and the module globals `Attention.block` looks up at trace time (`apply_rope`,
  # replaced by use_rope_frequencies) and the class it subclasses
  "tunix.models.qwen3.model": (qwen3_model, ("shard", "apply_rope", "Attention")),
  "tunix.models.qwen2.model": (qwen2_model, ("_generate_pos_embeddings",)),
  "tunix.models.llama3.model": (llama3_model, ("apply_rope", "Attention")),
}
# Instance attributes set in constructors: none here.
PINNED_INSTANCE_ATTRIBUTES: dict[str, tuple[str, ...]] = {}


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


_BLOCKWISE_CLASSES: dict[tuple[type, int], type] = {}


def rope(attention: Any, module: Any, inputs: Any, positions: Any) -> Any:
  """`inputs` rotated as the layer `attention` (of tunix family `module`) rotates them in
  its own `block`: by its config's `rope_inv_freq` where it has them (what
  `use_rope_frequencies` makes `block` do), else by `module.apply_rope`'s default theta."""
  inv_freq = getattr(attention.config, "rope_inv_freq", None)
  if inv_freq is not None:
    return rotate(inputs, positions, inv_freq)
  return module.apply_rope(inputs, positions, head_dim=attention.head_dim)


def _blockwise_block(base: type, block_size: int) -> Callable[..., Any]:
  """`base.block`, except that a pass without cache and with segment ids attends blockwise."""

  def block(self: Any, x: Any, segment_pos: Any, cache: Any, attn_mask: Any, segment_ids=None):
    if cache is not None or segment_ids is None or x.shape[1] == 1:
      return base.block(self, x, segment_pos, cache, attn_mask, segment_ids=segment_ids)
    query = rope(self, qwen3_model, self.q_norm(self.q_proj(x)), segment_pos)
    key = rope(self, qwen3_model, self.k_norm(self.k_proj(x)), segment_pos)
    out = segment_attention(
      query, key, self.v_proj(x), segment_ids, block_size=block_size, scale=self.scale
    )
    return None, self.o_proj(out)

  return block


def _blockwise_class(base: type, block_size: int) -> type:
  """The subclass of `base` (tunix's Qwen3 `Attention`, or its RoPE subclass) attending in
  blocks of `block_size` keys (defined in the class itself, as `_rope_class`)."""
  if (base, block_size) not in _BLOCKWISE_CLASSES:
    body = {"block": _blockwise_block(base, block_size), "__module__": __name__}
    name = f"Blockwise{block_size}{base.__name__}"
    _BLOCKWISE_CLASSES[base, block_size] = type(base)(name, (base,), body)
  return _BLOCKWISE_CLASSES[base, block_size]


def use_blockwise_attention(model: Any, block_size: int) -> int:
  """Makes every tunix Qwen3 attention layer in `model` (a policy, or a value model around
  one) attend blockwise on its cache-free passes; returns how many layers it changed (0:
  none is a Qwen3 layer, or each is already blockwise)."""
  changed = 0
  for _, module in nnx.iter_graph(model):
    kind = type(module)
    if isinstance(module, qwen3_model.Attention) and kind not in _BLOCKWISE_CLASSES.values():
      module.__class__ = _blockwise_class(kind, block_size)
      changed += 1
  return changed


def qwen2_rope_tables(positions: Any, head_dim: int, rope_theta: float) -> tuple[Any, Any]:
  """tunix's Qwen2 rotary `(sin, cos)` tables `[B, L, head_dim // 2]` for positions `[B, L]`."""
  return qwen2_model._generate_pos_embeddings(positions, head_dim, rope_theta)


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


def final_hidden_states(
  model: Any, *args: Any, keep_cache: bool = False, adapters_ok: bool = False, **kwargs: Any
) -> Any:
  """`model(*args, **kwargs)`'s final-norm hidden states `[B, L, D]`, the input of its LM
  head, in the model's dtype; no logits are computed (what the model then returns in their
  place is its hidden states again, unused). The call is tunix's own `__call__`, so qwix's
  LoRA interception, remat and the RoPE override (`use_rope_frequencies`) all apply. With
  `keep_cache`, `(hidden, the KV cache the model returns)`; `adapters_ok`: a head carrying
  LoRA adapters is no error (the caller applies the head itself, `lm_head`)."""
  module, method, _, _ = _head(model, adapters_ok)
  if "skip_lm_head" in inspect.signature(_family(model).__call__).parameters:  # tunix main
    out = model(*args, skip_lm_head=True, **kwargs)
    return (out[0], out[1]) if keep_cache else out[0]
  original = type(module)
  with _HEAD_LOCK:
    module.__class__ = _pass_through_class(original, method)
    _CAPTURED.hidden = None
    try:
      out = model(*args, **kwargs)
      hidden = _CAPTURED.hidden
    finally:
      module.__class__ = original
      _CAPTURED.hidden = None
  if hidden is None:
    raise ValueError(f"{FUSED_HEAD_KEY}: {type(model).__name__}.__call__ never called its head")
  return (hidden, out[1]) if keep_cache else hidden


# The families whose attention, given a KV cache, writes the keys and values of the tokens
# it is fed at the cache's next slot and attends over every slot its mask allows (tunix's
# sampler relies on it for them too).
CACHE_FAMILIES = (qwen2_model.Qwen2, qwen3_model.Qwen3, llama3_model.Llama3)


def kv_cache_dtype(model: Any) -> Any:
  """The dtype of the keys and values `model` writes into a KV cache: its config's compute
  `dtype` where it has one (the projections cast to it; what tunix's sampler builds its
  cache in), else its input embedding's (Llama 3 computes in its weights' dtype, and
  adapted projections return their inputs'). None when the model is not of a
  `CACHE_FAMILIES` family, takes splash attention (no cache) or attends blockwise
  (`use_blockwise_attention`: a cache pass would hold the dense scores it avoids). A value
  model (`models.ValueModel`, which takes a cache as tunix's transformers do) is judged
  by its `backbone`."""
  family = getattr(model, "backbone", model)
  config = getattr(family, "config", None)
  if not isinstance(family, CACHE_FAMILIES) or getattr(config, "use_flash_attention", False):
    return None
  blockwise = tuple(_BLOCKWISE_CLASSES.values())
  if any(isinstance(module, blockwise) for _, module in nnx.iter_graph(family)):
    return None
  dtype = getattr(config, "dtype", None)
  return dtype if dtype is not None else family.embedder.input_embedding[...].dtype


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
