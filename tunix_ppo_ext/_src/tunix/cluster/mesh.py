"""Device meshes from the run config: one shared mesh, or separate meshes for some roles.

`make_mesh` makes one mesh (Auto axes; a mesh of CPUs quiets tunix's TPU notices,
`quiet_cpu_notices`). `role_meshes` turns the config's `mesh` section into the
`{Role: Mesh}` mapping of tunix's `ClusterConfig.role_to_mesh`. Roles given the same shape
and axis names get one `Mesh` object; tunix then shares weights between actor and rollout
instead of syncing a copy. What needs the device count lives here, not in the config
validation, so configs written for a TPU slice still validate on a laptop.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from tunix.rl import rl_cluster as rl_cluster_lib

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.config.run_sections import MESH_ROLES

# tunix's absl warnings that every CPU-only run prints and that ask nothing of its user:
# its memory report's (tunix/sft/utils.py, each learner's start) and RLCluster's note that
# it moved a model built without a mesh onto its role's mesh (tunix/rl/rl_cluster.py).
CPU_NOTICES = ("Skipping non-TPU device: cpu. ", "Resharding model from None to Mesh(")


def make_mesh(
  shape: Sequence[int] = (1, 1),
  axis_names: Sequence[str] = ("fsdp", "tp"),
  devices: Sequence[jax.Device] | None = None,
) -> jax.sharding.Mesh:
  """A mesh of `shape` (default 1x1) named like tunix's Qwen3 shardings (`fsdp`, `tp`).

  It takes the first `prod(shape)` of `devices` (default `jax.devices()`); on all of them,
  `jax.make_mesh` orders devices by the physical topology. Axis types must be Auto:
  `jax.make_mesh` defaults to Explicit, under which tunix's embedding lookup fails with a
  `ShardingTypeError`. A mesh of CPUs also quiets tunix's TPU notices (`quiet_cpu_notices`).

  Args:
    shape: the mesh's shape.
    axis_names: one name per axis of `shape`.
    devices: the devices to take from; None: `jax.devices()`.

  Returns:
    The `jax.sharding.Mesh`.
  """
  devices = list(jax.devices() if devices is None else devices)
  size = math.prod(shape)
  if size > len(devices):
    raise ConfigError(f"mesh shape {tuple(shape)} needs {size} devices, got {len(devices)}")
  auto = (jax.sharding.AxisType.Auto,) * len(shape)
  chosen = None if size == len(jax.devices()) == len(devices) else devices[:size]
  quiet_cpu_notices(devices[:size])
  return jax.make_mesh(tuple(shape), tuple(axis_names), axis_types=auto, devices=chosen)


def quiet_cpu_notices(devices: Sequence[jax.Device] | None = None) -> bool:
  """On CPU only (`devices`, default `jax.devices()`, all CPUs), drops tunix's `CPU_NOTICES`
  from the `absl` logger for the rest of the process (`drop_cpu_notices`); every other
  record passes. Returns whether the filter is on. Called where a run's meshes are made
  (`make_mesh`) and its cluster built (`build_cluster`); installing it twice installs it
  once."""
  devices = jax.devices() if devices is None else devices
  if not devices or any(device.platform != "cpu" for device in devices):
    return False
  logging.getLogger("absl").addFilter(drop_cpu_notices)
  return True


def drop_cpu_notices(record: logging.LogRecord) -> bool:
  """A logging filter: False (drop) for a record whose message begins with one of
  `CPU_NOTICES`, True for any other."""
  return not record.getMessage().startswith(CPU_NOTICES)


Role = rl_cluster_lib.Role


def resolve_shape(
  key: str, shape: Sequence[int] | None, axis_names: Sequence[str], num_devices: int
) -> tuple[int, ...]:
  """The concrete axis sizes of a checked spec on `num_devices` devices.

  None -> `(num_devices, 1, ...)`; a -1 takes the devices the other axes leave. The
  product may be smaller than `num_devices` (the first devices are used), never larger.
  """
  if shape is None:
    return (num_devices,) + (1,) * (len(axis_names) - 1)
  sizes = list(shape)
  if -1 in sizes:
    rest = math.prod(s for s in sizes if s != -1)
    if num_devices % rest:
      raise ConfigError(
        f"config key '{key}.shape'={sizes}: the -1 axis needs jax.device_count()="
        f"{num_devices} to be a multiple of {rest}"
      )
    sizes[sizes.index(-1)] = num_devices // rest
  if math.prod(sizes) > num_devices:
    raise ConfigError(
      f"config key '{key}.shape'={list(shape)} needs {math.prod(sizes)} devices, but "
      f"jax.device_count()={num_devices}"
    )
  return tuple(sizes)


def role_specs(section: Any) -> dict[str, tuple[list[int] | None, list[str]]]:
  """`{role: (shape, axis_names)}` for the four roles; unlisted roles get the main mesh.

  `section` is a `run_sections.MeshSection` (`shape`, `axis_names`, `roles`).
  """
  main = (section.shape, list(section.axis_names))
  specs = {}
  for role in MESH_ROLES:
    entry = section.roles.get(role)
    if entry is None:
      specs[role] = main
    else:
      specs[role] = (entry.shape, list(entry.axis_names or section.axis_names))
  return specs


def role_meshes(section: Any, devices: Sequence[jax.Device] | None = None) -> dict[Role, Any]:
  """tunix's `role_to_mesh` for a `MeshSection` on `devices` (default: all JAX devices).

  Each mesh takes the first `prod(shape)` devices; equal specs share one `Mesh` object.
  Raises ValueError naming the config key when a mesh needs more devices than there are.

  Args:
    section: the run config's `mesh` section.
    devices: the devices to take from; None: all JAX devices.

  Returns:
    tunix's `Role` -> `jax.sharding.Mesh`.
  """
  devices = list(jax.devices() if devices is None else devices)
  built: dict[tuple[tuple[int, ...], tuple[str, ...]], Any] = {}
  meshes = {}
  for role, (shape, names) in role_specs(section).items():
    key = "mesh" if section.roles.get(role) is None else f"mesh.roles.{role}"
    sizes = resolve_shape(key, shape, names, len(devices))
    spec = (sizes, tuple(names))
    if spec not in built:
      built[spec] = make_mesh(sizes, tuple(names), devices=devices[: math.prod(sizes)])
    meshes[Role(role)] = built[spec]
  return meshes


def check_batch_divisible(meshes: Mapping[Role, Any], batch_size: int) -> None:
  """Raises ValueError unless `batch_size` divides by the trainers' `fsdp` axis size.

  tunix shards each training batch's rows on `fsdp` (`data_sharding_axis`) and silently
  replicates a batch that does not divide; this makes that a clear error instead.
  """
  for role in (Role.ACTOR, Role.CRITIC):
    fsdp = meshes[role].shape["fsdp"]
    if batch_size % fsdp:
      raise ConfigError(
        f"config key 'train.batch_size'={batch_size} must be a multiple of the {role.value} "
        f"mesh's fsdp size {fsdp} (tunix shards each batch's rows on 'fsdp')"
      )


def check_multi_turn_rollout_mesh(meshes: Mapping[Role, Any]) -> None:
  """Raises ValueError when the rollout role has a mesh other than the actor's.

  The multi-turn rollout samples with tunix 0.1.7's vanilla engine, whose weight sync to a
  rollout mesh of its own fails (`Disallowed host-to-device transfer`, seen on simulated
  CPU devices); refused here, before anything compiles, rather than inside the sync.
  """
  rollout, actor = meshes.get(Role.ROLLOUT), meshes.get(Role.ACTOR)
  if rollout is not None and actor is not None and rollout != actor:
    raise ConfigError(
      "config key 'mesh.roles.rollout': the multi-turn rollout needs the actor's mesh (tunix "
      "0.1.7's vanilla engine cannot sync the actor's weights to a rollout mesh of its own); "
      "remove mesh.roles.rollout or give it the actor's shape and axis names"
    )


def describe_meshes(meshes: Mapping[Role, Any]) -> str:
  """One line per distinct mesh: its axis sizes and the roles on it (for the CLI's log)."""
  groups: dict[int, list[str]] = {}
  for role, mesh in meshes.items():
    groups.setdefault(id(mesh), []).append(role.value)
  by_id = {id(mesh): mesh for mesh in meshes.values()}
  lines = []
  for key, roles in groups.items():
    mesh = by_id[key]
    axes = " x ".join(f"{name}={size}" for name, size in mesh.shape.items())
    lines.append(f"mesh {axes} on {mesh.devices.size} device(s): {', '.join(roles)}")
  return "\n".join(lines)
