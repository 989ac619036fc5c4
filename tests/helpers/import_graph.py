"""The package's import graph, read from the source (no import): for the layout test and
for the fast lane's selection (`pytest -m fast`: the tests that never reach tunix)."""

from __future__ import annotations

import ast
import functools
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "tunix_ppo_ext"
# helpers of tests/conftest.py that need no tunix (the fast lane may import these)
NUMPY_HELPERS = frozenset({"flush_subnormals", "make_prompts", "target_char_reward"})


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def package_modules() -> dict[str, pathlib.Path]:
  return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _statements(path: pathlib.Path) -> list[ast.Import | ast.ImportFrom]:
  tree = ast.parse(path.read_text())
  return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def imports(path: pathlib.Path) -> set[str]:
  """Modules of the package that `path` imports (at any depth of its code)."""
  modules = package_modules()
  inside = path.is_relative_to(PACKAGE)
  name = module_name(path) if inside else ""
  package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
  found: set[str] = set()
  for node in _statements(path):
    if isinstance(node, ast.Import):
      found |= {alias.name for alias in node.names}
      continue
    base = node.module or ""
    if node.level:
      parent = package.split(".")[: len(package.split(".")) - node.level + 1]
      base = ".".join(parent + ([base] if base else []))
    subs = {f"{base}.{alias.name}" for alias in node.names} & set(modules)
    found |= subs if len(subs) == len(node.names) else subs | {base}
  return {m for m in found if m in modules and m != name}


def imports_tunix(path: pathlib.Path, roots: tuple[str, ...] = ("tunix",)) -> bool:
  """Whether `path` itself imports tunix (not this package), or another of `roots`."""
  for node in _statements(path):
    names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
    if isinstance(node, ast.ImportFrom) and not node.level:
      names = [node.module or ""]
    if any(n.split(".")[0] in roots for n in names):
      return True
  return False


def _uses_tunix_test_helpers(path: pathlib.Path) -> bool:
  for node in _statements(path):
    if isinstance(node, ast.ImportFrom) and node.module in ("tests.conftest", "tests.tunix"):
      if any(a.name not in NUMPY_HELPERS for a in node.names):
        return True
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests.tunix"):
      return True
  return False


@functools.cache
def reaches_tunix(path: pathlib.Path) -> bool:
  """Whether importing `path` (a package module or a test file) imports tunix."""
  if imports_tunix(path) or (not path.is_relative_to(PACKAGE) and _uses_tunix_test_helpers(path)):
    return True
  return any(reaches_tunix(package_modules()[m]) for m in imports(path))
