"""Multi-host runs: when the CLI joins other hosts, which process writes, and a real run of
two JAX processes on this machine whose mesh spans both (CPU collectives over gloo), the way
the hosts of a TPU pod run the same command."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from tunix_ppo_ext._src.metrics.sinks import read_jsonl
from tunix_ppo_ext._src.run import distributed

SMOKE = pathlib.Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml"
STEPS = 1  # a second step would compile everything again (multi-process JAX; see README)


@pytest.mark.fast
@pytest.mark.parametrize(
  "flag, env, expected",
  [
    (None, {}, None),
    (None, {"JAX_COORDINATOR_ADDRESS": "10.0.0.2:1234"}, "JAX_COORDINATOR_ADDRESS is set"),
    (None, {"TPU_WORKER_HOSTNAMES": "t1k-w-0"}, None),  # a single-host TPU VM
    (None, {"TPU_WORKER_HOSTNAMES": "w-0,w-1,w-2,w-3"}, "TPU_WORKER_HOSTNAMES lists 4 hosts"),
    (None, {"TPU_PROCESS_ADDRESSES": "10.0.0.1:8476,10.0.0.2:8476"}, "lists 2 hosts"),
    (True, {}, "--multi-host"),
    (False, {"JAX_COORDINATOR_ADDRESS": "10.0.0.2:1234"}, None),
  ],
)
def test_multi_host_is_detected_or_forced(flag, env, expected):
  reason = distributed.multi_host_reason(flag, env)
  assert reason == expected or (expected is not None and expected in reason)


@pytest.mark.fast
def test_process_count_and_index_come_from_the_environment():
  env = {"JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
  assert distributed.initialize_kwargs(env) == {"num_processes": 4, "process_id": 3}
  assert distributed.initialize_kwargs({}) == {}  # JAX detects them (TPU pod, Slurm, MPI)
  with pytest.raises(ValueError, match="JAX_PROCESS_ID='one' must be an int"):
    distributed.initialize_kwargs({"JAX_PROCESS_ID": "one"})


@pytest.mark.fast
def test_only_process_zero_gets_the_sinks():
  sinks = ["jsonl", "progress", "wandb"]
  assert distributed.primary_only(0, sinks) == sinks
  assert distributed.primary_only(1, sinks) == [] == distributed.primary_only(7, sinks)
  assert distributed.is_primary(0) and not distributed.is_primary(3)


def free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


@pytest.mark.tunix  # two processes train: out of the fast lane
@pytest.mark.slow
def test_two_processes_train_on_one_mesh_and_only_process_zero_writes(tmp_path):
  out = tmp_path / "run"
  port = free_port()
  command = [sys.executable, "-m", "tunix_ppo_ext._src.run.cli", "train", "--config", str(SMOKE)]
  command += ["--output-dir", str(out), f"train.steps={STEPS}", "train.eval_batches=0"]
  command += ["mesh.shape=[2,1]"]  # fsdp over the two processes' devices: data split too
  processes, logs = [], []
  for index in range(2):
    env = {
      **os.environ,
      "JAX_PLATFORMS": "cpu",
      "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=1",
      "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
      "JAX_NUM_PROCESSES": "2",
      "JAX_PROCESS_ID": str(index),
    }
    logs.append(tmp_path / f"process{index}.log")
    with logs[-1].open("w") as log:
      processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=log))
  try:
    for process in processes:
      process.wait(timeout=600)
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
        process.wait()
  texts = [log.read_text() for log in logs]
  for process, text in zip(processes, texts, strict=True):
    assert process.returncode == 0, text[-3000:]
    assert "multi-host run (JAX_COORDINATOR_ADDRESS is set)" in text
    assert "mesh fsdp=2 x tp=1 on 2 device(s)" in text  # one device of each process
  ends = [[line for line in t.splitlines() if "next: tunix-ppo-ext plot" in line] for t in texts]
  assert len(ends[0]) == 1 and ends[1] == []  # process 1 prints no end of run
  assert "update/s" in texts[0] and "update/s" not in texts[1]  # nor a progress bar
  # one writer: every step once (steps count from 0 or 1, either layout)
  steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert steps[0] in (0, 1) and steps == list(range(steps[0], STEPS + 1))
  assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == steps
  assert json.loads((out / "summary.json").read_text())["steps"] == STEPS
  assert len(list((out / "tensorboard").rglob("events.out.tfevents*"))) == 1
  assert str(STEPS) in {p.name for p in (out / "checkpoints" / "actor").iterdir()}
