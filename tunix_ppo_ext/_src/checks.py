"""Validation helpers shared by every layer (stdlib only): one message style for bad values.

- `did_you_mean(value, choices)`: `"; did you mean 'x'?"` or `""`.
- `check_number(name, value, ...)`: a real, finite number inside an interval, as float.
- `check_integer(name, value, low)`: an integer (not a bool) `>= low`.
- `check_choice(name, value, choices)`: one of `choices`, with the closest as a hint.
- `FieldKeys`: how a section's own checks name its fields (`ppo.epsilon` in a run config,
  `PpoExtConfig.epsilon` in Python), passed to the checks rather than rewritten after.

Every error is one `ConfigError` line (a `ValueError`) naming the field, the value and what
is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import struct
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
  "ConfigError",
  "FieldKeys",
  "check_choice",
  "check_integer",
  "check_number",
  "did_you_mean",
]


class ConfigWarning(UserWarning):
  """A config that runs, but likely not as meant (a key with no effect, a warm-up as long
  as the run), named in one line; the command line prints it as `tunix-ppo-ext: warning:`."""


class ConfigError(ValueError):
  """Bad input a user can fix: a config key, an option, a file or a value, named in one line.

  The command line exits with status 2 for it (and for a broken plugin), status 1 for any
  other failure.
  """


@dataclasses.dataclass(frozen=True)
class FieldKeys:
  """How the checks of a section's fields name them: the key a user sets each by.

  In a run config a field `f` of the section under `prefix` (`"ppo."`) is the key
  `ppo.f`, or the key in `elsewhere` that sets it from another section
  (`{"fused_head": "model.fused_head"}`); a message opens with `config key 'ppo.f'`. With
  an `owner` (the class built in Python, `"PpoExtConfig"`) a message opens with
  `PpoExtConfig.f` (an empty `owner`: `f`) and mentions other fields by their bare names.
  """

  prefix: str = ""
  elsewhere: Mapping[str, str] = dataclasses.field(default_factory=dict)
  owner: str | None = None

  def key(self, field: str) -> str:
    """`field` as a message mentions it (`ppo.logits_chunk_size`)."""
    return self.elsewhere.get(field, self.prefix + field)

  def subject(self, field: str) -> str:
    """`field` as the subject a message opens with (`check_number`'s `name`)."""
    if self.owner is not None:
      return f"{self.owner}.{field}" if self.owner else field
    return f"config key {self.key(field)!r}"


def did_you_mean(value: object, choices: Iterable[str], n: int = 1) -> str:
  """`"; did you mean 'x'?"` (up to `n` of the closest `choices` to `value`), else `""`."""
  close = difflib.get_close_matches(str(value), list(choices), n=n)
  return f"; did you mean {', '.join(map(repr, close))}?" if close else ""


def interval(
  low: float | None, high: float | None, low_open: bool = False, high_open: bool = False
) -> str:
  """`"(0.0, 1.0]"`-style text of an interval; an absent bound is infinite."""
  lo = "(-inf" if low is None else ("(" if low_open else "[") + f"{low}"
  hi = "inf)" if high is None else f"{high}" + (")" if high_open else "]")
  return f"{lo}, {hi}"


def check_number(
  name: str,
  value: object,
  low: float | None = None,
  high: float | None = None,
  low_open: bool = False,
  high_open: bool = False,
) -> float:
  """`float(value)` if it is a finite real number (not a bool) inside the interval, in
  float64 and in float32, the precision training computes in (`5e-324` is 0 there, `1e308`
  infinite).

  Raises:
    ValueError: `"<name>=<value> is invalid: must be a finite number in [low, high]."`
  """
  ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
  single = None
  if ok:
    value_f = float(value)
    single = as_float32(value_f)
    ok = all(_inside(v, low, high, low_open, high_open) for v in (value_f, single))
  if not ok:
    allowed = f"a finite number in {interval(low, high, low_open, high_open)}"
    shown = single is not None and math.isfinite(value_f) and single != value_f
    in_float32 = f" (in float32: {single!r})" if shown else ""
    raise ConfigError(f"{name}={value!r} is invalid: must be {allowed}{in_float32}.")
  return value_f


def _inside(value: float, low, high, low_open: bool, high_open: bool) -> bool:
  ok = math.isfinite(value)
  ok = ok and (low is None or (value > low if low_open else value >= low))
  return ok and (high is None or (value < high if high_open else value <= high))


def as_float32(value: float) -> float:
  """`value` rounded to float32 (inf beyond its range)."""
  try:
    return struct.unpack("f", struct.pack("f", value))[0]
  except OverflowError:
    return math.copysign(math.inf, value)


def check_integer(name: str, value: object, low: int, high: int | None = None) -> int:
  """`value` if it is an integer (not a bool) in `[low, high]`; ValueError naming `name`
  otherwise."""
  ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low
  if not ok or (high is not None and value > high):
    bound = f">= {low}" if high is None else f"in [{low}, {high}]"
    raise ConfigError(f"{name}={value!r} is invalid: must be an integer {bound}.")
  return int(value)


BOUNDS = "bounds"  # a dataclass field's metadata key: its bound (`bounded`)


def bounded(default: Any, *, integer: bool = False, none_ok: bool = False, **interval: Any) -> Any:
  """A dataclass field with `default` and its bound beside it, checked by `check_fields`:
  an integer (`integer`, `check_integer`'s `low` and `high`) or a finite number in an
  interval (`check_number`'s `low`, `high`, `low_open`, `high_open`); None allowed with
  `none_ok`."""
  bound = {"integer": integer, "none_ok": none_ok, **interval}
  return dataclasses.field(default=default, metadata={BOUNDS: bound})


def check_fields(instance: Any, keys: FieldKeys) -> None:
  """Checks every field of dataclass `instance` declared `bounded` (ConfigError naming it
  by `keys`); a number is stored back as the float `check_number` returns."""
  for field in dataclasses.fields(instance):
    bound = dict(field.metadata.get(BOUNDS) or {})
    if not bound:
      continue
    integer, none_ok = bound.pop("integer"), bound.pop("none_ok")
    value = getattr(instance, field.name)
    if value is None and none_ok:
      continue
    if integer:
      check_integer(keys.subject(field.name), value, **bound)
    else:
      checked = check_number(keys.subject(field.name), value, **bound)
      object.__setattr__(instance, field.name, checked)


def check_choice(name: str, value: object, choices: Iterable[str]) -> None:
  """ConfigError `"<name>=<value> unknown; did you mean 'x'? (valid: (...))"` unless `value`
  is one of `choices`."""
  choices = tuple(choices)
  if value not in choices:
    raise ConfigError(f"{name}={value!r} unknown{did_you_mean(value, choices)} (valid: {choices})")


def whole_share(ratio: float, total: int) -> int | None:
  """`ratio * total` as an int when it is whole up to float rounding (`0.28 * 50` is
  14.000000000000002), else None."""
  share = ratio * total
  nearest = round(share)
  return nearest if math.isclose(share, nearest, rel_tol=1e-9, abs_tol=1e-9) else None
