"""Mask-aware replacements for tunix's `rl/common.py` model passes.

A trajectory carries two masks over its completion tokens, never mixed up:
- the attention mask (`attention_mask`): 1 on every real completion token, agent and
  environment alike; it decides attention and positions;
- the loss mask: 1 on the agent's own tokens only; it never reaches these functions.

With `attention_mask=None` every function reproduces tunix 0.1.7's `rl/common.py` (the mask is
derived as `completion_tokens != pad_id`). The passes only read the model, so they use
`nnx.jit` in tree mode (`graph=False`): the model is a plain pytree, which skips the graph
protocol's per-call flatten (half the call overhead of a toy-size pass on CPU); tree mode
does not accept a model whose `Variable`s are shared between submodules.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from tunix.rl import common as tunix_common

from tunix_ppo_ext._src.ops.logits import (
  full_kl_divergence,
  fused_full_kl_divergence,
  fused_logps_and_entropy,
  logps_and_entropy,
)
from tunix_ppo_ext._src.ops.packing import (
  Packing,
  packed_model_inputs,
  plan_rows,
  unpack,
)
from tunix_ppo_ext._src.tunix import compat


@functools.partial(jax.jit, static_argnames=("pad_id", "eos_id"))
def process_ids(
  prompt_tokens: jax.Array,
  completion_tokens: jax.Array,
  pad_id: int,
  eos_id: int,
  segment_ids: jax.Array | None = None,
  segment_positions: jax.Array | None = None,
  *,
  completion_mask: jax.Array | None = None,
  attention_mask: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array | None]:
  """tunix's `rl.common.process_ids` (same signature, same outputs), with a given mask.

  Builds the model inputs for `[B, P]` prompts and `[B, T]` completions.

  Args:
    prompt_tokens: `[B, P]` int prompt ids, left-padded with `pad_id`.
    completion_tokens: `[B, T]` int completion ids, right-padded with `pad_id`.
    pad_id: the padding token's id.
    eos_id: the end-of-sequence token's id.
    segment_ids: tunix's packed-sequence input; with it the call is tunix's own (no mask
      is derived; a mask given beside it is refused).
    segment_positions: tunix's packed-sequence positions, likewise.
    completion_mask: optional `[B, T]` mask over the completion, 1 for every real token
      (agent and observation tokens alike): the attention mask. This is the seed's (and
      GRL's) name; `attention_mask` is the same argument under this package's name. Used
      as is (ValueError unless shaped as `completion_tokens`); `None` derives
      `completion_tokens != pad_id` as tunix does.
    attention_mask: the same as `completion_mask` (give one of them, not both).

  Returns:
    `(input_ids [B, P+T], positions [B, P+T], causal_mask [B, P+T, P+T],
    real_token_mask [B, P+T] int32)`; the last is what tunix passes as `segment_ids`.
  """
  if completion_mask is not None and attention_mask is not None:
    raise ValueError("process_ids: give completion_mask or attention_mask (the same), not both")
  mask = attention_mask if completion_mask is None else completion_mask
  name = "attention_mask" if completion_mask is None else "completion_mask"
  if segment_ids is not None:
    if mask is not None:
      raise ValueError(
        f"process_ids: {name} is not used with segment_ids (tunix's packed path derives "
        "its own mask): give one or the other"
      )
    return tunix_common.process_ids(
      prompt_tokens, completion_tokens, pad_id, eos_id, segment_ids, segment_positions
    )
  if mask is not None and tuple(jnp.shape(mask)) != tuple(jnp.shape(completion_tokens)):
    raise ValueError(
      f"process_ids: {name} has shape {tuple(jnp.shape(mask))}, the completion_tokens "
      f"{tuple(jnp.shape(completion_tokens))}: one mask entry per completion token"
    )
  del eos_id  # Kept for tunix's signature; the mask is never derived from EOS tokens.
  input_ids = jnp.concatenate([prompt_tokens, completion_tokens], axis=1)
  if mask is None:
    mask = completion_tokens != pad_id
  real = jnp.concatenate([prompt_tokens != pad_id, mask.astype(jnp.bool_)], axis=-1)
  positions = tunix_common.build_positions_from_mask(real)
  causal_mask = tunix_common.make_causal_attn_mask(real)
  return input_ids, positions, causal_mask, real.astype(jnp.int32)


def packing_of(prompt_tokens: Any, attention_mask: Any, pad_id: int) -> Packing:
  """The `Packing` of one chunk (`plan_rows`), for a pass over it."""
  slots, _, k, rows = plan_rows(prompt_tokens, attention_mask, pad_id)
  return Packing(jnp.asarray(slots), rows, k * slots.shape[1])


def _accepts_segment_ids(model: nnx.Module) -> bool:
  """Whether the model's `__call__` takes `segment_ids`, as tunix checks: a wrapper's
  backbone (`model.transformer`: tunix's `TransformerWithScoreHead`, whose `**kwargs` go to
  it) decides, so a critic over a backbone without them (Gemma3) gets none."""
  target = getattr(model, "transformer", model)
  try:
    params = inspect.signature(target.__call__).parameters
  except (TypeError, ValueError):
    return False
  return "segment_ids" in params or any(
    p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()
  )


@functools.partial(jax.tree_util.register_dataclass, data_fields=["groups"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class SharedPrompts:
  """A pass's rows by the prompt they hold (`math.shared_prompts`): `groups` `[B, U]` one-hot,
  row b holds distinct prompt u (`U`, its shape, is static). Given as a pass's `packing`,
  it runs each distinct prompt once (`_shared_prompt_forward`)."""

  groups: jax.Array


def _shared_prompt_forward(
  model: nnx.Module, inputs: tuple[jax.Array, ...], groups: jax.Array, width: int, hidden: bool
) -> jax.Array | None:
  """The model's output `[B, P+T, ...]` on `inputs` `(input_ids, positions, causal_mask)`
  (`process_ids`'), with the prompt (the first `width` positions) of each distinct prompt
  run once (`groups` `[B, U]`, `SharedPrompts`): the U prompts write their keys and values
  into a KV cache (`compat.empty_kv_cache`), whose rows each row's completion attends
  through, as a continued turn attends through the sampler's. The prompts' outputs are
  the same in every row that holds them (they attend to the prompt only). None when the
  model takes no such cache (`compat.kv_cache_dtype`): the caller runs the padded pass."""
  dtype = compat.kv_cache_dtype(model)
  if dtype is None:
    return None
  input_ids, positions, mask = inputs
  first, rows = jnp.argmax(groups, axis=0), jnp.argmax(groups, axis=1)  # [U], [B]
  cache = compat.empty_kv_cache(model.config, first.shape[0], input_ids.shape[1], dtype)

  def run(ids: jax.Array, at: jax.Array, attend: jax.Array, kv: Any) -> tuple[Any, Any]:
    kwargs = {"positions": at, "cache": kv, "attention_mask": attend}
    if hidden:
      return compat.final_hidden_states(model, ids, keep_cache=True, **kwargs)
    return model(ids, **kwargs)

  prompt = (input_ids[first, :width], positions[first, :width], mask[first, :width])
  prompt_out, cache = run(*prompt, cache)
  completion = (input_ids[:, width:], positions[:, width:], mask[:, width:])
  completion_out, _ = run(*completion, compat.kv_rows(cache, rows))
  return jnp.concatenate([prompt_out[rows], completion_out], axis=1)


def _forward(
  model: nnx.Module,
  prompt_tokens: jax.Array,
  completion_tokens: jax.Array,
  pad_id: int,
  eos_id: int,
  attention_mask: jax.Array | None,
  hidden: bool = False,
  packing: Packing | SharedPrompts | None = None,
) -> jax.Array:
  """One model pass over prompt + completion; returns the model's first output `[B, P+T, ...]`
  (with `hidden`, its final-norm hidden states `[B, P+T, D]` instead: no LM head runs).
  `packing`, the rows' layout: a `Packing` runs the model on the packed rows
  (`math.packing`), its output back in the padded layout (zeros at padding); a
  `SharedPrompts` runs each distinct prompt once (`_shared_prompt_forward`)."""
  input_ids, positions, causal_mask, real = process_ids(
    prompt_tokens, completion_tokens, pad_id, eos_id, attention_mask=attention_mask
  )
  if isinstance(packing, SharedPrompts):
    inputs = (input_ids, positions, causal_mask)
    width = prompt_tokens.shape[1]
    out = _shared_prompt_forward(model, inputs, packing.groups, width, hidden)
    if out is not None:
      return out
    packing = None
  if packing is not None:
    input_ids, positions, causal_mask, real = packed_model_inputs(
      input_ids, positions, real, packing
    )
  kwargs = {"positions": positions, "cache": None, "attention_mask": causal_mask}
  if _accepts_segment_ids(model):
    kwargs["segment_ids"] = real
  if hidden:
    out = compat.final_hidden_states(model, input_ids, **kwargs)
  else:
    out = model(input_ids, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
  return out if packing is None else unpack(out, packing)


@nnx.jit(static_argnames=("pad_id", "eos_id", "stop_gradient"), graph=False)
def compute_completion_logits(
  model: nnx.Module,
  prompt_tokens: jax.Array,
  completion_tokens: jax.Array,
  *,
  pad_id: int,
  eos_id: int,
  attention_mask: jax.Array | None = None,
  stop_gradient: bool = True,
  packing: Packing | SharedPrompts | None = None,
) -> jax.Array:
  """Logits `[B, T, V]` that predict each completion token (one forward pass).

  Args:
    model: the tunix model (an `nnx.Module`).
    prompt_tokens: `[B, P]` int prompt ids, left-padded with `pad_id`.
    completion_tokens: `[B, T]` int completion ids, right-padded with `pad_id`.
    pad_id: the padding token's id.
    eos_id: the end-of-sequence token's id.
    attention_mask: `[B, T]` 0/1, 1 on every real completion token (agent and
      environment); None: `completion_tokens != pad_id`.
    stop_gradient: stop the gradient at the output.
    packing: run the pass on packed rows (`ops.Packing`) or once per shared prompt
      (`SharedPrompts`); None: the padded rows as they are.

  Returns:
    `[B, T, V]` logits in the model's output dtype.
  """
  logits = _completion_logits(
    model, prompt_tokens, completion_tokens, pad_id, eos_id, attention_mask, packing
  )
  return jax.lax.stop_gradient(logits) if stop_gradient else logits


def predicting_positions(per_position: jax.Array, completion_width: int) -> jax.Array:
  """`per_position [B, P+T, ...]` at the positions that predict the completion's T tokens:
  the prompt's last position through the completion's second-to-last."""
  return per_position[:, -completion_width - 1 : -1]


def head_weight(model: nnx.Module, dtype: jnp.dtype) -> jax.Array:
  """The LM head's weight `[D, V]` in the hidden states' `dtype` (as tunix's head multiplies;
  a tied embedding transposed)."""
  return compat.head_weight(model).astype(dtype)


def _completion_hidden(
  model: nnx.Module,
  prompt_tokens: jax.Array,
  completion_tokens: jax.Array,
  pad_id: int,
  eos_id: int,
  attention_mask: jax.Array | None,
  packing: Packing | SharedPrompts | None = None,
) -> jax.Array:
  """The final hidden states `[B, T, D]` that predict each completion token."""
  hidden = _forward(
    model, prompt_tokens, completion_tokens, pad_id, eos_id, attention_mask, True, packing
  )
  return predicting_positions(hidden, completion_tokens.shape[1])


@nnx.jit(static_argnames=("pad_id", "eos_id", "stop_gradient"), graph=False)
def compute_completion_hidden(
  model: nnx.Module,
  prompt_tokens: jax.Array,
  completion_tokens: jax.Array,
  *,
  pad_id: int,
  eos_id: int,
  attention_mask: jax.Array | None = None,
  stop_gradient: bool = True,
  packing: Packing | SharedPrompts | None = None,
) -> jax.Array:
  """Final hidden states `[B, T, D]` that predict each completion token (the fused head's
  input: one forward pass that stops before the LM head)."""
  hidden = _completion_hidden(
    model, prompt_tokens, completion_tokens, pad_id, eos_id, attention_mask, packing
  )
  return jax.lax.stop_gradient(hidden) if stop_gradient else hidden


def trained_filter(model: nnx.Module) -> Any:
  """What tunix's trainer differentiates and its optimizer updates: `nnx.LoRAParam` when
  the model has adapters, else `nnx.Param`."""
  return nnx.LoRAParam if jax.tree.leaves(nnx.state(model, nnx.LoRAParam)) else nnx.Param


def completion_head(
  model: nnx.Module,
  prompt_tokens: jax.Array,
  completion_tokens: jax.Array,
  *,
  fused_head: bool,
  stop_gradient: bool = True,
  **pass_kw: Any,
) -> jax.Array | tuple[jax.Array, jax.Array]:
  """What the log-prob and exact-KL functions take of a model: completion logits
  `[B, T, V]`, or with `fused_head` `(hidden [B, T, D], head weight [D, V])`."""
  args = (model, prompt_tokens, completion_tokens)
  if not fused_head:
    return compute_completion_logits(*args, stop_gradient=stop_gradient, **pass_kw)
  hidden = compute_completion_hidden(*args, stop_gradient=stop_gradient, **pass_kw)
  weight = head_weight(model, hidden.dtype)
  return hidden, (jax.lax.stop_gradient(weight) if stop_gradient else weight)


def exact_kl(
  policy: jax.Array | tuple[jax.Array, jax.Array],
  reference: jax.Array | tuple[jax.Array, jax.Array],
  *,
  temperature: float,
  chunk_size: int,
) -> jax.Array:
  """Per-token `KL(pi || pi_ref)` `[B, T]` over the vocabulary from two passes' outputs:
  completion logits `[B, T, V]` each, or `(hidden, weight)` pairs with the fused head
  (`compute_completion_hidden`; no `[B, T, V]` logits then)."""
  if isinstance(policy, tuple):
    return fused_full_kl_divergence(
      *policy, *reference, temperature=temperature, chunk_size=chunk_size
    )
  return full_kl_divergence(policy, reference, temperature, chunk_size)


def _completion_logits(
  model: nnx.Module,
  prompt_tokens: jax.Array,
  completion_tokens: jax.Array,
  pad_id: int,
  eos_id: int,
  attention_mask: jax.Array | None,
  packing: Packing | SharedPrompts | None = None,
) -> jax.Array:
  """Logits `[B, T, V]` predicting the completion. For the families whose call ends in
  the LM head, the head runs on the T predicting positions' hidden states only (the
  prompt's `P` positions need no logits: a forward, and in training its backward, through
  a `[B, P+T, D] x [D, V]` head is the largest single product of a small model's pass)."""
  args = (model, prompt_tokens, completion_tokens, pad_id, eos_id, attention_mask, packing)
  if compat.has_pinned_head(model):
    return compat.lm_head(model, _completion_hidden(*args))
  return predicting_positions(_forward(*args[:-1], packing=packing), completion_tokens.shape[1])


@nnx.jit(
  static_argnames=(
    "pad_id",
    "eos_id",
    "return_entropy",
    "stop_gradient",
    "temperature",
    "chunk_size",
    "fused_head",
  ),
  graph=False,
)
def compute_per_token_logps(
  model: nnx.Module,
  prompt_tokens: jax.Array,
  completion_tokens: jax.Array,
  *,
  pad_id: int,
  eos_id: int,
  attention_mask: jax.Array | None = None,
  return_entropy: bool = False,
  stop_gradient: bool = True,
  temperature: float = 1.0,
  chunk_size: int = 0,
  fused_head: bool = False,
  packing: Packing | SharedPrompts | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
  """Per-token log-probs `[B, T]` of the completion, and its entropy `[B, T]` when asked.

  Both come from the same forward pass, through the chunked `logps_and_entropy`; with
  `fused_head` (`PpoExtConfig.fused_head`), through `fused_logps_and_entropy` from the final
  hidden states and the head's weight, `chunk_size` positions of logits at a time (the
  `[B, T, V]` logits never exist). `attention_mask` is the attention mask (all real tokens),
  not the loss mask. `packing` (`math.packing`): the pass runs on packed rows.

  Args:
    model: the tunix model (an `nnx.Module`).
    prompt_tokens: `[B, P]` int prompt ids, left-padded with `pad_id`.
    completion_tokens: `[B, T]` int completion ids, right-padded with `pad_id`.
    pad_id: the padding token's id.
    eos_id: the end-of-sequence token's id.
    attention_mask: `[B, T]` 0/1, 1 on every real completion token (agent and
      environment); None: `completion_tokens != pad_id`.
    return_entropy: also return the entropy.
    stop_gradient: stop the gradient at the outputs.
    temperature: the logits are divided by it, > 0.
    chunk_size: positions per chunk of logits (`ops.logps_and_entropy`); 0: all at once.
    fused_head: compute from the hidden states and the head's weight
      (`ops.fused_logps_and_entropy`).
    packing: run the pass on packed rows (`ops.Packing`) or once per shared prompt
      (`SharedPrompts`); None: the padded rows as they are.

  Returns:
    float32 `[B, T]` log-probs, or `(logps, entropy)`, both float32 `[B, T]`, with
    `return_entropy`.
  """
  kw = dict(temperature=temperature, chunk_size=chunk_size, return_entropy=return_entropy)
  args = (model, prompt_tokens, completion_tokens, pad_id, eos_id, attention_mask, packing)
  if fused_head:
    hidden = _completion_hidden(*args)
    weight = head_weight(model, hidden.dtype)
    logps, entropy = fused_logps_and_entropy(hidden, weight, completion_tokens, **kw)
  else:
    logps, entropy = logps_and_entropy(_completion_logits(*args), completion_tokens, **kw)
  if stop_gradient:
    logps = jax.lax.stop_gradient(logps)
    entropy = None if entropy is None else jax.lax.stop_gradient(entropy)
  return (logps, entropy) if return_entropy else logps


@nnx.jit(static_argnames=("pad_id", "eos_id", "stop_gradient"), graph=False)
def compute_score(
  model: nnx.Module,
  prompt_tokens: jax.Array,
  completion_tokens: jax.Array,
  *,
  pad_id: int,
  eos_id: int,
  attention_mask: jax.Array | None = None,
  stop_gradient: bool = True,
  packing: Packing | SharedPrompts | None = None,
) -> jax.Array:
  """Per-token scores `[B, P+T]` of a critic or reward model whose output is `[B, P+T, 1]`.

  Args:
    model: the tunix model (an `nnx.Module`).
    prompt_tokens: `[B, P]` int prompt ids, left-padded with `pad_id`.
    completion_tokens: `[B, T]` int completion ids, right-padded with `pad_id`.
    pad_id: the padding token's id.
    eos_id: the end-of-sequence token's id.
    attention_mask: `[B, T]` 0/1, 1 on every real completion token (agent and
      environment); None: `completion_tokens != pad_id`.
    stop_gradient: stop the gradient at the output.
    packing: run the pass on packed rows (`ops.Packing`) or once per shared prompt
      (`SharedPrompts`); None: the padded rows as they are.

  Returns:
    `[B, P+T]` scores, one per position (prompt and completion).
  """
  args = (model, prompt_tokens, completion_tokens, pad_id, eos_id, attention_mask)
  scores = _forward(*args, packing=packing)
  scores = jnp.squeeze(scores, axis=-1)
  return jax.lax.stop_gradient(scores) if stop_gradient else scores
