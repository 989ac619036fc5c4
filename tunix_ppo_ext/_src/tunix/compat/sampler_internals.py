"""tunix's generate `Sampler` (`tunix.generate.sampler`): its private step functions, and the
layout of its sampling state and KV cache, which the multi-turn rollout's
`ContinuingSampler` keeps between turns (and `tunix-ppo-ext plan` compiles on).

What tunix 0.1.7 offers no public way to do, each with its reason:

- `sampler_step_functions`: tunix's `Sampler` jits its prefill and decode loop only inside
  `__call__`; `ContinuingSampler` jits the unjitted `_prefill_fn` itself to run it on a state
  it keeps between turns (called as `prefill_arguments` says), and `tunix-ppo-ext plan`
  compiles that program ahead of time on abstract inputs to read its memory.
- `sample_next_token` (`_sample`): the next token from logits, which `ContinuingSampler`'s
  own prefill of a turn's new tokens and decode step call.
- `sample_without_training_options` (`_transformer_graphdef`): the graph tunix's sampler
  merges inside its decode loop, where a remat'ed layer cannot run and splash attention
  takes no KV cache.
- `keep_prompt_width_static` (the state's `num_input_tokens`): tunix's `init_sample_state`
  stores this static field (pytree metadata, a compilation key) as a JAX array. jit compares
  the metadata of equal-hashing arguments in its caches; an array there makes that
  comparison an array operation, which fails inside a trace ("Exception raised while
  checking equality of metadata fields of pytree"): a later, unrelated jitted program in
  the same process (a second run in a notebook, the next test) stops. The width is made a
  Python int on every state tunix's sampler builds for us.
- the sampling state (tunix's private `_SamplingState`, `STATE_FIELDS`) and its KV cache
  (one dict per layer, `CACHE_KEYS`): tunix builds and advances them inside `__call__`
  only; `ContinuingSampler` sets a state up for each turn, prefills a block of new tokens
  into a kept cache, moves cache slots and reads the buffers back. Every read and write of
  a field or a cache key is a function here: `fresh_state`, `set_up_turn`,
  `turn_first_slot`, `after_prefill`, `decode_inputs`, `still_decoding`, `buffered_tokens`,
  `cache_written_from`, `gather_cache_slots`, `kv_rows`, `cache_rows`, `empty_kv_cache`,
  `layer_caches`, `cache_of_layers`,
  `with_buffers`, `turn_buffers`,
  `abstract_turn_state`. Pinned on live states of tunix's Qwen2, Qwen3 and Llama 3 by
  tests/tunix/compat/test_sampler_layout.py, which also finds no field or key used elsewhere.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.generate import sampler as sampler_lib

PINNED: dict[str, tuple[Any, tuple[str, ...]]] = {
  # object the names live on -> (the object, private names used here)
  "tunix.generate.sampler.Sampler": (
    sampler_lib.Sampler,
    ("_prefill_fn", "_decode_fn", "_sample"),
  ),
}
# Instance attributes set in constructors (checked on live objects by the tests).
PINNED_INSTANCE_ATTRIBUTES = {"Sampler": ("_transformer_graphdef",)}
# The fields of tunix's `_SamplingState` read or written here: the decode step (the slot
# whose token is fed next), the `[B, S]` token buffer and positions (RoPE, pad slots not
# counted), the KV cache, the rows done, the last step to sample, the prefill width (static),
# the sampling key and the `[B, S]` log-prob buffer.
STATE_FIELDS = (
  "decoding_step",
  "token_buffer",
  "positions",
  "cache",
  "done",
  "total_sampling_steps",
  "num_input_tokens",
  "seed",
  "logprobs_buffer",
)
# The keys of each layer's dict in tunix's KV cache: keys and values `[B, S, KV, H]`, and the
# `[B]` slot from which the model writes the next ones.
CACHE_KEYS = ("k", "v", "end_index")
# The static arguments of tunix's `_prefill_fn` (jitted as tunix jits it).
PREFILL_STATIC_ARGNAMES = ("echo",)


def sample_without_training_options(sampler: Any) -> None:
  """Makes `sampler` run its model without activation rematerialisation (`model.remat`) and
  with dense attention (`model.attention`): both are for the trainers' passes.

  tunix's sampler merges its `_transformer_graphdef` with the weights inside its decode
  `while_loop`; a Qwen3 / Qwen2 / Llama 3 / Gemma 3 layer whose config asks for remat then
  wraps itself in `nnx.remat` there, which mutates the freshly merged `Param`s from an inner
  trace (flax's `TraceContextError`), so a remat'ed policy could not sample at all. Remat
  only matters for a backward pass, which sampling never takes. tunix's splash path
  (`use_flash_attention`, Qwen3 and Qwen2) takes no KV cache, which every prefill and decode
  step of the sampler writes. So the sampler's graph gets the same modules with
  `remat_config` NONE and `use_flash_attention` False; the trainers keep theirs.
  """
  model = sampler.transformer
  changed = False
  for _, module in nnx.iter_graph(model):
    config = getattr(module, "config", None) if isinstance(module, nnx.Module) else None
    plain = _sampling_config(config)
    if plain is not config:
      module.config = plain
      changed = True
  if changed:
    sampler._transformer_graphdef = nnx.graphdef(model)


def _sampling_config(config: Any) -> Any:
  """`config` (a tunix model config, or anything) without remat and splash attention; the
  same object when it has neither on."""
  remat = getattr(config, "remat_config", None)
  if isinstance(remat, enum.Enum) and remat.name != "NONE":
    config = dataclasses.replace(config, remat_config=type(remat).NONE)
  if getattr(config, "use_flash_attention", False) is True:
    config = dataclasses.replace(config, use_flash_attention=False)
  return config


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


def prefill_arguments(params: Any, state: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
  """`(args, kwargs)` of tunix's prefill (`sampler_step_functions`) on `state`: no images,
  `echo=False` (logits at the last position only: `Sampler.__call__`'s default)."""
  return (params, state, None), {"echo": False}


# ----- the sampling state and its KV cache -----


def _with_static_width(state: Any, ids: Any) -> Any:
  """`state` built for the contexts `ids` `[B, W]`, with its static `num_input_tokens` the
  Python int `W` (tunix stores a JAX array; `ids` may be abstract, as under `plan`)."""
  return dataclasses.replace(state, num_input_tokens=int(ids.shape[1]))


def keep_prompt_width_static(sampler: Any) -> None:
  """Makes tunix's `sampler` build every sampling state (`init_sample_state`, which its
  `__call__` calls) with `num_input_tokens` a Python int, not a JAX array: an array in
  pytree metadata breaks later jit cache lookups inside a trace (module docstring)."""
  build = sampler.init_sample_state
  if getattr(build, "keeps_width_static", False):
    return

  def init_sample_state(*args: Any, **kwargs: Any) -> Any:
    ids = args[0] if args else kwargs["all_input_ids"]
    return _with_static_width(build(*args, **kwargs), ids)

  init_sample_state.keeps_width_static = True  # type: ignore[attr-defined]
  sampler.init_sample_state = init_sample_state


def _int32(x: int) -> jax.Array:
  return jnp.asarray(x, jnp.int32)


def fresh_state(
  sampler: Any,
  ids: jax.Array,
  slots: int,
  *,
  temperature: float,
  top_p: float | None,
  top_k: int | None,
  seed: int,
  with_logprobs: bool,
  forbidden_ids: Sequence[int] | None = None,
) -> Any:
  """tunix's `init_sample_state` for left-padded contexts `ids` `[B, W]`: a `[B, slots]`
  token buffer holding them, their positions and an empty KV cache; top-p sampling unless
  `top_p` is None (greedy), no logits buffer, a log-prob buffer with `with_logprobs`, the
  key `PRNGKey(seed)`; `forbidden_ids` are never sampled (tunix sets their logits to -inf).

  Its `num_input_tokens` is a Python int (`keep_prompt_width_static`)."""
  state = sampler.init_sample_state(
    ids,
    total_sampling_steps=slots,
    include_logits=False,
    forbidden_token_ids=forbidden_ids,
    temperature=temperature,
    top_p=top_p,
    top_k=top_k,
    seed=jax.random.PRNGKey(seed),
    beam_size=None,
    include_logprobs=with_logprobs,
  )
  return _with_static_width(state, ids)


def set_up_turn(
  state: Any,
  active: np.ndarray,
  first: int,
  max_tokens: int,
  *,
  seed: int | None = None,
  prefill_width: int | None = None,
) -> Any:
  """`state` set up to sample up to `max_tokens` tokens at slots `[first, first +
  max_tokens)` for the `active` rows `[B]` (the others are done): the decode step at
  `first - 1`, the last step at `first + max_tokens - 1`, both int32 scalars (one
  compilation of each jitted program whatever the turn); with `seed`, the turn's key
  `PRNGKey(seed)`; with `prefill_width` (a fresh state), the width tunix's prefill reads."""
  fields: dict[str, Any] = {
    "decoding_step": _int32(first - 1),
    "total_sampling_steps": _int32(first + max_tokens - 1),
    "done": jnp.asarray(~np.asarray(active, bool)),
  }
  if seed is not None:
    fields["seed"] = jax.random.PRNGKey(seed)
  if prefill_width is not None:
    fields["num_input_tokens"] = prefill_width
  return dataclasses.replace(state, **fields)


def turn_first_slot(state: Any, max_tokens: int) -> jax.Array:
  """The first slot of the turn `state` was set up for (`set_up_turn`, `max_tokens`)."""
  return state.total_sampling_steps - (max_tokens - 1)


def after_prefill(state: Any) -> Any:
  """`state` after tunix's prefill: its `num_input_tokens`, static (a compilation key of
  every program the state is handed to) and read by the prefill only, back to 0."""
  return dataclasses.replace(state, num_input_tokens=0)


def buffered_tokens(state: Any) -> jax.Array:
  """The state's token buffer `[B, S]` (the pad id in every slot without a token)."""
  return state.token_buffer


def decode_inputs(state: Any) -> tuple[jax.Array, jax.Array, jax.Array, Any]:
  """`(step, token, position, cache)` of tunix's decode step on `state`: the decode step,
  the token at that slot `[B, 1]`, its position `[B, 1]` and the KV cache."""
  step = state.decoding_step
  return step, state.token_buffer[:, step][:, None], state.positions[:, step][:, None], state.cache


def still_decoding(state: Any) -> jax.Array:
  """tunix's decode loop condition: a step left before the last one and a row not done."""
  return (state.decoding_step < state.total_sampling_steps) & jnp.any(~state.done)


def cache_written_from(state: Any, slot: jax.Array) -> Any:
  """The state's KV cache with every layer's `end_index` at `slot`: the model writes the
  keys and values of the tokens it is fed next from there."""
  return {
    name: {**layer, "end_index": jnp.full_like(layer["end_index"], slot)}
    for name, layer in state.cache.items()
  }


def _map_keys_values(cache: Any, function: Callable[[Any], Any]) -> Any:
  """`cache` with `function` applied to every layer's keys and values `[B, S, KV, H]`."""
  return {
    name: {**layer, "k": function(layer["k"]), "v": function(layer["v"])}
    for name, layer in cache.items()
  }


def gather_cache_slots(state: Any, source: jax.Array) -> Any:
  """The state's KV cache whose slot j of row b holds the keys and values of its slot
  `source[b, j]` (`[B, S]`)."""
  index = source[:, :, None, None]
  return _map_keys_values(state.cache, lambda x: jnp.take_along_axis(x, index, axis=1))


def kv_rows(cache: Any, rows: jax.Array) -> Any:
  """The rows `rows` (`[B]`) of a KV cache (every layer's keys, values and next slot): a
  cache filled once per distinct context, handed to every row that holds that context."""
  return {name: {key: value[rows] for key, value in layer.items()} for name, layer in cache.items()}


def cache_rows(state: Any, rows: jax.Array) -> Any:
  """The rows `rows` (`[B]`) of `state`'s KV cache (`kv_rows`)."""
  return kv_rows(state.cache, rows)


def layer_caches(cache: Any, layers: int) -> list[Any]:
  """Each of `layers` layers' part of a KV cache, in layer order (Nones for no cache): what
  a tunix transformer's `__call__` hands each decoder layer."""
  return [None if cache is None else cache[f"layer_{i}"] for i in range(layers)]


def cache_of_layers(parts: Sequence[Any]) -> Any:
  """The KV cache whose layers are `parts` (`layer_caches`' inverse)."""
  return {f"layer_{i}": part for i, part in enumerate(parts)}


def empty_kv_cache(config: Any, batch: int, slots: int, dtype: Any) -> Any:
  """A KV cache of `slots` slots for `batch` rows of a tunix model with `config` (its
  `num_layers`, `num_kv_heads`, `head_dim`), in the layout tunix's sampler builds: layer
  `layer_{i}` -> keys and values `[batch, slots, KV, H]` of `dtype`, next slot 0 `[batch]`.
  A model called with it writes its keys and values there and attends over every slot
  its mask allows."""
  shape = (batch, slots, config.num_kv_heads, config.head_dim)
  layer = {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
  layer["end_index"] = jnp.zeros((batch,), jnp.int32)
  return cache_of_layers([dict(layer) for _ in range(config.num_layers)])


def with_buffers(
  state: Any,
  tokens: jax.Array,
  cache: Any,
  *,
  positions: jax.Array | None = None,
  step: jax.Array | None = None,
) -> Any:
  """`state` with the token buffer `tokens` `[B, S]` and the KV cache `cache`, and where
  given the positions `[B, S]` and the decode step."""
  fields: dict[str, Any] = {"token_buffer": tokens, "cache": cache}
  if positions is not None:
    fields["positions"] = positions
  if step is not None:
    fields["decoding_step"] = step
  return dataclasses.replace(state, **fields)


def turn_buffers(state: Any, with_logprobs: bool) -> tuple[np.ndarray, int, np.ndarray | None]:
  """`(tokens, step, logprobs)` on the host after a turn: the token buffer `[B, S]`, the
  decode step the loop stopped at and (with `with_logprobs`, else None) the log-prob
  buffer `[B, S]`, each sampled token's log-prob in its slot."""
  tokens, step = jax.device_get((state.token_buffer, state.decoding_step))
  logprobs = jax.device_get(state.logprobs_buffer) if with_logprobs else None
  return tokens, int(step), logprobs


def abstract_turn_state(
  state: Any,
  counter: Any,
  place_seed: Callable[[Any], Any],
  place_keys_values: Callable[[Any], Any],
  prefill_width: int,
) -> Any:
  """An abstract `state` (`jax.ShapeDtypeStruct` leaves: `jax.eval_shape` of `fresh_state`)
  as `set_up_turn` hands a fresh one to the prefill: its decode and last steps `counter`
  (an int32 scalar), its key and every layer's keys and values placed by the functions
  given, `num_input_tokens` `prefill_width`."""
  return dataclasses.replace(
    state,
    cache=_map_keys_values(state.cache, place_keys_values),
    seed=place_seed(state.seed),
    decoding_step=counter,
    total_sampling_steps=counter,
    num_input_tokens=prefill_width,
  )
