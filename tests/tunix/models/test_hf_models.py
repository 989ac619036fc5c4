"""Hugging Face checkpoints of each family (written offline by `transformers`) as tunix models:
logits equal to `transformers`', the refusals, the value model on each backbone, PPO steps."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx

from tests.helpers.hf_fixtures import (
  FAMILIES,
  hf_hidden,
  hf_logits,
  write_checkpoint,
  write_config_only,
)
from tests.helpers.runs import SMOKE
from tests.helpers.tokenizers import save_byte_level_tokenizer
from tunix_ppo_ext._src.run import job
from tunix_ppo_ext._src.run.run_config import load_run_config, tokenizer_directory
from tunix_ppo_ext._src.tunix.models import hf_models, toy_models

pytestmark = pytest.mark.tunix

pytest.importorskip("torch")

TOKENS = np.array([[1, 5, 23, 7, 8, 3, 12, 0, 9, 22, 4], [2, 2, 17, 6, 11, 19, 21, 1, 13, 14, 15]])
TIED = {"qwen2": True, "qwen3": False, "llama": False, "gemma3": True}


def _positions(tokens):
  return jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)


@nnx.jit
def _logits(model, tokens):
  return model(tokens, _positions(tokens), None, toy_models.causal_mask(*tokens.shape))[0]


@nnx.jit
def _hidden_and_scores(critic, tokens):
  mask = toy_models.causal_mask(*tokens.shape)
  return critic.hidden_states(tokens, _positions(tokens), mask), critic(tokens, _positions(tokens))


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory):
  """`(family, directory)`: a tiny random checkpoint of each family."""
  directory = tmp_path_factory.mktemp(request.param)
  return request.param, write_checkpoint(directory, request.param)


def test_loaded_logits_equal_transformers(checkpoint):
  family, directory = checkpoint
  model = hf_models.load_checkpoint(directory)
  assert type(model) is hf_models.family_of(hf_models.read_hf_config(directory)).model_class
  assert hasattr(model, "lm_head") == (not TIED[family])  # tied embeddings: no lm_head
  logits = np.asarray(_logits(model, jnp.asarray(TOKENS)))
  assert logits.shape == (2, 11, 24) and hf_models.vocab_size(model) == 24
  np.testing.assert_allclose(logits, hf_logits(directory, TOKENS), atol=1e-4, rtol=0)


GEMMA3_LINEAR_ROPE = {  # Gemma 3 4B+: the global layers' RoPE linearly scaled by 8
  "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
}


@pytest.mark.parametrize(
  "family, overrides",
  [("qwen3", {"tie_word_embeddings": True}), ("gemma3", {"rope_parameters": GEMMA3_LINEAR_ROPE})],
  ids=["qwen3-tied", "gemma3-linear-rope"],
)
def test_variants_load_and_match(family, overrides, tmp_path):
  write_checkpoint(tmp_path, family, **overrides)
  model = hf_models.load_checkpoint(tmp_path)
  assert not hasattr(model, "lm_head")
  logits = np.asarray(_logits(model, jnp.asarray(TOKENS)))
  np.testing.assert_allclose(logits, hf_logits(tmp_path, TOKENS), atol=1e-4, rtol=0)


def test_value_model_on_each_backbone_reads_transformers_hidden_state(checkpoint):
  family, directory = checkpoint
  policy = hf_models.load_checkpoint(directory)
  critic = toy_models.critic_from_policy(policy, seed=1)
  assert type(critic.backbone) is type(policy) and not hasattr(critic.backbone, "lm_head")
  hidden, scores = _hidden_and_scores(critic, jnp.asarray(TOKENS))
  np.testing.assert_allclose(hidden, hf_hidden(directory, TOKENS), atol=1e-4, rtol=0)
  assert scores.shape == (2, 11, 1) and np.isfinite(scores).all()
  head = critic.value_head
  expected = np.asarray(hidden) @ np.asarray(head.kernel[...]) + np.asarray(head.bias[...])
  np.testing.assert_allclose(scores, expected, atol=1e-5, rtol=1e-5)
  # the copy is independent of the policy: its buffers are not the policy's
  emb, policy_emb = critic.backbone.embedder.input_embedding, policy.embedder.input_embedding
  assert emb.get_value() is not policy_emb.get_value()


def _run_config(tmp_path: pathlib.Path, checkpoint: pathlib.Path, *overrides: str):
  """The smoke config without its `model.*` sizes (they come from config.json)."""
  data = yaml.safe_load(SMOKE.read_text())
  data.pop("model")
  file = tmp_path / "run.yaml"
  file.write_text(yaml.safe_dump(data))
  out = tmp_path / "run"
  base = [f"model.checkpoint={checkpoint}", f"output_dir={out}", "train.steps=2"]
  fast = ["train.batch_size=4", "train.eval_batches=0", "train.checkpoint_every=10"]
  return load_run_config(str(file), [*base, *fast, *overrides]), out


def _value(model, path):
  """The array of parameter `path` (dotted, e.g. `layers.0.mlp.up_proj.kernel`)."""
  flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  key = tuple(int(p) if p.isdigit() else p for p in path.split("."))
  return flat[key][...]


def _param(model, path):
  return np.asarray(_value(model, path))


@pytest.mark.parametrize("family", FAMILIES)
def test_ppo_steps_train_each_family_through_the_job(family, tmp_path):
  layers = {"num_hidden_layers": 2}  # Gemma's global layer is checked by the logits test
  # qwen2 in bfloat16, as real instruct checkpoints are (GAE's guarded optimizers included)
  bf16 = family == "qwen2"
  if family == "qwen2":  # room for a byte-level tokenizer's ids (and padding)
    layers["vocab_size"] = 288
  directory = write_checkpoint(tmp_path / "ckpt", family, seed=3, bfloat16=bf16, **layers)
  if family == "qwen2":  # a tokenizer in the checkpoint directory is used by default
    save_byte_level_tokenizer(directory)  # byte-level BPE, as Qwen2's own
  run, out = _run_config(tmp_path, directory)
  assert tokenizer_directory(run.model) == (str(directory) if family == "qwen2" else None)
  learner, batches, eval_batches, _ = job.build_run(run, out)
  cluster = learner.rl_cluster
  actor, critic = cluster.actor_trainer.model, cluster.critic_trainer.model
  assert type(actor) is hf_models.family_of(hf_models.read_hf_config(directory)).model_class
  embedding = "embedder.input_embedding"
  before = _param(actor, embedding)
  assert before.dtype == (jnp.bfloat16 if bf16 else np.float32)
  np.testing.assert_array_equal(before, _param(critic, "backbone." + embedding))
  learner.train(batches, eval_ds=eval_batches)
  assert cluster.actor_trainer.train_steps == 2
  assert not np.array_equal(_param(actor, embedding), before)
  np.testing.assert_array_equal(
    _param(cluster.inference_worker.get_model("reference"), embedding), before
  )


# ----- refusals: one line naming the key and the value -----


@pytest.mark.parametrize(
  "family, overrides, message",
  [
    (
      "qwen3",
      {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}},
      "rope_type='yarn' is not supported: the RoPE types supported here are "
      "['default', 'linear', 'llama3']",
    ),
    (
      "llama",
      {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 5e5, "factor": 2.0}},
      "rope_type='dynamic' is not supported",
    ),
    ("qwen2", {"use_sliding_window": True}, "use_sliding_window=True is not supported"),
    ("gemma3", {"query_pre_attn_scalar": 64}, "query_pre_attn_scalar=64 is not supported"),
    ("gemma3", {"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0"),
    (
      "gemma3",
      {"num_hidden_layers": 2, "layer_types": ["full_attention", "sliding_attention"]},
      "layer_types=['full_attention', 'sliding_attention'] is not supported",
    ),
  ],
)
def test_what_tunix_would_get_wrong_is_refused_naming_the_value(
  family, overrides, message, tmp_path
):
  write_config_only(tmp_path, family, **overrides)
  with pytest.raises(ValueError, match="config key 'model.checkpoint'") as caught:
    load_run_config(None, [f"model.checkpoint={tmp_path}"])
  assert message in str(caught.value) and "\n" not in str(caught.value)


def test_unknown_model_type_is_refused_with_suggestions(tmp_path):
  write_config_only(tmp_path, "qwen2")
  config = tmp_path / "config.json"
  config.write_text(config.read_text().replace('"qwen2"', '"qwen2_moe"'))
  with pytest.raises(ValueError, match=r"model_type 'qwen2_moe' is not supported; did you mean"):
    load_run_config(None, [f"model.checkpoint={tmp_path}"])


def test_sizes_are_read_from_config_json_and_a_mismatch_names_both_values(tmp_path):
  write_config_only(tmp_path, "llama")
  run = load_run_config(None, [f"model.checkpoint={tmp_path}", "model.embed_dim=32"])
  assert run.model.checkpoint == str(tmp_path)  # agreeing sizes are fine
  with pytest.raises(ValueError) as caught:
    load_run_config(None, [f"model.checkpoint={tmp_path}", "model.num_layers=3"])
  assert (
    "'model.num_layers'=3 differs from the checkpoint's config.json num_hidden_layers=2"
    in str(caught.value)
  )
  with pytest.raises(ValueError, match="'model.config_name'='qwen3_0p6b' names a Qwen3 size"):
    load_run_config(None, [f"model.checkpoint={tmp_path}", "model.config_name=qwen3_0p6b"])


def test_a_named_qwen3_size_must_agree_with_config_json(tmp_path):
  write_config_only(tmp_path, "qwen3")
  with pytest.raises(ValueError) as caught:
    load_run_config(None, [f"model.checkpoint={tmp_path}", "model.config_name=qwen3_0p6b"])
  assert "'model.config_name'='qwen3_0p6b' has num_kv_heads=8 but the checkpoint's config.json" in (
    str(caught.value)
  )


def test_a_quoted_size_in_config_json_is_refused_naming_the_key(tmp_path):
  write_config_only(tmp_path, "llama")
  config = tmp_path / "config.json"
  quoted = config.read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": "2"')
  config.write_text(quoted)
  with pytest.raises(ValueError, match=r"config.json num_hidden_layers='2': must be an integer"):
    load_run_config(None, [f"model.checkpoint={tmp_path}"])


def test_truncated_weights_are_refused_naming_the_checkpoint(tmp_path):
  directory = write_checkpoint(tmp_path / "ckpt", "qwen3")
  weights = directory / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
  with pytest.raises(ValueError) as caught:
    hf_models.load_checkpoint(directory)
  message = str(caught.value)
  assert message.startswith(f"checkpoint {str(directory)!r} cannot be loaded (")
  assert "weight files are damaged or disagree with its config.json" in message


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path):
  directory = write_checkpoint(tmp_path / "ckpt", "qwen2", vocab_size=12)
  run, out = _run_config(tmp_path, directory)
  with pytest.raises(
    ValueError, match="tokenizer has 17 ids but the checkpoint's vocab_size is 12"
  ):
    job.build_run(run, out)


def test_a_checkpoint_loads_onto_a_mesh_and_the_critic_keeps_its_sharding(checkpoint):
  _, directory = checkpoint
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"))
  policy = hf_models.load_checkpoint(directory, mesh)
  critic = toy_models.critic_from_policy(policy)
  for path in ("embedder.input_embedding", "layers.0.mlp.up_proj.kernel"):
    mine = _value(critic, "backbone." + path).sharding
    assert isinstance(mine, jax.sharding.NamedSharding) and mine.mesh == mesh
    assert mine == _value(policy, path).sharding and any(mine.spec), path


def test_a_legacy_gemma3_config_scales_only_the_global_rope():
  """Gemma 3 4B's older config.json: `rope_scaling` (linear, 8) for the global layers, the
  local ones at `rope_local_base_freq` without scaling."""
  legacy = {
    "model_type": "gemma3_text",
    "num_hidden_layers": 6,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "query_pre_attn_scalar": 16,
    "vocab_size": 24,
    "sliding_window": 4,
    "sliding_window_pattern": 6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
  }
  config = hf_models.tunix_config(legacy)
  assert (config.local_base_frequency, config.local_scale_factor) == (10_000.0, 1.0)
  assert (config.global_base_frequency, config.global_scale_factor) == (1e6, 8.0)
  with pytest.raises(ValueError, match="sliding_window_pattern=4 is not supported"):
    hf_models.tunix_config({**legacy, "sliding_window_pattern": 4})
