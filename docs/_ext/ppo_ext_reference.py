"""Generates the reference pages' tables from the code, before Sphinx reads the sources.

`docs/reference/_generated/` (not committed) gets:
- `config_keys.md`: every run-config key (the `RunConfig` dataclasses, `PpoExtConfig` for
  `ppo.*`) with its type, default and meaning (from the field's comment or its class
  docstring; `EXTRA_MEANINGS` for fields neither describes),
- `metric_keys.md`: every published metric key of `tunix_ppo_ext._src.metrics.keys`,
- `api_<module>.md`: an autosummary of each public module's `__all__`,
- `layout.md`: the public modules and the private layers.

`config_entries()`, `metric_entries()` and `PUBLIC_MODULES` are also what
`tests/test_docs.py` checks the built site against.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pathlib
import re
import types
import typing
from typing import Any

PUBLIC_MODULES = (
  "tunix_ppo_ext",
  "tunix_ppo_ext.ops",
  "tunix_ppo_ext.envs",
  "tunix_ppo_ext.rollout",
  "tunix_ppo_ext.losses",
  "tunix_ppo_ext.models",
  "tunix_ppo_ext.config",
  "tunix_ppo_ext.data",
  "tunix_ppo_ext.metrics",
  "tunix_ppo_ext.plugins",
  "tunix_ppo_ext.jobs",
)

# Fields whose class docstring and source line say nothing about them.
EXTRA_MEANINGS = {
  "seed": "the run's seed: model initialisation, episode seeds, sampling",
  "output_dir": "where the run writes metrics, summary, config and checkpoints "
  "(`--output-dir` overrides it)",
  "model.config_name": "a tunix `qwen3.ModelConfig` constructor name (e.g. `qwen3_0p6b`) "
  "for a checkpoint without `config.json`",
  "model.num_layers": "toy model: transformer layers",
  "model.embed_dim": "toy model: embedding width",
  "model.hidden_dim": "toy model: MLP width",
  "model.num_heads": "toy model: attention heads",
  "model.head_dim": "toy model: width of one head",
  "model.num_kv_heads": "toy model: key/value heads",
  "env.name": "the environment: a built-in, a plugin's name or `gym:<id>`",
  "env.kwargs": "keyword arguments of the environment's factory",
  "env.max_turns": "agent turns per episode at most",
  "env.max_completion_len": "tokens of an episode after the prompt (agent and observation "
  "tokens); longer episodes are cut and counted (`train/truncated_frac`)",
  "env.max_tokens_per_turn": "tokens the agent may sample in one turn",
  "train.steps": "optimizer updates (tunix's `max_steps`); with `ppo.num_iterations: 2` "
  "and no mini-batches, two per batch",
  "train.batch_size": "episodes per rollout batch",
  "train.lr": "the actor's peak learning rate",
  "train.critic_lr": "the critic's peak learning rate",
  "train.temperature": "sampling temperature of training rollouts",
  "train.max_prompt_length": "tokens of the first observation (the prompt) at most",
  "train.checkpoint_every": "optimizer updates between checkpoints",
  "train.eval_every": "optimizer updates between evaluations",
  "train.eval_batches": "batches of `train.batch_size` episodes per evaluation (0: none)",
  "optim.actor": "the actor's optimizer (`OptimizerSpec`)",
  "optim.critic": "the critic's optimizer (`OptimizerSpec`)",
  "shaping.eps": "the `mean_std` normalization's epsilon",
  "mesh.roles.<role>.shape": "axis sizes of the role's own mesh",
  "mesh.roles.<role>.axis_names": "axis names of the role's own mesh (None: the shared mesh's)",
  "dapo.overlong_buffer.enable": "turn DAPO's overlong reward shaping on",
  "dapo.filter_groups.enable": "turn DAPO's dynamic sampling on",
  "ppo.algo_variant": "tunix's algorithm variant name (`ppo`)",
  "ppo.reward_manager": "tunix's reward manager (`sequence-level`)",
  "ppo.kl_clamp_value": "clamp of the per-token KL estimate (None: no clamp)",
}


# Keys the recipe sections and the samples table publish under their own names (internal
# names outside the taxonomy table are published as they are): (key, where it comes from).
EXTRA_METRICS = {
  "rollout/filter_kept_frac": "`filter`: share of groups kept (`tunix_ppo_ext/_src/run/recipe.py`)",
  "rollout/in_group_std": "`filter`: mean in-group score std of all groups",
  "rollout/kept_in_group_std": "`filter`: mean in-group score std of the kept groups",
  "rollout/malformed_turns": "`shaping.format_penalty`: malformed turns per episode "
  "(`tunix_ppo_ext/_src/data/score_shaping.py`)",
  "rollout/format_penalty": "`shaping.format_penalty`: penalty added per episode",
  "eval/samples": "W&B only: the sampled conversations of an evaluation, as a table "
  "(`tunix_ppo_ext/_src/metrics/samples.py`)",
}


@dataclasses.dataclass(frozen=True)
class ConfigEntry:
  key: str
  type: str
  default: str
  meaning: str
  section: str


def _type_name(tp: Any) -> str:
  if isinstance(tp, str):
    return tp
  if tp is type(None):
    return "None"
  origin = typing.get_origin(tp)
  if origin in (typing.Union, types.UnionType):
    return " | ".join(_type_name(a) for a in typing.get_args(tp))
  if origin is not None:
    args = ", ".join(_type_name(a) for a in typing.get_args(tp))
    return f"{getattr(origin, '__name__', str(origin))}[{args}]"
  return getattr(tp, "__name__", str(tp))


def _clauses(doc: str) -> list[str]:
  text = " ".join(line.strip() for line in doc.splitlines() if line.strip())
  return [c.strip() for c in re.split(r"(?<=[.;])\s+(?=[A-Z`(])", text) if c.strip()]


def _field_comments(cls: type) -> dict[str, str]:
  comments = {}
  for klass in reversed(cls.__mro__):
    if not dataclasses.is_dataclass(klass):
      continue
    try:
      source = inspect.getsource(klass)
    except (OSError, TypeError):
      continue
    for match in re.finditer(r"^\s+(\w+):[^#\n]*#\s*(.+)$", source, flags=re.M):
      comments[match.group(1)] = match.group(2).strip()
  return comments


def _attributes(doc: str) -> dict[str, str]:
  """Google-style `Attributes:` entries (`a, b: text` lines and their continuations)."""
  out: dict[str, str] = {}
  lines = doc.splitlines()
  current: list[str] = []
  text: list[str] = []
  in_attrs = False
  for line in lines:
    if line.strip() == "Attributes:" or line.strip().startswith("Attributes ("):
      in_attrs = True
      continue
    if not in_attrs:
      continue
    pending = re.match(r"^\s{2,4}([\w, ]+,)\s*$", line)
    if pending and not line.startswith(" " * 5):
      for name in current:
        out[name] = " ".join(text)
      current, text = [n.strip() for n in pending.group(1).split(",") if n.strip()], []
      continue
    match = re.match(r"^\s{2,8}([\w, ]+):\s*(.*)$", line)
    if match and current and not text:
      current += [n.strip() for n in match.group(1).split(",") if n.strip()]
      text = [match.group(2)]
      continue
    if match and not line.startswith(" " * 5):
      for name in current:
        out[name] = " ".join(text)
      current = [n.strip() for n in match.group(1).split(",") if n.strip()]
      text = [match.group(2)]
    elif line.strip():
      text.append(line.strip())
  for name in current:
    out[name] = " ".join(text)
  return out


def _meaning(cls: type, name: str, key: str) -> str:
  if key in EXTRA_MEANINGS:
    return EXTRA_MEANINGS[key]
  doc = inspect.getdoc(cls) or ""
  for klass in cls.__mro__:
    attrs = (
      _attributes(inspect.getdoc(klass) or "") if "Attributes" in (klass.__doc__ or "") else {}
    )
    if name in attrs:
      return attrs[name]
  for clause in _clauses(doc):
    if f"`{name}`" in clause:
      return clause
  for clause in _clauses(doc):
    if re.search(r"`[^`]*\b" + re.escape(name) + r"\b[^`]*`", clause):
      return clause
  return _field_comments(cls).get(name, "")


def _fmt_default(value: Any) -> str:
  if isinstance(value, str):
    return repr(value).replace("'", '"')
  return repr(value)


def _walk(cls: type, prefix: str, section: str, defaults: dict[str, Any] | None = None):
  from tunix_ppo_ext._src.config import run_sections

  hints = typing.get_type_hints(cls)
  for field in dataclasses.fields(cls):
    key = f"{prefix}{field.name}"
    if key == "ppo":
      continue  # `ppo.*`: `config_entries` lists PpoExtConfig's fields
    tp = hints.get(field.name, field.type)
    if field.default is not dataclasses.MISSING:
      default = field.default
    elif field.default_factory is not dataclasses.MISSING:
      default = field.default_factory()
    else:
      default = None
    if defaults is not None and field.name in defaults:
      default = defaults[field.name]
    sub = {
      "model.lora": run_sections.LoraSection,
      "envs": run_sections.EnvEntry,
      "validation.envs": run_sections.EnvEntry,
    }.get(key)
    if dataclasses.is_dataclass(tp) and not isinstance(default, (list, dict)):
      yield from _walk(
        tp, key + ".", key, {f.name: getattr(default, f.name) for f in dataclasses.fields(default)}
      )
      continue
    yield ConfigEntry(
      key, _type_name(tp), _fmt_default(default), _meaning(cls, field.name, key), section
    )
    if sub is not None:
      sep = "[]." if key.endswith("envs") else "."
      yield from _walk(sub, key + sep, key + sep.rstrip("."))
    if key == "mesh.roles":
      yield from _walk(run_sections.RoleMeshSection, "mesh.roles.<role>.", "mesh.roles.<role>")


def config_entries() -> list[ConfigEntry]:
  """Every key of a run config, `ppo.*` included, in the order of the dataclasses."""
  from tunix_ppo_ext._src.config import loader, ppo_section, run_sections
  from tunix_ppo_ext._src.tunix.learner.ppo_config import PpoExtConfig

  entries = [e for e in _walk(run_sections.RunConfig, "", "top level") if e.key != "ppo"]
  for e in list(entries):
    if e.section != "top level":
      continue
  top = [e for e in entries if "." not in e.key and not e.key.endswith("]")]
  rest = [e for e in entries if e not in top]
  # `ppo`: every field of PpoExtConfig with its default (a config inherits it), and the
  # embedded default's own tuning where it differs
  ppo = []
  hints = typing.get_type_hints(PpoExtConfig)
  embedded = loader.read_run_config(None).ppo  # the keys the file gives
  for field in dataclasses.fields(PpoExtConfig):
    if field.name in ppo_section.SET_ELSEWHERE:  # set from another section (`model.fused_head`)
      continue
    default = field.default
    note = ""
    if field.name in embedded and embedded[field.name] != field.default:
      shown = _fmt_default(embedded[field.name])
      note = f" (the embedded default, `configs/default.yaml`, sets `{shown}`)"
    if field.name == "logps_temperature":
      note = " (the run config sets it to `train.temperature` unless given)"
    key = f"ppo.{field.name}"
    meaning = _meaning(PpoExtConfig, field.name, key)
    ppo.append(
      ConfigEntry(
        key,
        _type_name(hints.get(field.name, field.type)),
        _fmt_default(default),
        meaning + note,
        "ppo",
      )
    )
  return top + rest + ppo


def _cell(text: str) -> str:
  return text.replace("|", "\\|").replace("\n", " ")


def anchor(key: str) -> str:
  return "config-" + re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")


def write_config_keys(path: pathlib.Path) -> None:
  """One table per section: key (with its own anchor), type, default, meaning."""
  lines = []
  sections: dict[str, list[ConfigEntry]] = {}
  for entry in config_entries():
    head = entry.key.split(".")[0].split("[")[0] if "." in entry.key or "[" in entry.key else ""
    sections.setdefault(head or "top level", []).append(entry)
  for head, entries in sections.items():
    title = "Top level" if head == "top level" else f"`{head}`"
    lines += [f"({anchor('section-' + head)})=", f"## {title}", ""]
    lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for entry in entries:
      key = f'<span id="{anchor(entry.key)}"></span>`{entry.key}`'
      cells = [key, f"`{_cell(entry.type)}`", f"`{_cell(entry.default)}`"]
      cells.append(_cell(entry.meaning or "(undocumented)"))
      lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
  path.write_text("\n".join(lines))


def metric_entries() -> list[tuple[str, str]]:
  """(published key, internal name) for every default published key."""
  from tunix_ppo_ext._src.metrics import keys

  out = {}
  for internal in keys.TAXONOMY:
    for mode in keys.MODES:
      key = keys.published_key(internal, mode)
      if key is not None:
        out.setdefault(key, internal)
  return sorted(out.items())


def write_metric_keys(path: pathlib.Path) -> None:
  from tunix_ppo_ext._src.metrics import keys

  groups: dict[str, list[tuple[str, str]]] = {}
  for key, internal in metric_entries():
    groups.setdefault(key.split("/")[0], []).append((key, internal))
  lines = []
  conditional = keys.CONDITIONAL_KEYS
  for group, items in groups.items():
    lines += [f"## `{group}/`", "", "| key | internal name | published |", "| --- | --- | --- |"]
    for key, internal in items:
      when = (
        "only while its feature is on" if key.removeprefix("eval/") in conditional else "always"
      )
      lines.append(f"| `{key}` | `{internal}` | {when} |")
    lines.append("")
  lines += ["## Published by the recipe sections", ""]
  lines += ["Outside the taxonomy table, under their own names, while the section is on:", ""]
  lines += ["| key | from |", "| --- | --- |"]
  lines += [f"| `{key}` | {_cell(where)} |" for key, where in EXTRA_METRICS.items()]
  lines.append("")
  dropped = sorted(k for k, v in keys.TAXONOMY.items() if v is None)
  lines += ["## Dropped by default", "", ", ".join(f"`{k}`" for k in dropped), ""]
  lines += ["## Open-ended families", ""]
  lines += [f"- `{{train,eval}}/{keys.ENV_INFO_PREFIX}<key>`: the environment's `info` entries"]
  lines += [f"- `{keys.CUSTOM_PREFIX}/<name>`: what your `metric_fns` return", ""]
  path.write_text("\n".join(lines))


def write_api(directory: pathlib.Path) -> None:
  """One page per public module: a summary table of its `__all__`, then every name."""
  for name in PUBLIC_MODULES:
    module = importlib.import_module(name)
    short = name.replace(".", "_")
    public = sorted(module.__all__)
    # constants and type aliases: autodoc skips imported data, so they are named one by one
    data = [n for n in public if not (inspect.isclass(v := getattr(module, n)) or callable(v))]
    data += [n for n in public if typing.get_origin(getattr(module, n)) is not None]
    data = sorted(set(data))
    lines = [f"# `{name}`", "", "```{eval-rst}", f".. currentmodule:: {name}", ""]
    lines += [".. autosummary::", "   :nosignatures:", ""]
    lines += [f"   {item}" for item in public]
    lines += ["", f".. automodule:: {name}", "   :members:", "   :undoc-members:"]
    lines += ["   :imported-members:"]
    if data:
      lines += [f"   :exclude-members: {', '.join(data)}"]
    for item in data:
      lines += ["", f".. autodata:: {item}"]
    lines += ["```", ""]
    (directory / f"{short}.md").write_text("\n".join(lines))


def write_layers(path: pathlib.Path) -> None:
  """The private layers, lowest first, with what each holds: `tunix_ppo_ext._src.LAYERS`
  and `TUNIX_PARTS`, the tuples `tests/test_layout.py` checks the imports against."""
  from tunix_ppo_ext import _src

  source = inspect.getsource(_src)
  lines = ["| layer | what it holds |", "| --- | --- |"]
  for name in _src.LAYERS:
    holds = re.search(rf'^  "{name}",  # (.*)$', source, flags=re.M)
    lines.append(f"| `{name}` | {_cell(holds.group(1) if holds else '')} |")
  parts = " < ".join(f"`{part}`" for part in _src.TUNIX_PARTS)
  lines += ["", f"The `tunix` layer's parts, in the same order: {parts}."]
  path.write_text("\n".join(lines) + "\n")


def write_layout(path: pathlib.Path) -> None:
  lines = ["| module | what it holds | names |", "| --- | --- | --- |"]
  for name in PUBLIC_MODULES:
    module = importlib.import_module(name)
    doc = (inspect.getdoc(module) or "").split("\n\n")[0].replace("\n", " ")
    short = name.replace(".", "_")
    lines.append(f"| [`{name}`](../api/{short}.md) | {_cell(doc)} | {len(module.__all__)} |")
  path.write_text("\n".join(lines) + "\n")


def generate(app) -> None:
  docs = pathlib.Path(app.srcdir)
  out = docs / "reference" / "_generated"
  out.mkdir(parents=True, exist_ok=True)
  write_config_keys(out / "config_keys.md")
  write_metric_keys(out / "metric_keys.md")
  write_layout(out / "layout.md")
  write_layers(out / "layers.md")
  api = docs / "api"
  api.mkdir(exist_ok=True)
  write_api(api)


_CODE = re.compile(r"(``.*?``|`[^`]*`)")


def _escape(text: str) -> str:
  if text.count("`") % 2:
    text = text.replace("`", "'")
  parts = _CODE.split(text)
  for j in range(0, len(parts), 2):
    part = parts[j].replace("\\", "\\\\").replace("*", "\\*").replace("|", "\\|")
    parts[j] = re.sub(r"(\w)_(?=\W|$)", r"\1\\_", part)
  for j in range(1, len(parts), 2):  # a code span glued to a word (`LoRAParam`s)
    if j + 1 < len(parts) and re.match(r"\w", parts[j + 1]):
      parts[j] += "\\ "
    if re.search(r"\w$", parts[j - 1]):
      parts[j] = "\\ " + parts[j]
  return "".join(parts)


def plain_docstring(app, what, name, obj, options, lines) -> None:
  """The package's docstrings are Markdown-flavoured plain text, not reStructuredText: the
  first paragraph becomes the summary (code spans kept, other markup characters literal),
  the rest is shown as written, preformatted, as `help()` shows it."""
  if not lines:
    return
  blank = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
  summary = _escape(" ".join(line.strip() for line in lines[:blank]))
  rest = lines[blank:]
  while rest and not rest[0].strip():
    rest = rest[1:]
  while rest and not rest[-1].strip():
    rest = rest[:-1]
  lines[:] = [summary]
  if rest:
    lines += ["", "::", ""] + [("   " + line) if line.strip() else "" for line in rest] + [""]


def setup(app):
  app.connect("builder-inited", generate, priority=100)  # before autosummary's stubs
  app.connect("autodoc-process-docstring", plain_docstring)
  return {"parallel_read_safe": True, "version": "1"}
