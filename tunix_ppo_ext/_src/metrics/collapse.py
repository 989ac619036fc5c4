"""The Echo Trap: RAGEN's multi-turn collapse, detected from a run's published metrics.

RAGEN (Wang et al., 2025, arXiv 2504.20073, section 4) reports a recurring collapse of
multi-turn agent RL: the reward's spread within a group falls off a cliff, the policy's
entropy collapses and the gradient norm spikes, as the agent repeats one reply whatever
the feedback. `EchoTrapRule` writes it down as one rule over published keys, per training
batch:

- `S`: `train/in_group_return_std` (the mean over groups of the episodes' return std;
  `train/episode_return_std`, the batch's, when the run has groups of one),
- `H`: `actor/entropy` (mean per agent token),
- `G`: `actor/grad_norm` (the actor's gradient norm before any clipping),
- `R`: `train/episode_return/mean`, against the environment's `max_return` when known.

Each signal's early level is the median of its first `early` values, its current level the
median of its latest `window` values. The rule fires, once, at the first batch where the
spread and the entropy have collapsed,

    S_now <= std_frac * S_early  and  H_now <= entropy_frac * H_early,

and the run is not a solved one: its gradients spike, `G_now > grad_spike * G_early`
(RAGEN's sign), or its return is short of the task, `R_now < return_frac * max_return`.
A run that solves its task also loses spread and entropy, but keeps its return and its
gradients shrink. The return condition is ours: on this package's toy tasks the collapse
comes with vanishing gradients, the policy settled on one reply (an empty one, an invalid
one, or always taking) far below the maximum. A run whose returns never varied has
`S_early = 0` and meets the spread condition.
`echo_trap_step` applies the rule to a finished run's rows (`metrics.jsonl`); `EchoTrapWatch`
applies it while a run trains, warns once and logs `train/echo_trap` (1.0) at that step.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from tunix_ppo_ext._src.checks import FieldKeys, check_integer, check_number
from tunix_ppo_ext._src.metrics.keys import SUMMARY_KEY, MetricKeys

GROUP_STD_KEY = "train/in_group_return_std"
BATCH_STD_KEY = "train/episode_return_std"
ENTROPY_KEY = "actor/entropy"
GRAD_KEY = "actor/grad_norm"
RETURN_KEY = SUMMARY_KEY  # train/episode_return/mean
ECHO_TRAP_EVENT = "learner/train/echo_trap"  # published `train/echo_trap`


class EchoTrapWarning(RuntimeWarning):
  """The Echo Trap rule fired during training (`EchoTrapWatch`)."""


@dataclasses.dataclass(frozen=True)
class EchoTrapRule:
  """RAGEN's Echo Trap as one rule over published metrics (see the module docstring).

  `early`, `window`: values per signal forming its early and current medians; `std_frac`,
  `entropy_frac` (> 0): the fractions of their early levels that the return spread and
  the entropy must fall to; `grad_spike` (>= 0): the multiple of its early level the
  gradient norm must exceed (0: any gradient); `return_frac` (in (0, 1]): the share of the
  environment's `max_return` the return must stay under (without a maximum, only the
  gradient condition can tell a collapse).
  """

  early: int = 10
  window: int = 10
  std_frac: float = 0.25
  entropy_frac: float = 0.5
  grad_spike: float = 2.0
  return_frac: float = 0.9
  # how the checks name the fields (init-only; None: bare, `early`), e.g. `metrics.echo_trap.`
  keys: dataclasses.InitVar[FieldKeys | None] = None

  def __post_init__(self, keys: FieldKeys | None = None):
    name = (keys or FieldKeys(owner="")).subject
    check_integer(name("early"), self.early, low=1)
    check_integer(name("window"), self.window, low=1)
    check_number(name("std_frac"), self.std_frac, low=0.0, low_open=True)
    check_number(name("entropy_frac"), self.entropy_frac, low=0.0, low_open=True)
    check_number(name("grad_spike"), self.grad_spike, low=0.0)
    check_number(name("return_frac"), self.return_frac, low=0.0, high=1.0, low_open=True)

  def levels(self, series: Mapping[str, list[float]]) -> dict[str, tuple[float, float]] | None:
    """`{signal: (early, now)}` of `series` (`std`, `entropy`, `grad`, `return`: values in
    step order, NaNs left out), or None while one has fewer than `early + window`."""
    if min(len(values) for values in series.values()) < self.early + self.window:
      return None
    return {
      name: (float(np.median(values[: self.early])), float(np.median(values[-self.window :])))
      for name, values in series.items()
    }

  def fires(self, series: Mapping[str, list[float]], max_return: float | None = None) -> bool:
    """Whether the rule holds on `series` (as `levels` takes it)."""
    levels = self.levels(series)
    if levels is None:
      return False
    (s0, s1), (h0, h1), (g0, g1) = levels["std"], levels["entropy"], levels["grad"]
    collapsed = s1 <= self.std_frac * s0 and h1 <= self.entropy_frac * h0
    short = max_return is not None and levels["return"][1] < self.return_frac * max_return
    return collapsed and (g1 > self.grad_spike * g0 or short)


SHOWN = {"std": "return spread", "entropy": "entropy", "grad": "grad norm", "return": "return"}


def signal_keys(in_group: bool) -> dict[str, str]:
  """The published key of each signal; the spread is the in-group one when the run logged
  it (groups of two or more), else the batch's."""
  std = GROUP_STD_KEY if in_group else BATCH_STD_KEY
  return {"std": std, "entropy": ENTROPY_KEY, "grad": GRAD_KEY, "return": RETURN_KEY}


