"""Real-checkpoint path: HF-layout safetensors written here, loaded with tunix's loader, trained."""

import pathlib

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from tests.helpers.clusters import toy_policy
from tests.helpers.runs import save_weights_only, train_argv
from tests.helpers.tokenizers import save_hf_tokenizer
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.run import cli, job
from tunix_ppo_ext._src.run.run_config import load_run_config
from tunix_ppo_ext._src.tunix.models import qwen3_safetensors as checkpoints

pytestmark = pytest.mark.tunix

CONFIGS = pathlib.Path(__file__).resolve().parents[3] / "configs"


def params(model):
  flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
  return {".".join(map(str, path)): np.asarray(v[...]) for path, v in flat}


def test_save_writes_hugging_face_layout_and_tunix_loads_it_back(tmp_path):
  policy = toy_policy(CharTokenizer().vocab_size, num_layers=2, num_heads=2, head_dim=16)
  file = save_weights_only(policy, tmp_path)
  tensors = load_file(str(file))
  assert tensors["model.layers.1.self_attn.q_proj.weight"].shape == (2 * 16, 32)  # [out, in]
  assert tensors["model.layers.0.self_attn.o_proj.weight"].shape == (32, 2 * 16)
  assert tensors["model.embed_tokens.weight"].shape == (CharTokenizer().vocab_size, 32)
  np.testing.assert_array_equal(
    tensors["model.layers.0.mlp.up_proj.weight"], params(policy)["layers.0.mlp.up_proj.kernel"].T
  )
  loaded = checkpoints.load_qwen3_checkpoint(tmp_path, policy.config)
  original, restored = params(policy), params(loaded)
  assert original.keys() == restored.keys()
  for key, value in original.items():
    np.testing.assert_array_equal(restored[key], value, err_msg=key)


def test_main_job_trains_from_a_local_checkpoint(tmp_path):
  run = load_run_config(str(CONFIGS / "smoke.yaml"))
  tokenizer = CharTokenizer(run.model.alphabet)
  policy = toy_policy(tokenizer.vocab_size)
  save_weights_only(policy, tmp_path / "ckpt")
  run = load_run_config(
    str(CONFIGS / "smoke.yaml"),
    [f"model.checkpoint={tmp_path / 'ckpt'}", f"output_dir={tmp_path / 'run'}", "train.steps=2"],
  )
  learner, batches, eval_batches, _ = job.build_run(run, tmp_path / "run")
  actor = learner.rl_cluster.actor_trainer.model
  for key, value in params(policy).items():
    np.testing.assert_array_equal(params(actor)[key], value, err_msg=key)
  learner.train(batches, eval_ds=eval_batches)
  assert learner.rl_cluster.actor_trainer.train_steps == 2
  assert not np.array_equal(
    params(actor)["layers.0.attn.q_proj.w"], params(policy)["layers.0.attn.q_proj.w"]
  )


def test_main_job_trains_a_checkpoint_with_its_hugging_face_tokenizer(tmp_path):
  run = load_run_config(str(CONFIGS / "smoke.yaml"))
  save_hf_tokenizer(tmp_path / "tokenizer", run.model.alphabet)
  policy = toy_policy(len(run.model.alphabet) + 3, seed=11)
  save_weights_only(policy, tmp_path / "ckpt")
  out = tmp_path / "run"
  code = cli.main(
    train_argv(
      CONFIGS / "smoke.yaml",
      out,
      f"model.checkpoint={tmp_path / 'ckpt'}",
      f"model.tokenizer={tmp_path / 'tokenizer'}",
      "train.steps=2",
    )
  )
  assert code == 0
  assert (out / "summary.json").is_file()


@pytest.mark.parametrize(
  "override, message",
  [
    (
      "model.checkpoint=/nonexistent/ckpt",
      "'model.checkpoint': '/nonexistent/ckpt' is not a directory",
    ),
    (
      "model.tokenizer=/nonexistent/tok",
      "'model.tokenizer': '/nonexistent/tok' is not a directory",
    ),
    (
      "model.config_name=qwen3_0.6b",
      "'model.config_name'='qwen3_0.6b' unknown; did you mean 'qwen3_0p6b'",
    ),
  ],
)
def test_bad_checkpoint_settings_fail_before_compiling(override, message, capsys):
  assert cli.main(["train", override]) == 2
  assert message in capsys.readouterr().err
