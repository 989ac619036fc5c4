"""`tunix-ppo-ext export RUN_DIR OUT_DIR`: a trained policy back as a Hugging Face checkpoint
that `transformers` loads with the trained tunix policy's logits; the refusals."""

from __future__ import annotations

import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx
from safetensors.numpy import load_file

from tests.helpers.hf_fixtures import FAMILIES, hf_logits, write_checkpoint
from tests.helpers.runs import SMOKE, train_in_process
from tests.helpers.tokenizers import save_hf_tokenizer
from tunix_ppo_ext._src.run import cli, job
from tunix_ppo_ext._src.run.run_config import load_run_config
from tunix_ppo_ext._src.tunix.models import hf_export, hf_models, lora, toy_models

pytestmark = pytest.mark.tunix

pytest.importorskip("torch")

TOKENS = np.array([[1, 5, 13, 7, 8, 3, 12, 0, 9], [2, 2, 10, 6, 11, 4, 15, 1, 14]])


@nnx.jit
def _logits(model, tokens):
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  return model(tokens, positions, None, toy_models.causal_mask(*tokens.shape))[0]


def _train(tmp_path: pathlib.Path, *overrides: str, keep_model: bool = True, steps: int = 2):
  """Trains 2 steps of the smoke config (its `model` section dropped when `overrides` name a
  checkpoint) as `train` does, checkpointing step 2; returns `(run_dir, trained policy)`."""
  data = yaml.safe_load(SMOKE.read_text())
  if not keep_model:
    data.pop("model")
  file = tmp_path / "run.yaml"
  file.write_text(yaml.safe_dump(data))
  out = tmp_path / "run"
  fast = [f"train.steps={steps}", "train.batch_size=4", "train.eval_batches=0"]
  fast.append("train.checkpoint_every=2")
  return out, train_in_process(file, out, *fast, *overrides).rl_cluster


def _export(run: pathlib.Path, out: pathlib.Path) -> None:
  assert cli.main(["export", str(run), str(out)]) == 0
  assert (out / "config.json").is_file() and (out / hf_export.SAFETENSORS_FILE).is_file()


def test_an_exported_checkpoint_loads_in_transformers_with_the_trained_logits(tmp_path):
  family = "qwen3"
  source = write_checkpoint(tmp_path / "ckpt", family, seed=5)
  save_hf_tokenizer(source, "abcehikstw!?. ")
  run, cluster = _train(tmp_path, f"model.checkpoint={source}", keep_model=False)
  policy = cluster.actor_trainer.model
  _export(run, tmp_path / "hf")
  np.testing.assert_allclose(
    hf_logits(tmp_path / "hf", TOKENS), np.asarray(_logits(policy, jnp.asarray(TOKENS))), atol=1e-4
  )
  exported, initial = (
    load_file(str(tmp_path / "hf" / "model.safetensors")),
    load_file(str(source / "model.safetensors")),
  )
  assert exported.keys() == initial.keys()  # the same names (tied: no lm_head in either)
  assert any(not np.array_equal(exported[k], initial[k]) for k in initial)  # training moved them
  assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == family
  import transformers

  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  assert (
    tokenizer("cat").input_ids
    == transformers.AutoTokenizer.from_pretrained(source)("cat").input_ids
  )


def _saved_names(role_dir: pathlib.Path, step: int) -> set[str]:
  """The parameter names in an orbax checkpoint tunix's trainer wrote (its tree metadata)."""
  metadata = json.loads((role_dir / str(step) / "model_params" / "_METADATA").read_text())
  return {"/".join(eval(key)[:-1]) for key in metadata["tree_metadata"]}


