"""A model of each family, batches and training examples for the training-pass tests, and a
tolerance check on pytrees.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from tests.helpers.hf_fixtures import hf_config
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.learner.ppo_learner import TrainExample
from tunix_ppo_ext._src.tunix.models import hf_models

PAD, EOS = 0, 1


def family_model(family: str) -> nnx.Module:
  """A random tiny tunix model of `family` (float32): Qwen2 and Gemma 3 tied, Qwen3 and
  Llama 3 with an `lm_head`."""
  hf = hf_config(family).to_dict()
  config = hf_models.tunix_config(hf)
  return compat.use_rope_frequencies(hf_models.family_of(hf).model_class(config, rngs=nnx.Rngs(0)))


def batch(vocab: int, b: int = 2, p: int = 3, t: int = 7):
  rng = np.random.default_rng(1)
  prompt = rng.integers(2, vocab, (b, p))
  completion = rng.integers(2, vocab, (b, t))
  attention = np.ones((b, t), np.int32)
  attention[1, 5:] = 0
  completion[attention == 0] = PAD
  return jnp.asarray(prompt), jnp.asarray(completion), jnp.asarray(attention)


def assert_trees_close(a, b, atol, rtol=1e-7):
  flat_a, flat_b = nnx.to_flat_state(a), nnx.to_flat_state(b)
  assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
  for (path, x), (_, y) in zip(flat_a, flat_b, strict=True):
    np.testing.assert_allclose(
      np.asarray(x[...]), np.asarray(y[...]), atol=atol, rtol=rtol, err_msg=path
    )


def example(vocab: int) -> TrainExample:
  prompt, completion, attention = batch(vocab)
  rng = np.random.default_rng(2)
  mask = attention.astype(jnp.float32).at[:, 0].set(0.0)  # an observation token
  shape = completion.shape
  return TrainExample(
    prompt_ids=prompt,
    prompt_mask=jnp.ones_like(prompt),
    completion_ids=completion,
    completion_mask=mask,
    ref_per_token_logps=jnp.asarray(rng.normal(-3.0, 0.3, shape), jnp.float32),
    advantages=jnp.asarray(rng.normal(0, 1, shape), jnp.float32),
    returns=jnp.zeros(shape),
    old_per_token_logps=jnp.asarray(rng.normal(-3.0, 0.3, shape), jnp.float32),
    old_values=jnp.zeros(shape),
    attention_mask=attention,
    loss_mask=mask,
  )
