"""Plugin registry: named KL estimators, losses, advantage estimators, metric sinks, environments.

Every name a config can hold is looked up here. This package's own names come from the
table in `plugins/builtins.py` (a name added there works from the source tree, no
reinstall); other distributions offer theirs as entry points in these groups
(`tunix_ppo_ext.<kind>`), each naming an object that satisfies its kind's protocol:

- `kl_estimators`: `fn(logp, ref_logp) -> values`, per-token float arrays of one shape;
  `name+` selects the straight-through form (the value of `fn`, the gradient of k2).
- `advantage_estimators`: `fn(**inputs)` taking keyword arguments named from
  `ADVANTAGE_INPUTS`: `rewards`, `values`, `mask` (`[B, T]`: token rewards, critic values,
  loss mask), `scores`, `group_ids` (`[B]`: summed rewards, sample groups), `gamma`,
  `gae_lambda`, `gamma_turn`, `whiten`, `norm_by_std` (the config's values). It must take `mask` and
  `rewards` or `scores`, and returns `advantages [B, T]` or `(advantages, returns)`.
  Whether it needs a critic is its registration's `needs_critic` (the built-ins' table,
  `register(..., needs_critic=)`); a plugin's entry point without one needs a critic when
  its signature names `values` or takes `**kwargs` (`needs_critic`).
- `policy_losses`: tunix's policy-loss signature `fn(model, train_example, algo_config,
  pad_id, eos_id, **kwargs) -> (loss, metrics)` (called with `temperature`, `ref_model`).
- `value_losses`: `fn(model, train_example, clip_range_value, pad_id, eos_id, **kwargs)
  -> (loss, metrics)` (called with `loss_agg_mode`).
- `environments`: a factory `fn(**kwargs) -> Environment` (`tunix_ppo_ext._src.envs`).
- `metric_sinks`: a factory `fn(output_dir: pathlib.Path, config: dict) -> backend`, a
  metrax `LoggingBackend`-like object with `log_scalar(event, value, *, step)` and `close()`.

Discovery reads the built-ins' table and installed metadata and imports nothing; an
object's module is imported when one of its names is looked up (or listed with `report`),
and the result is cached. The built-ins belong to the distribution `tunix-ppo-ext` (its
own installed entry points, if an older install declares them, are ignored). A name
offered by two distributions is an error naming both, unless pinned as
`name@distribution`. A plugin that fails to import or breaks its protocol raises
`PluginError` naming the entry point, its distribution and the cause, only when that name
is used. `register` adds names in code (notebooks) with the same checks.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tunix_ppo_ext._src.checks import did_you_mean
from tunix_ppo_ext._src.plugins import protocols
from tunix_ppo_ext._src.plugins.builtins import BUILTINS
from tunix_ppo_ext._src.plugins.kinds import (  # noqa: F401 (the kinds: re-exported)
  ADVANTAGE_ESTIMATORS,
  ENVIRONMENTS,
  KINDS,
  KL_ESTIMATORS,
  LABELS,
  METRIC_SINKS,
  POLICY_LOSSES,
  VALUE_LOSSES,
)
from tunix_ppo_ext._src.plugins.protocols import PRODUCT_CHECKS, PROTOCOLS

GROUP_PREFIX = "tunix_ppo_ext."
OWN_DISTRIBUTION = "tunix-ppo-ext"
IN_CODE = "<in-code>"  # the distribution label of names added with `register`
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*\Z")
_RESERVED = {KL_ESTIMATORS: ("full",)}  # `kl_method="full"` is the exact KL, not an estimator


class PluginError(ValueError):
  """A name that cannot be used: unknown, offered twice, failing to load or to conform.

  `cause`: the reason alone, without the entry point's description (for tables).
  """

  def __init__(self, message: str, cause: str | None = None):
    super().__init__(message)
    self.cause = cause if cause is not None else message


class UnknownNameError(PluginError):
  """No distribution (nor in-code registration) offers the name."""


@dataclasses.dataclass(frozen=True)
class Entry:
  """One name offered by one distribution: an entry point, a built-in or an in-code object.

  `needs_critic`: an advantage estimator's declared need of critic values (None: not
  declared, the signature decides; `needs_critic`).
  """

  kind: str
  name: str
  distribution: str
  version: str
  value: str  # `module:attribute`
  entry_point: importlib.metadata.EntryPoint | None = dataclasses.field(default=None, repr=False)
  obj: Any = dataclasses.field(default=None, repr=False, compare=False)
  builtin: bool = False  # a row of `plugins/builtins.py`, imported from `value`
  needs_critic: bool | None = dataclasses.field(default=None, compare=False)

  def describe(self) -> str:
    """`entry point 'name = module:attr' (group ...) of distribution 'dist' 1.0`."""
    where = f"distribution {self.distribution!r}" + (f" {self.version}" if self.version else "")
    if self.builtin:
      return f"built-in '{self.name} = {self.value}' ({LABELS[self.kind]}) of {where}"
    if self.entry_point is None:
      return f"in-code registration '{self.name} = {self.value}' ({LABELS[self.kind]})"
    return f"entry point '{self.name} = {self.value}' (group {group(self.kind)}) of {where}"


def group(kind: str) -> str:
  """The entry-point group of `kind`, e.g. `tunix_ppo_ext.kl_estimators`."""
  _check_kind(kind)
  return GROUP_PREFIX + kind


def _check_kind(kind: str) -> None:
  if kind not in KINDS:
    raise ValueError(f"unknown plugin kind {kind!r}; kinds: {list(KINDS)}")


def normalize_distribution(name: str) -> str:
  """PEP 503 normalisation: `Tunix_PPO.ext` -> `tunix-ppo-ext`."""
  return re.sub(r"[-_.]+", "-", name).lower()


# ----- discovery (the built-ins' table and metadata only, nothing imported) -----


@functools.cache
def _installed(kind: str) -> tuple[Entry, ...]:
  """Other distributions' entry points of `kind` (this package's own, if any, skipped)."""
  entries, seen, own = [], set(), normalize_distribution(OWN_DISTRIBUTION)
  for ep in importlib.metadata.entry_points(group=group(kind)):
    dist = getattr(ep, "dist", None)
    dist_name = dist.name if dist is not None else "<unknown>"
    key = (ep.name, normalize_distribution(dist_name))
    if key[1] != own and key not in seen:  # the same distribution seen twice on sys.path
      seen.add(key)
      version = dist.version if dist is not None else ""
      entries.append(Entry(kind, ep.name, dist_name, version, ep.value, ep))
  return tuple(entries)


def _builtins(kind: str) -> tuple[Entry, ...]:
  """This package's names of `kind`, read from the table at each call (it is small)."""
  version = _own_version()
  return tuple(
    Entry(
      kind, name, OWN_DISTRIBUTION, version, row.target, builtin=True, needs_critic=row.needs_critic
    )
    for name, row in BUILTINS.get(kind, {}).items()
  )


