"""Llama 3 and Qwen3 checkpoints with the RoPE tunix 0.1.7 ignores (its attention always
rotates with theta 1e6, unscaled): loaded here with the checkpoint's own frequencies
(`compat.use_rope_frequencies`), their logits equal `transformers`' to 1e-4."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers.hf_fixtures import hf_config, hf_logits, write_checkpoint
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.models import hf_models, toy_models

pytestmark = pytest.mark.tunix

pytest.importorskip("torch")

# positions up to 40, past the tiny `original_max_position_embeddings` (16), so every band
# of the llama3 scaling (kept, interpolated, divided) is exercised
TOKENS = np.random.default_rng(3).integers(0, 24, size=(2, 40))
LLAMA31 = {  # Llama 3.1's published scaling, at a context the tiny model reaches
  "rope_type": "llama3",
  "rope_theta": 500_000.0,
  "factor": 8.0,
  "low_freq_factor": 1.0,
  "high_freq_factor": 4.0,
  "original_max_position_embeddings": 16,
}
CASES = {
  "llama3-theta-5e5": ("llama", {"rope_type": "default", "rope_theta": 500_000.0}),
  "llama3.1-scaling": ("llama", LLAMA31),
  "smollm2-theta-1e5": ("llama", {"rope_type": "default", "rope_theta": 100_000.0}),
  "llama-linear": ("llama", {"rope_type": "linear", "rope_theta": 10_000.0, "factor": 4.0}),
  "qwen3-theta-5e6": ("qwen3", {"rope_type": "default", "rope_theta": 5_000_000.0}),
}


def _write(directory, family, rope, sharp=8.0):
  """A tiny random checkpoint whose query/key projections are scaled by `sharp`: with
  `transformers`' small init the attention is nearly uniform, and the rotation barely
  shows in the logits."""
  import torch

  write_checkpoint(directory, family, head_dim=32, rope_parameters=rope)
  model = transformers_model(directory)
  with torch.no_grad():
    for name, param in model.named_parameters():
      if name.endswith(("q_proj.weight", "k_proj.weight")):
        param.mul_(sharp)
  model.save_pretrained(directory)
  return directory


def transformers_model(directory):
  import torch
  import transformers

  return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)


@nnx.jit
def _logits(model, tokens):
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  return model(tokens, positions, None, toy_models.causal_mask(*tokens.shape))[0]


@pytest.mark.parametrize("case", list(CASES))
def test_rope_of_the_checkpoint_matches_transformers(case, tmp_path):
  family, rope = CASES[case]
  # head_dim 32: 16 frequencies, so the llama3 bands each hold several
  _write(tmp_path, family, rope)
  model = hf_models.load_checkpoint(tmp_path)
  assert all(type(layer.attn).__name__.startswith("ConfiguredRope") for layer in model.layers)
  logits = np.asarray(_logits(model, jnp.asarray(TOKENS)))
  np.testing.assert_allclose(logits, hf_logits(tmp_path, TOKENS), atol=1e-4, rtol=0)


def test_without_the_seam_tunix_would_rotate_with_1e6(tmp_path):
  """The seam is what makes the difference: the same weights under tunix's own attention
  (theta 1e6) give other logits."""
  _write(tmp_path, "llama", CASES["llama3-theta-5e5"][1])
  model = hf_models.load_checkpoint(tmp_path)
  for layer in model.layers:
    layer.attn.__class__ = type(layer.attn).__mro__[1]  # back to tunix's Attention
  logits = np.asarray(_logits(model, jnp.asarray(TOKENS)))
  assert np.abs(logits - hf_logits(tmp_path, TOKENS)).max() > 1e-2


def test_frequencies_are_transformers_own():
  """`rope_frequencies` against `transformers`' `ROPE_INIT_FUNCTIONS` (the function its
  models call), for each supported type."""
  import transformers.modeling_rope_utils as rope_utils

  for name, (family, rope) in CASES.items():
    config = hf_config(family, head_dim=32, rope_parameters=rope)
    expected = _transformers_inv_freq(rope_utils, config, rope["rope_type"])
    ours = hf_models.rope_frequencies(config.to_dict())
    np.testing.assert_allclose(ours, expected, rtol=1e-6, err_msg=name)


def _transformers_inv_freq(rope_utils, config, kind):
  if kind == "default":
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding.compute_default_rope_parameters(config)[0].numpy()
  return rope_utils.ROPE_INIT_FUNCTIONS[kind](config, "cpu")[0].numpy()


def test_rotate_is_the_rotary_embedding_of_transformers():
  import torch
  from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

  rng = np.random.default_rng(0)
  x = rng.normal(size=(1, 5, 2, 8)).astype(np.float32)  # [B, L, heads, head_dim]
  inv = 1.0 / 1e4 ** (np.arange(0, 8, 2) / 8)
  positions = np.arange(5)[None]
  angle = positions[..., None] * inv
  emb = np.concatenate([angle, angle], -1)
  cos, sin = torch.tensor(np.cos(emb), dtype=torch.float32), torch.tensor(np.sin(emb))
  xt = torch.tensor(x).transpose(1, 2)  # transformers: [B, heads, L, head_dim]
  expected = apply_rotary_pos_emb(xt, xt, cos.float(), sin.float())[0].transpose(1, 2).numpy()
  ours = np.asarray(compat.rotate(jnp.asarray(x), jnp.asarray(positions), inv))
  np.testing.assert_allclose(ours, expected, atol=1e-6)


def test_a_llama3_scaling_without_its_keys_is_refused_naming_the_key():
  config = hf_config("llama").to_dict()
  config["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}
  with pytest.raises(ValueError, match="rope_type 'llama3' needs 'low_freq_factor'") as caught:
    hf_models.tunix_config(config)
  assert "\n" not in str(caught.value)
