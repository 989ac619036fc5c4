"""The package's shape: layers import only downward, no cycles, the math imports no tunix;
and the tests' shape: folders that mirror the package's, shared code only in `tests/helpers/`,
each test's lane declared in its module."""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys
import tomllib

import pytest

from tests.helpers import lanes
from tests.helpers.import_graph import PACKAGE, imports, imports_tunix, module_name, reaches_tunix
from tunix_ppo_ext._src import LAYERS, TUNIX_PARTS

pytestmark = pytest.mark.fast

REPO = PACKAGE.parent

SRC = PACKAGE / "_src"
# Lowest first (the package states them, the layout page prints them); a module may import
# its own layer's modules and any lower layer's.
RANK = {name: rank for rank, name in enumerate(LAYERS)}
# Inside the tunix layer, the same rule between its parts.
TUNIX_RANK = {name: rank for rank, name in enumerate(TUNIX_PARTS)}
PUBLIC = (
  "config",
  "data",
  "envs",
  "jobs",
  "losses",
  "metrics",
  "models",
  "ops",
  "plugins",
  "rollout",
)
# What the tunix layer's rule counts as tunix: tunix, and qwix, the LoRA library of tunix's
# models (`compat.qwix_adapters` reaches them through it and imports no tunix itself).
TUNIX_STACK = ("tunix", "qwix")


def _graph() -> dict[str, set[str]]:
  return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def _layer(module: str) -> str | None:
  """`tunix_ppo_ext._src.<layer>...` -> layer; public modules and `_src` itself -> None."""
  parts = module.split(".")
  return parts[2] if len(parts) > 2 and parts[1] == "_src" else None


def _tunix_part(module: str) -> str | None:
  parts = module.split(".")
  return parts[3] if len(parts) > 3 and parts[2] == "tunix" else None


def test_every_module_is_in_a_layer():
  top = {p.stem for p in SRC.iterdir() if p.suffix == ".py" or p.is_dir()}
  assert top - {"__init__", "__pycache__"} == set(LAYERS)
  parts = {p.stem for p in (SRC / "tunix").iterdir() if p.suffix == ".py" or p.is_dir()}
  assert parts - {"__init__", "__pycache__"} == set(TUNIX_PARTS)
  public = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py"} - {"__init__"}
  assert public == set(PUBLIC)


def _upward(rank: dict[str, int], where) -> list[str]:
  upward = []
  for module, targets in _graph().items():
    here = where(module)
    for target in targets:
      there = where(target)
      if here is None or there is None or there == here:
        continue
      if rank[there] >= rank[here]:
        upward.append(f"{module} -> {target}")
  return upward


# Package folders with no test folder of their own, and why.
UNMIRRORED = {
  "tunix/aot": "compiled through `plan` (tests/run/test_plan.py) and the fused head's memory "
  "(tests/tunix/learner/test_fused_head.py)",
}


def _test_folders() -> set[str]:
  """The folders of `tests/` that hold test modules, and the folders above them."""
  tests = REPO / "tests"
  folders = {p.parent.relative_to(tests) for p in tests.rglob("test_*.py")}
  return {str(f) for folder in folders for f in [folder, *folder.parents] if f.parts}


def test_the_tests_mirror_the_package_s_folders():
  """`tests/<layer>/` tests `_src/<layer>/`, and `tests/tunix/<part>/` tests
  `_src/tunix/<part>/`: every folder of the one has its folder in the other (but the
  `UNMIRRORED` ones, for the reasons given); `tests/helpers/` holds the shared code."""
  package = {
    str(p.parent.relative_to(SRC))
    for p in SRC.rglob("__init__.py")
    if p.parent != SRC and "__pycache__" not in p.parts
  }
  assert _test_folders() <= package, sorted(_test_folders() - package)
  assert package - _test_folders() == set(UNMIRRORED), sorted(package - _test_folders())


def _test_modules() -> list[pathlib.Path]:
  return sorted((REPO / "tests").rglob("test_*.py"))