def echo_trap_step(
  rows: Iterable[Mapping[str, Any]],
  rule: EchoTrapRule | None = None,
  max_return: float | None = None,
) -> int | None:
  """The first published step at which `rule` fires on a run's rows (`read_jsonl`), or None.

  The rule is checked at each row with a return spread (one per training batch), on the
  values logged up to that step; `max_return`: the environment's (a sweep's summary has it).

  Args:
    rows: a run's metric rows, each with a `"step"`.
    rule: the rule to apply; None: `EchoTrapRule()`'s defaults.
    max_return: the environment's best episode return, if known.

  Returns:
    The step, or None when the rule never fires.
  """
  rule, rows = rule or EchoTrapRule(), sorted(rows, key=lambda row: row["step"])
  keys = signal_keys(any(row.get(GROUP_STD_KEY) is not None for row in rows))
  series: dict[str, list[float]] = {name: [] for name in keys}
  for row in rows:
    for name, key in keys.items():
      value = row.get(key)
      if value is not None and np.isfinite(value):
        series[name].append(float(value))
    if row.get(keys["std"]) is not None and rule.fires(series, max_return):
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

  def __init__(
    self,
    keys: MetricKeys | None = None,
    rule: EchoTrapRule | None = None,
    max_return: float | None = None,
  ):
    keys = keys or MetricKeys()
    self.rule, self.max_return = rule or EchoTrapRule(), max_return
    self._keys = keys
    names = (GROUP_STD_KEY, BATCH_STD_KEY, ENTROPY_KEY, GRAD_KEY, RETURN_KEY)
    self._names = {keys.final(name): name for name in names if keys.final(name)}
    self._series: dict[str, list[tuple[int, float]]] = {name: [] for name in names}
    self._pending: list[int] = []  # steps with a return spread, not yet checked
    self._latest = {ENTROPY_KEY: -1, GRAD_KEY: -1}  # the latest step each was logged at
    self.fired_at: int | None = None
    self._closed = False

  def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
    name = self._names.get(event)
    if name is None or self.fired_at is not None or self._closed:
      return  # closed: JAX never drops a scalar listener, so later runs' events still come
    # (a run that failed never closes its sinks: a step going back tells the next run apart)
    number = float(np.asarray(value).reshape(-1)[0])
    if not np.isfinite(number):
      return
    step = int(kwargs.get("step", 0))
    if self._series[name] and step < self._series[name][-1][0]:
      self._closed = True  # another run's events (its steps start again): this run is over
      return
    self._series[name].append((step, number))
    if name in (GROUP_STD_KEY, BATCH_STD_KEY):
      self._pending.append(step)
    elif name in self._latest:
      self._latest[name] = max(self._latest[name], step)
    while (
      self._pending and self.fired_at is None and min(self._latest.values()) >= self._pending[0]
    ):
      self._check(self._pending.pop(0), log=True)

  def _check(self, step: int, log: bool) -> None:
    keys = signal_keys(bool(self._series[GROUP_STD_KEY]))
    series = {n: [v for s, v in self._series[k] if s <= step] for n, k in keys.items()}
    if self.fired_at is not None or not self.rule.fires(series, self.max_return):
      return
    self.fired_at = step
    levels = self.rule.levels(series) or {}
    shown = ", ".join(
      f"{SHOWN[n]} {now:.3g} (early {early:.3g})" for n, (early, now) in levels.items()
    )
    warnings.warn(
      f"echo trap at step {step}: {shown}; the return spread and the entropy collapsed "
      "(RAGEN's Echo Trap: the policy may be repeating one reply), see train/echo_trap",
      EchoTrapWarning,
      stacklevel=3,
    )
    if log:  # JAX loads here, in a run: the rule itself is checked in a config without it
      import jax

      batch = (step - 1) // max(self._keys.updates_per_batch, 1)  # the learner's batch index
      jax.monitoring.record_scalar(ECHO_TRAP_EVENT, 1.0, step=batch)

  def close(self) -> None:
    """Checks the batches still waiting (warns, without logging); ignores what comes after."""
    for step in self._pending:
      self._check(step, log=False)
    self._pending, self._closed = [], True
