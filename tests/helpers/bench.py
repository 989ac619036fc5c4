"""The bench scripts (`bench/<name>.py`) loaded as modules."""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  pass


def load_bench(name: str) -> Any:
  """`bench/<name>.py` as a module (the bench scripts are not a package; their shared
  `bench/_timing.py` is imported as the scripts run do: from their own folder)."""
  path = pathlib.Path(__file__).resolve().parents[2] / "bench" / f"{name}.py"
  if str(path.parent) not in sys.path:
    sys.path.append(str(path.parent))
  spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
