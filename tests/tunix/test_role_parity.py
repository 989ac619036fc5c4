"""Role meshes and log-prob micro-batches change nothing: same losses as one shared mesh.

Each variant runs `parity_run.py` in its own process on 4 simulated CPU devices.
(`offload_to_cpu=True` is not among them: on CPU, tunix 0.1.7's own `PPOLearner` fails
in its sampler with a host/device memory-space mismatch, before any pass of ours runs.)
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = pathlib.Path(__file__).with_name("parity_run.py")


@functools.cache
def losses(variant: str) -> dict[str, list[float]]:
  env = {
    **os.environ,
    "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
    "JAX_PLATFORMS": "cpu",
    "PYTHONPATH": str(SCRIPT.parents[2]),
  }
  done = subprocess.run(
    [sys.executable, str(SCRIPT), variant], capture_output=True, text=True, env=env, timeout=600
  )
  assert done.returncode == 0, done.stderr[-3000:]
  line = next(x for x in done.stdout.splitlines() if x.startswith("PARITY "))
  return json.loads(line.removeprefix("PARITY "))


@pytest.mark.parametrize("variant", ["role_meshes", "micro1", "micro2", "micro4"])
def test_losses_match_the_shared_mesh_run(variant):
  shared, other = losses("shared"), losses(variant)
  for role in ("actor", "critic"):
    assert len(other[role]) == len(shared[role]) == 2, role
    np.testing.assert_allclose(other[role], shared[role], rtol=0, atol=1e-5, err_msg=role)
