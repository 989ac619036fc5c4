"""Every shipped config loads and validates; the real-model TPU configs fit a v4-8 and a v5e-8.

Nothing is downloaded: the real-model configs' checkpoint and tokenizer paths are pointed
at a tiny safetensors checkpoint and a character-level Hugging Face tokenizer written here.
"""

import dataclasses
import math
import pathlib
import re
import warnings

import jax
import pytest
import yaml
from flax import nnx
from tunix.models.qwen3 import model as qwen3

from tests.helpers.clusters import toy_policy
from tests.helpers.runs import save_weights_only
from tests.helpers.tokenizers import save_hf_tokenizer
from tunix_ppo_ext import envs
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.run.run_config import RunConfig, load_run_config
from tunix_ppo_ext._src.tunix.cluster.mesh import resolve_shape
from tunix_ppo_ext._src.tunix.models import toy_models

pytestmark = pytest.mark.tunix

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
ALL_CONFIGS = sorted(CONFIGS.glob("*.yaml"))
TPU_CONFIGS = sorted(CONFIGS.glob("*_tpu.yaml"))
SLICES = {"v4-8": 4, "v5e-8": 8}  # JAX devices (chips) of each slice


@pytest.fixture(scope="module")
def local_model_dirs(tmp_path_factory) -> dict[str, str]:
  """A tiny Qwen3 safetensors checkpoint and a character-level HF tokenizer, written locally."""
  root = tmp_path_factory.mktemp("local_model")
  save_weights_only(toy_policy(CharTokenizer().vocab_size), root / "ckpt")
  save_hf_tokenizer(root / "tokenizer", "abc")
  return {"checkpoint": str(root / "ckpt"), "tokenizer": str(root / "tokenizer")}


def load(config: pathlib.Path, dirs: dict[str, str]) -> RunConfig:
  """`load_run_config` with the config's checkpoint/tokenizer paths replaced by local ones."""
  model = (yaml.safe_load(config.read_text()) or {}).get("model") or {}
  # a checkpoint that brings its own tokenizer (a GGUF file: configs/smollm2.yaml) gets the
  # local tokenizer too
  keys = [key for key in ("checkpoint", "tokenizer") if model.get(key) or model.get("checkpoint")]
  overrides = [f"model.{key}={dirs[key]}" for key in keys]
  return load_run_config(str(config), overrides)


def test_the_real_model_configs_are_there():
  assert {c.name for c in TPU_CONFIGS} >= {"qwen3_0p6b_tpu.yaml", "qwen3_1p7b_tpu.yaml"}


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=lambda c: c.name)
def test_every_config_loads_and_validates(config, local_model_dirs):
  run = load(config, local_model_dirs)
  assert isinstance(run, RunConfig)
  assert run.train.batch_size % run.ppo.get("num_generations", 1) == 0
  env = envs.make_env(run.env.name, **run.env.kwargs)
  if run.model.tokenizer is None:  # the built-in tokenizer: prompts must encode and fit
    tokenizer = CharTokenizer(**({"alphabet": run.model.alphabet} if run.model.alphabet else {}))
    for seed in range(50):
      observation, _ = env.reset(seed)
      assert len(tokenizer.encode(observation, add_bos=True)) <= run.train.max_prompt_length


@pytest.mark.parametrize("config", TPU_CONFIGS, ids=lambda c: c.name)
def test_real_model_configs_need_the_user_s_checkpoint(config):
  with pytest.raises(ValueError, match="'model.checkpoint'.*is not a directory"):
    load_run_config(str(config))


def abstract_params(build) -> list[tuple[str, tuple[int, ...], tuple]]:
  """`(name, shape, partition spec)` of every parameter of `build()`, without allocating it."""
  state = nnx.state(nnx.eval_shape(build), nnx.Param)
  specs = nnx.get_partition_spec(state)
  is_spec = lambda s: s is None or isinstance(s, jax.sharding.PartitionSpec)  # noqa: E731
  named = jax.tree_util.tree_leaves_with_path(specs, is_leaf=is_spec)
  return [
    (jax.tree_util.keystr(path), tuple(leaf.shape), tuple(spec or ()))
    for (path, spec), leaf in zip(named, jax.tree.leaves(state), strict=True)
  ]


def param_count(build) -> int:
  """Number of parameters of `build()` (abstract, nothing allocated)."""
  return sum(math.prod(shape) for _, shape, _ in abstract_params(build))


@pytest.mark.parametrize("config", TPU_CONFIGS, ids=lambda c: c.name)
def test_real_model_configs_fit_a_v4_8_and_a_v5e_8_mesh(config, local_model_dirs):
  run = load(config, local_model_dirs)
  assert run.model.config_name is not None and run.model.tokenizer is not None
  model_config = getattr(qwen3.ModelConfig, run.model.config_name)()
  # Layers are identical: one- and two-layer copies give every parameter's shape and spec
  # and the exact count, in a fraction of the time of tracing all of them.
  one, two = (dataclasses.replace(model_config, num_layers=n) for n in (1, 2))
  policy = abstract_params(lambda: toy_models.make_policy(one))
  critic = abstract_params(lambda: toy_models.make_critic(one))
  per_layer = param_count(lambda: toy_models.make_policy(two)) - param_count(
    lambda: toy_models.make_policy(one)
  )
  count = sum(math.prod(shape) for _, shape, _ in policy)
  count += (model_config.num_layers - 1) * per_layer
  stated = re.search(r"Parameters: ([0-9.]+)e9", config.read_text())
  assert stated, "the memory comment states the parameter count"
  assert float(stated.group(1)) == pytest.approx(count / 1e9, abs=5e-4)
  for slice_name, devices in SLICES.items():
    shape = resolve_shape("mesh", run.mesh.shape, run.mesh.axis_names, devices)
    sizes = dict(zip(run.mesh.axis_names, shape, strict=True))
    assert math.prod(shape) == devices, slice_name  # the whole slice is used
    assert run.train.batch_size % sizes["fsdp"] == 0, slice_name
    for name, param_shape, spec in policy + critic:
      for dim, axes in zip(param_shape, spec, strict=False):
        axes = axes if isinstance(axes, tuple) else (axes,)
        parts = math.prod(sizes[a] for a in axes if a is not None)
        assert dim % parts == 0, (slice_name, name, param_shape, spec)


def test_a_critic_warm_up_as_long_as_the_run_warns_that_the_actor_never_trains():
  """A critic-only run is allowed (the critic learning-rate probe is one), but said so."""
  smoke = str(pathlib.Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")
  with pytest.warns(UserWarning, match=r"critic_warmup_steps=4 is not below the run's 4 batches"):
    load_run_config(smoke, ["ppo.critic_warmup_steps=4"])
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    load_run_config(smoke, ["ppo.critic_warmup_steps=3"])
  assert not [w for w in caught if "critic_warmup_steps" in str(w.message)]
