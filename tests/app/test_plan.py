"""`tunix-ppo-ext plan`: the compiler's per-device memory of a config on a TPU topology.

The compile runs in a subprocess (it needs 8 CPU devices before JAX starts) with
`--compiler cpu`, so the test does not depend on `libtpu` being installed (with it, the
TPU compiler takes minutes per piece on this machine). The argument and donated bytes of
the compiled train step are checked against the parameter and Adam arithmetic of the
Qwen3 architecture, written here from its layer sizes.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tunix_ppo_ext.app import cli, plan
from tunix_ppo_ext.tunix import abstract, compat, models
from tunix_ppo_ext.tunix.guards import guarded_adam

ROOT = pathlib.Path(__file__).resolve().parents[2]
QWEN3_0P6B = ROOT / "configs" / "qwen3_0p6b_tpu.yaml"


def run_plan(tmp_path: pathlib.Path, *args: str) -> dict:
  """`tunix-ppo-ext plan --compiler cpu ARGS --json ...` in a subprocess; the JSON figures."""
  out = tmp_path / "plan.json"
  command = [sys.executable, "-m", "tunix_ppo_ext.app.cli", "plan", "--compiler", "cpu"]
  result = subprocess.run(
    [*command, *args, "--json", str(out)], capture_output=True, text=True, timeout=1800
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert "peak:" in result.stdout and "HBM per chip" in result.stdout, result.stdout
  return json.loads(out.read_text())


def qwen3_elements(config) -> tuple[int, int]:
  """`(elements sharded on fsdp, replicated elements)` of a Qwen3 from its sizes: embedding
  V*D; per layer q D*H*K, k and v D*KV*K each, o H*K*D, gate/up/down 3*D*F (all sharded on
  their model dimension); RMSNorm scales 2*D + 2*K per layer and D at the end (on `tp`
  only); an untied lm_head D*V more."""
  d, h, kv, k, f = (
    config.embed_dim,
    config.num_heads,
    config.num_kv_heads,
    config.head_dim,
    config.hidden_dim,
  )
  layer = d * h * k + 2 * d * kv * k + h * k * d + 3 * d * f
  sharded = config.vocab_size * d * (1 if config.use_tied_embedding else 2)
  sharded += config.num_layers * layer
  return sharded, config.num_layers * (2 * d + 2 * k) + d


def adam_scalar_bytes(dtype) -> int:
  """Bytes of the optimizer state besides Adam's two moments: a one-parameter model's
  `nnx.Optimizer(guarded_adam)` state minus its two moments (one scalar has the weights'
  dtype, so the model's dtype matters)."""

  def optimizer():
    linear = nnx.Linear(1, 1, use_bias=False, param_dtype=dtype, rngs=nnx.Rngs(0))
    return nnx.Optimizer(linear, guarded_adam(0.1), wrt=nnx.Param)

  leaves = jax.tree.leaves(nnx.state(nnx.eval_shape(optimizer)))
  return sum(x.size * jnp.dtype(x.dtype).itemsize for x in leaves) - 2 * jnp.dtype(dtype).itemsize


CASES = {  # name: (plan arguments, model config, weight dtype, fsdp, rows, prompt, width, fields)
  # the toy default (float32, untied lm_head, KL in the loss: 9 completion-wide fields)
  "toy_v5e_2x2": (
    ["--topology", "v5e:2x2", "wandb=disabled"],
    lambda: models.tiny_qwen3_config(17, num_heads=2, head_dim=32, num_kv_heads=1),
    jnp.float32,
    4,
    32,
    8,
    16,
    9,
  ),
  # Qwen3-0.6B from its config (bfloat16 checkpoint, tied embeddings, KL in the reward: 8)
  "qwen3_0p6b_v5e_2x4": (
    ["--config", str(QWEN3_0P6B), "--topology", "v5e:2x4"],
    lambda: models.named_qwen3_config("qwen3_0p6b"),
    jnp.bfloat16,
    8,
    16,
    256,
    512,
    8,
  ),
}


@pytest.mark.parametrize(
  "case", ["toy_v5e_2x2", pytest.param("qwen3_0p6b_v5e_2x4", marks=pytest.mark.slow)]
)
def test_plan_train_step_bytes_are_the_arithmetic(tmp_path, case):
  """The compiled actor train step's arguments are the weights + Adam state + batch on one
  device, to the byte, and the donated bytes are exactly the optimizer state."""
  args, config, dtype, fsdp, batch, prompt, width, fields = CASES[case]
  figures = run_plan(tmp_path, *args, "--pieces", "actor/train_step")
  sharded, replicated = qwen3_elements(config())
  assert figures["parameters"] == sharded + replicated
  if case.startswith("qwen3_0p6b"):
    assert figures["parameters"] == 596_049_920
  assert figures["mesh"] == {"fsdp": fsdp, "tp": 1}
  weights = jnp.dtype(dtype).itemsize * (sharded // fsdp + replicated)
  optimizer = 2 * weights + adam_scalar_bytes(dtype)  # mu and nu keep the weights' dtype
  b = batch // fsdp  # rows per device; 2 prompt-wide, `fields` completion-wide, 2 per-row
  batch_bytes = 4 * (2 * b * prompt + fields * b * width + 2 * b)
  (step,) = figures["pieces"]
  assert figures["resident"]["actor weights"] == weights
  assert figures["resident"]["actor optimizer"] == optimizer
  assert step["argument_bytes"] == weights + optimizer + batch_bytes
  assert step["alias_bytes"] == optimizer
  assert step["temp_bytes"] > 0 and figures["peak_bytes"] > weights + optimizer


def test_plan_temporaries_grow_when_the_sequence_doubles(tmp_path):
  """The toy default's log-prob pass: twice the completion width, more temporaries."""
  widths = (16, 32)
  temps = []
  for width in widths:
    figures = run_plan(
      tmp_path,
      "--pieces",
      "actor/logps_pass",
      f"env.max_completion_len={width}",
      "wandb=disabled",
    )
    temps.append(figures["pieces"][0]["temp_bytes"])
  assert temps[1] > temps[0] > 0


def test_topology_names_and_chip_counts():
  assert plan.parse_topology("v5e:2x4") == ("v5e", 8)
  assert plan.parse_topology("v4:2x2x1") == ("v4", 4)
  with pytest.raises(ValueError, match=r"--topology 'v9:2x4'"):
    plan.parse_topology("v9:2x4")


@pytest.mark.parametrize(
  ("argv", "named"),
  [
    (["plan", "--pieces", "actor/train_stpe"], "--pieces"),
    (["plan", "--topology", "v5e-8"], "--topology"),
    (["plan", "--compiler", "gpu"], "--compiler"),
    (["plan", "train.batch_size=0"], "train.batch_size"),
  ],
)
def test_bad_plan_arguments_are_one_line_naming_the_option(argv, named, capsys):
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and named in err[0], err


def test_bytes_per_device_follow_the_sharding():
  """A [8, 6] float32 array split 1 way (one device) and a replicated bfloat16 vector."""
  mesh = jax.make_mesh((1,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
  tree = {
    "w": jax.ShapeDtypeStruct((8, 6), jnp.float32, sharding=NamedSharding(mesh, P("fsdp"))),
    "b": jax.ShapeDtypeStruct((5,), jnp.bfloat16, sharding=NamedSharding(mesh, P())),
    "n": np.zeros((3,), np.int32),
  }
  assert abstract.tree_bytes_per_device(tree) == 8 * 6 * 4 + 5 * 2 + 3 * 4


def test_activation_sharding_is_restored_after_tracing():
  from tunix.models.qwen3 import model as qwen3  # noqa: PLC0415

  original = qwen3.shard
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  with compat.qwen3_activation_sharding(mesh):
    assert qwen3.shard is not original
    x = jax.jit(lambda x: qwen3.shard(x, ("fsdp", None)))(jnp.ones((2, 3)))
    assert x.sharding.spec == P("fsdp", None) or x.sharding.is_fully_replicated
  assert qwen3.shard is original


def test_hf_config_gives_the_named_sizes():
  """A Hugging Face Qwen3-0.6B `config.json` mapping gives tunix's `qwen3_0p6b` sizes."""
  hf = {
    "num_hidden_layers": 28,
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_attention_heads": 16,
    "head_dim": 128,
    "num_key_value_heads": 8,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
  }
  config, dtype = abstract.qwen3_config_from_hf(hf)
  named = models.named_qwen3_config("qwen3_0p6b")
  for field in ("num_layers", "vocab_size", "embed_dim", "hidden_dim", "num_heads", "head_dim"):
    assert getattr(config, field) == getattr(named, field), field
  assert config.num_kv_heads == named.num_kv_heads and config.use_tied_embedding
  assert dtype == jnp.bfloat16