def _own_version() -> str:
  """`tunix_ppo_ext.__version__`: Python imports the package before any module of it, so
  it is read from `sys.modules` (an import here would climb above this layer)."""
  return getattr(sys.modules.get("tunix_ppo_ext"), "__version__", "")


def _discovered(kind: str) -> tuple[Entry, ...]:
  """The built-ins and the installed entry points of `kind`, by name and distribution."""
  found = _builtins(kind) + _installed(kind)
  return tuple(sorted(found, key=lambda e: (e.name, normalize_distribution(e.distribution))))


_IN_CODE: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
_LOADED: dict[Entry, Any] = {}  # entry -> object, or the PluginError it raised
_RESOLVED: dict[tuple[str, str], Any] = {}  # (kind, spec) -> object: the fast path


def entries(kind: str) -> tuple[Entry, ...]:
  """Every entry of `kind` (installed and in-code), sorted by name; imports nothing."""
  return _discovered(kind) + tuple(sorted(_IN_CODE[kind].values(), key=lambda e: e.name))


def names(kind: str) -> list[str]:
  """The sorted, distinct names of `kind`; imports nothing.

  Args:
    kind: a plugin kind (one of `KINDS`).

  Returns:
    The names, installed entry points and in-code registrations alike.
  """
  return sorted({entry.name for entry in entries(kind)})


