"""tunix's vanilla `Sampler`, continued from its own KV cache turn after turn.

tunix 0.1.7's `Sampler.__call__` takes strings, tokenises them, builds a fresh KV cache,
prefills the whole (left-padded) prompt and decodes; a multi-turn episode played that
way re-encodes its whole history at every turn, a cost that grows with the square of
the number of turns. `ContinuingSampler` subclasses it and keeps the sampling state (the
token buffer, positions, KV cache) of one batch of episodes between turns
(`Conversation`): a turn prefills only the tokens each row's context gained since the
previous turn, then decodes with tunix's decode loop (its step, except that a pad id the
agent samples is attended, as in the trainer's context).

Layout of the state (`[B, S]` buffers, `S` the cache size; one slot is one token, as in
tunix): the first turn's left-padded prompts, then per turn the generated slots and the
next block of new tokens. Slots a row does not use (padding of a block, tokens sampled
after its EOS, a finished row's slots) hold the pad id, which tunix's sampler masks out
of attention; positions (RoPE) count the non-pad slots only, so a row sees exactly its
context, as when the context is re-encoded. The last token of a turn (EOS, or the last
sampled token of a turn cut at `max_tokens`) is fed again in the next block: the decode
loop may stop before feeding it, so its cache entry is not relied on.

Rows that start from the same context (a GRPO group's prompt) share its prefill: the
first turn prefills each distinct context once, hands its KV cache to every row holding
it, and feeds each row's last context token again to draw that row's own first token, as
a prefill of every row would. Blocks are bucketed to few widths (`math.buckets.bucket`: at
most a third of a block is padding).

When the buffer has no room for the next turn's block and tokens, the state is first
compacted: every row's kept slots (keys and values included: they depend on positions,
not slots) are moved, in order, to the start of the buffer, which frees every hole (a
gather, no model pass). When a row's context does not extend what the cache holds, the
sampling settings change, the contexts still do not fit, or the model's attention depends
on slot distances (Gemma3's sliding windows), the turn re-encodes the whole context into
a fresh state (`reencoded`).

tunix's sampling state and KV cache (their fields and keys) are read and written only
through `compat`'s sampler functions (`compat.sampler_internals`), which pin their layout.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.generate import sampler as sampler_lib
from tunix.generate import utils as generate_utils
from tunix.models.llama3 import model as llama3
from tunix.models.qwen2 import model as qwen2
from tunix.models.qwen3 import model as qwen3

from tunix_ppo_ext._src.ops.buckets import bucket
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.models.hf_models import vocab_size

# Models whose attention layers attend to every cache slot the mask allows (no sliding
# window over slot indices): a cache with masked holes gives them the same logits.
CONTINUABLE = (qwen2.Qwen2, qwen3.Qwen3, llama3.Llama3)


@dataclasses.dataclass(frozen=True)
class TurnSampling:
  """One turn's sampling settings (those of tunix's `RolloutConfig`).

  `temperature == 0` (or `top_p is None`) is greedy, as in tunix's sampler; `seed` makes
  the turn's key `PRNGKey(seed)`, folded with the slot index per token.
  """

  max_tokens: int
  temperature: float = 1.0
  top_p: float | None = 1.0
  top_k: int | None = None
  seed: int = 0
  return_logprobs: bool = False

  def mode(self) -> tuple[Any, ...]:
    """What a sampling state is built for (a state built otherwise is not continued)."""
    return (self.temperature, self.top_p, self.top_k, self.return_logprobs)


@dataclasses.dataclass(frozen=True)
class TurnOutput:
  """One turn's samples, as tunix's `RolloutOutput` gives them.

  `tokens[b]`: row b's sampled ids before its first EOS (the EOS stripped);
  `logprobs[b]`: their log-probs (with `return_logprobs`); `reencoded`: whether the turn
  prefilled whole contexts; `prefilled`: the prefill width `W` (slots per row).
  """

  tokens: list[np.ndarray]
  logprobs: list[list[float]] | None
  reencoded: bool
  prefilled: int


class ContinuingSampler(sampler_lib.Sampler):
  """tunix's `Sampler` plus `conversation()`: multi-turn sampling from token ids that
  continues from the KV cache of the previous turn (see the module docstring). A turn
  ends at the tokenizer's EOS (tunix's default stop token)."""

  def __init__(self, transformer: nnx.Module, tokenizer: Any, cache_config: Any):
    super().__init__(transformer, tokenizer, cache_config)
    compat.sample_without_training_options(self)  # remat and splash: the trainers' only
    prefill, _ = compat.sampler_step_functions(self, [self.tokenizer.eos_id()])
    # name: (function, donated argument, static argument names); decode per turn length
    self._functions = {
      "prefill": (prefill, 1, compat.PREFILL_STATIC_ARGNAMES),
      "extend": (self._extend_fn, 1, ()),
      "compact": (self._compact_fn, 0, ()),
    }
    self._start_jit, self._extend_jit, self._compact_jit = (
      self._jit(name) for name in ("prefill", "extend", "compact")
    )
    self._decode_jits: dict[int, Any] = {}  # per number of tokens a turn samples
    self.continuable = isinstance(transformer, CONTINUABLE)
    self.placeholder = 1 if self.tokenizer.pad_id() == 0 else 0  # a non-pad id, never fed
    self.unused_ids = unused_vocabulary(transformer, self.tokenizer)
    self._last_token_only = (
      "decode_only_last_token" in inspect.signature(transformer.__call__).parameters
    )

  @classmethod
  def like(cls, sampler: sampler_lib.Sampler) -> ContinuingSampler:
    """A `ContinuingSampler` on `sampler`'s model, tokenizer and cache, sharing its weights
    (the same variables: a trainer that updates them in place updates both)."""
    continuing = cls(sampler.transformer, sampler.tokenizer, sampler.cache_config)
    continuing.follow(sampler)
    return continuing

  def follow(self, sampler: sampler_lib.Sampler) -> None:
    """Samples with `sampler`'s variables (tunix replaces the engine's when it syncs
    weights to a rollout model that is not the actor's)."""
    if self.transformer_state is not sampler.transformer_state:
      self.transformer_state = sampler.transformer_state

  def conversation(self, continued: bool = True) -> Conversation:
    """A new batch of episodes; `continued=False` re-encodes every turn (the old path)."""
    return Conversation(self, continued and self.continuable)

  # ----- the jitted pieces -----

  def prefill(self, params: Any, state: Any) -> Any:
    """tunix's prefill of a fresh `state` (`compat.set_up_turn` with its prefill width) and
    its first sample (jitted); the state comes back ready for `decode`."""
    args, kwargs = compat.prefill_arguments(params, state)
    return compat.after_prefill(self._start_jit(*args, **kwargs))

  def decode(self, params: Any, state: Any, max_tokens: int) -> Any:
    """tunix's decode loop on `state`, for a turn sampling `max_tokens` tokens (jitted)."""
    return self.programs(max_tokens)["decode"](params, state)

  def extend(self, params: Any, state: Any, *block: jax.Array) -> Any:
    """The prefill of a turn's new tokens into the kept cache (`_extend_fn`, jitted):
    `block` is `(blocks [B, W], real [B, W], start, hole_from [B])` as `_extend_fn` takes it."""
    return self._extend_jit(params, state, *block)

  def compact(self, state: Any, source: jax.Array, kept: jax.Array) -> Any:
    """The state with its kept slots moved to the front (`_compact_fn`, jitted)."""
    return self._compact_jit(state, source, kept)

  def programs(self, max_tokens: int, keep_unused: bool = False) -> dict[str, Any]:
    """The jitted programs a conversation runs, by name, for turns of `max_tokens` tokens:
    `prefill` (tunix's, a fresh or re-encoded turn: `(params, state, None, echo=False)`),
    `decode` (`(params, state)`), `extend` (`(params, state, blocks [B, W], real [B, W],
    start, hole_from [B])`) and `compact` (`(state, source [B, S], kept [B, S])`); the
    sampling state is donated in each. `keep_unused`: the same programs jitted anew with
    every argument kept, also state fields a program does not read (they stay on the
    device during the call: what `tunix-ppo-ext plan` compiles to count them)."""
    if max_tokens not in self._decode_jits:
      self._decode_jits[max_tokens] = self._jit("decode", max_tokens=max_tokens)
    if keep_unused:
      names = ("prefill", "decode", "extend", "compact")
      return {name: self._jit(name, True, max_tokens=max_tokens) for name in names}
    return {
      "prefill": self._start_jit,
      "decode": self._decode_jits[max_tokens],
      "extend": self._extend_jit,
      "compact": self._compact_jit,
    }

  def _jit(self, name: str, keep_unused: bool = False, max_tokens: int = 0) -> Any:
    """Program `name` jitted with its sampling state donated (decode: for `max_tokens`)."""
    if name == "decode":
      step = functools.partial(self._decode_fn_for_turn, max_tokens=max_tokens)
      function, donated, static = step, 1, ()
    else:
      function, donated, static = self._functions[name]
    return jax.jit(
      function, donate_argnums=(donated,), static_argnames=static, keep_unused=keep_unused
    )

  def _decode_fn_for_turn(self, params: Any, state: Any, max_tokens: int) -> Any:
    """tunix's `Sampler` decode loop and sample step (a `while_loop` feeding one token a
    step), except that a pad id the agent samples in this turn is attended, as in the
    trainer's context: only pad ids before the turn's first sampled slot are masked."""
    pad = self.tokenizer.pad_id()
    first = compat.turn_first_slot(state, max_tokens)
    graphdef, _ = self.model_def_and_state()

    def step(s: Any) -> Any:
      d, token, position, cache = compat.decode_inputs(s)
      buffer = compat.buffered_tokens(s)
      slots = jnp.arange(buffer.shape[1])[None, :]
      masked = (buffer == pad) & (slots < first)
      mask = generate_utils.compute_attention_masks(d, self.cache_config.cache_size, masked)
      transformer = nnx.merge(graphdef, params)
      logits, cache = transformer(token, positions=position, cache=cache, attention_mask=mask)
      return compat.sample_next_token(self, logits, cache, s)

    return jax.lax.while_loop(compat.still_decoding, step, state)

  def _extend_fn(
    self,
    params: Any,
    state: Any,
    blocks: jax.Array,
    real: jax.Array,
    start: jax.Array,
    hole_from: jax.Array,
  ) -> Any:
    """Prefills `blocks` `[B, W]` at slots `[start, start + W)` and samples the next token.

    Slots `[hole_from[b], start)` of row b become pad (masked); positions are recounted
    over the non-pad slots (future slots count); key slot j is attended by the block's
    query i iff j <= start + i and slot j is not pad. The cache is written from `start`
    (`compat.cache_written_from`): the model writes the block's keys and values there.
    """
    batch, width = blocks.shape
    pad = self.tokenizer.pad_id()
    buffer = compat.buffered_tokens(state)
    slots = jnp.arange(buffer.shape[1], dtype=jnp.int32)[None, :]
    hole = (slots >= hole_from[:, None]) & (slots < start)
    tokens = jnp.where(hole, pad, buffer)
    # a pad id among a block's real ids (one the agent sampled, fed again) stands in the
    # buffer as `placeholder`: attended and counted from now on, as in the trainer's context
    written = jnp.where(real, jnp.where(blocks == pad, self.placeholder, blocks), pad)
    tokens = jax.lax.dynamic_update_slice(tokens, written, (jnp.int32(0), start))
    positions = generate_utils.build_positions_from_mask((tokens != pad) | (slots >= start + width))
    block_positions = jax.lax.dynamic_slice(positions, (jnp.int32(0), start), (batch, width))
    queries = start + jnp.arange(width, dtype=jnp.int32)
    mask = (tokens != pad)[:, None, :] & (slots[:, None, :] <= queries[None, :, None])
    cache = compat.cache_written_from(state, start)
    graphdef, _ = self.model_def_and_state()
    transformer = nnx.merge(graphdef, params)
    logits, cache = self._last_logits(transformer, blocks, block_positions, cache, mask)
    state = compat.with_buffers(state, tokens, cache, positions=positions, step=start + width - 1)
    return compat.sample_next_token(self, logits, cache, state)

  def _last_logits(self, transformer: nnx.Module, *inputs: Any) -> tuple[jax.Array, Any]:
    """`(logits [B, 1, V] at a block's last slot, the KV cache)` of `transformer` fed
    `inputs` (tokens, positions, cache, mask): the LM head runs on that slot only (a
    family's own `decode_only_last_token` where it has one, else the model's own head on
    the last final hidden state), not on every slot of the block, where it took about a
    sixth of the block's pass on SmolLM2."""
    if self._last_token_only:
      return transformer(*inputs, decode_only_last_token=True)
    if not compat.has_pinned_head(transformer):
      return transformer(*inputs)
    hidden, cache = compat.final_hidden_states(
      transformer, *inputs, keep_cache=True, adapters_ok=True
    )
    return compat.lm_head(transformer, hidden[:, -1:]), cache

  def _compact_fn(self, state: Any, source: jax.Array, kept: jax.Array) -> Any:
    """Slot j of row b takes slot `source[b, j]`'s token, keys and values where `kept[b, j]`
    (`[B, S]`), else becomes pad: each row's kept slots moved, in order, to the front."""
    pad = self.tokenizer.pad_id()
    tokens = jnp.take_along_axis(compat.buffered_tokens(state), source, axis=1)
    cache = compat.gather_cache_slots(state, source)
    return compat.with_buffers(state, jnp.where(kept, tokens, pad), cache)


