"""ContinuingSampler on a real toy Qwen3 (float32): multi-turn sampling that continues from
the KV cache samples what a full-history forward pass (no cache) gives, and greedy
continuation samples the same tokens as re-encoding the history every turn."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx
from tunix.generate import sampler as sampler_lib

from tests.helpers.attention import value_shapes
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.tunix.models import toy_models
from tunix_ppo_ext._src.tunix.rollout.continuing_sampler import (
  ContinuingSampler,
  TurnSampling,
)

# tunix_facing: also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.tunix, pytest.mark.tunix_facing]

PAD, EOS = 0, 2
G, TURNS, ROWS = 4, 5, 12
ALPHABET = "abcdefghijklmnopqrstuvwx"
CACHE = 44  # room for about four continued turns, then a compaction


@pytest.fixture(scope="module")
def world():
  """`(policy, sampler)`: a float32 toy Qwen3 and one `ContinuingSampler` on it (its
  compilations shared by the tests)."""
  tokenizer = CharTokenizer(ALPHABET, pad_id=PAD, eos_id=EOS)  # 27 ids: EOS ends some turns
  config = toy_models.tiny_qwen3_config(tokenizer.vocab_size, num_layers=2, embed_dim=32)
  policy = toy_models.make_policy(config, seed=3)
  cache = sampler_lib.CacheConfig(CACHE, config.num_layers, config.num_kv_heads, config.head_dim)
  return policy, ContinuingSampler(policy, tokenizer, cache)


def play(sampler, continued, sampling, fresh_width=8, seed=0, group=1):
  """`TURNS` turns of `ROWS` rows; each turn's context is the last one, the sampled ids,
  EOS if the turn ended on one, and 1-4 random observation ids. Row 0 stops after turn 2.
  Consecutive `group` rows start from the same context (a GRPO group's prompt).

  Returns `(contexts, samples, outputs, conversation)`: every row's final context (the
  last turn's samples included), per row `(index in the context, ids, log-probs)` of each
  turn's samples, and each turn's `TurnOutput`."""
  rng = np.random.default_rng(seed)
  ids = np.arange(3, 27)
  prompts = [[1, *rng.choice(ids, int(rng.integers(2, 7))).tolist()] for _ in range(ROWS)]
  contexts = [list(prompts[row // group]) for row in range(ROWS)]
  samples = [[] for _ in range(ROWS)]
  active = np.ones(ROWS, bool)
  conversation, outputs = sampler.conversation(continued), []
  for turn in range(TURNS):
    if turn == 2:
      active[0] = False
    turn_sampling = dataclasses.replace(sampling, seed=sampling.seed + turn)
    out = conversation.turn(contexts, active, turn_sampling, fresh_width)
    outputs.append(out)
    for row in np.flatnonzero(active):
      agent = out.tokens[row].tolist()
      samples[row].append((len(contexts[row]), agent, out.logprobs and out.logprobs[row]))
      contexts[row] += agent + [EOS] * (len(agent) < G)
      if turn < TURNS - 1:
        contexts[row] += rng.choice(ids, int(rng.integers(1, 5))).tolist()
  return contexts, samples, outputs, conversation


def full_history_logps(policy, contexts):
  """`[rows, L, V]` log-softmax of the model's logits on each whole context at once (no
  cache; contexts right-padded, which the causal mask keeps from earlier positions)."""
  n = max(len(c) for c in contexts)
  tokens = np.array([c + [PAD] * (n - len(c)) for c in contexts], np.int32)
  positions = np.broadcast_to(np.arange(n, dtype=np.int32), tokens.shape)
  mask = np.broadcast_to(np.tril(np.ones((n, n), bool)), (len(contexts), n, n))
  graphdef, state = nnx.split(policy)
  logits = jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a, None, mask)[0])(
    state, tokens, positions
  )
  return np.asarray(jax.nn.log_softmax(logits.astype(np.float32), axis=-1))


def replay_logps(policy, contexts, samples):
  """`(sampler, reference)` log-probs of every sampled token (sampled pad ids included: the
  sampler attends to them, as the full forward does), and how many are the reference argmax."""
  got, want, argmax = [], [], 0
  references = full_history_logps(policy, contexts)
  for reference, row_samples in zip(references, samples, strict=True):
    for start, agent, logps in row_samples:
      for i, token in enumerate(agent):
        got.append(logps[i])
        want.append(reference[start + i - 1, token])
        argmax += int(reference[start + i - 1].argmax() == token)
  return np.array(got), np.array(want), argmax


@pytest.mark.parametrize("group", [1, 4])
def test_continued_turns_sample_from_the_full_history(world, group):
  """Temperature 1: each sampled token's log-prob equals the full-history forward pass's
  to 1e-5 (float32), on continued turns and after the full cache was compacted; with rows
  in groups of 4 sharing their prompt, its prefill runs once per group."""
  policy, sampler = world
  sampling = TurnSampling(max_tokens=G, temperature=1.0, top_p=1.0, seed=5, return_logprobs=True)
  contexts, samples, outputs, conversation = play(sampler, True, sampling, group=group)
  got, want, _ = replay_logps(policy, contexts, samples)
  print(
    f"{len(got)} tokens, compactions {conversation.compactions}, "
    f"max |diff| {np.abs(got - want).max():.2e}"
  )
  assert len(got) >= ROWS * TURNS
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  ended = sum(len(o.tokens[r]) < G for o in outputs for r in range(ROWS))
  assert 0 < ended < ROWS * TURNS  # turns ended by EOS and cut at G both occur
  assert [o.reencoded for o in outputs] == [True] + [False] * (TURNS - 1)
  assert conversation.reencodes == 1 and conversation.compactions >= 1


def test_greedy_continuation_samples_what_reencoding_samples(world):
  policy, sampler = world
  sampling = TurnSampling(max_tokens=G, temperature=0.0, top_p=None, return_logprobs=True)
  runs = {
    continued: play(sampler, continued, sampling, 8 if continued else 40)
    for continued in (True, False)
  }
  assert runs[True][3].reencodes == 1 and runs[False][3].reencodes == TURNS
  assert runs[True][3].compactions >= 1
  assert runs[True][0] == runs[False][0]  # the same contexts, token for token
  got, want, argmax = replay_logps(policy, runs[True][0], runs[True][1])
  assert argmax == len(got)  # every sampled id is the full-history argmax
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  for new, old in zip(runs[True][1], runs[False][1], strict=True):  # per row, per turn
    for (start, ids, logps), (old_start, old_ids, old_logps) in zip(new, old, strict=True):
      assert (start, ids) == (old_start, old_ids)
      np.testing.assert_allclose(logps, old_logps, atol=1e-5, rtol=0)


def test_a_shared_prompt_is_prefilled_once_and_each_row_draws_its_own_tokens(world):
  """Rows in groups of 4 with one prompt each, temperature 1: the first turn, whose prompt
  is prefilled once per group, samples token for token (and log-prob for log-prob) what the
  re-encoding path's prefill of every row samples with the same key; rows of one group do
  not all draw the same tokens."""
  _, sampler = world
  sampling = TurnSampling(max_tokens=G, temperature=1.0, top_p=1.0, seed=7, return_logprobs=True)
  rng = np.random.default_rng(3)
  prompts = [[1, *rng.choice(np.arange(3, 27), 5).tolist()] for _ in range(ROWS // 4)]
  contexts = [prompts[row // 4] for row in range(ROWS)]
  turns = {
    continued: sampler.conversation(continued).turn(contexts, [True] * ROWS, sampling, 8)
    for continued in (True, False)
  }
  for new, old in zip(turns[True].tokens, turns[False].tokens, strict=True):
    assert new.tolist() == old.tolist()
  np.testing.assert_allclose(
    np.concatenate(turns[True].logprobs), np.concatenate(turns[False].logprobs), atol=1e-5
  )
  groups = [{tuple(turns[True].tokens[r]) for r in range(g, g + 4)} for g in range(0, ROWS, 4)]
  assert max(len(drawn) for drawn in groups) > 1


def test_reencoded_turns_attend_to_the_pad_ids_the_agent_sampled(world):
  """Temperature 1, every turn re-encoded (`kv_cache: reencode`): a pad id the agent sampled
  in an earlier turn is attended in the re-encoded history, as in the full-history pass
  (tunix's prefill alone masks every pad id): each log-prob equals the full pass's."""
  policy, sampler = world
  sampling = TurnSampling(max_tokens=G, temperature=1.0, top_p=1.0, seed=5, return_logprobs=True)
  contexts, samples, _, conversation = play(sampler, False, sampling, fresh_width=40)
  assert conversation.reencodes == TURNS
  assert any(PAD in ids for row in samples for _, ids, _ in row[:-1])  # then more turns
  got, want, _ = replay_logps(policy, contexts, samples)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_contexts_that_do_not_extend_the_cache_are_reencoded(world):
  _, sampler = world  # the greedy test's batch shape: no new compilation
  sampling = TurnSampling(max_tokens=G, temperature=0.0, top_p=None, return_logprobs=True)
  conversation, active = sampler.conversation(), [True] * ROWS
  contexts = [[1, 5, 6, 7]] + [[1, 8]] * (ROWS - 1)
  first = conversation.turn(contexts, active, sampling, fresh_width=8)
  grown = [c + first.tokens[r].tolist() + [EOS, 9] for r, c in enumerate(contexts)]
  assert not conversation.turn(grown, active, sampling, fresh_width=8).reencoded
  edited = [[1, 5, 6, 9, 9]] + [c + [10] for c in grown[1:]]  # row 0 no longer extends it
  assert conversation.turn(edited, active, sampling, fresh_width=8).reencoded
  with pytest.raises(ValueError, match="does not fit the rollout KV cache of 44"):
    conversation.turn([[1] * 50] * ROWS, active, sampling, fresh_width=8)


def test_padded_vocabulary_rows_are_never_sampled():
  """A model with more output rows than the tokenizer has ids (a padded vocabulary), whose
  padded rows would win almost every draw: with continued and re-encoded turns alike, no
  sampled id is past the tokenizer's last one."""
  tokenizer = CharTokenizer(ALPHABET, pad_id=PAD, eos_id=EOS)
  known = tokenizer.vocab_size
  config = toy_models.tiny_qwen3_config(known + 5, num_layers=1, embed_dim=16)
  policy = toy_models.make_policy(config, seed=0)
  rng = np.random.default_rng(0)
  head = np.zeros((16, known + 5), np.float32)  # every real id's logit 0 ...
  head[:, known:] = 50 * rng.standard_normal((16, 5))  # ... a padded one far above it
  policy.lm_head.w[...] = jax.numpy.asarray(head)
  cache = sampler_lib.CacheConfig(CACHE, config.num_layers, config.num_kv_heads, config.head_dim)
  sampler = ContinuingSampler(policy, tokenizer, cache)
  assert sampler.unused_ids == tuple(range(known, known + 5))
  logits = policy(jax.numpy.asarray([[1, 3, 4]]), jax.numpy.arange(3)[None], None, None)[0]
  assert int(np.argmax(logits[0, -1])) >= known  # unmasked, a padded id would be drawn
  sampling = TurnSampling(max_tokens=G, temperature=1.0, top_p=1.0, seed=1)
  for continued in (True, False):
    _, samples, _, _ = play(sampler, continued, sampling)
    drawn = [t for row in samples for _, ids, _ in row for t in ids]
    assert drawn and max(drawn) < known, continued


def test_a_block_s_head_runs_on_its_last_slot_only(world):
  """The turn's block prefill (`_extend_fn`) asks the LM head for the block's last slot only,
  the one it samples from: no `[B, W, V]` logits appear in its program, only `[B, 1, V]`
  (the head's product over a whole block cost up to a fifth of the block's pass)."""
  policy, sampler = world
  rows, width, vocab = 3, 5, policy.config.vocab_size
  conversation = sampler.conversation()
  conversation.turn([[1, 3, 4]] * rows, [True] * rows, TurnSampling(max_tokens=2), 4)
  state = conversation._state
  graphdef, params = nnx.split(policy)
  del graphdef
  blocks = np.full((rows, width), 5, np.int32)
  real = np.ones((rows, width), bool)
  start = np.int32(conversation._next_slot)
  jaxpr = jax.make_jaxpr(sampler._extend_fn)(
    params, state, blocks, real, start, np.zeros(rows, np.int32)
  )
  shapes = set(value_shapes(jaxpr.jaxpr))
  assert (rows, 1, vocab) in shapes
  assert (rows, width, vocab) not in shapes
