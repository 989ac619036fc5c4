"""What a batch of episodes shows beyond its returns: success rate, `info` means, samples.

An environment reports success through its step `info`: `info["success"]` (a bool) on the
step that decides it (Countdown: a correct answer; a game: won). An episode succeeded when
the last step that reported `success` said True; once any episode of a batch reported it,
episodes that never did (e.g. cut by the turn limit) count as failures.

Every other entry of a step's `info` that is a number or a bool becomes `env/<key>`: per
episode the value of the last step that reported it, then the mean over the episodes
that reported it (non-finite values are skipped, so no NaN reaches a metric).

In a run with several environments (`envs`), `env_metrics` reports the same per
environment, under `env/<tag>/` (with `env/<tag>/episode_return`).

`conversation` turns an episode's turns into a sample: `[{"role": "observation" | "agent",
"text": ...}, ...]`, as written to `samples.jsonl` and W&B (`metrics.samples`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SUCCESS_KEY = "success"
SUCCESS_METRIC = "batch/success_rate"  # internal name; published `{mode}/success_rate`
ENV_PREFIX = "env"  # `env/<key>`; published `{mode}/env/<key>`
OBSERVATION, AGENT = "observation", "agent"


def _number(value: Any) -> float | None:
  """`value` as a finite float if it is a real number or a bool (NumPy's included)."""
  if isinstance(value, bool | np.bool_):
    return float(bool(value))
  if isinstance(value, numbers.Real):
    number = float(value)
    return number if math.isfinite(number) else None
  return None


def last_values(infos: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """Per key, the finite number of the last `info` (in step order) that holds one."""
  values: dict[str, float] = {}
  for info in infos:
    for key, value in info.items():
      number = _number(value)
      if isinstance(key, str) and key and number is not None:
        values[key] = number
  return values


def episode_metrics(episodes: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, float]:
  """Internal-name metrics of a batch of `B` episodes, each the list of its step `info`s.

  Returns `{"batch/success_rate": share of successful episodes}` when any episode reported
  `success`, and `{"env/<key>": mean over the episodes that reported <key>}` for every
  other numeric or bool `info` entry. Empty when nothing was reported.
  """
  finals = [last_values(infos) for infos in episodes]
  metrics: dict[str, float] = {}
  succeeded = _successes(finals)
  if succeeded[0] is not None:
    metrics[SUCCESS_METRIC] = sum(succeeded) / len(finals)
  keys = sorted({key for final in finals for key in final} - {SUCCESS_KEY})
  for key in keys:
    reported = [final[key] for final in finals if key in final]
    metrics[f"{ENV_PREFIX}/{key}"] = math.fsum(reported) / len(reported)
  return metrics


def episode_successes(episodes: Sequence[Sequence[Mapping[str, Any]]]) -> list[bool | None]:
  """Each episode's success, as `batch/success_rate` counts it: the last reported
  `info["success"]`, False for an episode that never reported it once another episode of
  the batch did; all None when no episode reported it."""
  return _successes([last_values(infos) for infos in episodes])


def _successes(finals: Sequence[Mapping[str, float]]) -> list[bool | None]:
  if not any(SUCCESS_KEY in final for final in finals):
    return [None] * len(finals)
  return [final.get(SUCCESS_KEY, 0.0) > 0 for final in finals]


def conversation(turns: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
  """`[(role, text), ...]` as `[{"role": role, "text": text}, ...]`; roles checked."""
  for role, _ in turns:
    if role not in (OBSERVATION, AGENT):
      raise ValueError(f"a turn's role must be {OBSERVATION!r} or {AGENT!r}, got {role!r}")
  return [{"role": role, "text": text} for role, text in turns]


def env_metrics(
  tags: Sequence[str],
  returns: Sequence[float],
  episodes: Sequence[Sequence[Mapping[str, Any]]],
) -> dict[str, float]:
  """Per-environment metrics of a mixed batch (`B` episodes): for each tag `t` present,
  `env/<t>/episode_return` (mean of its episodes' returns) and `episode_metrics` of its
  episodes under `env/<t>/` (`env/<t>/success_rate`, `env/<t>/<info key>`)."""
  if not len(tags) == len(returns) == len(episodes):
    raise ValueError(f"{len(tags)} tags, {len(returns)} returns, {len(episodes)} episodes")
  metrics: dict[str, float] = {}
  for tag in dict.fromkeys(tags):  # first-seen order
    rows = [i for i, t in enumerate(tags) if t == tag]
    prefix = f"{ENV_PREFIX}/{tag}/"
    metrics[prefix + "episode_return"] = math.fsum(float(returns[i]) for i in rows) / len(rows)
    for key, value in episode_metrics([episodes[i] for i in rows]).items():
      name = "success_rate" if key == SUCCESS_METRIC else key.removeprefix(f"{ENV_PREFIX}/")
      metrics[prefix + name] = value
  return metrics
