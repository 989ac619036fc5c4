"""The lanes a test module declares, read from its source (no import): `pytestmark` at the
top of the module, or a mark on each test function.

Every test is in one lane: `fast` (the fast lane, `pytest -m fast`: nothing of tunix in the
test's process or in a run it starts) or `tunix` (the full suite only). `tunix_facing` marks
the tests lane 2 of `.ci/run` also runs on tunix main. `tests/test_layout.py` checks that each
test declares its lane, and that a `fast` one reaches no tunix (`import_graph.reaches_tunix`)
and is not `slow`.
"""

from __future__ import annotations

import ast
import functools
import pathlib

LANES = ("fast", "tunix")


def mark_names(node: ast.expr) -> set[str]:
  """The `X` of every `pytest.mark.X` (or `pytest.mark.X(...)`) in `node`."""
  names = set()
  for sub in ast.walk(node):
    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute):
      base = sub.value
      if base.attr == "mark" and isinstance(base.value, ast.Name) and base.value.id == "pytest":
        names.add(sub.attr)
  return names


@functools.cache
def module_marks(path: pathlib.Path) -> frozenset[str]:
  """The marks of the module-level `pytestmark = ...` of `path` (empty without one)."""
  for node in ast.parse(path.read_text()).body:
    if isinstance(node, ast.Assign) and any(
      isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
    ):
      return frozenset(mark_names(node.value))
  return frozenset()


@functools.cache
def marks_by_test(path: pathlib.Path) -> dict[str, frozenset[str]]:
  """Each top-level `test_*` function of `path`: its own marks, then its module's."""
  own = module_marks(path)
  return {
    node.name: own | {m for d in node.decorator_list for m in mark_names(d)}
    for node in ast.parse(path.read_text()).body
    if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
  }


def declares(path: pathlib.Path, mark: str) -> bool:
  """Whether `path` puts any of its tests in `mark` (its module or one of its tests)."""
  return mark in module_marks(path) or any(mark in m for m in marks_by_test(path).values())