def clear_cache() -> None:
  """Forgets discovered entry points and loaded objects (after installing a plugin)."""
  importlib.invalidate_caches()
  _installed.cache_clear()
  _LOADED.clear()
  _RESOLVED.clear()


# ----- lookup -----


def split_spec(spec: str) -> tuple[str, str | None]:
  """`"name@dist"` -> `("name", "dist")`; `"name"` -> `("name", None)`."""
  name, at, dist = spec.partition("@")
  return name, (dist if at else None)


def has(kind: str, spec: str) -> bool:
  """Whether some entry answers to `spec` (`name` or `name@distribution`); imports nothing."""
  if not isinstance(spec, str):
    return False
  if (kind, spec) in _RESOLVED:
    return True
  return bool(_candidates(kind, *split_spec(spec)))


def _candidates(kind: str, name: str, dist: str | None) -> list[Entry]:
  found = [entry for entry in entries(kind) if entry.name == name]
  if dist is not None:
    wanted = normalize_distribution(dist)
    found = [entry for entry in found if normalize_distribution(entry.distribution) == wanted]
  return found


def resolve(kind: str, spec: str) -> Entry:
  """The one entry `spec` selects; `PluginError` if none or several do. Imports nothing."""
  _check_kind(kind)
  label = LABELS[kind]
  if not isinstance(spec, str):
    raise UnknownNameError(f"{label} name must be a string, got {spec!r}")
  name, dist = split_spec(spec)
  found = _candidates(kind, name, dist)
  if len(found) == 1:
    return found[0]
  if not found:
    raise UnknownNameError(_unknown_message(kind, name, dist))
  offered = ", ".join(f"{e.distribution!r} ({e.value})" for e in found)
  raise PluginError(
    f"{label} {name!r} is offered by several distributions: {offered}; select one as "
    f"'{name}@<distribution>', e.g. {name + '@' + found[0].distribution!r}"
  )


def _unknown_message(kind: str, name: str, dist: str | None) -> str:
  label, available = LABELS[kind], names(kind)
  if dist is not None and name in available:
    offered = sorted({e.distribution for e in entries(kind) if e.name == name})
    return f"no {label} {name!r} in distribution {dist!r}; it is offered by {offered}"
  return f"unknown {label} {name!r}; available: {available}{did_you_mean(name, available)}"


def get(kind: str, spec: str) -> Any:
  """The object `spec` names (`name` or `name@distribution`), loaded and checked once.

  Args:
    kind: a plugin kind (one of `KINDS`).
    spec: `name`, or `name@distribution` to pick one distribution's entry.

  Returns:
    The loaded object.

  Raises:
    UnknownNameError: listing the available names and the closest one.
    PluginError: the name is offered twice, or its plugin fails to import or to conform.
  """
  try:
    return _RESOLVED[(kind, spec)]
  except (KeyError, TypeError):
    pass
  entry = resolve(kind, spec)
  obj = _load(entry)
  _RESOLVED[(kind, spec)] = obj
  return obj


def _load(entry: Entry) -> Any:
  cached = _LOADED.get(entry)
  if isinstance(cached, PluginError):
    raise cached
  if entry in _LOADED:
    return cached
  try:
    obj = _object_of(entry)
    problem = _conformance_problem(entry, obj)
    if problem:
      cause = f"does not satisfy the {LABELS[entry.kind]} protocol: {problem}"
      raise PluginError(f"{entry.describe()} {cause}", cause)
  except PluginError as err:
    _LOADED[entry] = err
    raise
  except Exception as err:
    cause = f"failed to load: {type(err).__name__}: {err}"
    error = PluginError(f"{entry.describe()} {cause}", cause)
    _LOADED[entry] = error
    raise error from err
  _LOADED[entry] = obj
  return obj