def test_a_lora_run_trains_and_saves_only_adapters_resumes_and_exports_merged(tmp_path):
  """One LoRA run (actor and critic adapters) on the tiny Qwen3 checkpoint: the base weights
  stay the checkpoint's and stay shared with the reference, the adapters move, checkpoints
  hold only what is trained, a rebuild restores the adapters, and the export merges them."""
  source = write_checkpoint(tmp_path / "ckpt", "qwen3", seed=5)
  save_hf_tokenizer(source, "abcehikstw!?. ")
  spec = "model.lora={rank: 4, alpha: 8.0, critic: true}"
  run, cluster = _train(tmp_path, f"model.checkpoint={source}", spec, keep_model=False)
  actor, base = cluster.actor_trainer.model, hf_models.load_checkpoint(source)
  reference = cluster.inference_worker.get_model("reference")
  frozen = dict(nnx.to_flat_state(nnx.state(actor, lora.FROZEN)))
  for path, value in nnx.to_flat_state(nnx.state(base, nnx.Param)):
    np.testing.assert_array_equal(frozen[path][...], value[...], err_msg=str(path))
  adapters = dict(nnx.to_flat_state(nnx.state(actor, nnx.LoRAParam)))
  assert all(np.abs(v[...]).max() > 0 for p, v in adapters.items() if p[-1].endswith("lora_b"))
  assert lora.shares_base(actor, reference)  # after the updates too (`lora.SharedBase`)
  assert lora.shares_base(cluster.critic_trainer.model.backbone, reference)

  report = lora.memory_report(cluster)
  adapter_count = report["actor"]["params"]["trainable"]
  assert adapter_count == sum(v[...].size for v in adapters.values())
  assert adapter_count < report["actor"]["params"]["total"] / 4
  assert report["actor"]["optimizer_state_bytes"] < 3 * 4 * adapter_count  # Adam: 2 per param
  trained_bytes = 4 * (adapter_count + report["critic"]["params"]["trainable"])
  assert report["model_bytes"] == lora.array_bytes(nnx.state(base, nnx.Param)) + trained_bytes

  checkpoints = run / "checkpoints"
  assert all(n.endswith(("_lora_a", "_lora_b")) for n in _saved_names(checkpoints / "actor", 2))
  assert len(_saved_names(checkpoints / "actor", 2)) == len(adapters)
  critic_saved = _saved_names(checkpoints / "critic", 2)
  assert {n for n in critic_saved if "lora" not in n} == {"value_head/kernel", "value_head/bias"}

  rerun = load_run_config(str(run / "config.json"), [f"output_dir={run}", "train.steps=3"])
  resumed = job.build_run(rerun, run)[0].rl_cluster
  assert resumed.actor_trainer.train_steps == 2
  for path, value in nnx.to_flat_state(nnx.state(resumed.actor_trainer.model, nnx.LoRAParam)):
    np.testing.assert_array_equal(value[...], adapters[path][...], err_msg=str(path))
  resumed.close()

  _export(run, tmp_path / "hf")
  trained = np.asarray(_logits(actor, jnp.asarray(TOKENS)))
  np.testing.assert_allclose(hf_logits(tmp_path / "hf", TOKENS), trained, atol=1e-4)
  assert np.abs(trained - np.asarray(_logits(base, jnp.asarray(TOKENS)))).max() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_s_tunix_model_exports_to_transformers_unchanged(family, tmp_path):
  """tunix's loader, then the export: the same tensors and `transformers` logits as the
  checkpoint's (the mapping is the exact inverse, for each family)."""
  source = write_checkpoint(tmp_path / "ckpt", family, seed=2)
  model = hf_models.load_checkpoint(source)
  hf_export.save_hf_checkpoint(model, tmp_path / "hf", hf_models.read_hf_config(source))
  exported, initial = (load_file(str(d / "model.safetensors")) for d in (tmp_path / "hf", source))
  assert exported.keys() == initial.keys()
  for name, array in initial.items():
    np.testing.assert_array_equal(exported[name], array, err_msg=name)
  np.testing.assert_allclose(
    hf_logits(tmp_path / "hf", TOKENS), np.asarray(_logits(model, jnp.asarray(TOKENS))), atol=1e-4
  )


def test_the_built_in_toy_model_exports_as_a_qwen3(tmp_path):
  run, cluster = _train(tmp_path)
  policy = cluster.actor_trainer.model
  _export(run, tmp_path / "hf")
  config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert config["model_type"] == "qwen3" and config["rope_theta"] == 1e6  # what tunix computes
  tokens = TOKENS % policy.config.vocab_size
  np.testing.assert_allclose(
    hf_logits(tmp_path / "hf", tokens), np.asarray(_logits(policy, jnp.asarray(tokens))), atol=1e-4
  )
  assert not (tmp_path / "hf" / "tokenizer.json").exists()  # the character tokenizer has none


def test_a_non_empty_out_dir_and_a_run_without_checkpoints_are_refused(tmp_path, capsys):
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text("{}")
  taken = tmp_path / "taken"
  taken.mkdir()
  (taken / "x").write_text("")
  assert cli.main(["export", str(run), str(taken)]) == cli.EXIT_BAD_INPUT
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [
    f"tunix-ppo-ext: error: OUT_DIR {str(taken)!r} exists and is not empty: export "
    "into a new or empty directory"
  ]
  assert cli.main(["export", str(run), str(tmp_path / "new")]) == cli.EXIT_BAD_INPUT
  (line,) = capsys.readouterr().err.strip().splitlines()
  assert "has no finalized actor checkpoint in checkpoints/actor" in line and str(run) in line
  assert not (tmp_path / "new").exists()
  assert cli.main(["export", str(tmp_path / "nothing"), str(tmp_path / "new")]) == 2
  assert "has no config.json" in capsys.readouterr().err


def test_sigterm_while_writing_leaves_nothing_and_restores_the_handler(tmp_path):
  """SIGTERM during the write ended the process and left `OUT.partial-PID/` with a cut
  `model.safetensors`; now it interrupts the write, which removes the staging directory."""
  import os
  import signal

  from tunix_ppo_ext._src.run.export_cmd import _staged

  before = signal.getsignal(signal.SIGTERM)
  out = tmp_path / "out"
  with pytest.raises(KeyboardInterrupt), _staged(out) as staging:
    (staging / "model.safetensors").write_bytes(b"cut short")
    os.kill(os.getpid(), signal.SIGTERM)
    pytest.fail("SIGTERM did not interrupt the write")
  assert not staging.exists() and not out.exists()
  assert signal.getsignal(signal.SIGTERM) is before