def _imported(path: pathlib.Path) -> set[str]:
  """The modules `path` imports (at any depth; `from A import b` gives `A` and `A.b`)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom) and not node.level:
      found |= {node.module or ""} | {f"{node.module}.{alias.name}" for alias in node.names}
    elif isinstance(node, ast.ImportFrom):
      found.add("." * node.level + (node.module or ""))  # relative: refused below
  return found


def _wrong_imports(path: pathlib.Path) -> list[str]:
  """Imports of `path` that reach a test module or `conftest`: of this suite, only
  `tests.helpers` (and its modules) may be imported."""
  wrong = []
  for name in sorted(_imported(path)):
    parts = name.split(".")
    if name.startswith(".") or "conftest" in parts:
      wrong.append(name)
    elif parts[0] == "tests" and name != "tests" and parts[1] != "helpers":
      wrong.append(name)
  return wrong


def test_no_test_module_imports_another_test_module_or_conftest(tmp_path):
  """A test module (or a helper) imports only `tests.helpers` of the suite: no other test
  module, no `conftest.py` (its hooks and fixtures reach the tests through pytest)."""
  bad = tmp_path / "test_bad.py"
  bad.write_text(
    "from tests.conftest import x\nfrom tests.ops.test_kl import y\nimport conftest\n"
    "from . import z\nfrom tests.helpers.losses import RTOL\nfrom tests.helpers import scores\n"
  )
  assert _wrong_imports(bad) == [
    ".",
    "conftest",
    "tests.conftest",
    "tests.conftest.x",
    "tests.ops.test_kl",
    "tests.ops.test_kl.y",
  ]
  helpers = sorted((REPO / "tests" / "helpers").glob("*.py"))
  wrong = {str(p.relative_to(REPO)): _wrong_imports(p) for p in [*_test_modules(), *helpers]}
  assert not {path: names for path, names in wrong.items() if names}


def _lane_problems(path: pathlib.Path) -> list[str]:
  """Each test of `path` declares one lane (`lanes.LANES`), by its module's `pytestmark`
  or its own mark; a `fast` one is not `slow` and its module reaches no tunix."""
  problems = []
  for test, marks in lanes.marks_by_test(path).items():
    declared = marks & set(lanes.LANES)
    if len(declared) != 1:
      problems.append(f"{test}: lanes {sorted(declared)}")
    elif "fast" in declared and ("slow" in marks or reaches_tunix(path)):
      problems.append(f"{test}: fast, but {'slow' if 'slow' in marks else 'reaches tunix'}")
  return problems


def test_each_test_declares_its_lane(tmp_path):
  """Lane membership is written in the test module, not derived from its imports: moving an
  import moves no test between lanes, it fails here until the mark says where it runs."""
  module = tmp_path / "test_marks.py"
  module.write_text(
    "import pytest\nimport tunix\npytestmark = pytest.mark.fast\n"
    "def test_a(): pass\n@pytest.mark.tunix\ndef test_b(): pass\n"
  )
  assert _lane_problems(module) == [
    "test_a: fast, but reaches tunix",
    "test_b: lanes ['fast', 'tunix']",
  ]
  module = tmp_path / "test_more_marks.py"  # (the marks are read once per file)
  module.write_text(
    "import pytest\n@pytest.mark.fast\n@pytest.mark.slow\ndef test_c(): pass\ndef test_d(): pass\n"
  )
  assert _lane_problems(module) == ["test_c: fast, but slow", "test_d: lanes []"]
  problems = {str(p.relative_to(REPO)): _lane_problems(p) for p in _test_modules()}
  assert not {path: found for path, found in problems.items() if found}


def test_layers_import_only_downward():
  assert not _upward(RANK, _layer)


def test_tunix_parts_import_only_downward():
  assert not _upward(TUNIX_RANK, _tunix_part)


def _cycles(graph: dict[str, set[str]]) -> list[str]:
  """The cycles a depth-first walk of `graph` (module -> modules it imports) closes."""
  state, cycles = {}, []

  def visit(module: str, path: list[str]) -> None:
    state[module] = "open"
    for target in sorted(graph.get(module, ())):
      if state.get(target) == "open":
        cycles.append(" -> ".join([*path[path.index(target) :], target]))
      elif target not in state:
        visit(target, [*path, target])
    state[module] = "done"

  for module in sorted(graph):
    if module not in state:
      visit(module, [module])
  return cycles


def test_no_import_cycles():
  """The package's import graph (imports at any depth of a module's code, lazy and
  type-only ones included) has no cycle, inside a layer as between layers."""
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a -> b -> c -> a"]
  assert _cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
  assert not _cycles(_graph()), _cycles(_graph())


def test_the_implementation_never_imports_the_public_modules():
  public = {"tunix_ppo_ext"} | {f"tunix_ppo_ext.{name}" for name in PUBLIC}
  wrong = [
    f"{module} -> {target}"
    for module, targets in _graph().items()
    if module.startswith("tunix_ppo_ext._src")
    for target in targets
    if target in public
  ]
  assert not wrong, wrong


def test_no_two_modules_share_a_basename():
  stems = sorted(p.stem for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
  assert len(stems) == len(set(stems)), sorted({s for s in stems if stems.count(s) > 1})


def test_no_two_test_modules_share_a_basename():
  """Each test module is named after what it tests (`tests/<part>/test_<module>.py`), once."""
  stems = sorted(p.stem for p in (REPO / "tests").rglob("test_*.py"))
  assert len(stems) == len(set(stems)), sorted({s for s in stems if stems.count(s) > 1})


def test_a_module_is_in_the_tunix_layer_if_and_only_if_itimports_tunix():
  """Directly, or through another module of the tunix layer (`compat`'s seam, say); the
  layers above it reach tunix only through it (tunix or qwix: `TUNIX_STACK`)."""
  graph, wrong = _graph(), []
  for path in PACKAGE.rglob("*.py"):
    module = module_name(path)
    if path.name == "__init__.py":
      continue
    if _layer(module) == "tunix":
      if not (imports_tunix(path, TUNIX_STACK) or any(_layer(t) == "tunix" for t in graph[module])):
        wrong.append(f"{module}: imports no tunix")
    elif imports_tunix(path, TUNIX_STACK):
      wrong.append(f"{module}: imports tunix outside the tunix layer")
    elif _layer(module) is not None and RANK[_layer(module)] < RANK["tunix"]:
      if any(_layer(t) == "tunix" for t in graph[module]):
        wrong.append(f"{module}: below the tunix layer, imports it")
  assert not wrong, wrong


def test_the_public_modules_export_a_curated_all():
  """No name twice, every name there, every function and class documented (optax's rule)."""
  for name in ("",) + tuple(f".{n}" for n in PUBLIC):
    module = importlib.import_module(f"tunix_ppo_ext{name}")
    assert module.__doc__, name
    assert len(set(module.__all__)) == len(module.__all__), name
    for attr in module.__all__:
      value = getattr(module, attr)
      if callable(value):
        assert getattr(value, "__doc__", None), (name, attr)


def test_each_public_name_has_one_home():
  """A name is exported by one public module; the package itself re-exports the headline
  ones from theirs (the same object), and `compute_kl_divergence` (tunix's signature) lives
  there alone."""
  homes: dict[str, list[str]] = {}
  for name in PUBLIC:
    for attr in importlib.import_module(f"tunix_ppo_ext.{name}").__all__:
      homes.setdefault(attr, []).append(name)
  assert not {a: h for a, h in homes.items() if len(h) > 1}
  package = importlib.import_module("tunix_ppo_ext")
  for attr in package.__all__:
    if attr in homes:
      module = importlib.import_module(f"tunix_ppo_ext.{homes[attr][0]}")
      assert getattr(package, attr) is getattr(module, attr), attr


def _loaded_after(statement: str) -> set[str]:
  code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  return set(out.stdout.split())


def test_the_math_and_the_package_import_no_tunix():
  for statement in ("import tunix_ppo_ext.ops", "import tunix_ppo_ext"):
    loaded = _loaded_after(statement)
    leaked = sorted(m for m in loaded if m.split(".")[0] in ("tunix", "orbax", "flax"))
    assert not leaked, (statement, leaked[:5])


def _console_script() -> tuple[str, str]:
  """(module, function) of the installed `tunix-ppo-ext` script, as pyproject.toml declares it."""
  scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
  module, function = scripts["tunix-ppo-ext"].split(":")
  return module, function


HEAVY = ("jax", "jaxlib", "tunix", "flax", "orbax", "optax", "numpy")


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["sweep", "--help"]])
def test_the_command_s_help_imports_no_jax_nor_tunix(argv):
  """`tunix-ppo-ext --help` prints at once: the console script's module, the package and the
  parser load none of jax, tunix, flax or NumPy (seconds of imports before a line)."""
  module, function = _console_script()
  code = (
    f"import sys\nfrom {module} import {function}\nsys.argv = ['tunix-ppo-ext', *{argv!r}]\n"
    f"try:\n  {function}()\nexcept SystemExit as done:\n  assert done.code == 0, done.code\n"
    "print('\\n'.join(sorted(sys.modules)), file=sys.stderr)"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
  )
  assert out.stdout.startswith(f"usage: tunix-ppo-ext {argv[0].removeprefix('--help')}".strip())
  leaked = sorted(m for m in out.stderr.split() if m.split(".")[0] in HEAVY)
  assert not leaked, leaked[:5]


