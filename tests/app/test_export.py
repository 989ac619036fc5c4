"""`tunix-ppo-ext export RUN_DIR OUT_DIR`: a trained policy back as a Hugging Face checkpoint
that `transformers` loads with the trained tunix policy's logits; the refusals."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx
from safetensors.numpy import load_file

from tests.conftest import SMOKE, save_hf_tokenizer
from tests.tunix.hf_fixtures import FAMILIES, hf_logits, write_checkpoint
from tunix_ppo_ext.app import cli, job, run_dir
from tunix_ppo_ext.app.run_config import load_run_config
from tunix_ppo_ext.tunix import hf_export, hf_models, models

pytest.importorskip("torch")

TOKENS = np.array([[1, 5, 13, 7, 8, 3, 12, 0, 9], [2, 2, 10, 6, 11, 4, 15, 1, 14]])


@nnx.jit
def _logits(model, tokens):
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  return model(tokens, positions, None, models.causal_mask(*tokens.shape))[0]


def _train(tmp_path: pathlib.Path, *overrides: str, keep_model: bool = True):
  """Trains 2 steps of the smoke config (its `model` section dropped when `overrides` name a
  checkpoint) as `train` does, checkpointing step 2; returns `(run_dir, trained policy)`."""
  data = yaml.safe_load(SMOKE.read_text())
  if not keep_model:
    data.pop("model")
  file = tmp_path / "run.yaml"
  file.write_text(yaml.safe_dump(data))
  out = tmp_path / "run"
  fast = ["train.steps=2", "train.batch_size=4", "train.eval_batches=0", "train.checkpoint_every=2"]
  run = load_run_config(str(file), [f"output_dir={out}", *fast, *overrides])
  out.mkdir()
  run_dir.check_rerun(out, dataclasses.asdict(run), None)  # the run's config.json
  learner, batches, eval_batches, _ = job.build_run(run, out)
  learner.train(batches, eval_ds=eval_batches)
  learner.rl_cluster.close()
  return out, learner.rl_cluster.actor_trainer.model


def _export(run: pathlib.Path, out: pathlib.Path) -> None:
  assert cli.main(["export", str(run), str(out)]) == 0
  assert (out / "config.json").is_file() and (out / hf_export.SAFETENSORS_FILE).is_file()


def test_an_exported_checkpoint_loads_in_transformers_with_the_trained_logits(tmp_path):
  family = "qwen3"
  source = write_checkpoint(tmp_path / "ckpt", family, seed=5)
  save_hf_tokenizer(source, "abcehikstw!?. ")
  run, policy = _train(tmp_path, f"model.checkpoint={source}", keep_model=False)
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
  run, policy = _train(tmp_path)
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
