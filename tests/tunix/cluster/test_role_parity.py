"""Role meshes, host offloading and log-prob micro-batches change nothing: same losses as
one shared mesh.

Each variant runs `parity_run.py` in its own process on 4 simulated CPU devices. tunix 0.1.7's
own `PPOLearner` cannot run the `offload` variant (its `get_values` reads the offloaded critic
from host memory, see `test_values_pass_loads_an_offloaded_critic`); ours can. The same runs
on a GPU: `bench/gpu_offload_parity.sh`.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.rollout import base_rollout

from tests.helpers.parity_run import stock_cluster
from tunix_ppo_ext._src.tunix.cluster.mesh import make_mesh
from tunix_ppo_ext._src.tunix.learner.role_passes import ModelInputs, RolePasses

pytestmark = pytest.mark.tunix

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "helpers" / "parity_run.py"


@functools.cache
def losses(variant: str) -> dict[str, list[float]]:
  env = {
    **os.environ,
    "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4",
    "JAX_PLATFORMS": "cpu",
    "PYTHONPATH": str(SCRIPT.parents[2]),
  }
  done = subprocess.run(
    [sys.executable, str(SCRIPT), variant], capture_output=True, text=True, env=env, timeout=600
  )
  assert done.returncode == 0, done.stderr[-3000:]
  line = next(x for x in done.stdout.splitlines() if x.startswith("PARITY "))
  return json.loads(line.removeprefix("PARITY "))


@pytest.mark.parametrize("variant", ["role_meshes", "offload", "micro1", "micro2", "micro4"])
def test_losses_match_the_shared_mesh_run(variant):
  shared, other = losses("shared"), losses(variant)
  for role in ("actor", "critic"):
    assert len(other[role]) == len(shared[role]) == 2, role
    np.testing.assert_allclose(other[role], shared[role], rtol=0, atol=1e-5, err_msg=role)


def offloading_cluster(offload: bool) -> rl_cluster_lib.RLCluster:
  """tunix's own cluster of a one-layer Qwen3 with a critic, `offload_to_cpu` as given."""
  meshes = dict.fromkeys(rl_cluster_lib.Role, make_mesh((1, 1)))
  rollout = base_rollout.RolloutConfig(
    max_tokens_to_generate=4, max_prompt_length=8, kv_cache_size=16
  )
  return stock_cluster(meshes, rollout, max_steps=1, offload=offload)


def test_values_pass_loads_an_offloaded_critic():
  """tunix 0.1.7 offloads the critic at start-up and its `get_values` never loads it back
  (a gather across memory spaces); ours loads it, gives the same values and offloads it again."""
  rng = np.random.default_rng(0)
  prompt = jnp.asarray(rng.integers(2, 10, (2, 5)), jnp.int32)
  completion = jnp.asarray(rng.integers(2, 10, (2, 4)), jnp.int32)
  inputs = ModelInputs(
    prompt, completion, jnp.ones((2, 4), jnp.int32), jnp.ones((2, 4)), 0, 1, None
  )
  on_device, offloaded = offloading_cluster(False), offloading_cluster(True)
  with pytest.raises(ValueError, match="memory_space"):
    offloaded.get_values(prompt, completion, 0, 1)
  values = RolePasses(offloaded, None).values(inputs)
  np.testing.assert_array_equal(values, RolePasses(on_device, None).values(inputs))
  kernel = offloaded.critic_trainer.model.value_head.kernel.value
  assert kernel.sharding.memory_kind == "pinned_host"
