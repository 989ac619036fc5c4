"""Meshes from the config: validation, role meshes, and a sharded run equal to a 1-device run.

The sharded run needs several devices before JAX starts, so it runs `tunix-ppo-ext train`
in a subprocess with `XLA_FLAGS=--xla_force_host_platform_device_count=4` (four simulated
CPU devices standing in for TPU cores).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import subprocess
import sys
import types

import jax
import numpy as np
import pytest
from absl import logging as absl_logging

from tunix_ppo_ext._src.metrics.sinks import read_jsonl
from tunix_ppo_ext._src.run import cli, job
from tunix_ppo_ext._src.run.run_config import load_run_config
from tunix_ppo_ext._src.tunix.cluster import cluster_setup as cluster
from tunix_ppo_ext._src.tunix.cluster import mesh
from tunix_ppo_ext._src.tunix.models import toy_models

pytestmark = pytest.mark.tunix

SMOKE = pathlib.Path(__file__).resolve().parents[3] / "configs" / "smoke.yaml"
# Both runs alike: tp=2 needs an even vocabulary (15 characters + 3 special ids) and an
# even number of KV heads; GAE without whitening makes the policy loss depend on the critic
# and nonzero at once (whitened advantages average to 0 at ratio 1).
SHARDABLE = [
  "train.steps=3",
  "train.eval_batches=0",
  "train.checkpoint_every=100",
  "model.num_kv_heads=2",
  "model.alphabet=abcehikst wx!?.",
  "ppo.advantage_estimator=gae",
  "ppo.whiten_advantages=false",
]
# (published key, tunix's own layout): the taxonomy renames tunix's `prefix/mode/name`.
LOSSES = [
  ("actor/pg_loss", "actor/train/pg_loss"),
  ("critic/vf_loss", "critic/train/vf_loss"),
  ("actor/loss", "actor/train/loss"),
  ("actor/entropy", "actor/train/entropy"),
]


def start_training(out: pathlib.Path, devices: int, overrides: list[str]) -> subprocess.Popen:
  """Starts `tunix-ppo-ext train` on `devices` simulated CPU devices (stderr to a file)."""
  flags = os.environ.get("XLA_FLAGS", "")
  env = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={devices}".strip(),
  }
  command = [sys.executable, "-m", "tunix_ppo_ext._src.run.cli", "train", "--config", str(SMOKE)]
  out.mkdir(parents=True)
  with (out / "stderr.log").open("w") as log:
    return subprocess.Popen(
      [*command, "--output-dir", str(out), *overrides], env=env, stdout=log, stderr=log
    )


def finished(process: subprocess.Popen, out: pathlib.Path) -> str:
  """Waits for the run; returns its stderr after checking that it succeeded."""
  process.wait(timeout=600)
  log = (out / "stderr.log").read_text()
  assert process.returncode == 0, log[-3000:]
  return log


def loss_series(rows: list[dict], names: tuple[str, ...]) -> tuple[str, dict[int, float]]:
  """`(key, {step: value})` of the first of `names` present in the rows."""
  for name in names:
    series = {r["step"]: r[name] for r in rows if r.get(name) is not None}
    if series:
      return name, series
  raise AssertionError(f"none of {names} in metrics.jsonl")


def test_fsdp2_tp2_on_4_devices_matches_one_device(tmp_path):
  # both at once: most of each run is single-threaded compilation
  one = start_training(tmp_path / "one", 1, [*SHARDABLE, "mesh.shape=[1,1]"])
  four = start_training(tmp_path / "four", 4, [*SHARDABLE, "mesh.shape=[2,2]"])
  try:
    log_one, log_four = finished(one, tmp_path / "one"), finished(four, tmp_path / "four")
  finally:
    for process in (one, four):
      if process.poll() is None:
        process.kill()
        process.wait()
  assert "mesh fsdp=1 x tp=1 on 1 device(s): actor, critic, reference, rollout" in log_one
  assert "Skipping non-TPU device" not in log_one + log_four  # tunix's notice, dropped
  assert "mesh fsdp=2 x tp=2 on 4 device(s): actor, critic, reference, rollout" in log_four
  rows_one = read_jsonl(tmp_path / "one" / "metrics.jsonl")
  rows_four = read_jsonl(tmp_path / "four" / "metrics.jsonl")
  for names in LOSSES:
    key, expected = loss_series(rows_one, names)
    _, actual = loss_series(rows_four, names)
    assert len(expected) >= 2 and sorted(actual) == sorted(expected), key
    steps = sorted(expected)
    np.testing.assert_allclose(
      [actual[s] for s in steps], [expected[s] for s in steps], rtol=0, atol=1e-4, err_msg=key
    )
  _, pg = loss_series(rows_one, LOSSES[0])
  assert any(abs(v) > 1e-4 for v in pg.values())  # the comparison is not of zeros


def test_mesh_bigger_than_the_devices_stops_the_command(capsys):
  n = jax.device_count()
  assert cli.main(["train", f"mesh.shape=[{n + 1},1]"]) == 2
  err = capsys.readouterr().err
  assert f"'mesh.shape'=[{n + 1}, 1] needs {n + 1} devices, but jax.device_count()={n}" in err


@pytest.mark.parametrize(
  "override, message",
  [
    ("mesh.shape=[2]", r"'mesh.shape'=\[2\] has 1 axes but 'mesh.axis_names'"),
    ("mesh.shape=[0,1]", r"'mesh.shape'=\[0, 1\]: sizes must be >= 1"),
    ("mesh.shape=[-1,-1]", r"at most one -1"),
    ("mesh.shape=[two,1]", r"'mesh.shape\[0\]' must be int, got 'two'"),
    ("mesh.axis_names=[data,model]", r"must include \['fsdp', 'tp'\].*missing"),
    ("mesh.axis_names=[fsdp,fsdp]", r"repeated names"),
    ("mesh.roles.actr.shape=[1,1]", r"'mesh.roles.actr': unknown role; did you mean 'actor'"),
    ("mesh.roles.rollout.shap=[1,1]", r"'mesh.roles.rollout.shap'; did you mean 'shape'"),
    ("mesh.roles.critic.shape=[1,1,1]", r"'mesh.roles.critic.shape'=\[1, 1, 1\] has 3 axes"),
  ],
)
def test_bad_mesh_sections_are_named(override, message):
  with pytest.raises(ValueError, match=message):
    load_run_config(None, [override])


def test_shapes_resolve_against_the_device_count():
  names = ["fsdp", "tp"]
  assert mesh.resolve_shape("mesh", None, names, 8) == (8, 1)
  assert mesh.resolve_shape("mesh", None, ["fsdp", "tp", "sp"], 4) == (4, 1, 1)
  assert mesh.resolve_shape("mesh", [-1, 2], names, 8) == (4, 2)
  assert mesh.resolve_shape("mesh", [2, 2], names, 8) == (2, 2)  # the first 4 of 8
  with pytest.raises(ValueError, match=r"the -1 axis needs jax.device_count\(\)=6"):
    mesh.resolve_shape("mesh", [-1, 4], names, 6)


def test_roles_share_one_mesh_unless_given_their_own():
  shared = load_run_config(None, ["mesh.shape=[1,1]"]).mesh
  meshes = mesh.role_meshes(shared)
  assert set(meshes) == {mesh.Role.ACTOR, mesh.Role.CRITIC, mesh.Role.REFERENCE, mesh.Role.ROLLOUT}
  assert len({id(m) for m in meshes.values()}) == 1
  assert all(m.axis_types == (jax.sharding.AxisType.Auto,) * 2 for m in meshes.values())
  own = load_run_config(None, ["mesh.roles.rollout.axis_names=[fsdp,tp,sp]"]).mesh
  meshes = mesh.role_meshes(own)
  assert meshes[mesh.Role.ROLLOUT].axis_names == ("fsdp", "tp", "sp")
  assert meshes[mesh.Role.ACTOR] is meshes[mesh.Role.CRITIC] is meshes[mesh.Role.REFERENCE]
  assert meshes[mesh.Role.ACTOR] != meshes[mesh.Role.ROLLOUT]
  text = mesh.describe_meshes(meshes)
  assert "actor, critic, reference" in text and "fsdp=1 x tp=1 x sp=1" in text


def test_a_rollout_mesh_of_its_own_is_refused_before_anything_compiles():
  run = load_run_config(None, ["mesh.roles.rollout.axis_names=[fsdp,tp,sp]"])
  with pytest.raises(ValueError, match=r"'mesh.roles.rollout'.*needs the actor's mesh"):
    job.run_meshes(run)
  code = cli.main(["train", "mesh.roles.rollout.axis_names=[fsdp,tp,sp]", "wandb=disabled"])
  assert code == 2  # one line on stderr, nothing trained
  job.run_meshes(load_run_config(None, ["mesh.roles.rollout.shape=[1,1]"]))  # same spec: fine


def test_batch_must_divide_by_the_trainers_fsdp_size():
  fsdp2 = jax.sharding.AbstractMesh((2, 1), ("fsdp", "tp"))
  meshes = dict.fromkeys(mesh.Role, fsdp2)
  mesh.check_batch_divisible(meshes, 8)
  with pytest.raises(ValueError, match=r"'train.batch_size'=7 must be a multiple of the actor"):
    mesh.check_batch_divisible(meshes, 7)


def test_indivisible_parameter_is_named_before_placement():
  tp2 = jax.sharding.AbstractMesh((1, 2), ("fsdp", "tp"))
  config = toy_models.tiny_qwen3_config(18, num_layers=1, embed_dim=32, num_heads=2, num_kv_heads=2)
  cluster.check_shardable(toy_models.make_policy(config), tp2)
  odd_vocab = toy_models.make_policy(dataclasses.replace(config, vocab_size=17))
  with pytest.raises(ValueError, match=r"'input_embedding'.*shape \(17, 32\).*of total size 2"):
    cluster.check_shardable(odd_vocab, tp2)
  one_kv_head = toy_models.make_policy(dataclasses.replace(config, num_kv_heads=1))
  with pytest.raises(ValueError, match=r"'k_proj'.*dimension of 1 sharded on mesh axes \('tp',\)"):
    cluster.check_shardable(one_kv_head, tp2)


def _tunix_warnings(mesh: jax.sharding.Mesh) -> None:
  """tunix's two CPU notices, as tunix logs them (absl), between warnings that must pass."""
  absl_logging.warning("checkpoint %d is kept", 1)
  absl_logging.warning(
    "Skipping non-TPU device: %s. You might be missing jax[tpu] dependency.", "cpu"
  )
  absl_logging.warning("Resharding model from %s to %s", None, mesh)
  absl_logging.warning("Resharding model from %s to %s", mesh, "Mesh('fsdp': 2)")
  logging.getLogger("absl").warning("Skipping non-TPU devices is not this message")