def _object_of(entry: Entry) -> Any:
  if entry.entry_point is not None:
    return entry.entry_point.load()
  if not entry.builtin:
    return entry.obj
  module, _, attribute = entry.value.partition(":")
  obj = importlib.import_module(module)
  for part in attribute.split("."):
    obj = getattr(obj, part)
  return obj


def _conformance_problem(entry: Entry, obj: Any) -> str | None:
  if entry.name in _RESERVED.get(entry.kind, ()) or not _NAME.match(entry.name):
    return f"the name {entry.name!r} is reserved or not of the form [A-Za-z0-9_.-]+"
  problem = PROTOCOLS[entry.kind](obj)
  if problem is None and entry.needs_critic is not None:
    problem = protocols.critic_mismatch(obj, entry.needs_critic)
  return problem


def needs_critic(spec: str) -> bool:
  """Whether advantage estimator `spec` takes a critic's values (the learner builds one).

  Args:
    spec: an advantage estimator's `name` or `name@distribution`.

  Returns:
    Its registration's `needs_critic` (the built-ins declare it, and so may `register`);
    where none is declared (a plugin's entry point), whether its signature names `values`
    or takes `**kwargs`, loading it.

  Raises:
    PluginError: as `get`.
  """
  entry = resolve(ADVANTAGE_ESTIMATORS, spec)
  if entry.needs_critic is not None:
    return entry.needs_critic
  wanted = protocols.wanted_inputs(get(ADVANTAGE_ESTIMATORS, spec))
  return wanted is None or "values" in wanted


def build(kind: str, spec: str, *args: Any, **kwargs: Any) -> Any:
  """Calls the factory `spec` names (environments, metric sinks) and checks its product."""
  factory = get(kind, spec)
  product = factory(*args, **kwargs)
  problem = PRODUCT_CHECKS[kind](product)
  if problem:
    raise PluginError(f"{resolve(kind, spec).describe()} built {product!r}, which {problem}")
  return product


# ----- in-code registration -----


def register(
  kind: str,
  name: str | None = None,
  *,
  replace: bool = False,
  needs_critic: bool | None = None,
) -> Callable[[Any], Any]:
  """Decorator: registers the object under `name` (default: its `__name__`) in code.

  The object is checked against the kind's protocol at once; a name a built-in or an
  installed distribution offers is refused, and so is another in-code object under a
  taken name unless `replace=True` (re-running the same notebook cell replaces its own
  function).

  Args:
    kind: a plugin kind (one of `KINDS`).
    name: the name to register under; None: the object's `__name__`.
    replace: replace an in-code object already registered under `name`.
    needs_critic: advantage estimators only: whether it takes a critic's values (None:
      its signature decides, `needs_critic`); checked against the signature.

  Returns:
    The decorator; it returns the object unchanged.
  """
  _check_kind(kind)
  if needs_critic is not None and kind != ADVANTAGE_ESTIMATORS:
    raise ValueError(f"needs_critic is for advantage estimators, not a {LABELS[kind]}")

  def decorator(obj: Any) -> Any:
    key = name if name is not None else getattr(obj, "__name__", None)
    target = f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"
    entry = Entry(kind, str(key), IN_CODE, "", target, obj=obj, needs_critic=needs_critic)
    problem = _conformance_problem(entry, obj)
    if problem:
      raise PluginError(f"cannot register {LABELS[kind]} {key!r} ({target}): {problem}")
    installed = [e for e in _discovered(kind) if e.name == key]
    if installed:
      raise PluginError(
        f"cannot register {LABELS[kind]} {key!r} in code: {installed[0].describe()} "
        "already offers it; choose another name"
      )
    previous = _IN_CODE[kind].get(key)
    if previous is not None and previous.value != target and not replace:
      raise PluginError(
        f"{LABELS[kind]} {key!r} is already registered in code ({previous.value}); "
        "pass replace=True to replace it"
      )
    _IN_CODE[kind][key] = entry
    _forget(kind, key)
    return obj

  return decorator


