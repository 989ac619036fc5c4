"""The documentation site builds offline with warnings as errors, covers what the code has,
and the README and the docs name nothing that does not exist.

- `test_the_site_builds_and_covers_the_code` builds `docs/` with `sphinx-build -W` (a broken
  reference, a missing page or a docstring the build cannot read fails it) and checks the
  generated reference against the code: every public name of every public module's
  `__all__`, every run-config key (with a meaning), every metric key, every CLI option.
- `test_docs_and_readme_name_only_what_exists`: every `tunix_ppo_ext.<...>` name resolves,
  every repository file or directory and `tests/...::test_name` exists, and every dotted
  run-config key (`ppo.kl_ctrl`, overrides like `train.steps=100`) is a key of the reference.
- `test_every_config_file_key_is_in_the_reference`: the keys of `configs/*.yaml`.
- `test_docs_name_only_metric_keys_that_exist`: metric keys and families the text names.
- `test_marked_code_examples_run`: the Python blocks marked `% test: run` in the docs run.
- `test_every_public_function_documents_its_arguments`: every function of a public module's
  `__all__` that takes parameters has a Google-style `Args:` section naming each of them.
- `test_math_examples_run`: every public function of `tunix_ppo_ext.ops` has a doctest
  example (`>>>`) in its docstring, and they all print what they show.
"""

from __future__ import annotations

import argparse
import ast
import doctest
import functools
import importlib
import inspect
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
import ppo_ext_reference as reference  # noqa: E402  (docs/_ext: the generator the site uses)

pytestmark = pytest.mark.tunix

SECTIONS = ("model", "env", "envs", "train", "metrics", "mesh", "optim", "batch", "sampling")
SECTIONS += ("shaping", "filter", "validation", "dapo", "ppo")
TOP_DIRS = ("tunix_ppo_ext/", "tests/", "configs/", "examples/", "bench/", "notebooks/")
TOP_DIRS += ("docs/", ".ci/")
# Paths the text names in other projects (tunix's and GRL's repositories).
EXTERNAL_PATHS = {"tests/rl/ppo/ppo_learner_test.py", "configs/tunix_base.yaml"}
EXTERNAL_PATHS |= {"configs/agents.yaml", "tunix_ppo_ext/gguf", "tunix_ppo_ext/xla"}  # ~/.cache/...


def doc_files() -> list[pathlib.Path]:
  skip = ("_build", "_generated", "_autosummary")
  pages = [p for p in DOCS.rglob("*.md") if not any(s in p.parts for s in skip)]
  pages = [p for p in pages if not (p.parent.name == "api" and p.name != "index.md")]
  return [REPO / "README.md", *sorted(pages), *sorted(DOCS.rglob("*.rst"))]


def test_the_site_builds_and_covers_the_code(tmp_path):
  out = tmp_path / "html"
  command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
  command += ["-d", str(tmp_path / "doctrees"), str(DOCS), str(out)]
  done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
  assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]

  missing = []
  for name in reference.PUBLIC_MODULES:
    page = (out / "api" / f"{name.replace('.', '_')}.html").read_text()
    for item in importlib.import_module(name).__all__:
      if f'id="{name}.{item}"' not in page:
        missing.append(f"{name}.{item}")
  assert not missing, f"public names without documentation: {missing}"

  config = (out / "reference" / "config.html").read_text()
  entries = reference.config_entries()
  assert len(entries) > 100
  missing = [e.key for e in entries if f'id="{reference.anchor(e.key)}"' not in config]
  assert not missing, f"config keys without a reference entry: {missing}"
  assert not [e.key for e in entries if not e.meaning.strip()], "config keys without meaning"

  metrics = (out / "reference" / "metrics.html").read_text()
  from tunix_ppo_ext.metrics import known_keys

  missing = [
    key
    for key in known_keys()
    if f'<code class="docutils literal notranslate"><span class="pre">{key}</span>' not in metrics
  ]
  assert not missing, f"metric keys missing from the reference: {missing}"

  from tunix_ppo_ext._src.run import cli

  cli_page = (out / "reference" / "cli.html").read_text()
  missing = []
  for parser in _parsers(cli._parser()):
    if parser.prog.split()[-1] not in cli_page:
      missing.append(parser.prog)
    for action in parser._actions:
      if isinstance(action, argparse._HelpAction):
        continue
      names = action.option_strings or [action.metavar or action.dest]
      missing += [f"{parser.prog} {n}" for n in names if isinstance(n, str) and n not in cli_page]
  assert not missing, f"CLI options missing from the reference: {missing}"


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
  found = [parser]
  for action in parser._actions:
    if isinstance(action, argparse._SubParsersAction):
      for sub in action.choices.values():
        found += _parsers(sub)
  return found


