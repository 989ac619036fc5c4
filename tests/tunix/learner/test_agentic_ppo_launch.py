"""`tunix-ppo-ext tunix-agentic CONFIG.yaml` end to end, as a tunix user launches it, offline:
tunix's own model loading (`model_source: gcs`, a local checkpoint in Gemma's upstream
layout, which tunix's `map_from_upstream_checkpoint` maps onto tunix's Gemma3 270m),
tunix's Hugging Face tokenizer from a local directory (SmolLM2's), tunix's `data_module`
and `reward_functions`, tunix's meshes, rollout and trainers, `AgenticPpoLearner` with a
critic: one PPO step, its metrics in TensorBoard under the `train` job's keys.

Nothing of tunix is replaced: the checkpoint holds random weights of tunix's real
Gemma3 270m architecture, written here in the layout tunix reads."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers.launch import REPO, launch_config, needs_main, needs_smollm2

# tunix_facing: also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.tunix, pytest.mark.tunix_facing]


def upstream_gemma3_checkpoint(path: pathlib.Path, config, seed: int = 0) -> None:
  """An orbax checkpoint at `path` in Gemma's upstream layout (`transformer/layer_0/attn/
  q_einsum: {w: ...}`, the MLP's gate and up projections one `gating_einsum`), of random
  bfloat16 weights of tunix's Gemma3 of `config` (text only): what tunix's
  `map_from_upstream_checkpoint` maps onto that model."""
  import flax
  import ml_dtypes
  from flax import nnx
  from orbax import checkpoint as ocp
  from tunix.models.gemma3 import model as gemma3

  shapes = nnx.eval_shape(lambda: gemma3.Gemma3(config, rngs=nnx.Rngs(0)))
  flat = flax.traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(shapes)))
  rng = np.random.default_rng(seed)

  def draw(shape, name):  # norms' `scale` is added to 1: zero is the identity
    if name == "scale":
      return np.zeros(shape, ml_dtypes.bfloat16)
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)

  params = {}
  for key, leaf in flat.items():
    if key[0] != "layers":  # ('embedder', 'input_embedding'), ('final_norm', 'scale')
      params[f"transformer/{key[0]}"] = {key[1]: draw(leaf.shape, key[1])}
      continue
    layer, module, name = f"transformer/layer_{key[1]}", key[2:-1], key[-1]
    if module == ("mlp", "gate_proj"):  # [D, H] each; upstream: [2, H, D]
      gate, up = draw(leaf.shape, name), draw(leaf.shape, name)
      params[f"{layer}/mlp/gating_einsum"] = {"w": np.stack([gate.T, up.T])}
    elif module == ("mlp", "down_proj"):
      params[f"{layer}/mlp/linear"] = {"w": draw(leaf.shape, name)}
    elif module != ("mlp", "up_proj"):  # the rest keep their names
      params["/".join((layer, *module))] = {name: draw(leaf.shape, name)}
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(path, params)


@pytest.mark.slow  # a 270m model trains in a subprocess (about 2 minutes on 2 cores)
@needs_main
@needs_smollm2
def test_a_gemma3_checkpoint_trains_a_ppo_step_through_the_launcher(tmp_path):
  """The command in a subprocess (as a user runs it; JAX on the CPU): tunix loads the
  checkpoint three times (actor and reference, critic with tunix's score head), samples,
  and `AgenticPpoLearner` updates the actor and the critic once; the run exits 0."""
  from tunix.models.gemma3 import model as gemma3

  from tunix_ppo_ext._src.data import gguf_files
  from tunix_ppo_ext._src.metrics.sinks import read_tensorboard

  upstream_gemma3_checkpoint(tmp_path / "gemma3", gemma3.ModelConfig.gemma3_270m())
  config = launch_config(tmp_path, gguf_files.resolve("smollm2"))
  path = os.pathsep.join([str(REPO), str(tmp_path), os.environ.get("PYTHONPATH", "")])
  env = {**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu", "WANDB_MODE": "disabled"}
  command = [sys.executable, "-m", "tunix_ppo_ext._src.run.cli", "tunix-agentic", str(config)]
  done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  metrics = read_tensorboard(tmp_path / "metrics")  # the `train` job's keys (metrics guide)
  for name in ("actor/pg_loss", "critic/vf_loss", "train/advantage/mean", "rewards/has_an_a"):
    assert name in metrics, sorted(metrics)
    assert all(np.isfinite(value) for _, value in metrics[name]), (name, metrics[name])
  for name in ("actor/pg_loss", "critic/vf_loss", "train/advantage/mean"):  # one step
    assert {step for step, _ in metrics[name]} == {1}, (name, metrics[name])
  assert not [tag for tag in metrics if tag.split("/")[0] in ("batch", "learner", "advantages")]