def test_the_package_imports_no_jax():
  """`import tunix_ppo_ext` (what the console script imports first) loads no JAX: its
  names that need JAX load on first use."""
  loaded = _loaded_after("import tunix_ppo_ext")
  assert not sorted(m for m in loaded if m.split(".")[0] in ("jax", "jaxlib")), "jax"


def test_the_math_imports_only_jax_numpy_chex():
  allowed = {"jax", "numpy", "chex", "tunix_ppo_ext", "__future__"}
  allowed |= set(sys.stdlib_module_names)
  for path in (SRC / "ops").rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      names = []
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and not node.level:
        names = [node.module or ""]
      for name in names:
        assert name.split(".")[0] in allowed, (path.name, name)
        if name.startswith("tunix_ppo_ext."):
          assert _layer(name) in ("ops", "plugins", "names", "checks"), (path.name, name)


@pytest.mark.parametrize("layer", ["plugins", "names.py", "checks.py"])
def test_the_lowest_layers_are_stdlib_only(layer):
  allowed = set(sys.stdlib_module_names) | {"tunix_ppo_ext", "__future__"}
  paths = [SRC / layer] if layer.endswith(".py") else (SRC / layer).rglob("*.py")
  for path in paths:
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and not node.level:
        names = [node.module or ""]
      else:
        continue
      for name in names:
        assert name.split(".")[0] in allowed, (path.name, name)


def _imports_private(path) -> bool:
  """Whether a script imports a `tunix_ppo_ext._src` module (`import_graph.imports`: its
  imports, not its text, since a probe table quotes old tracebacks that name private
  modules); a notebook, by its text."""
  if path.suffix != ".py":
    return "tunix_ppo_ext._src" in path.read_text()
  return any(name.startswith("tunix_ppo_ext._src") for name in imports(path))


def test_the_benches_examples_and_notebooks_use_only_the_public_api():
  """What a user reads as an example imports no `tunix_ppo_ext._src` name."""
  places = [*REPO.glob("bench/*.py"), *REPO.glob("examples/*.py"), *REPO.glob("notebooks/*.ipynb")]
  assert places
  private = [str(p.relative_to(REPO)) for p in places if _imports_private(p)]
  assert not private, private