def _code_spans(text: str) -> list[tuple[str, str]]:
  """(text, language) of inline code spans (language "") and the lines of fenced blocks."""
  spans, fence = [], None
  for line in text.splitlines():
    if line.lstrip().startswith(("```", "~~~")):
      fence = None if fence is not None else (line.strip().strip("`~") or "text")
      continue
    if fence is not None:
      spans.append((line, fence))
    else:
      spans += [(span, "") for span in re.findall(r"``?([^`]+)``?", line)]
  return spans


def _resolve(name: str) -> bool:
  name = name.rstrip(".").replace(":", ".")
  parts = name.split(".")
  if len(parts) == 2 and parts[1] in _plugin_kinds():
    return True  # an entry-point group, `tunix_ppo_ext.<kind>`
  for cut in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:cut]))
    except ImportError:
      continue
    try:
      for attr in parts[cut:]:
        obj = getattr(obj, attr)
    except AttributeError:
      return False
    return True
  return False


def _plugin_kinds() -> tuple[str, ...]:
  from tunix_ppo_ext.plugins import KINDS

  return tuple(KINDS)


def _config_keys() -> tuple[set[str], set[str]]:
  """(every key, the keys that hold a free-form mapping whose own keys are not checked)."""
  keys, free = set(), set()
  for entry in reference.config_entries():
    keys.add(entry.key)
    parts = entry.key.split(".")
    keys.update(".".join(parts[:i]) for i in range(1, len(parts)))
    if entry.type.startswith("dict") or "dict[" in entry.type:
      free.add(entry.key)
  return keys, free


def _known_key(key: str, keys: set[str], free: set[str]) -> bool:
  key = re.sub(r"\.\d+(?=\.|$)", "[]", key).replace("[0]", "[]")
  key = re.sub(r"^mesh\.roles\.(actor|critic|reference|rollout)", "mesh.roles.<role>", key)
  if key.endswith("*"):
    return any(k.startswith(key[:-1]) for k in keys)
  if key in keys:
    return True
  return any(key.startswith(f + ".") for f in free if f not in ("mesh.roles",))


def _expand(token: str) -> list[str]:
  match = re.search(r"\{([\w,]+)\}", token)
  if not match:
    return [token]
  return [
    t for alt in match.group(1).split(",") for t in _expand(token.replace(match.group(0), alt, 1))
  ]


KEY = re.compile(
  r"(?<![\w./-])((?:" + "|".join(SECTIONS) + r")(?:\.(?:[\w*<>]+|\{[\w,]+\}|\[\]))+)"
)
PATH = re.compile(r"(?<![\w.-])((?:" + "|".join(map(re.escape, TOP_DIRS)) + r")[\w./-]*)")


@functools.cache
def _ignored(target: str) -> bool:
  """Whether git ignores `target`: a file the checkout has here but a clean one (CI) lacks."""
  done = subprocess.run(
    ["git", "check-ignore", "-q", target], cwd=REPO, capture_output=True, check=False
  )
  return done.returncode == 0  # 1: not ignored; 128: not a git checkout


# the probe tables (`tools/fault_probes.py`) quote bad keys and metric names on purpose
PROBE_TABLES = DOCS / "probes"


def _problems(path: pathlib.Path) -> list[str]:
  text = path.read_text()
  keys, free = _config_keys()
  bad_on_purpose = PROBE_TABLES in path.parents
  problems = []
  foreign_first_column = path.name.startswith("from_") and path.parent.name == "guides"
  lines = []
  for line in text.splitlines():
    if foreign_first_column and line.startswith("|"):
      line = "|".join(line.split("|")[2:])  # the other project's keys
    lines.append(line)
  for span, language in _code_spans("\n".join(lines)):
    for name in re.findall(r"tunix_ppo_ext(?:\.\w+)+(?::\w+)?", span):
      if not _resolve(name):
        problems.append(f"{path.name}: no such name {name}")
    for match in PATH.finditer(span):
      target = match.group(1).rstrip(".,;:)")
      test = re.match(r"(tests/[\w/]+\.py)::(\w+)", span[match.start() :])
      glob = span[match.end() : match.end() + 1] == "*"
      if target in EXTERNAL_PATHS or "<" in target or glob or target.startswith("docs/_build"):
        continue  # docs/_build: what the build writes (the build test may not have run yet)
      if not (REPO / target).exists() or _ignored(target):
        problems.append(f"{path.name}: no such file {target}")
      elif test and not re.search(rf"def {test.group(2)}\b", (REPO / test.group(1)).read_text()):
        problems.append(f"{path.name}: no test {test.group(0)}")
    if "python" in language or bad_on_purpose:
      continue  # Python code: `env.step(...)` is an attribute, not a config key
    for match in KEY.finditer(span):
      token = match.group(1).rstrip(".")
      if re.match(r"[\w]+\.(py|yaml|md|json|jsonl|png|toml|ipynb|safetensors)$", token):
        continue  # a file name (`train.py`)
      for key in _expand(token):
        if not _known_key(key, keys, free):
          problems.append(f"{path.name}: no config key {key}")
  return problems


