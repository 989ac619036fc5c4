"""`model.remat`: tunix's activation rematerialisation from the run config, in train and plan;
resuming a run with it (and `model.fused_head`) changed."""

from __future__ import annotations

import inspect
import json

import jax
import numpy as np
import pytest
from flax import nnx

from tests.helpers.hf_fixtures import hf_config
from tests.helpers.passes import example
from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.run import job, plan, run_dir
from tunix_ppo_ext._src.run.run_config import config_dict, load_resolved
from tunix_ppo_ext._src.tunix.learner import loss_fns as tunix_losses
from tunix_ppo_ext._src.tunix.learner.ppo_config import PpoExtConfig
from tunix_ppo_ext._src.tunix.models import hf_models, toy_models

pytestmark = pytest.mark.tunix

# Lane 2 (tunix main) runs the tests of each family's RematConfig; the rest is our code.


@pytest.mark.tunix_facing
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama", "gemma3"])
def test_every_family_s_remat_config_has_the_choices_and_uses_them(family):
  """Each family's `RematConfig` has the members `model.remat` names, and its decoder layer
  and blocks test for them (so none of the choices is silently ignored)."""
  hf = hf_config(family).to_dict()
  config = hf_models.tunix_config(hf)
  for name in hf_models.REMAT_CHOICES:
    assert hf_models.with_remat(config, name).remat_config.name == name.upper()
  source = inspect.getsource(inspect.getmodule(hf_models.family_of(hf).model_class))
  assert "RematConfig.BLOCK" in source and "RematConfig.DECODER" in source


@pytest.mark.tunix_facing
def test_a_bad_remat_is_one_line_naming_the_key():
  with pytest.raises(ConfigError) as err:
    load_resolved(None, ["model.remat=blok"])
  message = str(err.value)
  assert message.startswith("config key 'model.remat'='blok' unknown; did you mean 'block'?")
  assert "\n" not in message


@pytest.mark.tunix_facing
def test_a_bad_value_head_init_is_one_line_naming_the_key():
  with pytest.raises(ConfigError) as err:
    load_resolved(None, ["model.value_head_init=zeros"])
  message = str(err.value)
  assert message.startswith("config key 'model.value_head_init'='zeros' unknown; did you mean")
  assert "\n" not in message


def test_train_and_plan_build_the_policy_and_critic_with_it():
  resolved = load_resolved(None, ["model.remat=decoder", "model.num_layers=1"])
  policy, critic, _ = job.build_models(resolved)
  assert policy.config.remat_config.name == "DECODER"
  assert critic.backbone.layers[0].config.remat_config.name == "DECODER"
  assert plan.model_config(resolved).config.remat_config.name == "DECODER"
  default = load_resolved(None, [])
  assert plan.model_config(default).config.remat_config.name == "NONE"


def _train_smoke(out, remat: str) -> list[dict]:
  from tunix_ppo_ext._src.run import cli
  from tunix_ppo_ext.metrics import read_jsonl

  args = ["train", "--config", "configs/smoke.yaml", "--output-dir", str(out)]
  assert cli.main([*args, "train.steps=2", f"model.remat={remat}"]) == 0
  return read_jsonl(out / "metrics.jsonl")


@pytest.fixture(scope="module")
def without_remat(tmp_path_factory) -> list[dict]:
  return _train_smoke(tmp_path_factory.mktemp("remat") / "none", "none")


@pytest.mark.parametrize("remat", ["block", "decoder"])
def test_a_remat_run_trains_and_samples_what_a_run_without_remat_samples(
  tmp_path, remat, without_remat
):
  """The sampler runs without remat (it merges the model inside its decode loop, where a
  remat'ed layer raised flax's TraceContextError): the run trains, and its first rollout,
  before any update, is the one of the same run without remat."""
  rows = {"none": without_remat, remat: _train_smoke(tmp_path / remat, remat)}
  keys = ("train/response_length/mean", "train/episode_return/mean", "train/num_turns/mean")
  first = {name: [r for r in found if r["step"] == 1][0] for name, found in rows.items()}
  for key in keys:
    assert first[remat][key] == first["none"][key], key
  assert [r["step"] for r in rows[remat] if "actor/loss" in r] == [1, 2]


def test_the_actor_s_train_step_recomputes_what_remat_says_and_keeps_its_gradient():
  """The actor's loss gradient as tunix's trainer takes it: `block` puts each layer's attention
  and MLP under `jax.checkpoint` (two per layer), `decoder` each layer (one), `none` nothing;
  the gradient is the same. (On XLA:CPU the compiler's temporaries hardly change with it:
  measured 133.9 MiB without and 130.9 MiB with `decoder` for 4 toy layers at 512 tokens on
  this 2-core machine; what it saves on a TPU is not measured here.)"""
  static = dict(algo_config=PpoExtConfig(logits_chunk_size=4), pad_id=0, eos_id=1, temperature=1.0)
  train_example = example(64)
  grads = {}
  for name, remats in (("none", 0), ("block", 4), ("decoder", 2)):
    config = toy_models.tiny_qwen3_config(64, num_layers=2)
    model = toy_models.make_policy(hf_models.with_remat(config, name), seed=3)

    def grad(model):
      return nnx.grad(tunix_losses.ppo_ext_policy_loss_fn, has_aux=True)(
        model, train_example, **static
      )

    assert str(jax.make_jaxpr(grad)(model)).count("remat2[") == remats, name
    grads[name] = jax.tree.leaves(grad(model))
  for name in ("block", "decoder"):
    for x, y in zip(grads["none"], grads[name], strict=True):
      np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-5, atol=1e-6)


def test_a_resumed_run_may_turn_remat_the_fused_head_and_attention_on_not_change_the_model(
  tmp_path,
):
  """They change how the model computes, not what it is: a rerun over a checkpoint (also one
  saved before the keys existed) may set them, and they are recorded in the history."""
  saved = config_dict(load_resolved(None, []).run)
  for key in ("fused_head", "remat", "attention", "attention_block_size"):
    del saved["model"][key]  # a run of an earlier version
  (tmp_path / "config.json").write_text(json.dumps(saved))
  overrides = ["model.remat=block", "model.fused_head=true", "ppo.logits_chunk_size=8"]
  overrides += ["model.attention=blockwise", "model.attention_block_size=128"]
  rerun = load_resolved(None, overrides)
  run_dir.check_rerun(tmp_path, rerun.config, 1, rerun.optimizers)
  history = (tmp_path / run_dir.HISTORY).read_text()
  assert "model.remat" in history and "model.fused_head" in history
  assert "model.attention" in history
  other = load_resolved(None, ["model.embed_dim=48"])
  with pytest.raises(ConfigError, match=r"model\.embed_dim: 64 -> 48"):
    run_dir.check_rerun(tmp_path, other.config, 1, other.optimizers)
