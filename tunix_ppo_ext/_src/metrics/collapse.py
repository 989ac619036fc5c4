"""The Echo Trap: RAGEN's multi-turn collapse, detected from a run's published metrics.

RAGEN (Wang et al., 2025, arXiv 2504.20073, section 4) reports a recurring collapse of
multi-turn agent RL: the reward's spread within a group falls off a cliff, the policy's
entropy collapses and the gradient norm spikes, as the agent repeats one reply whatever
the feedback. `EchoTrapRule` writes that down as one rule over three published keys, per
training batch:

- `S`: `train/in_group_return_std` (the mean over groups of the episodes' return std;
  `train/episode_return_std`, the batch's, when the run has groups of one),
- `H`: `actor/entropy` (mean per agent token),
- `G`: `actor/grad_norm` (the actor's gradient norm before any clipping).

Each signal's early level is the median of its first `early` values, its current level the
median of its latest `window` values. The rule fires at the first batch where

    S_now <= std_frac * S_early,  H_now <= entropy_frac * H_early,  G_now > grad_spike * G_early

all three at once, and fires once (a run whose returns never varied has `S_early = 0` and
meets the first condition). A run that converges lowers `S` and `H` too, but its
gradients shrink with its advantages; the spike in `G` tells a collapse from a solved task.
`echo_trap_step` applies the rule to a finished run's rows (`metrics.jsonl`); `EchoTrapWatch`
applies it while a run trains, warns once and logs `train/echo_trap` (1.0) at that step.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np

from tunix_ppo_ext._src.checks import check_integer, check_number
from tunix_ppo_ext._src.metrics.keys import MetricKeys

GROUP_STD_KEY = "train/in_group_return_std"
BATCH_STD_KEY = "train/episode_return_std"
ENTROPY_KEY = "actor/entropy"
GRAD_KEY = "actor/grad_norm"
ECHO_TRAP_EVENT = "learner/train/echo_trap"  # published `train/echo_trap`


class EchoTrapWarning(RuntimeWarning):
  """The Echo Trap rule fired during training (`EchoTrapWatch`)."""


@dataclasses.dataclass(frozen=True)
class EchoTrapRule:
  """RAGEN's Echo Trap as one rule over published metrics (see the module docstring).

  `early`, `window`: values per signal forming its early and current medians; `std_frac`,
  `entropy_frac` (> 0): the fractions of their early levels that the return spread and
  the entropy must fall to; `grad_spike` (>= 0): the multiple of its early level the
  gradient norm must exceed (0: any gradient).
  """

  early: int = 10
  window: int = 10
  std_frac: float = 0.25
  entropy_frac: float = 0.5
  grad_spike: float = 2.0

  def __post_init__(self):
    check_integer("early", self.early, low=1)
    check_integer("window", self.window, low=1)
    check_number("std_frac", self.std_frac, low=0.0, low_open=True)
    check_number("entropy_frac", self.entropy_frac, low=0.0, low_open=True)
    check_number("grad_spike", self.grad_spike, low=0.0)

  def levels(
    self, std: list[float], entropy: list[float], grad: list[float]
  ) -> list[tuple[float, float]] | None:
    """`[(early, now)]` of the three series (each in step order, NaNs left out), or None
    while one has fewer than `early + window` values."""
    if min(len(std), len(entropy), len(grad)) < self.early + self.window:
      return None
    return [
      (float(np.median(s[: self.early])), float(np.median(s[-self.window :])))
      for s in (std, entropy, grad)
    ]

  def fires(self, std: list[float], entropy: list[float], grad: list[float]) -> bool:
    """Whether the rule holds on these series (`levels`)."""
    levels = self.levels(std, entropy, grad)
    if levels is None:
      return False
    (s0, s1), (h0, h1), (g0, g1) = levels
    return s1 <= self.std_frac * s0 and h1 <= self.entropy_frac * h0 and g1 > self.grad_spike * g0


def _std_key(rows: Iterable[Mapping[str, Any]]) -> str:
  """The spread the rule reads: the in-group one when the run logged it."""
  return GROUP_STD_KEY if any(row.get(GROUP_STD_KEY) is not None for row in rows) else BATCH_STD_KEY


def echo_trap_step(
  rows: Iterable[Mapping[str, Any]], rule: EchoTrapRule | None = None
) -> int | None:
  """The first published step at which `rule` fires on a run's rows (`read_jsonl`), or None.

  The rule is checked at each row with a return spread (one per training batch), on the
  values logged up to that step.
  """
  rule, rows = rule or EchoTrapRule(), sorted(rows, key=lambda row: row["step"])
  std_key = _std_key(rows)
  series: dict[str, list[float]] = {std_key: [], ENTROPY_KEY: [], GRAD_KEY: []}
  for row in rows:
    for key, values in series.items():
      value = row.get(key)
      if value is not None and np.isfinite(value):
        values.append(float(value))
    if row.get(std_key) is not None and rule.fires(*series.values()):
      return int(row["step"])
  return None


class EchoTrapWatch:
  """A metric sink (behind `KeyedBackend`) that applies `EchoTrapRule` while a run trains.

  It receives every published key. A batch's step (one with a return spread) is checked
  once the entropy and the gradient norm have been logged at that step or later (or at
  `close`), on the values logged at steps up to it, as `echo_trap_step` does on the
  finished run: tunix's trainers log an update's metrics after the learner has logged the
  next batches'. When the rule first fires it issues one `EchoTrapWarning` naming the step
  and the three levels, and logs `train/echo_trap` = 1.0 at that step through tunix's
  metrics path, so every sink records it (not at `close`: the sinks are closing). Renamed
  keys are followed through `keys`. A resumed run's watch starts from the resumed part;
  `echo_trap_step` on the whole `metrics.jsonl` sees it all.
  """

  def __init__(self, keys: MetricKeys | None = None, rule: EchoTrapRule | None = None):
    keys = keys or MetricKeys()
    self.rule = rule or EchoTrapRule()
    self._keys = keys
    names = (GROUP_STD_KEY, BATCH_STD_KEY, ENTROPY_KEY, GRAD_KEY)
    self._names = {keys.final(name): name for name in names if keys.final(name)}
    self._series: dict[str, list[tuple[int, float]]] = {name: [] for name in names}
    self._pending: list[int] = []  # steps with a return spread, not yet checked
    self._latest = {ENTROPY_KEY: -1, GRAD_KEY: -1}  # the latest step each was logged at
    self.fired_at: int | None = None

  def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
    name = self._names.get(event)
    number = float(np.asarray(value).reshape(-1)[0])
    if name is None or self.fired_at is not None or not np.isfinite(number):
      return
    step = int(kwargs.get("step", 0))
    self._series[name].append((step, number))
    if name in (GROUP_STD_KEY, BATCH_STD_KEY):
      self._pending.append(step)
    else:
      self._latest[name] = max(self._latest[name], step)
    while (
      self._pending and self.fired_at is None and min(self._latest.values()) >= self._pending[0]
    ):
      self._check(self._pending.pop(0), log=True)

  def _check(self, step: int, log: bool) -> None:
    std_name = GROUP_STD_KEY if self._series[GROUP_STD_KEY] else BATCH_STD_KEY
    series = [
      [v for s, v in self._series[k] if s <= step] for k in (std_name, ENTROPY_KEY, GRAD_KEY)
    ]
    if self.fired_at is not None or not self.rule.fires(*series):
      return
    self.fired_at = step
    shown = ", ".join(
      f"{name} {now:.3g} (early {early:.3g})"
      for name, (early, now) in zip(
        ("return spread", "entropy", "grad norm"), self.rule.levels(*series) or [], strict=True
      )
    )
    warnings.warn(
      f"echo trap at step {step}: {shown}; the policy may be collapsing onto one reply "
      "(RAGEN's Echo Trap), see train/echo_trap",
      EchoTrapWarning,
      stacklevel=3,
    )
    if log:
      batch = (step - 1) // max(self._keys.updates_per_batch, 1)  # the learner's batch index
      jax.monitoring.record_scalar(ECHO_TRAP_EVENT, 1.0, step=batch)

  def close(self) -> None:
    """Checks the last batch (warns, without logging)."""
    for step in self._pending:
      self._check(step, log=False)
    self._pending = []
