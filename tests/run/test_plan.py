"""`tunix-ppo-ext plan`: the compiler's per-device memory of a config on a TPU topology.

The compile runs in a subprocess (it needs 8 CPU devices before JAX starts) with
`--compiler cpu`, so the test does not depend on `libtpu` being installed (with it, the
TPU compiler takes minutes per piece on this machine). The argument and donated bytes of
the compiled train step are checked against the parameter and Adam arithmetic of the
Qwen3 architecture, written here from its layer sizes.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.helpers.compile_settings import large_program_env
from tests.helpers.runs import SMOKE
from tunix_ppo_ext._src.optim.guards import guarded_adam
from tunix_ppo_ext._src.optim.optimizers import build_optimizer
from tunix_ppo_ext._src.run import cli, plan
from tunix_ppo_ext._src.run.run_config import load_resolved, load_run_config
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.aot import compile_pieces as abstract
from tunix_ppo_ext._src.tunix.learner import loss_fns
from tunix_ppo_ext._src.tunix.models import toy_models

pytestmark = pytest.mark.tunix

ROOT = pathlib.Path(__file__).resolve().parents[2]
QWEN3_0P6B = ROOT / "configs" / "qwen3_0p6b_tpu.yaml"


def run_plan(tmp_path: pathlib.Path, *args: str, env: Mapping[str, str] | None = None) -> dict:
  """`tunix-ppo-ext plan --compiler cpu ARGS --json ...` in a subprocess (over `env`: none,
  this process's); the JSON figures."""
  out = tmp_path / "plan.json"
  command = [sys.executable, "-m", "tunix_ppo_ext._src.run.cli", "plan", "--compiler", "cpu"]
  result = subprocess.run(
    [*command, *args, "--json", str(out)], env=env, capture_output=True, text=True, timeout=1800
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert "peak:" in result.stdout and "HBM per chip" in result.stdout, result.stdout
  return json.loads(out.read_text())


# `cli.main(["plan", ...])` for each argument list, all in one subprocess: the plans of one
# test share a JAX start-up (the first plan sets the device count: one topology per call)
PLANS = """
import contextlib, io, json, sys
from tunix_ppo_ext._src.run import cli
for argv in json.loads(sys.argv[1]):
  stdout, stderr = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
    code = cli.main(argv)
  print(json.dumps({"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}))
"""


def run_plans(tmp_path: pathlib.Path, *runs: Sequence[str]) -> list[dict]:
  """`run_plan`'s JSON figures of each of `runs` (arguments; one topology), planned one after
  another by one subprocess."""
  files = [tmp_path / f"plan{k}.json" for k in range(len(runs))]
  argvs = [
    ["plan", "--compiler", "cpu", *args, "--json", str(file)]
    for args, file in zip(runs, files, strict=True)
  ]
  result = subprocess.run(
    [sys.executable, "-c", PLANS, json.dumps(argvs)], capture_output=True, text=True, timeout=1800
  )
  assert result.returncode == 0, result.stderr[-3000:]
  outputs = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
  assert len(outputs) == len(runs), result.stdout[-3000:]
  for output in outputs:
    assert output["code"] == 0, output["stderr"][-3000:]
    assert "peak:" in output["stdout"] and "HBM per chip" in output["stdout"], output["stdout"]
  return [json.loads(file.read_text()) for file in files]


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


def actor_tx(*overrides: str, config: str | None = None) -> optax.GradientTransformation:
  """The actor's optimizer of a run config (its `optim.actor` section)."""
  run = load_run_config(config, list(overrides), need_files=False)
  return build_optimizer(run.optim.actor, run.train.lr, run.train.steps)


def scalar_bytes(dtype, tx=None, copies: int = 2) -> int:
  """Bytes of an optimizer state besides its per-parameter buffers: a one-parameter model's
  `nnx.Optimizer(tx)` state minus `copies` parameter-sized buffers (Adam's two moments; a
  third for `optax.MultiSteps`' accumulated gradients). One scalar has the weights' dtype,
  so the model's dtype matters; a learning-rate schedule adds a step count."""
  tx = guarded_adam(0.1) if tx is None else tx

  def optimizer():
    linear = nnx.Linear(1, 1, use_bias=False, param_dtype=dtype, rngs=nnx.Rngs(0))
    return nnx.Optimizer(linear, tx, wrt=nnx.Param)

  leaves = jax.tree.leaves(nnx.state(nnx.eval_shape(optimizer)))
  size = sum(x.size * jnp.dtype(x.dtype).itemsize for x in leaves)
  return size - copies * jnp.dtype(dtype).itemsize


CASES = {  # name: (plan arguments, model config, weight dtype, fsdp, rows, prompt, width, fields)
  # the toy default (float32, untied lm_head, KL in the loss: 9 completion-wide fields)
  "toy_v5e_2x2": (
    ["--topology", "v5e:2x2", "wandb=disabled"],
    lambda: toy_models.tiny_qwen3_config(17, num_heads=2, head_dim=32, num_kv_heads=1),
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
    lambda: toy_models.named_qwen3_config("qwen3_0p6b"),
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
  env = large_program_env(os.environ) if case.startswith("qwen3") else None
  figures = run_plan(tmp_path, *args, "--pieces", "actor/train_step", env=env)
  sharded, replicated = qwen3_elements(config())
  assert figures["parameters"] == sharded + replicated
  if case.startswith("qwen3_0p6b"):
    assert figures["parameters"] == 596_049_920
  assert figures["mesh"] == {"fsdp": fsdp, "tp": 1}
  weights = jnp.dtype(dtype).itemsize * (sharded // fsdp + replicated)
  tx = actor_tx(config=str(QWEN3_0P6B) if case.startswith("qwen3") else None)
  optimizer = 2 * weights + scalar_bytes(dtype, tx)  # mu and nu keep the weights' dtype
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
  args = ("--pieces", "actor/logps_pass", "wandb=disabled")
  plans = run_plans(tmp_path, *[(*args, f"env.max_completion_len={w}") for w in (16, 32)])
  temps = [figures["pieces"][0]["temp_bytes"] for figures in plans]
  assert temps[1] > temps[0] > 0


def test_tpu_topologies_have_one_device_per_chip():
  """With `libtpu`, a v4 slice's compile-only devices are its chips (megacore, as JAX sees
  a real v4), so `v4:2x2x1` gives 4 devices, like `v5e:2x2` (one core per chip)."""
  pytest.importorskip("libtpu")
  for topology in ("v4:2x2x1", "v5e:2x2"):
    devices = plan.plan_devices(topology, "tpu")
    assert devices.compiler == "tpu" and len(devices.devices) == 4, topology


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
    (
      ["plan", "--pieces", "critic/train_step", "ppo.advantage_estimator=grpo"]
      + ["ppo.num_generations=2"],
      "--pieces",
    ),
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
  from tunix.models.qwen3 import model as qwen3

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
  named = toy_models.named_qwen3_config("qwen3_0p6b")
  for field in ("num_layers", "vocab_size", "embed_dim", "hidden_dim", "num_heads", "head_dim"):
    assert getattr(config, field) == getattr(named, field), field
  assert config.num_kv_heads == named.num_kv_heads and config.use_tied_embedding
  assert dtype == jnp.bfloat16


TOY = ["--topology", "v5e:2x2", "wandb=disabled"]  # the toy default on fsdp=4
TOY_CONFIG = CASES["toy_v5e_2x2"][1]


def toy_weights() -> int:
  """Bytes per device of the toy default's float32 weights on fsdp=4."""
  sharded, replicated = qwen3_elements(TOY_CONFIG())
  return 4 * (sharded // 4 + replicated)


def toy_batch_bytes(rows: int) -> int:
  """One device's share of a toy train example of `rows` episodes (fsdp=4, prompt 8,
  completion 16, KL in the loss: 9 completion-wide fields, 2 prompt-wide, 2 per-row)."""
  b = rows // 4
  return 4 * (2 * b * 8 + 9 * b * 16 + 2 * b)


def test_group_estimator_plans_no_critic(tmp_path):
  """GRPO builds no critic: no critic piece is compiled and nothing of a critic is resident."""
  figures = run_plan(
    tmp_path,
    "--config",
    str(ROOT / "configs" / "smoke.yaml"),
    "--topology",
    "v5e:2x2",
    "ppo.advantage_estimator=grpo",
    "ppo.num_generations=4",
  )
  roles = {piece["role"] for piece in figures["pieces"]}
  assert roles == {"rollout", "actor", "reference"}
  assert set(figures["resident"]) == {"actor weights", "actor optimizer", "reference weights"}


def test_a_packed_run_is_planned_padded_and_says_so(capsys):
  argv = ["plan", "--config", str(SMOKE), "--compiler", "cpu", "--topology", "v5e:1x1"]
  argv += ["--pieces", "actor/logps_pass"]
  assert cli.main([*argv, "model.packing=true"]) == 0
  out = capsys.readouterr().out
  assert plan.PACKING_NOTE.format(k=4) in out.splitlines()
  assert cli.main(argv) == 0
  assert "model.packing" not in capsys.readouterr().out


def test_a_run_whose_groups_share_prompts_says_its_plan_is_an_upper_bound(capsys):
  """Rows of a GRPO group share their prompt, which the passes run once: the plan, made on
  padded rows, says its figures are an upper bound; one episode a prompt says nothing."""
  argv = ["plan", "--config", str(SMOKE), "--compiler", "cpu", "--topology", "v5e:1x1"]
  argv += ["--pieces", "actor/logps_pass"]
  assert cli.main([*argv, "ppo.advantage_estimator=grpo", "ppo.num_generations=4"]) == 0
  note = plan.SHARED_PROMPTS_NOTE.format(g=4, families="Qwen2, Qwen3, Llama3")
  assert note in capsys.readouterr().out.splitlines()  # the families that take a cache
  assert cli.main([*argv, "ppo.num_generations=1"]) == 0
  assert "upper bound" not in capsys.readouterr().out


@pytest.mark.tunix_facing  # tunix main's own losses return a LossOutput
def test_tunix_own_losses_are_planned_as_tunix_learner_runs_them(tmp_path):
  """`ppo.policy_loss_fn=ppo` / `ppo.value_loss_fn=ppo` (tunix's own, in tunix's registry
  only) are what plan compiles, from tunix's registry as tunix's learner looks them up; the
  step's arguments are those of our loss (the same weights, optimizer state and batch)."""
  from tunix.rl import algo_core

  assert loss_fns.configured_loss("policy_losses", "ppo") is algo_core.ppo_policy_loss_fn
  assert loss_fns.configured_loss("value_losses", "ppo") is algo_core.ppo_value_loss_fn
  ours = loss_fns.configured_loss("policy_losses", "ppo_ext")
  assert ours is loss_fns.ppo_ext_policy_loss_fn
  smoke = ("--config", str(ROOT / "configs" / "smoke.yaml"), "model.fused_head=false")
  steps = ("--pieces", "actor/train_step,critic/train_step")
  tunix_loss = ("ppo.policy_loss_fn=ppo", "ppo.value_loss_fn=ppo")
  tunix_loss += ("ppo.kl_method=kl", "ppo.kl_ctrl=fixed")  # what tunix's loss does (k1)
  tunix_own, own = run_plans(tmp_path, (*smoke, *steps, *tunix_loss), (*smoke, *steps))
  for tunix_step, own_step in zip(tunix_own["pieces"], own["pieces"], strict=True):
    assert tunix_step["role"] == own_step["role"] and tunix_step["name"] == "train_step"
    assert tunix_step["argument_bytes"] == own_step["argument_bytes"] > 0
    assert tunix_step["temp_bytes"] > 0


def test_optimizer_state_follows_the_optim_and_batch_sections(tmp_path):
  """The donated optimizer state is the run's: AdamW's decoupled decay and gradient clipping
  keep no state (same bytes as Adam), a micro-batch adds tunix's `optax.MultiSteps`
  accumulator (one more weights-sized buffer), and the train step then takes the micro-
  batch's rows (8 episodes, 2 per device), not the whole batch (32)."""
  weights = toy_weights()
  step = "actor/train_step"
  adamw_keys = ["optim.actor.name=adamw", "optim.actor.weight_decay=0.01"]
  adamw_keys.append("optim.actor.clip_grad_norm=1.0")
  adamw, micro = run_plans(
    tmp_path,
    (*TOY, "--pieces", step, *adamw_keys),
    (*TOY, "--pieces", step, "batch.train_micro_batch_size=8"),
  )
  adam = 2 * weights + scalar_bytes(jnp.float32, actor_tx())  # the default optim section
  assert adamw["pieces"][0]["alias_bytes"] == 2 * weights + scalar_bytes(
    jnp.float32, actor_tx(*adamw_keys)
  )
  assert adamw["pieces"][0]["alias_bytes"] == adam
  multi = optax.MultiSteps(actor_tx(), 4)  # mini-batch 32 / micro-batch 8
  accumulated = 3 * weights + scalar_bytes(jnp.float32, multi, copies=3)
  (micro_step,) = micro["pieces"]
  assert micro_step["alias_bytes"] == micro["resident"]["actor optimizer"] == accumulated
  assert micro_step["argument_bytes"] == weights + accumulated + toy_batch_bytes(8)
  assert adamw["pieces"][0]["argument_bytes"] == weights + adam + toy_batch_bytes(32)
  # tunix's rollout and log-prob micro-batches default to the train micro-batch
  assert micro["rows"] == {"rollout": 8, "logps": 8, "train": 8, "accumulation": 4}


def toy_adapter_bytes(rank: int) -> int:
  """Bytes per device of qwix's LoRA adapters on every projection of the toy Qwen3 (fsdp=4,
  tp=1, float32). Per layer, A takes the weight's input dims and B its output dims, each
  sharded as that side of the weight: the model dimension D on fsdp, heads N/KV x head_dim
  H and the MLP width F not. q, k, v: A [D, r] (sharded), B [r, N*H], [r, KV*H] twice;
  o: A [N*H, r], B [r, D] (sharded); gate, up: A [D, r] (sharded), B [r, F]; down: A [F, r],
  B [r, D] (sharded)."""
  c = TOY_CONFIG()
  d, nh, kvh, f = c.embed_dim, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.hidden_dim
  sharded = 7 * d * rank
  replicated = rank * (nh + 2 * kvh + nh + 2 * f + f)
  return 4 * c.num_layers * (sharded // 4 + replicated)


def test_lora_plan_trains_and_keeps_only_the_adapters(tmp_path):
  """With `model.lora`, the actor's optimizer state is Adam over the adapters alone, the
  base weights are held once (the reference pass runs on them, no second copy), and the
  train step donates exactly that state."""
  rank = 4
  figures = run_plan(
    tmp_path, *TOY, "--pieces", "actor/train_step,reference/logps_pass", f"model.lora.rank={rank}"
  )
  weights, adapters = toy_weights(), toy_adapter_bytes(rank)
  resident = figures["resident"]
  assert resident["base weights (actor, reference)"] == weights
  assert resident["actor adapters"] == adapters
  assert "reference weights" not in resident and "actor weights" not in resident
  optimizer = 2 * adapters + scalar_bytes(jnp.float32, actor_tx())
  assert resident["actor optimizer"] == optimizer
  pieces = {piece["role"]: piece for piece in figures["pieces"]}
  assert pieces["actor"]["alias_bytes"] == optimizer
  assert pieces["actor"]["argument_bytes"] == weights + adapters + optimizer + toy_batch_bytes(32)
  assert pieces["reference"]["resident_bytes"] == weights


def sampling_state_bytes(rows: int, cache: int, layers: int, kv_heads: int, head_dim: int) -> int:
  """One device's share of a float32 model's sampling state: token buffer and positions
  (int32) and log-prob buffer (float32), `[rows, cache]` each; per layer the KV cache's k
  and v `[rows, cache, kv_heads, head_dim]` and its end index `[rows]` (int32); `done`
  `[rows]` (bool); decoding step and total steps (int32 scalars); the PRNG key (2 uint32)."""
  kv_cache = layers * (2 * rows * cache * kv_heads * head_dim * 4 + 4 * rows)
  return 3 * 4 * rows * cache + kv_cache + rows + 2 * 4 + 2 * 4


def test_continuing_sampler_pieces_take_the_kv_cache(tmp_path):
  """The toy default (4 turns, `kv_cache: continue`) compiles the ContinuingSampler's
  prefill, decode, extend and compact programs; their arguments are the weights plus the
  sampling state with its KV cache of 8 + 16 + 2 slots for 32 / 4 rows per device, plus
  each program's own inputs; with `reencode` only prefill and decode are built."""
  figures, reencode = run_plans(
    tmp_path,
    (*TOY, "--pieces", "rollout/sampler"),
    (*TOY, "--pieces", "rollout/sampler", "env.kv_cache=reencode"),
  )
  pieces = {piece["name"]: piece for piece in figures["pieces"]}
  names = ["sampler_prefill", "sampler_decode", "sampler_extend", "sampler_compact"]
  assert list(pieces) == names
  c = TOY_CONFIG()
  rows, cache, width = 32 // 4, 8 + 16 + 2, 16  # extend: the completion budget's bucket
  state = sampling_state_bytes(rows, cache, c.num_layers, c.num_kv_heads, c.head_dim)
  weights = figures["resident"]["actor weights"]
  assert weights == toy_weights()
  assert pieces["sampler_prefill"]["argument_bytes"] == weights + state
  assert pieces["sampler_decode"]["argument_bytes"] == weights + state
  extend_inputs = rows * width * (4 + 1) + 4 + 4 * rows  # blocks, real, start, hole_from
  assert pieces["sampler_extend"]["argument_bytes"] == weights + state + extend_inputs
  compact = pieces["sampler_compact"]
  assert compact["argument_bytes"] == state + rows * cache * (4 + 1)  # + source, kept
  assert compact["resident_bytes"] == 0
  assert [piece["name"] for piece in reencode["pieces"]] == names[:2]


def test_step_rows_count_episodes_with_groups():
  """With groups of 4, a log-prob micro-batch of 8 episodes is 8 rows per pass (2 prompts x 4
  generations, the learner's chunk), inside a rollout of lcm(4, 8) = 8 episodes."""
  overrides = ["ppo.advantage_estimator=grpo", "ppo.num_generations=4"]
  overrides += ["batch.train_micro_batch_size=4", "batch.logps_micro_batch_size=8"]
  rows = plan.step_rows(load_resolved(None, overrides, need_files=False))
  assert (rows.rollout, rows.logps, rows.train) == (8, 8, 4)


def test_an_interrupted_plan_writes_nothing_and_the_rerun_writes_its_json(
  tmp_path, monkeypatch, capsys
):
  """Ctrl-C while a piece compiles: exit 130, one line saying nothing was written, no JSON
  (not even a partial one); the same command then writes it whole, over another config's."""
  out = tmp_path / "plan.json"
  command = ["plan", "--config", str(SMOKE), "--compiler", "cpu", "--topology", "v5e:1x1"]
  command += ["--pieces", "actor/logps_pass"]  # one chip: as many devices as JAX has here
  out.write_text('{"from": "another config"}')

  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt

  with monkeypatch.context() as patched:
    patched.setattr(abstract, "_compile", interrupted)
    assert cli.main([*command, "--json", str(out)]) == cli.EXIT_INTERRUPTED
  (line,) = capsys.readouterr().err.strip().splitlines()
  assert line == f"tunix-ppo-ext: error: {cli.INTERRUPTED['plan']}"
  assert json.loads(out.read_text()) == {"from": "another config"}  # left as it was
  assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]  # no partial sibling
  assert cli.main([*command, "--json", str(out)]) == 0
  (piece,) = json.loads(out.read_text())["pieces"]
  assert (piece["role"], piece["name"]) == ("actor", "logps_pass") and piece["temp_bytes"] > 0


def test_the_tpu_compilers_out_of_memory_refusal_gives_the_temporaries():
  """The TPU compiler refuses a program whose temporaries exceed the chip (message as
  libtpu 0.0.42.1 printed it for Qwen3-0.6B at 8,192 tokens a row); sizes are binary."""
  message = (
    "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
    "temporaries (131.74G) exceeds available HBM (15.75G)."
  )
  assert abstract.refused_temporaries(message) == round(131.74 * 2**30)
  assert abstract.refused_temporaries(message.replace("131.74G", "512.5M")) == 537395200
  assert abstract.refused_temporaries(message.replace("(131.74G)", "(900)")) == 900
  assert abstract.refused_temporaries("RESOURCE_EXHAUSTED: out of host memory") is None


def test_a_refused_piece_is_marked_and_the_verdict_says_so():
  def piece(name: str, temps: int, refused: bool) -> abstract.CompiledPiece:
    return abstract.CompiledPiece(
      role="actor",
      name=name,
      argument_bytes=3 * 2**20,
      output_bytes=0 if refused else 2**20,
      alias_bytes=0,
      temp_bytes=temps,
      code_bytes=0,
      resident_bytes=2**20,
      compile_s=12.5,
      refused=refused,
    )

  result = plan.Plan(
    topology="v5e:2x4",
    compiler="tpu",
    hbm_bytes=16 * 2**30,
    model_source="qwen3_0p6b",
    parameters=596_049_920,
    mesh={"fsdp": 8, "tp": 1},
    pieces=[piece("logps_pass", 2**30, False), piece("train_step", 20 * 2**30, True)],
    resident={"actor weights": 2**20},
    rows={"rollout": 16, "logps": 16, "train": 16, "accumulation": None},
  )
  text = plan.format_plan(result, "configs/x.yaml")
  (train_row,) = [line for line in text.splitlines() if line.startswith("  actor/train_step")]
  assert "refused: temps from the compiler's refusal" in train_row
  (logps_row,) = [line for line in text.splitlines() if line.startswith("  actor/logps_pass")]
  assert "refused" not in logps_row
  (verdict,) = [line for line in text.splitlines() if line.startswith("peak:")]
  assert verdict.endswith(
    "DOES NOT FIT (the TPU compiler refused the piece: its temporaries exceed the chip)"
  )
  assert result.peak_bytes == 2**20 + 2 * 2**20 + 20 * 2**30
  assert result.to_json()["pieces"][1]["refused"] is True


def test_the_tpu_compiler_is_asked_without_libtpus_process_lock(monkeypatch):
  """With `libtpu` installed every JAX process holds libtpu's lockfile, so `plan` lets
  libtpu load beside them (`ALLOW_MULTIPLE_LIBTPU_LOAD`), set before it asks for a
  topology, with libtpu or without (then `--compiler tpu` is refused in one line)."""
  import os

  monkeypatch.delenv("ALLOW_MULTIPLE_LIBTPU_LOAD", raising=False)
  try:
    plan.plan_devices("v5e:2x2", "tpu")
  except plan.ConfigError as err:  # no libtpu here
    assert "no TPU compiler" in str(err) and "\n" not in str(err)
  assert os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
