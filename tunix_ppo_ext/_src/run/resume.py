"""Resuming after a hard kill: actor and critic checkpoints of the same step.

tunix saves the actor's and the critic's orbax checkpoints one after the other (in
`<dir>/actor/<step>` and `<dir>/critic/<step>`), and each trainer restores its own latest
step. A kill between the two saves would resume the actor at step k and the critic at an
older step. `align_role_checkpoints` moves such unmatched steps aside (to
`<dir>/incomplete/<role>/<step>`, nothing is deleted) so both restore the same step.
`set_aside` moves a step that cannot be restored (a deleted or truncated file) to
`<dir>/damaged/`, so the next older step is restored instead.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

from tunix_ppo_ext._src.tunix.cluster.disk_space import finalized_steps

ROLES: tuple[str, ...] = ("actor", "critic")
INCOMPLETE = "incomplete"
DAMAGED = "damaged"


def align_role_checkpoints(
  checkpoint_dir: str | pathlib.Path, roles: Sequence[str] = ROLES
) -> int | None:
  """Moves steps that not every role in `roles` has to `<checkpoint_dir>/incomplete/`.

  Returns the latest step every role has (what the trainers will restore), or None.
  """
  root = pathlib.Path(checkpoint_dir)
  steps = {role: finalized_steps(root / role) for role in roles}
  common = set.intersection(*steps.values()) if steps else set()
  for role, role_steps in steps.items():
    for step in sorted(role_steps - common):
      _move_aside(root, role, step, INCOMPLETE)
  return max(common) if common else None


def common_step(checkpoint_dir: str | pathlib.Path, roles: Sequence[str] = ROLES) -> int | None:
  """The latest step every role in `roles` has, or None; moves nothing (what
  `align_role_checkpoints` would return)."""
  root = pathlib.Path(checkpoint_dir)
  common = set.intersection(*(finalized_steps(root / role) for role in roles)) if roles else set()
  return max(common) if common else None


def set_aside(checkpoint_dir: str | pathlib.Path, step: int, roles: Sequence[str] = ROLES) -> None:
  """Moves every role's `step` to `<checkpoint_dir>/damaged/<role>/<step>` (nothing deleted)."""
  root = pathlib.Path(checkpoint_dir)
  for role in roles:
    if (root / role / str(step)).is_dir():
      _move_aside(root, role, step, DAMAGED)


def _move_aside(root: pathlib.Path, role: str, step: int, bucket: str) -> None:
  target = root / bucket / role / str(step)
  suffix = 0
  while target.exists():
    suffix += 1
    target = root / bucket / role / f"{step}-{suffix}"
  target.parent.mkdir(parents=True, exist_ok=True)
  (root / role / str(step)).rename(target)