METRIC = re.compile(
  r"(?<![\w/.-])((?:train|eval|actor|critic|rollout|timing_s|rewards|generation|advantages)"
  r"/[\w/{}<>*.,-]*)"
)


def _metric_problems(path: pathlib.Path) -> list[str]:
  from tunix_ppo_ext._src.run.plan import PIECES
  from tunix_ppo_ext.metrics import known_keys

  known = set(known_keys()) | set(reference.EXTRA_METRICS)
  pieces = set(PIECES)  # `plan`'s pieces share the look: `actor/train_step`
  known |= {f"eval/{k.removeprefix('train/')}" for k in known}
  problems = []
  if PROBE_TABLES in path.parents:
    return problems
  for span, language in _code_spans(path.read_text()):
    if language:
      continue  # code: paths and expressions, not metric names
    for match in METRIC.finditer(span):
      token = match.group(1).rstrip(".,")
      stem = re.split(r"[{<*]", token)[0]
      if token != stem or token.endswith("/"):  # a family: `train/score/{stats}`, `eval/`
        ok = any(k.startswith(stem) for k in known) or re.match(r"(train|eval)/env", stem)
      else:
        ok = token in known | pieces or re.match(r"(train|eval)/env/", token) is not None
      if not ok and not (REPO / token).exists():
        problems.append(f"{path.name}: no metric key {token}")
  return problems


def test_docs_name_only_metric_keys_that_exist():
  problems = [p for path in doc_files() for p in _metric_problems(path)]
  assert not problems, "\n".join(problems)
  source = "".join(p.read_text() for p in (REPO / "tunix_ppo_ext" / "_src").rglob("*.py"))
  for key in reference.EXTRA_METRICS:  # the extra keys are still what the code logs
    assert key.split("/")[-1] in source or key in source, key


def test_docs_and_readme_name_only_what_exists():
  problems = [p for path in doc_files() for p in _problems(path)]
  assert not problems, "\n".join(problems)


def test_the_checks_catch_what_does_not_exist(tmp_path):
  bad = tmp_path / "bad.md"
  bad.write_text(
    "`tunix_ppo_ext.checkpoints.save_qwen3_safetensors`, `tunix_ppo_ext/registry.py`,\n"
    "`tests/run/test_configs.py::test_nothing_here`, `ppo.kl_controller: fixed`,\n"
    "`tunix-ppo-ext train batch.mini_batch=4`\n"
  )
  problems = _problems(bad)
  assert len(problems) == 5, problems
  bad.write_text("`actor/kl_coeff`, `train/scores/{stats}`, `actor/kl_coef`, `train/env/<tag>/`")
  assert len(_metric_problems(bad)) == 2, _metric_problems(bad)
  good = tmp_path / "good.md"
  good.write_text(
    "`tunix_ppo_ext.ops.kl_k3`, `tunix_ppo_ext.envs:render_board`, `configs/default.yaml`,\n"
    "`ppo.kl_ctrl: fixed`, `env.kwargs.max_attempts=3`, `optim.{actor,critic}.schedule`,\n"
    "`mesh.roles.rollout.shape`, `envs[].groups`, `sampling.eval_*`, `tunix_ppo_ext.environments`\n"
  )
  assert _problems(good) == []


def _flatten(data, prefix=""):
  if isinstance(data, dict):
    for key, value in data.items():
      yield from _flatten(value, f"{prefix}.{key}" if prefix else str(key))
  elif isinstance(data, list) and data and all(isinstance(v, dict) for v in data):
    for value in data:
      yield from _flatten(value, f"{prefix}[]")
  else:
    yield prefix


def test_every_config_file_key_is_in_the_reference():
  keys, free = _config_keys()
  problems = []
  for path in sorted((REPO / "configs").glob("*.yaml")):
    for key in _flatten(yaml.safe_load(path.read_text()) or {}):
      key = key.replace("[].", "[].")
      if not _known_key(key, keys, free):
        problems.append(f"{path.name}: {key}")
  assert not problems, problems


def _marked_blocks() -> list[tuple[str, str]]:
  blocks = []
  for path in doc_files():
    text = path.read_text()
    for match in re.finditer(r"^% test: run\n```python\n(.*?)^```", text, flags=re.M | re.S):
      blocks.append(
        (f"{path.relative_to(REPO)}:{text[: match.start()].count(chr(10)) + 1}", match.group(1))
      )
  return blocks


