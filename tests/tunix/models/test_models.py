"""The built-in tokenizer, the toy Qwen3 policy / value model, and a stock tunix PPO run."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.generate import tokenizer_adapter
from tunix.rl import common as tunix_common
from tunix.rl.ppo import ppo_learner

from tests.helpers.clusters import param_leaf
from tests.helpers.toy_data import echo_answer_reward, iterate_forever, make_prompts_dataset
from tunix_ppo_ext._src.data.char_tokenizer import DEFAULT_ALPHABET, CharTokenizer
from tunix_ppo_ext._src.tunix.cluster.cluster_setup import build_cluster, make_models
from tunix_ppo_ext._src.tunix.models import toy_models
from tunix_ppo_ext.models import ClusterSpec

# tunix_facing: also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.tunix, pytest.mark.tunix_facing]

# ----- tokenizer -----


def test_tokenizer_round_trips_the_whole_alphabet():
  tok = CharTokenizer()
  ids = tok.encode(DEFAULT_ALPHABET)
  assert len(ids) == len(DEFAULT_ALPHABET)
  assert tok.decode(ids) == DEFAULT_ALPHABET
  assert tok.decode(tok.encode("say hi: 42!")) == "say hi: 42!"
  assert set(ids).isdisjoint({tok.pad_id(), tok.bos_id(), tok.eos_id()})
  assert sorted(ids + [tok.pad_id(), tok.bos_id(), tok.eos_id()]) == list(range(tok.vocab_size))
  assert tok.vocab_size <= 128


def test_tokenizer_special_ids_and_flags():
  tok = CharTokenizer()
  assert (tok.pad_id(), tok.bos_id(), tok.eos_id()) == (0, 1, 2)
  ids = tok.encode("ab", add_bos=True, add_eos=True)
  assert ids[0] == tok.bos_id() and ids[-1] == tok.eos_id() and len(ids) == 4
  assert tok.decode(ids) == "ab"
  assert tok.decode(ids, skip_special_tokens=False) == "<bos>ab<eos>"
  assert tok.decode([*tok.encode("a"), tok.pad_id(), 10_000]) == "a"


def test_tokenizer_eos_can_equal_pad():
  tok = CharTokenizer(pad_id=0, eos_id=0, bos_id=1)
  assert tok.eos_id() == tok.pad_id() == 0
  assert tok.vocab_size == len(DEFAULT_ALPHABET) + 2
  assert tok.decode(tok.encode("x y")) == "x y"
  assert tok.decode([tok.eos_id()], skip_special_tokens=False) == "<eos/pad>"


def test_tokenizer_is_deterministic_and_validates():
  assert CharTokenizer(eos_id=5).encode("hello") == CharTokenizer(eos_id=5).encode("hello")
  with pytest.raises(ValueError, match="not in the alphabet"):
    CharTokenizer().encode("héllo")
  with pytest.raises(ValueError, match="bos_id"):
    CharTokenizer(bos_id=0, pad_id=3)
  with pytest.raises(ValueError, match="special ids"):
    CharTokenizer(eos_id=1000)


def test_tokenizer_through_tunix_adapter():
  tok = CharTokenizer(pad_id=0, eos_id=0, bos_id=1)
  adapter = tokenizer_adapter.TokenizerAdapter(tok)
  assert adapter._tokenizer_type == tokenizer_adapter.TokenizerType.NONE
  assert adapter.encode("abc") == tok.encode("abc")
  assert adapter.decode(tok.encode("abc")) == "abc"
  assert (adapter.bos_id(), adapter.eos_id(), adapter.pad_id()) == (1, 0, 0)
  assert adapter.dedup_bos_ids([1, 1, *tok.encode("a")]) == [1, *tok.encode("a")]
  assert adapter.vocab_size == tok.vocab_size  # delegated attribute


# ----- models -----


@pytest.fixture(scope="module")
def tok():
  return CharTokenizer()


@pytest.fixture(scope="module")
def config(tok):
  return toy_models.tiny_qwen3_config(tok.vocab_size, num_layers=1, embed_dim=32, head_dim=8)


def _positions(tokens):
  return jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)


@nnx.jit
def _forward(model, tokens):
  """`model` on unpadded `tokens` with a causal mask (jitted: eager Qwen3 is slow on CPU)."""
  return model(tokens, _positions(tokens), None, toy_models.causal_mask(*tokens.shape))


def test_policy_is_deterministic_qwen3(config):
  tokens = jnp.array([[1, 5, 6, 7]])
  a, b = toy_models.make_policy(config, 3), toy_models.make_policy(config, 3)
  logits_a, cache = _forward(a, tokens)
  logits_b, _ = _forward(b, tokens)
  assert logits_a.shape == (1, 4, config.vocab_size) and cache is None
  np.testing.assert_array_equal(logits_a, logits_b)
  assert jax.tree.leaves(nnx.state(a))[0].dtype == jnp.float32


def test_value_model_shape_and_causality(config):
  critic = toy_models.make_critic(config, seed=0)
  tokens = jnp.array([[1, 5, 6, 7, 8], [1, 9, 10, 11, 12]])
  scores = _forward(critic, tokens)
  assert scores.shape == (2, 5, 1) and scores.dtype == jnp.float32
  no_mask = nnx.jit(lambda model, t: model(t, _positions(t)))  # defaults to a causal mask
  np.testing.assert_allclose(no_mask(critic, tokens), scores, rtol=1e-6)
  changed = _forward(critic, tokens.at[:, -1].set(20))
  np.testing.assert_allclose(changed[:, :-1], scores[:, :-1], rtol=1e-5, atol=1e-6)
  assert not np.allclose(changed[:, -1], scores[:, -1])


def test_value_model_through_compute_score(tok, config):
  critic = toy_models.make_critic(config, seed=0)
  pad = tok.pad_id()
  prompt = jnp.array([[pad, pad, 1, 5, 6], [1, 7, 8, 9, 10]])
  completion = jnp.array([[11, 12, 13, pad], [14, 15, pad, pad]])
  scores = tunix_common.compute_score(critic, prompt, completion, pad, tok.eos_id())
  assert scores.shape == (2, 9)
  # Left padding is masked out and positions restart at the first real token.
  unpadded = jnp.array([[1, 5, 6, 11, 12, 13]])
  direct = _forward(critic, unpadded)[..., 0]
  np.testing.assert_allclose(scores[0, 2:8], direct[0], rtol=1e-4, atol=1e-5)


def test_critic_from_policy_copies_the_backbone(config):
  policy = toy_models.make_policy(config, seed=0)
  critic = toy_models.critic_from_policy(policy, seed=1)
  np.testing.assert_array_equal(
    critic.backbone.embedder.input_embedding[...], policy.embedder.input_embedding[...]
  )
  np.testing.assert_array_equal(
    critic.backbone.layers[0].mlp.up_proj.kernel[...], policy.layers[0].mlp.up_proj.kernel[...]
  )
  assert not hasattr(critic.backbone, "lm_head")
  fresh = toy_models.make_critic(config, seed=1).backbone.embedder.input_embedding[...]
  assert not np.allclose(fresh, policy.embedder.input_embedding[...])
  reference = toy_models.copy_model(policy)
  ref_emb, policy_emb = reference.embedder.input_embedding, policy.embedder.input_embedding
  assert ref_emb.get_value() is not policy_emb.get_value()  # copied, not shared
  np.testing.assert_array_equal(reference.lm_head.w[...], policy.lm_head.w[...])


def test_a_zero_value_head_starts_every_value_at_zero_and_still_learns(config):
  policy = toy_models.make_policy(config, seed=0)
  tokens = jnp.asarray([[3, 5, 7, 2]])
  positions = jnp.arange(4)[None]
  critic = toy_models.critic_from_policy(policy, seed=1, head_init="zero")
  np.testing.assert_array_equal(critic(tokens, positions), 0.0)
  normal = toy_models.critic_from_policy(policy, seed=1)
  assert np.all(np.asarray(normal(tokens, positions)) != 0.0)

  def loss(model):
    return jnp.mean((model(tokens, positions) - 1.0) ** 2)

  grads = nnx.grad(loss)(critic)
  assert np.any(np.asarray(grads.value_head.kernel[...]) != 0.0)  # the head moves first
  with pytest.raises(ValueError, match="head_init='uniform'"):
    toy_models.critic_from_policy(policy, seed=1, head_init="uniform")


# ----- end to end: stock tunix PPOLearner on the harness cluster -----


@pytest.mark.parametrize("eos_equals_pad", [False, True], ids=["eos!=pad", "eos==pad"])
def test_stock_ppo_learner_two_steps(tmp_path, eos_equals_pad):
  tokenizer = CharTokenizer(eos_id=0) if eos_equals_pad else CharTokenizer()
  policy, critic, reference = make_models(tokenizer, seed=0)
  actor_before, critic_before = param_leaf(policy), param_leaf(critic.backbone)
  ref_before = param_leaf(reference)
  cluster = build_cluster(
    policy,
    critic,
    tokenizer,
    ClusterSpec(max_steps=2, batch=4, max_prompt_length=8, max_tokens_to_generate=6, lr=1e-2),
    reference=reference,
    checkpoint_dir=str(tmp_path / "ckpt"),
    metrics_dir=str(tmp_path / "metrics"),
  )
  assert cluster.actor_trainer.model is policy
  learner = ppo_learner.PPOLearner(cluster, ppo_learner.PPOConfig(), reward_fns=echo_answer_reward)
  learner.train(iterate_forever(make_prompts_dataset(num_batches=2, batch=4)))

  assert cluster.actor_trainer.train_steps == 2 and cluster.global_steps == 2
  assert not np.allclose(param_leaf(policy), actor_before)
  assert not np.allclose(param_leaf(cluster.critic_trainer.model.backbone), critic_before)
  np.testing.assert_array_equal(
    param_leaf(cluster.inference_worker.get_model("reference")), ref_before
  )
  metrics = cluster._rl_metrics_logger
  assert len(metrics.get_metric_history("rewards", "score/mean", "train")) == 2
  assert np.isfinite(metrics.get_metric_history("actor", "loss", "train")).all()
  assert np.isfinite(metrics.get_metric_history("critic", "loss", "train")).all()
  assert os.listdir(tmp_path / "metrics")
  assert sorted(os.listdir(tmp_path / "ckpt")) == ["actor", "critic"]
