"""Reads a run config: a YAML file (the embedded default when none) and dotted
`KEY=VALUE` overrides, built into a `RunConfig` whose every key, type and value is checked,
without JAX, tunix or transformers (a bad key is one `ConfigError` line, with the closest
valid names, well under a second after the command starts). Resolving it, which needs
those, is `tunix_ppo_ext._src.run.run_config.resolve`.
"""

from __future__ import annotations

import dataclasses
import inspect
import pathlib
import types
import typing
from typing import Any

from tunix_ppo_ext._src.checks import ConfigError, FieldKeys, check_fields, did_you_mean
from tunix_ppo_ext._src.config.run_sections import EnvSection, RunConfig
from tunix_ppo_ext._src.config.yaml_files import load_yaml

EMBEDDED_DEFAULT = pathlib.Path(__file__).with_name("default.yaml")


def read_run_config(path: str | None = None, overrides: typing.Sequence[str] = ()) -> RunConfig:
  """Reads YAML `path` (the embedded default when None), applies `KEY=VALUE` overrides and
  checks every key and value a config file alone can tell (`check_run`).

  Args:
    path: the YAML config file; None: the embedded default.
    overrides: `KEY=VALUE` strings applied on top, e.g. `train.steps=100`.

  Returns:
    The `RunConfig`.

  Raises:
    ConfigError: naming the key, the value and what is allowed.
  """
  if isinstance(overrides, str | bytes):  # its characters would be taken as overrides
    raise ConfigError(
      f"overrides={overrides!r} must be a list of KEY=VALUE strings, e.g. [{overrides!r}]"
    )
  file = EMBEDDED_DEFAULT if path is None else pathlib.Path(path)
  if not file.is_file():
    what = "a directory, not a YAML file" if file.is_dir() else "no such file"
    raise ConfigError(f"--config {path!r}: {what}")
  data = load_yaml(file, f"--config {path!r}") or {}
  if not isinstance(data, dict):
    raise ConfigError(f"--config {path!r}: expected a mapping at the top level")
  for override in overrides:
    key, sep, raw = override.partition("=")
    if not sep or not key:
      raise ConfigError(f"override {override!r} must look like section.key=value")
    _set_dotted(data, key.split("."), load_yaml(raw, f"override {override!r}"))
  run = build_section(RunConfig, data, prefix="")
  check_run(run)
  return run


def check_run(run: RunConfig) -> None:
  """The checks across a run config's sections that need nothing but the config (`envs`
  against `env`), and the counts and rates again: a config built or changed in code was
  never read."""
  for section, prefix in (
    (run, ""),
    (run.train, "train."),
    (run.env, "env."),
    (run.model, "model."),
  ):
    check_fields(section, FieldKeys(prefix=prefix))  # counts and rates, changed in code
  if run.envs and (run.env.name != EnvSection().name or run.env.kwargs):
    raise ConfigError(
      "config keys 'envs' and 'env.name'/'env.kwargs' both name the training environment: "
      "give one ('env' keeps the limits: max_turns, max_completion_len, max_tokens_per_turn)"
    )


def _set_dotted(data: dict[str, Any], keys: list[str], value: Any) -> None:
  for key in keys[:-1]:
    data = data.setdefault(key, {})
    if not isinstance(data, dict):
      raise ConfigError(f"override path {'.'.join(keys)!r} goes through a non-mapping")
  data[keys[-1]] = value


def build_section(cls: type, data: Any, prefix: str, default: Any = None) -> Any:
  """Instantiates dataclass `cls` from mapping `data`, checking keys and types recursively;
  the section checks its values itself (its `keys` names them: `sampling.top_p`).

  Keys `data` leaves out keep `default`'s values (a section's own default, e.g. the
  actor's cosine schedule in `optim.actor`, not the field type's), also inside nested
  sections: `optim.actor.clip_grad_norm=1.0` changes that one key.

  Args:
    cls: the section's dataclass.
    data: the section as the YAML gives it.
    prefix: the section's key with a trailing dot (`"optim.actor."`; `""` at the top).
    default: the section's own default instance (None: the class's defaults).

  Returns:
    The section.
  """
  if not isinstance(data, dict):
    raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
  fields = {f.name: f for f in dataclasses.fields(cls)}
  hints = typing.get_type_hints(cls)
  kwargs = {}
  for key, value in data.items():
    if key not in fields:
      hint = did_you_mean(key, fields, n=3)
      raise ConfigError(f"unknown config key {prefix + key!r}{hint} (valid: {sorted(fields)})")
    nested = getattr(default, key) if default is not None else _field_default(fields[key])
    kwargs[key] = _check_type(prefix + key, value, hints[key], nested)
  if "keys" in inspect.signature(cls).parameters:  # a section naming its fields' keys
    kwargs["keys"] = FieldKeys(prefix=prefix)
  return cls(**kwargs) if default is None else dataclasses.replace(default, **kwargs)


def _field_default(field: dataclasses.Field) -> Any:
  """A dataclass field's default value (its factory's product); None without one."""
  if field.default is not dataclasses.MISSING:
    return field.default
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return None


def _check_type(name: str, value: Any, hint: Any, default: Any = None) -> Any:
  origin = typing.get_origin(hint)
  allowed = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
  for option in allowed:
    base = typing.get_origin(option) or option
    if option is type(None) and value is None:
      return value
    if dataclasses.is_dataclass(option) and (isinstance(value, dict) or len(allowed) == 1):
      nested = default if isinstance(default, option) else None
      return build_section(option, value, prefix=name + ".", default=nested)
    if base is float and isinstance(value, int | float) and not isinstance(value, bool):
      return float(value)
    if base is int and isinstance(value, int) and not isinstance(value, bool):
      return value
    if base is dict and isinstance(value, dict) and _holds_sections(option):
      section = typing.get_args(option)[1]
      return {k: build_section(section, v, prefix=f"{name}.{k}.") for k, v in value.items()}
    if base is list and isinstance(value, list):
      (item,) = typing.get_args(option) or (typing.Any,)
      return [_check_type(f"{name}[{i}]", v, item) for i, v in enumerate(value)]
    if base in (str, bool, dict) and isinstance(value, base):
      return value
    if base is typing.Any:
      return value
  names = " or ".join(getattr(a, "__name__", str(a)) for a in allowed)
  raise ConfigError(f"config key {name!r} must be {names}, got {value!r}")


def _holds_sections(hint: Any) -> bool:
  """Whether `hint` is `dict[str, <a section's dataclass>]` (`mesh.roles`)."""
  args = typing.get_args(hint)
  return len(args) == 2 and dataclasses.is_dataclass(args[1])
