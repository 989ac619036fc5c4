"""Mask-aware model passes: attention mask kept apart from the loss mask, tunix parity."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.models.qwen3 import model as qwen3
from tunix.rl import common as tunix_common
from tunix.rl import utils as tunix_rl_utils

import tunix_ppo_ext
from tunix_ppo_ext._src.tunix.learner import passes
from tunix_ppo_ext._src.tunix.models.toy_models import tiny_qwen3_config

# tunix_facing: also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.tunix, pytest.mark.tunix_facing]

VOCAB = 32
PAD = 0
EOS = 1


class ScoreModel(nnx.Module):
  """A Qwen3 backbone with a scalar head: `[B, L] -> [B, L, 1]`."""

  def __init__(self, config: qwen3.ModelConfig, rngs: nnx.Rngs):
    self.backbone = qwen3.Qwen3(config, rngs=rngs)
    self.head = nnx.Linear(VOCAB, 1, rngs=rngs)

  def __call__(self, input_tokens, positions, cache, attention_mask, segment_ids=None):
    logits, _ = self.backbone(input_tokens, positions, cache, attention_mask)
    return self.head(logits)


@pytest.fixture(scope="module")
def config():
  return tiny_qwen3_config(
    VOCAB, embed_dim=16, hidden_dim=32, num_heads=2, head_dim=8, num_kv_heads=1
  )


@pytest.fixture(scope="module")
def model(config):
  return qwen3.Qwen3(config, rngs=nnx.Rngs(0))


def trajectory(seed=0, b=3, p=4, t=10):
  """Left-padded prompts, completions with interior EOS/observation tokens and right padding."""
  rng = np.random.default_rng(seed)
  prompt = rng.integers(2, VOCAB, size=(b, p))
  prompt[0, :2] = PAD  # left padding
  completion = rng.integers(2, VOCAB, size=(b, t))
  attention = np.ones((b, t), np.int32)
  attention[0, 7:] = 0
  attention[2, 5:] = 0
  completion[attention == 0] = PAD
  completion[:, 2] = EOS  # end of the first agent turn: an EOS inside the trajectory
  return prompt, completion, attention


def plain_logps(model, prompt, completion, attention, pad_id=PAD):
  """Reference: one forward with mask-built positions, NumPy log-softmax."""
  ids = np.concatenate([prompt, completion], axis=1)
  real = np.concatenate([prompt != pad_id, attention.astype(bool)], axis=1)
  positions = np.maximum(np.cumsum(real, axis=1) - 1, 0)
  length = ids.shape[1]
  causal = np.tril(np.ones((length, length), bool))
  attn = real[:, None, :] & causal[None]
  logits, _ = model(jnp.asarray(ids), jnp.asarray(positions), None, jnp.asarray(attn))
  logits = np.asarray(logits, np.float64)[:, prompt.shape[1] - 1 : -1]
  logits -= logits.max(-1, keepdims=True)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  logps = np.take_along_axis(log_probs, completion[..., None], axis=-1)[..., 0]
  entropy = -(np.exp(log_probs) * log_probs).sum(-1)
  return logps, entropy


def ours(model, prompt, completion, attention, pad_id=PAD, eos_id=EOS, **kw):
  return passes.compute_per_token_logps(
    model,
    jnp.asarray(prompt),
    jnp.asarray(completion),
    pad_id=pad_id,
    eos_id=eos_id,
    attention_mask=None if attention is None else jnp.asarray(attention),
    **kw,
  )


@pytest.mark.parametrize("chunk_size", [0, 3])
def test_logps_and_entropy_equal_one_plain_forward(model, chunk_size):
  prompt, completion, attention = trajectory()
  logps, entropy = ours(
    model, prompt, completion, attention, return_entropy=True, chunk_size=chunk_size
  )
  ref_logps, ref_entropy = plain_logps(model, prompt, completion, attention)
  real = attention.astype(bool)
  np.testing.assert_allclose(np.asarray(logps)[real], ref_logps[real], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(entropy)[real], ref_entropy[real], rtol=1e-5, atol=1e-5)


def test_eos_equal_to_pad_keeps_interior_eos_attended(model):
  """Tokenizers whose EOS id is the pad id: the given mask keeps the trajectory intact."""
  prompt, completion, attention = trajectory(seed=1)
  completion = np.where(completion == EOS, PAD, completion)  # EOS spelled with the pad id
  logps = ours(model, prompt, completion, attention, eos_id=PAD)
  ref_logps, _ = plain_logps(model, prompt, completion, attention)
  real = attention.astype(bool)
  np.testing.assert_allclose(np.asarray(logps)[real], ref_logps[real], rtol=1e-5, atol=1e-5)
  # tunix derives `completion != pad`: it hides the interior EOS and shifts later positions.
  derived = ours(model, prompt, completion, None, eos_id=PAD)
  after_eos = np.zeros_like(real)
  after_eos[:, 3:] = True
  assert np.max(np.abs(np.asarray(derived) - ref_logps)[real & after_eos]) > 1e-3


def test_environment_tokens_are_attended(model):
  prompt, completion, attention = trajectory(seed=2)
  base = np.asarray(ours(model, prompt, completion, attention))
  changed = completion.copy()
  changed[:, 3] = (changed[:, 3] + 5) % (VOCAB - 2) + 2  # an observation token
  after = np.asarray(ours(model, prompt, changed, attention))
  assert np.all(np.abs(after[1, 4:] - base[1, 4:]) > 0)
  np.testing.assert_array_equal(after[:, :3], base[:, :3])  # earlier tokens unaffected


def test_padding_tokens_change_nothing_at_real_positions(model):
  prompt, completion, attention = trajectory(seed=3)
  base = np.asarray(ours(model, prompt, completion, attention))
  junk_completion = np.where(attention == 0, 17, completion)  # non-pad ids at padding
  after = np.asarray(ours(model, prompt, junk_completion, attention))
  real = attention.astype(bool)
  np.testing.assert_allclose(after[real], base[real], rtol=1e-6, atol=1e-6)


def test_mask_none_reproduces_tunix(model, config):
  prompt, completion, _ = trajectory(seed=4)
  graphdef, state = nnx.split(model)
  theirs = tunix_common.compute_per_token_logps(
    graphdef, state, jnp.asarray(prompt), jnp.asarray(completion), PAD, EOS
  )
  np.testing.assert_allclose(ours(model, prompt, completion, None), theirs, rtol=1e-6, atol=1e-6)

  mine = passes.process_ids(jnp.asarray(prompt), jnp.asarray(completion), PAD, EOS)
  tunix_out = tunix_common.process_ids(jnp.asarray(prompt), jnp.asarray(completion), PAD, EOS)
  for a, b in zip(mine, tunix_out, strict=True):
    np.testing.assert_array_equal(a, b)

  scorer = ScoreModel(config, nnx.Rngs(1))
  kwargs = dict(pad_id=PAD, eos_id=EOS)
  np.testing.assert_allclose(
    passes.compute_score(scorer, jnp.asarray(prompt), jnp.asarray(completion), **kwargs),
    tunix_common.compute_score(scorer, jnp.asarray(prompt), jnp.asarray(completion), PAD, EOS),
    rtol=1e-6,
    atol=1e-6,
  )


@pytest.mark.parametrize("name", ["completion_mask", "attention_mask"])
def test_given_mask_is_used_as_is(model, name):
  prompt, completion, attention = trajectory(seed=5)
  ids, positions, attn, real = tunix_ppo_ext.process_ids(
    jnp.asarray(prompt), jnp.asarray(completion), PAD, EOS, **{name: jnp.asarray(attention)}
  )
  expected_real = np.concatenate([prompt != PAD, attention.astype(bool)], axis=1)
  np.testing.assert_array_equal(real, expected_real.astype(np.int32))
  np.testing.assert_array_equal(positions, np.maximum(np.cumsum(expected_real, 1) - 1, 0))
  np.testing.assert_array_equal(ids, np.concatenate([prompt, completion], axis=1))
  causal = np.tril(np.ones((14, 14), bool))[None] & expected_real[:, None, :]
  np.testing.assert_array_equal(attn, causal)


def test_process_ids_keeps_tunixs_signature_and_its_packed_path():
  theirs = inspect.signature(tunix_common.process_ids).parameters
  ours = inspect.signature(tunix_ppo_ext.process_ids).parameters
  assert list(ours)[: len(theirs)] == list(theirs)
  prompt = jnp.zeros((2, 0), jnp.int32)
  packed = jnp.asarray([[3, 4, 5, 6], [7, 8, 9, PAD]], jnp.int32)
  segments = jnp.asarray([[1, 1, 2, 2], [1, 1, 1, 0]], jnp.int32)
  positions = jnp.asarray([[0, 1, 0, 1], [0, 1, 2, 0]], jnp.int32)
  mine = tunix_ppo_ext.process_ids(prompt, packed, PAD, EOS, segments, positions)
  tunix_out = tunix_common.process_ids(prompt, packed, PAD, EOS, segments, positions)
  for a, b in zip(mine, tunix_out, strict=True):
    assert (a is None and b is None) or np.array_equal(a, b)


@pytest.mark.parametrize("shape", [(1, 3), (2, 4), (4,), (1, 4, 1)])
def test_process_ids_refuses_a_mask_not_shaped_as_the_completion(shape):
  """A mask one token short, of another batch size or rank: one line naming the argument
  and both shapes (before: outputs of disagreeing widths, or JAX's concatenate message)."""
  prompt, completion = jnp.ones((1, 3), jnp.int32), jnp.ones((1, 4), jnp.int32)
  for name in ("completion_mask", "attention_mask"):
    with pytest.raises(ValueError, match=rf"{name} has shape \({shape[0]},.*\(1, 4\)"):
      tunix_ppo_ext.process_ids(prompt, completion, PAD, EOS, **{name: jnp.ones(shape)})


def test_process_ids_refuses_a_mask_beside_segment_ids():
  """tunix's packed path derives its own mask: a mask given with `segment_ids` would be
  ignored, so it is refused."""
  prompt, completion = jnp.zeros((1, 0), jnp.int32), jnp.ones((1, 4), jnp.int32)
  segments = jnp.ones((1, 4), jnp.int32)
  with pytest.raises(ValueError, match="completion_mask is not used with segment_ids"):
    tunix_ppo_ext.process_ids(
      prompt, completion, PAD, EOS, segments, segments, completion_mask=jnp.ones((1, 4))
    )


def test_score_uses_the_attention_mask(config):
  scorer = ScoreModel(config, nnx.Rngs(2))
  prompt, completion, attention = trajectory(seed=6)
  completion = np.where(completion == EOS, PAD, completion)
  with_mask = passes.compute_score(
    scorer,
    jnp.asarray(prompt),
    jnp.asarray(completion),
    pad_id=PAD,
    eos_id=PAD,
    attention_mask=jnp.asarray(attention),
  )
  derived = passes.compute_score(
    scorer, jnp.asarray(prompt), jnp.asarray(completion), pad_id=PAD, eos_id=PAD
  )
  assert with_mask.shape == (3, 14)
  assert np.max(np.abs(np.asarray(with_mask) - np.asarray(derived))[:, 8:]) > 1e-4


@pytest.mark.skipif(
  not hasattr(tunix_rl_utils, "TransformerWithScoreHead"), reason="tunix main's score head"
)
def test_a_score_head_over_a_backbone_without_segment_ids_scores():
  """tunix's `TransformerWithScoreHead` takes `**kwargs` and hands them to its backbone:
  over Gemma3, which takes no `segment_ids`, the critic's pass gives it none (as tunix's
  passes: its backbone decides), where it raised a TypeError."""
  from tunix.models.gemma3 import model as gemma3

  sizes = {"num_layers": 1, "num_embed": VOCAB, "embed_dim": 16, "hidden_dim": 32}
  heads = {"num_heads": 2, "head_dim": 8, "num_kv_heads": 1, "sliding_window_size": 4}
  config = gemma3.ModelConfig(**sizes, **heads, param_dtype=jnp.float32)
  backbone = gemma3.Gemma3(config, rngs=nnx.Rngs(0))
  critic = tunix_rl_utils.TransformerWithScoreHead(backbone, rngs=nnx.Rngs(1))
  prompt, completion, _ = trajectory(seed=8)
  scores = passes.compute_score(
    critic, jnp.asarray(prompt), jnp.asarray(completion), pad_id=PAD, eos_id=EOS
  )
  assert scores.shape == (3, 14) and np.all(np.isfinite(np.asarray(scores)))


def test_gradient_flows_only_without_stop_gradient(model):
  prompt, completion, attention = trajectory(seed=7)
  graphdef, state = nnx.split(model)

  def total(state, stop):
    m = nnx.merge(graphdef, state)
    return jnp.sum(ours(m, prompt, completion, attention, stop_gradient=stop))

  grads = jax.grad(total)(state, False)
  assert any(float(jnp.abs(g).sum()) > 0 for g in jax.tree.leaves(grads))
  frozen = jax.grad(total)(state, True)
  assert all(float(jnp.abs(g).sum()) == 0 for g in jax.tree.leaves(frozen))