def unregister(kind: str, name: str) -> None:
  """Removes an in-code registration (installed entry points cannot be removed here).

  Args:
    kind: a plugin kind (one of `KINDS`).
    name: the registered name.

  Raises:
    UnknownNameError: when no in-code object is registered under `name`.
  """
  _check_kind(kind)
  if name not in _IN_CODE[kind]:
    raise UnknownNameError(f"no {LABELS[kind]} {name!r} registered in code")
  del _IN_CODE[kind][name]
  _forget(kind, name)


def _forget(kind: str, name: str) -> None:
  for key in [k for k in _RESOLVED if k[0] == kind and split_spec(k[1])[0] == name]:
    del _RESOLVED[key]
  for entry in [e for e in _LOADED if e.kind == kind and e.name == name]:
    del _LOADED[entry]


# ----- views and listing -----


class RegistryView(Mapping):
  """A read-only mapping name -> object over one kind (the old `*_ESTIMATORS` tables)."""

  def __init__(self, kind: str):
    _check_kind(kind)
    self.kind = kind

  def __getitem__(self, name: str) -> Any:
    try:
      return get(self.kind, name)
    except UnknownNameError as err:
      raise KeyError(name) from err

  def __contains__(self, name: object) -> bool:
    return isinstance(name, str) and has(self.kind, name)  # imports nothing

  def __iter__(self) -> Iterator[str]:
    return iter(names(self.kind))

  def __len__(self) -> int:
    return len(names(self.kind))

  def __repr__(self) -> str:
    return f"RegistryView({group(self.kind)!r}: {names(self.kind)})"


@dataclasses.dataclass(frozen=True)
class Status:
  """One row of `report`: an entry and whether it loads (`error` is None when it does)."""

  entry: Entry
  error: str | None
  clashes_with: tuple[str, ...]


def report(kinds: tuple[str, ...] = KINDS) -> dict[str, list[Status]]:
  """Loads every entry of every kind (plugin errors are caught and reported).

  Args:
    kinds: the kinds to load.

  Returns:
    kind -> one `Status` per entry.
  """
  rows: dict[str, list[Status]] = {}
  for kind in kinds:
    rows[kind] = []
    for entry in entries(kind):
      try:
        _load(entry)
        error = None
      except PluginError as err:
        error = err.cause
      others = tuple(e.distribution for e in entries(kind) if e.name == entry.name and e != entry)
      rows[kind].append(Status(entry, error, others))
  return rows


def format_report(rows: dict[str, list[Status]]) -> str:
  """The `tunix-ppo-ext plugins` table: per group, name, distribution, version, status.

  Args:
    rows: what `report` returned.

  Returns:
    The table as text.
  """
  lines = []
  for kind, statuses in rows.items():
    lines.append(f"{group(kind)}:")
    if not statuses:
      lines.append("  (none)")
    table = [("NAME", "DISTRIBUTION", "VERSION", "STATUS")]
    for status in statuses:
      state = "ok" if status.error is None else f"error: {status.error}"
      if status.clashes_with:
        pin = f"{status.entry.name}@{status.entry.distribution}"
        state += f"; name clash with {', '.join(status.clashes_with)}: select it as {pin!r}"
      entry = status.entry
      table.append((entry.name, entry.distribution, entry.version or "-", state))
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for row in table if statuses else []:
      cells = [cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)]
      lines.append("  " + "  ".join([*cells, row[3]]))
  return "\n".join(lines)
