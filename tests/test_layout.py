"""The package's shape: layers import only downward, no cycles, the math imports no tunix."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tunix_ppo_ext"
# Lowest first; a module may import its own layer's modules and any lower layer's.
LAYERS = ("checks", "ops", "plugins", "data", "envs", "config", "metrics", "tunix", "app")
RANK = {"checks": 0, "ops": 1, "plugins": 1, "data": 2, "envs": 3, "config": 4}
RANK |= {"metrics": 5, "tunix": 6, "app": 7}


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> set[str]:
  """Modules of the package that `path` imports (at any depth of its code)."""
  name = _module_name(path)
  package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
  found, modules = set(), {_module_name(p) for p in PACKAGE.rglob("*.py")}
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parent = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(parent + ([base] if base else []))
      subs = {f"{base}.{alias.name}" for alias in node.names} & modules
      found |= subs if len(subs) == len(node.names) else subs | {base}

  return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
  return {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def _layer(module: str) -> str | None:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else None


def test_every_module_is_in_a_layer():
  top = {p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()}
  top -= {"__init__.py", "__pycache__"}
  assert top == set(LAYERS), top ^ set(LAYERS)


def test_layers_import_only_downward():
  upward = []
  for module, targets in _graph().items():
    here = _layer(module)
    for target in targets:
      there = _layer(target)
      if here is None or there is None or there == here:
        continue
      if RANK[there] >= RANK[here]:
        upward.append(f"{module} -> {target}")
  assert not upward, upward


def test_no_import_cycles():
  graph, cycles, state, stack = _graph(), [], {}, []

  def visit(node: str) -> None:
    state[node] = 1
    stack.append(node)
    for nxt in graph[node]:
      if state.get(nxt) == 1:
        cycles.append(stack[stack.index(nxt) :] + [nxt])
      elif nxt not in state:
        visit(nxt)
    stack.pop()
    state[node] = 2

  for node in graph:
    if node not in state:
      visit(node)
  assert not cycles, cycles


def _loaded_after(statement: str) -> set[str]:
  code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  return set(out.stdout.split())


def test_the_math_and_the_package_import_no_tunix():
  for statement in ("import tunix_ppo_ext.ops", "import tunix_ppo_ext"):
    loaded = _loaded_after(statement)
    leaked = sorted(m for m in loaded if m.split(".")[0] in ("tunix", "orbax", "flax"))
    assert not leaked, (statement, leaked[:5])


def test_ops_imports_only_jax_numpy_chex():
  allowed = {"jax", "numpy", "chex", "tunix_ppo_ext", "__future__"}
  allowed |= set(sys.stdlib_module_names)
  for path in (PACKAGE / "ops").rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      names = []
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and not node.level:
        names = [node.module or ""]
      for name in names:
        assert name.split(".")[0] in allowed, (path.name, name)
        if name.startswith("tunix_ppo_ext."):
          assert _layer(name) in ("ops", "checks"), (path.name, name)


def test_plugins_layer_is_stdlib_only():
  allowed = set(sys.stdlib_module_names) | {"tunix_ppo_ext", "__future__"}
  for path in (PACKAGE / "plugins").rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and not node.level:
        names = [node.module or ""]
      else:
        continue
      for name in names:
        assert name.split(".")[0] in allowed, (path.name, name)


def test_only_the_tunix_layer_imports_tunix():
  for path in PACKAGE.rglob("*.py"):
    if _layer(_module_name(path)) == "tunix":
      continue
    text = path.read_text()
    assert "from tunix" not in text.replace("from tunix_ppo_ext", ""), path
    assert "import tunix\n" not in text, path