def test_a_cpu_mesh_drops_only_tunix_s_tpu_notices(caplog):
  """A user on a CPU takes tunix's "Skipping non-TPU device: cpu ... missing jax[tpu]" and
  "Resharding model from None to Mesh(...)" for errors: a mesh of CPUs drops those two
  from absl's logger, and every other record still passes."""
  absl = logging.getLogger("absl")
  absl.removeFilter(mesh.drop_cpu_notices)  # another test's mesh may have installed it
  try:
    with caplog.at_level(logging.WARNING):
      _tunix_warnings(jax.make_mesh((1,), ("fsdp",)))
      assert len(caplog.records) == 5  # without the filter every record passes
      caplog.clear()
      made = mesh.make_mesh()
      assert mesh.drop_cpu_notices in absl.filters
      _tunix_warnings(made)
    assert [r.getMessage() for r in caplog.records] == [
      "checkpoint 1 is kept",
      f"Resharding model from {made} to Mesh('fsdp': 2)",
      "Skipping non-TPU devices is not this message",
    ]
  finally:
    absl.removeFilter(mesh.drop_cpu_notices)


def test_the_notices_pass_where_a_device_is_not_a_cpu():
  absl = logging.getLogger("absl")
  absl.removeFilter(mesh.drop_cpu_notices)
  tpu = types.SimpleNamespace(platform="tpu")
  assert not mesh.quiet_cpu_notices([*jax.devices(), tpu])
  assert mesh.drop_cpu_notices not in absl.filters
  assert mesh.quiet_cpu_notices() and mesh.quiet_cpu_notices()  # CPUs here: on, once
  assert absl.filters.count(mesh.drop_cpu_notices) == 1
  absl.removeFilter(mesh.drop_cpu_notices)
