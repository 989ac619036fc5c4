"""tunix's sampler stores the prompt width of its sampling state (`num_input_tokens`, pytree
metadata) as a JAX array. jit then compares arrays while it looks its caches up, which fails
inside a trace, so a later jitted program in the same process stops (the suite's
order-dependent failure). `compat.keep_prompt_width_static` makes the width an int on the
states tunix's vanilla engine builds under our learner."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.generate import sampler as sampler_lib
from tunix.tests import test_common as tc

from tests.helpers.learner import make_cluster
from tunix_ppo_ext._src.tunix import compat

# tunix_facing: also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.tunix, pytest.mark.tunix_facing]

IDS = jnp.asarray([[0, 5, 6, 7], [8, 9, 10, 11]], jnp.int32)


def _sampler() -> sampler_lib.Sampler:
  vocab = tc.MockVocab()
  model = tc.ToyTransformer(
    config=tc.ModelConfig(vocab_size=vocab.GetPieceSize()), rngs=nnx.Rngs(0)
  )
  cache = sampler_lib.CacheConfig(cache_size=32, num_layers=4, num_kv_heads=4, head_dim=16)
  return sampler_lib.Sampler(model, vocab, cache)


def _state(sampler: sampler_lib.Sampler):
  return sampler.init_sample_state(
    IDS, total_sampling_steps=8, include_logits=False, forbidden_token_ids=None,
    temperature=1.0, top_p=1.0, top_k=None, seed=jax.random.PRNGKey(0), beam_size=None,
    include_logprobs=False,
  )  # fmt: skip


def _traced_lookup(sampler: sampler_lib.Sampler) -> None:
  """A jitted program of the sampling state called twice on the host, then from inside
  another jitted program: the third lookup compares its state's metadata with the cached
  ones' inside a trace."""
  width = jax.jit(lambda state: state.token_buffer.sum())
  first, second, third = (_state(sampler) for _ in range(3))
  width(first)
  width(second)
  jax.jit(lambda x: width(third) + x)(jnp.int32(1))


def test_tunix_still_stores_the_prompt_width_as_an_array_and_breaks_a_traced_lookup():
  """The upstream fault the workaround exists for: when tunix stores an int, this fails and
  `keep_prompt_width_static` can go."""
  sampler = _sampler()
  assert isinstance(_state(sampler).num_input_tokens, jax.Array)
  with pytest.raises(ValueError, match="equality of metadata fields"):
    _traced_lookup(sampler)


def test_a_kept_sampler_builds_int_widths_samples_the_same_and_traces():
  plain, kept = _sampler(), _sampler()
  compat.keep_prompt_width_static(kept)
  compat.keep_prompt_width_static(kept)  # idempotent: one wrapper
  state = _state(kept)
  assert type(state.num_input_tokens) is int and state.num_input_tokens == IDS.shape[1]
  _traced_lookup(kept)
  prompts = ["abc", "de"]
  args = dict(max_generation_steps=6, temperature=1.0, top_p=1.0, seed=3, echo=False)
  want, got = plain(prompts, **args), kept(prompts, **args)
  assert got.text == want.text
  np.testing.assert_array_equal(np.asarray(got.tokens[0]), np.asarray(want.tokens[0]))


def test_the_learner_keeps_the_vanilla_engine_s_width_static():
  from tunix_ppo_ext import PpoExtConfig, PpoExtLearner

  cluster, _, _ = make_cluster(reward_model=True, eval_temperature=None)
  PpoExtLearner(rl_cluster=cluster, ppo_config=PpoExtConfig(num_iterations=1))
  engine = compat.vanilla_sampler(cluster.rollout)
  assert type(_state(engine).num_input_tokens) is int
