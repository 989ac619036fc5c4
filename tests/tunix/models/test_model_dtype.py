"""`model.dtype` (`hf_models.with_dtype`, `cast_params`, `train_in_float32`): the frozen
weights in bfloat16 (or float32) for toy, Hugging Face and GGUF checkpoints, logits against
float32 within a stated tolerance, what the run trains kept in float32, training steps
finite end to end, export writing the dtype asked for, and bad values refused in one line
naming the key."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from tests.helpers.gguf_fixtures import write_gguf
from tests.helpers.hf_fixtures import hf_config, hf_logits, write_checkpoint
from tests.helpers.runs import SMOKE, train_in_process
from tests.helpers.tokenizers import save_hf_tokenizer
from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.data import gguf_files
from tunix_ppo_ext._src.run import cli, job, plan
from tunix_ppo_ext._src.run.run_config import load_resolved
from tunix_ppo_ext._src.tunix.models import hf_models, toy_models

pytestmark = pytest.mark.tunix

TOKENS = np.array([[1, 5, 13, 7, 8, 3, 12, 0, 9], [2, 2, 10, 6, 11, 4, 15, 1, 14]])
LORA = "model.lora={rank: 4}"
# bfloat16 keeps 8 significant bits (relative rounding 2^-9 per weight and per activation):
# through these 1-2 layer models the logits stay within 3% of their float32 range, and the
# next-token probabilities within 0.02.
LOGIT_TOLERANCE, PROB_TOLERANCE = 0.03, 0.02


@nnx.jit
def _logits(model, tokens):
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  return model(tokens, positions, None, toy_models.causal_mask(*tokens.shape))[0]


def _assert_close_to_float32(low: np.ndarray, reference: np.ndarray) -> None:
  low, reference = np.asarray(low, np.float64), np.asarray(reference, np.float64)
  scale = reference.max() - reference.min()
  assert np.abs(low - reference).max() <= LOGIT_TOLERANCE * scale
  probs = [jax.nn.softmax(x, axis=-1) for x in (low, reference)]
  assert np.abs(np.asarray(probs[0]) - np.asarray(probs[1])).max() <= PROB_TOLERANCE
  assert not np.array_equal(low, reference)  # bfloat16 did round something


def _dtypes(model, kind=nnx.Param) -> set[str]:
  return {str(x.dtype) for x in jax.tree.leaves(nnx.state(model, kind))}


def _frozen_dtypes(model) -> set[str]:
  lora = {id(x) for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))}
  return {str(x.dtype) for x in jax.tree.leaves(nnx.state(model, nnx.Param)) if id(x) not in lora}


@pytest.mark.tunix_facing
def test_a_toy_run_holds_its_base_in_bfloat16_and_trains_float32():
  resolved = load_resolved(SMOKE, ["model.dtype=bfloat16", LORA])
  actor, critic, reference = job.build_models(resolved)
  assert _frozen_dtypes(actor) == {"bfloat16"} and _dtypes(reference) == {"bfloat16"}
  assert _dtypes(actor, nnx.LoRAParam) == {"float32"}
  assert _dtypes(critic) == {"float32"}  # a critic trained whole: float32
  assert actor.config.dtype == jnp.bfloat16  # Qwen3 computes in it too
  full = job.build_models(load_resolved(SMOKE, [LORA]))[2]
  _assert_close_to_float32(_logits(reference, TOKENS), _logits(full, TOKENS))
  assert plan.model_config(resolved).weight_dtype == jnp.bfloat16


def test_a_lora_critic_keeps_its_adapters_and_head_float32():
  resolved = load_resolved(SMOKE, ["model.dtype=bfloat16", "model.lora={rank: 4, critic: true}"])
  _, critic, _ = job.build_models(resolved)
  assert _dtypes(critic, nnx.LoRAParam) == {"float32"}  # adapters and value head
  assert _frozen_dtypes(critic) == {"bfloat16"}


@pytest.mark.tunix_facing  # tunix's loaders take the dtype; its Qwen3 computes in config.dtype
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_hugging_face_checkpoint_loads_in_bfloat16_near_transformers_float32(family, tmp_path):
  pytest.importorskip("torch")
  directory = write_checkpoint(tmp_path / "ckpt", family, seed=2)
  model = hf_models.load_checkpoint(directory, dtype="bfloat16")
  assert _dtypes(model) == {"bfloat16"}
  _assert_close_to_float32(_logits(model, jnp.asarray(TOKENS)), hf_logits(directory, TOKENS))


def test_a_gguf_checkpoint_loads_in_bfloat16_near_its_float32(tmp_path, monkeypatch):
  pytest.importorskip("torch")
  pytest.importorskip("gguf")
  import transformers

  monkeypatch.setenv(gguf_files.ENV_CACHE, str(tmp_path / "cache"))
  rope = {"rope_type": "default", "rope_theta": 100_000.0}
  config = hf_config("llama", hidden_size=64, intermediate_size=128, rope_parameters=rope)
  file = tmp_path / "tiny.gguf"
  write_gguf(file, transformers.AutoModelForCausalLM.from_config(config), quant="F32")
  low = hf_models.load_checkpoint(file, dtype="bfloat16")
  assert _dtypes(low) == {"bfloat16"}
  full = hf_models.load_checkpoint(file)
  assert _dtypes(full) == {"float32"}
  _assert_close_to_float32(_logits(low, jnp.asarray(TOKENS)), _logits(full, jnp.asarray(TOKENS)))


@pytest.fixture(scope="module")
def bfloat16_run(tmp_path_factory):
  """Two PPO steps (GAE, a critic) of a toy Hugging Face checkpoint, its base in bfloat16."""
  pytest.importorskip("torch")
  tmp = tmp_path_factory.mktemp("bf16")
  source = write_checkpoint(tmp / "ckpt", "qwen3", seed=5, num_hidden_layers=1)
  save_hf_tokenizer(source, "abcehikstw!?. ")
  out = tmp / "run"
  steps = ["train.steps=2", "train.batch_size=4", "train.eval_batches=0"]
  overrides = [f"model.checkpoint={source}", "model.dtype=bfloat16", LORA, *steps]
  learner = train_in_process(SMOKE, out, *overrides, "train.checkpoint_every=2")
  return source, out, learner


def test_training_in_bfloat16_gives_finite_steps(bfloat16_run):
  from tunix_ppo_ext.metrics import read_jsonl

  _, out, learner = bfloat16_run
  rows = read_jsonl(out / "metrics.jsonl")
  losses = [row[k] for row in rows for k in ("actor/pg_loss", "critic/vf_loss") if k in row]
  assert len(losses) >= 4 and all(math.isfinite(v) for v in losses)
  assert all(math.isfinite(v) for row in rows for v in row.values() if isinstance(v, float))
  actor = learner.rl_cluster.actor_trainer.model
  assert _frozen_dtypes(actor) == {"bfloat16"}
  assert _dtypes(actor, nnx.LoRAParam) == {"float32"}


def test_export_writes_the_dtype_asked_for(bfloat16_run, tmp_path):
  import transformers

  _, out, _ = bfloat16_run
  assert cli.main(["export", str(out), str(tmp_path / "hf")]) == 0
  tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
  assert {str(t.dtype) for t in tensors.values()} == {"bfloat16"}
  assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"
  loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype="auto")
  assert str(loaded.dtype) == "torch.bfloat16"


@pytest.mark.parametrize(
  "overrides, message",
  [
    (["model.dtype=bf16"], "config key 'model.dtype'='bf16' unknown; did you mean 'bfloat16'?"),
    (["model.dtype=float16"], "config key 'model.dtype'='float16' unknown"),
    (["model.dtype=bfloat16"], "config key 'model.dtype'='bfloat16' needs model.lora"),
  ],
)
def test_a_bad_dtype_is_one_line_naming_the_key(overrides, message):
  with pytest.raises(ConfigError) as err:
    load_resolved(SMOKE, overrides)
  assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_cast_params_casts_floating_weights_of_the_kind_only():
  model = toy_models.make_policy(
    toy_models.tiny_qwen3_config(16, num_layers=1, embed_dim=16), seed=1
  )
  before = {k: np.asarray(v[...]) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  hf_models.cast_params(model, jnp.bfloat16)
  after = {k: np.asarray(v[...]) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  for key, value in before.items():  # round to nearest bfloat16, as numpy's ml_dtypes does
    np.testing.assert_array_equal(after[key], value.astype(jnp.bfloat16))
  assert hf_models.with_dtype(model.config, None) is model.config