def test_marked_code_examples_run(tmp_path):
  blocks = _marked_blocks()
  assert len(blocks) >= 3, blocks
  for where, code in blocks:
    ast.parse(code, filename=where)  # a syntax error names the block
  runner = "\n".join(
    f"exec(compile({code!r}, {where!r}, 'exec'), {{'__name__': '__doc_example__'}})"
    for where, code in blocks
  )
  done = subprocess.run(
    [sys.executable, "-c", runner], capture_output=True, text=True, timeout=600, cwd=tmp_path
  )
  assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.parametrize("path", ["README.md"])
def test_readme_is_a_front_page(path):
  text = (REPO / path).read_text()
  assert len(text.encode()) < 6_000, len(text.encode())  # read in two minutes; docs/results.md
  ci = (REPO / ".ci" / "run").read_text()
  lines = ci.splitlines()
  test_command = lines[lines.index("# The README's test command, verbatim:") + 1]
  assert test_command in text  # the command CI runs, verbatim
  first = text.index("```bash")
  assert text.index(test_command) > first and text.index("tunix-ppo-ext train") > first
  for page in ("docs/reference/config.md", "docs/guides/environments.md", "docs/results.md"):
    assert page in text, page
  # the fast lane's command works after the first command, which installs no pytest
  fast_lane = [line for line in text.splitlines() if "pytest -m fast" in line]
  assert fast_lane and all("pip install -e '.[dev]'" in line for line in fast_lane), fast_lane


def _public_functions(module_names) -> dict[str, object]:
  """`module.name` -> function (jitted ones too), over the `__all__` of `module_names`
  (classes and constants left out)."""
  found = {}
  for module_name in module_names:
    module = importlib.import_module(module_name)
    for name in module.__all__:
      obj = getattr(module, name)
      if inspect.isfunction(inspect.unwrap(obj)):
        found[f"{module_name}.{name}"] = obj
  return found


def _documented_arguments(doc: str) -> set[str] | None:
  """The parameter names of a Google-style `Args:` section (`name:`, `*args:`, `a, b:`
  entries at its first indentation); None without one."""
  found = re.search(r"^Args:\n((?:[ ]+\S.*\n|\n)*)", doc + "\n", flags=re.M)
  if found is None:
    return None
  names = set()
  for entry in re.findall(r"^  (\*{0,2}\w+(?:, \*{0,2}\w+)*):", found.group(1), flags=re.M):
    names |= {name.lstrip("*") for name in entry.split(", ")}
  return names


def test_every_public_function_documents_its_arguments():
  functions = _public_functions(reference.PUBLIC_MODULES)
  assert len(functions) > 100, len(functions)
  without, undocumented = [], []
  for name, fn in functions.items():
    parameters = list(inspect.signature(fn).parameters)
    documented = _documented_arguments(inspect.getdoc(fn) or "")
    if parameters and documented is None:
      without.append(name)
    elif parameters:
      undocumented += [f"{name}({p})" for p in parameters if p not in documented]
  assert not without, f"public functions without an Args: section: {without}"
  assert not undocumented, f"parameters missing from their function's Args: {undocumented}"


def test_math_examples_run():
  functions = _public_functions(["tunix_ppo_ext.ops"])
  assert len(functions) > 40, len(functions)
  finder = doctest.DocTestFinder(recurse=False)
  flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
  runner = doctest.DocTestRunner(optionflags=flags)
  without, failed = [], []
  for name, fn in functions.items():
    tests = [t for t in finder.find(fn, name, globs={}) if t.examples]
    if not tests:
      without.append(name)
    for test in tests:
      if runner.run(test, out=failed.append).failed:
        failed.append(f"^ {name}")
  assert not without, f"public ops functions without a doctest example: {without}"
  assert not failed, "".join(failed)[-8000:]


AGENTIC_GUIDE = DOCS / "guides" / "agentic_ppo.md"


def _undocumented_agentic_keys(text: str) -> list[str]:
  """The `AgenticPpoConfig` fields (tunix's inherited ones too) that `text` never names in
  backticks."""
  import dataclasses

  from tunix_ppo_ext import AgenticPpoConfig

  named = set(re.findall(r"`([a-z_0-9]+)`", text))
  return [f.name for f in dataclasses.fields(AgenticPpoConfig) if f.name not in named]


def test_every_agentic_ppo_config_key_is_in_the_guide():
  missing = _undocumented_agentic_keys(AGENTIC_GUIDE.read_text())
  assert not missing, f"AgenticPpoConfig keys missing from {AGENTIC_GUIDE.name}: {missing}"
  without = AGENTIC_GUIDE.read_text().replace("`kl_clamp_value`", "kl_clamp_value")
  assert _undocumented_agentic_keys(without) == ["kl_clamp_value"]  # the check catches one