def unused_vocabulary(transformer: nnx.Module, tokenizer: Any) -> tuple[int, ...] | None:
  """The model's output rows past the tokenizer's last id (a vocabulary padded to a round
  size, as Qwen checkpoints pad theirs), which have no text and are never to be
  sampled; None when there are none (or the tokenizer does not say how many ids it has)."""
  raw = getattr(tokenizer, "tokenizer", tokenizer)  # inside tunix's TokenizerAdapter
  try:
    known = len(raw)
  except TypeError:
    return None
  return tuple(range(known, vocab_size(transformer))) or None


def _kept(sampled: np.ndarray, pad: int) -> int:
  """How many of a turn's sampled ids (EOS included) the cache keeps: all but the last
  (the decode loop may stop before feeding it), and none from a sampled pad id on: those
  are fed again next turn, where the pad id is written as the placeholder that keeps it
  attended (in the buffer a pad id is masked)."""
  pads = np.flatnonzero(sampled == pad)
  return int(min(len(sampled) - 1, pads[0])) if len(pads) else len(sampled) - 1


def _distinct_rows(padded: np.ndarray, pad: int) -> tuple[np.ndarray, np.ndarray] | None:
  """`(distinct [U', W], rows [B])` of left-padded contexts `padded` `[B, W]`: the distinct
  ones (padded with copies to a bucket of rows, `math.buckets.bucket`: few compilations) and
  which one each row holds; None when the bucket is not under `B` (nothing to share) or a
  context ends on the pad id (fed again, it would become attended)."""
  distinct, rows = np.unique(padded, axis=0, return_inverse=True)
  rows_bucket = bucket(len(distinct))
  if rows_bucket >= len(padded) or np.any(padded[:, -1] == pad):
    return None
  copies = np.repeat(distinct[:1], rows_bucket - len(distinct), axis=0)
  return np.concatenate([distinct, copies]), rows.reshape(-1).astype(np.int32)


