"""The NaN guard on optimizer updates, in optax.

- `guarded_adam` / `guarded`: an optax optimizer behind `optax.apply_if_finite`, so an
  update whose gradient holds a NaN or inf (what a non-finite loss produces) is skipped:
  parameters and the optimizer's moments and step count stay as they were; a result that
  is not finite is dropped too (`skip_nonfinite_results`).
- `skip_counts`: those skips, read back from an optimizer state (the learner's
  `tunix.cluster.nan_guard.NanGuard` reports them and stops a run that keeps skipping);
  `new_skips`, `stuck` and `stuck_at_end`: the arithmetic of that report and those stops,
  on the counters alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

# apply_if_finite applies updates again after this many consecutive non-finite ones; the
# learner stops long before (`max_nonfinite_steps`), so in practice it never gives up.
_NEVER_GIVE_UP = 2**30


class NonFiniteTrainingError(RuntimeError):
  """Too many consecutive optimizer updates had a non-finite loss or gradient."""


def skip_nonfinite_results(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """`inner`, whose update is skipped (as `inner` skips a NaN gradient) when the parameters
  it would produce are not finite.

  `inner` is an `apply_if_finite` transformation: such an update is replaced by `inner`'s
  own update of a NaN gradient, which leaves parameters and moments as they were and counts
  a skip. So an overflowing step with a finite gradient (a huge learning rate) never
  reaches the parameters, and the state a checkpoint saves as "last good" holds no NaN.
  """

  def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
    new_updates, new_state = inner.update(updates, state, params)
    if params is None:
      return new_updates, new_state
    result = optax.apply_updates(params, new_updates)
    finite = jax.tree.reduce(lambda ok, x: ok & jnp.all(jnp.isfinite(x)), result, jnp.array(True))
    nan_gradient = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), updates)
    return jax.lax.cond(
      finite,
      lambda: (new_updates, new_state),
      lambda: inner.update(nan_gradient, state, params),
    )

  return optax.GradientTransformation(inner.init, update)


def in_gradient_dtype(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """`inner` whose updates come out in each gradient leaf's dtype.

  Adam's update of a bfloat16 leaf comes out float32 (the injected learning rate is a
  float32 array) while `apply_if_finite` skips with zeros in the gradient's dtype; its
  `lax.cond` needs both the same, so bfloat16 checkpoints could not train without this.
  """

  def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
    new_updates, new_state = inner.update(updates, state, params)
    return jax.tree.map(lambda u, g: u.astype(g.dtype), new_updates, updates), new_state

  return optax.GradientTransformation(inner.init, update)


def guarded(
  make: Callable[[Any], optax.GradientTransformation], learning_rate: float | optax.Schedule
) -> optax.GradientTransformation:
  """`make(learning_rate)` (any optax optimizer, e.g. clipping chained with AdamW) that
  skips an update whose gradient, or whose resulting parameters, are not finite (params and
  moments untouched; `skip_nonfinite_results`).

  `inject_hyperparams` stays outermost, so tunix finds (and logs) the learning rate in
  `opt_state.hyperparams["learning_rate"]`; a schedule there is evaluated per update.
  """

  def if_finite(learning_rate: Any) -> optax.GradientTransformation:
    guarded_inner = optax.apply_if_finite(
      in_gradient_dtype(make(learning_rate)), max_consecutive_errors=_NEVER_GIVE_UP
    )
    return skip_nonfinite_results(guarded_inner)

  return optax.inject_hyperparams(if_finite)(learning_rate=learning_rate)


def guarded_adam(learning_rate: float) -> optax.GradientTransformation:
  """optax Adam behind the NaN guard (`guarded`): an update whose gradient or result is
  NaN or inf is skipped and counted (the learner's `actor/nonfinite_skips`), never applied.
  Use it for tunix's `RLTrainingConfig(actor_optimizer=..., critic_optimizer=...)`.

  Args:
    learning_rate: Adam's learning rate (or an optax schedule).

  Returns:
    The guarded optax transformation.
  """
  return guarded(optax.adam, learning_rate)


@dataclasses.dataclass(frozen=True)
class SkipCounts:
  """`apply_if_finite`'s counters: skipped updates in a row now, and since initialisation."""

  consecutive: int
  total: int


def skip_counts(opt_state: Any) -> SkipCounts | None:
  """The counters of the (first) `apply_if_finite` inside an optimizer state; None if none.

  Works on an `nnx.Optimizer`'s `opt_state` (leaves wrapped in `OptArray`) and on plain
  optax states, whatever wraps it (`inject_hyperparams`, tunix's `MultiSteps`).
  """

  def is_guard(node: Any) -> bool:
    return isinstance(node, optax.ApplyIfFiniteState)

  for node in jax.tree_util.tree_leaves(opt_state, is_leaf=is_guard):
    if is_guard(node):
      return SkipCounts(
        consecutive=int(np.asarray(_value(node.notfinite_count))),
        total=int(np.asarray(_value(node.total_notfinite))),
      )
  return None


def _value(leaf: Any) -> Any:
  return leaf[...] if isinstance(leaf, nnx.Variable) else leaf


def new_skips(counts: Mapping[str, SkipCounts], seen: Mapping[str, int]) -> dict[str, int]:
  """Each trainer's updates skipped since the last look.

  Args:
    counts: each trainer's counters now, by role.
    seen: each role's `total` at the last look (a role not there: 0).

  Returns:
    The skips since then, by role.

  Examples:
    >>> new_skips({"actor": SkipCounts(consecutive=1, total=3)}, {"actor": 2})
    {'actor': 1}
  """
  return {role: found.total - seen.get(role, 0) for role, found in counts.items()}


def stuck(counts: Mapping[str, SkipCounts], max_consecutive: int) -> dict[str, SkipCounts]:
  """The trainers that skipped at least `max_consecutive` updates in a row.

  Args:
    counts: each trainer's counters, by role.
    max_consecutive: `PpoExtConfig.max_nonfinite_steps`.

  Returns:
    Their counters, by role (empty: none is stuck).
  """
  return {role: found for role, found in counts.items() if found.consecutive >= max_consecutive}


def stuck_at_end(
  counts: Mapping[str, SkipCounts], made: Mapping[str, int]
) -> dict[str, SkipCounts]:
  """At a run's last step: the trainers whose skips in a row at the end are at least half
  of the updates the run made (a short run that trained nothing is not a success).

  Args:
    counts: each trainer's counters, by role.
    made: the updates each role made in this run (a resumed run counts from its resume).

  Returns:
    Their counters, by role (empty: the run trained).

  Examples:
    >>> stuck_at_end({"actor": SkipCounts(consecutive=2, total=2)}, {"actor": 4})
    {'actor': SkipCounts(consecutive=2, total=2)}
  """
  return {
    role: found
    for role, found in counts.items()
    if found.consecutive > 0 and 2 * found.consecutive >= made[role]
  }
