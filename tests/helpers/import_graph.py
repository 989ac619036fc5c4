"""The package's import graph, read from the source (no import): for the layout test, which
checks that a test module declared `fast` (tests/helpers/lanes.py) never reaches tunix."""

from __future__ import annotations

import ast
import functools
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "tunix_ppo_ext"
HELPERS = pathlib.Path(__file__).resolve().parent


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


def helper_imports(path: pathlib.Path) -> set[pathlib.Path]:
  """The modules of `tests/helpers/` that `path` imports (at any depth of its code)."""
  found = set()
  for node in _statements(path):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif node.module == "tests.helpers":
      names = [f"tests.helpers.{alias.name}" for alias in node.names]
    else:
      names = [node.module or ""]
    for name in names:
      if name.startswith("tests.helpers."):
        found.add(HELPERS / f"{name.split('.')[2]}.py")
  return found


@functools.cache
def reaches_tunix(path: pathlib.Path) -> bool:
  """Whether importing `path` (a package module, a test helper or a test file) imports
  tunix: itself, or through the package's modules or the test helpers it imports."""
  if imports_tunix(path):
    return True
  helpers = helper_imports(path) - {path}
  modules = [package_modules()[m] for m in imports(path)]
  return any(reaches_tunix(p) for p in [*helpers, *modules])