class Conversation:
  """The sampling state of one batch of episodes between turns (`ContinuingSampler`).

  Each `turn(contexts, active, sampling, fresh_width)` samples one turn for every row:
  `contexts[b]` is row b's whole context so far (token ids); inactive rows (finished
  episodes) are not sampled for. `reencodes` counts the turns that re-encoded,
  `compactions` the times the state was compacted.
  """

  def __init__(self, sampler: ContinuingSampler, continued: bool):
    self.sampler = sampler
    self.continued = continued
    self.reencodes = 0
    self.compactions = 0
    self._tokens = np.zeros((0, 0), np.int32)  # the token buffer after the last turn
    self._state: Any = None
    self._mode: tuple[Any, ...] | None = None
    self._cached: list[np.ndarray] = []  # per row: the context ids the cache holds
    self._prompts: list[np.ndarray] = []  # per row: its first turn's context (the prompt)
    self._hole_from = np.zeros(0, np.int32)
    self._next_slot = 0  # where the next block goes

  def turn(
    self,
    contexts: Sequence[Sequence[int]],
    active: Sequence[bool],
    sampling: TurnSampling,
    fresh_width: int,
  ) -> TurnOutput:
    """Samples up to `sampling.max_tokens` tokens per active row after its context.

    Continues from the cache when possible, else re-encodes every context left-padded to
    `fresh_width` (or more, see `_fresh_width`) in a fresh state.
    """
    contexts = [np.asarray(c, np.int32) for c in contexts]
    active_rows = np.asarray(active, bool)
    if self._state is None:
      self._prompts = contexts
    blocks = self._blocks(contexts, active_rows, sampling)
    if blocks is not None and not self._fits(blocks, sampling):
      self._compact()
      blocks = blocks if self._fits(blocks, sampling) else None
    if blocks is None:
      width = self._fresh_width(contexts, sampling, fresh_width)
      start = self._start(contexts, active_rows, sampling, width)
      self.reencodes += 1
    else:
      width = bucket(max(len(b) for b in blocks))
      start = self._extend(blocks, active_rows, sampling, width)
    return self._read(contexts, active_rows, sampling, start, blocks is None, width)

  def _fresh_width(
    self, contexts: list[np.ndarray], sampling: TurnSampling, fresh_width: int
  ) -> int:
    """`fresh_width`, or the longest context's bucket (`math.buckets.bucket`; its length if the
    bucket leaves no room for the turn) when a context is longer."""
    longest = max(len(c) for c in contexts)
    if longest <= fresh_width:
      return fresh_width
    wide = bucket(longest)
    fits = wide + sampling.max_tokens <= self.sampler.cache_config.cache_size
    return wide if fits else longest

  def _blocks(
    self, contexts: list[np.ndarray], active: np.ndarray, sampling: TurnSampling
  ) -> list[np.ndarray] | None:
    """Per row, the ids its context gained since the cache's; None when the turn must
    re-encode (first turn, old path, other settings, a context that does not extend the
    cached one, or no room left in the buffer)."""
    if not self.continued or self._state is None or self._mode != sampling.mode():
      return None
    if len(contexts) != len(self._cached):
      return None
    blocks = []
    for context, cached, live in zip(contexts, self._cached, active, strict=True):
      if not live:
        blocks.append(np.zeros(0, np.int32))
        continue
      n = len(cached)
      if len(context) <= n or not np.array_equal(context[:n], cached):
        return None
      blocks.append(context[n:])
    return blocks if active.any() else None

  def _fits(self, blocks: list[np.ndarray], sampling: TurnSampling) -> bool:
    """Whether the blocks and the turn's tokens fit after the next free slot."""
    width = bucket(max(len(b) for b in blocks))
    return self._next_slot + width + sampling.max_tokens <= self.sampler.cache_config.cache_size

  def _compact(self) -> None:
    """Moves every row's kept slots (non-pad, before its hole), in order, to end at slot
    `L` (the most any row keeps), left-padded: slots from `L` on are free."""
    tokens = self._tokens
    slots = np.arange(tokens.shape[1])
    kept = (tokens != self.sampler.tokenizer.pad_id()) & (slots < self._hole_from[:, None])
    longest = int(kept.sum(1).max())
    source, moved = np.zeros(tokens.shape, np.int32), np.zeros(tokens.shape, bool)
    for row, row_kept in enumerate(kept):
      where = np.flatnonzero(row_kept)
      source[row, longest - len(where) : longest] = where
      moved[row, longest - len(where) : longest] = True
    self._state = self.sampler.compact(self._state, jnp.asarray(source), jnp.asarray(moved))
    self._next_slot, self._hole_from = longest, np.full(len(tokens), longest, np.int32)
    self.compactions += 1

  def _start(
    self, contexts: list[np.ndarray], active: np.ndarray, sampling: TurnSampling, width: int
  ) -> int:
    """A fresh state with `contexts` left-padded to `width`, prefilled by tunix's own
    prefill (once per distinct context where rows share one: `_shared_prefill`); returns
    the first generated slot."""
    sampler, pad = self.sampler, self.sampler.tokenizer.pad_id()
    room = sampler.cache_config.cache_size
    if width + sampling.max_tokens > room:
      raise ValueError(
        f"a context of {width} tokens plus {sampling.max_tokens} sampled ones does not fit "
        f"the rollout KV cache of {room}; raise max_tokens_to_generate"
      )
    padded = np.stack([generate_utils.pad_to_length(c, width, pad, left=True) for c in contexts])
    state = self._fresh(padded, sampling)
    _, params = sampler.model_def_and_state()
    attended = self._attended(contexts, width) if sampler.continuable else None
    shared = _distinct_rows(padded, pad) if self.continued else None
    if attended is not None:  # a sampled pad id: attended, as in the trainer's pass
      state = compat.set_up_turn(state, active, width, sampling.max_tokens, seed=sampling.seed)
      start, hole_from = jnp.asarray(0, jnp.int32), jnp.zeros(len(padded), jnp.int32)
      blocks = (jnp.asarray(padded), jnp.asarray(attended), start, hole_from)
      state = sampler.extend(params, state, *blocks)
    elif shared is None:
      state = compat.set_up_turn(state, active, width, sampling.max_tokens, prefill_width=width)
      state = sampler.prefill(params, state)
    else:
      state = self._shared_prefill(state, params, *shared, active, sampling)
    self._state = sampler.decode(params, state, sampling.max_tokens)
    self._mode = sampling.mode()
    self._cached = list(contexts)
    return width

  def _attended(self, contexts: list[np.ndarray], width: int) -> np.ndarray | None:
    """`[B, width]`: the slots of the left-padded `contexts` to attend where a context
    holds the pad id after its prompt (sampled by the agent): every token but the left
    padding and the prompt's own pad ids, as the trainer's pass and a continued turn
    attend; None when no context does (tunix's prefill masks every pad id)."""
    pad = self.sampler.tokenizer.pad_id()
    attended = np.zeros((len(contexts), width), bool)
    sampled_pad = False
    prompts = self._prompts if len(self._prompts) == len(contexts) else contexts
    for row, (context, prompt) in enumerate(zip(contexts, prompts, strict=True)):
      n = len(prompt) if np.array_equal(context[: len(prompt)], prompt) else len(context)
      sampled_pad |= bool(np.any(context[n:] == pad))
      attended[row, width - len(context) :] = np.concatenate(
        [context[:n] != pad, np.ones(len(context) - n, bool)]
      )
    return attended if sampled_pad else None

  def _fresh(self, padded: np.ndarray, sampling: TurnSampling) -> Any:
    """tunix's fresh sampling state for the left-padded contexts `padded` `[B, W]`."""
    return compat.fresh_state(
      self.sampler,
      jnp.asarray(padded),
      self.sampler.cache_config.cache_size,
      temperature=sampling.temperature,
      top_p=sampling.top_p if sampling.temperature > 0 else None,
      top_k=sampling.top_k,
      seed=sampling.seed,
      with_logprobs=sampling.return_logprobs,
      forbidden_ids=self.sampler.unused_ids,
    )

  def _shared_prefill(
    self,
    state: Any,
    params: Any,
    distinct: np.ndarray,
    rows: np.ndarray,
    active: np.ndarray,
    sampling: TurnSampling,
  ) -> Any:
    """The first turn of rows that share contexts (a GRPO group's prompt): tunix's prefill
    of each of the `distinct` contexts `[U, W]` once, its KV cache handed to every row
    holding it (row b holds `distinct[rows[b]]`), then every row's last context slot fed
    again (`extend`, the cache's own continuation) to sample that row's first token with
    its own key, as the prefill of all rows would."""
    batch, width = len(rows), distinct.shape[1]
    once = compat.set_up_turn(
      self._fresh(distinct, sampling),
      np.ones(len(distinct), bool),
      width,
      sampling.max_tokens,
      prefill_width=width,
    )
    once = self.sampler.prefill(params, once)
    cache = compat.cache_rows(once, jnp.asarray(rows))
    state = compat.with_buffers(state, compat.buffered_tokens(state), cache)
    state = compat.set_up_turn(state, active, width, sampling.max_tokens, seed=sampling.seed)
    last = distinct[rows, -1:]
    start = width - 1
    return self.sampler.extend(
      params,
      state,
      jnp.asarray(last),
      jnp.ones(last.shape, bool),
      jnp.asarray(start, jnp.int32),
      jnp.full(batch, start, jnp.int32),
    )

  def _extend(
    self, blocks: list[np.ndarray], active: np.ndarray, sampling: TurnSampling, width: int
  ) -> int:
    """Prefills each row's new ids (left-padded to `width`) at the next free slot and
    decodes; returns the first generated slot."""
    sampler, pad = self.sampler, self.sampler.tokenizer.pad_id()
    start = self._next_slot
    padded = np.stack([generate_utils.pad_to_length(b, width, pad, left=True) for b in blocks])
    real = np.arange(width)[None, :] >= width - np.array([len(b) for b in blocks])[:, None]
    state = compat.set_up_turn(
      self._state, active, start + width, sampling.max_tokens, seed=sampling.seed
    )
    _, params = sampler.model_def_and_state()
    state = sampler.extend(
      params,
      state,
      jnp.asarray(padded),
      jnp.asarray(real),
      jnp.asarray(start, jnp.int32),
      jnp.asarray(self._hole_from),
    )
    self._state = sampler.decode(params, state, sampling.max_tokens)
    self._cached = [
      c if not live else np.concatenate([c, b])
      for c, b, live in zip(self._cached, blocks, active, strict=True)
    ]
    return start + width

  def _read(
    self,
    contexts: list[np.ndarray],
    active: np.ndarray,
    sampling: TurnSampling,
    first: int,
    reencoded: bool,
    width: int,
  ) -> TurnOutput:
    """The turn's samples per row, and the bookkeeping for the next turn: the cache keeps
    every sampled token but the last (fed again next turn), the rest becomes a hole."""
    tokens_buffer, last_step, logps_buffer = compat.turn_buffers(
      self._state, sampling.return_logprobs
    )
    eos = self.sampler.tokenizer.eos_id()
    tokens, logprobs, hole_from = [], [], np.full(len(contexts), first, np.int32)
    for row, live in enumerate(active):
      sampled = tokens_buffer[row, first : first + sampling.max_tokens]
      stops = np.flatnonzero(sampled == eos)
      n = int(stops[0]) if len(stops) else len(sampled)  # tokens before the EOS
      tokens.append(sampled[:n])
      if logps_buffer is not None:
        logprobs.append(logps_buffer[row, first : first + n].tolist())
      if live:
        kept = _kept(sampled[: min(n + 1, len(sampled))], self.sampler.tokenizer.pad_id())
        hole_from[row] = first + kept
        self._cached[row] = np.concatenate([self._cached[row], sampled[:kept]])
    self._hole_from, self._next_slot, self._tokens = hole_from, last_step, tokens_buffer
    return TurnOutput(tokens, logprobs if logps_buffer is not None else None, reencoded, width)
