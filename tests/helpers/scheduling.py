"""The order the suite runs its test files in (longest first, by `tests/durations.json`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
  pass


def by_file_longest_first(items: list, seconds: dict[str, float]) -> list:
  """`items` grouped by file, the files longest first (the sum of their tests' `seconds`,
  by node id; a test not there counts 0), each file's tests in their given order."""
  files: dict[str, list] = {}
  for item in items:
    files.setdefault(item.nodeid.split("::")[0], []).append(item)
  total = {name: sum(seconds.get(i.nodeid, 0.0) for i in tests) for name, tests in files.items()}
  return [i for name in sorted(files, key=lambda name: -total[name]) for i in files[name]]
