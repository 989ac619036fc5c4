"""Refreshes `tests/durations.json` (the order `conftest.py` starts the slowest tests in)
from the `--durations` tables of a full run's log:

  PYTEST_ADDOPTS=--durations=0 bash .ci/run > ci.log; python tests/durations.py ci.log

A test's setup, call and teardown seconds are summed. With several tables (`.ci/run`
prints one per pytest run: lane 1 on tunix 0.1.7, lane 2 on tunix main), a test keeps its
longest, so a test that runs only in lane 2 (skipped in lane 1) is ordered by its lane-2
seconds. Only the suite's own tests (`tests/...`) are kept; the file lists them longest
first.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

ROW = re.compile(r"\s*([\d.]+)s (?:call|setup|teardown)\s+(\S+)")


def _table(rows: str) -> dict[str, float]:
  """Seconds per test node id of one table's rows (up to the first line that is not one)."""
  seconds: dict[str, float] = {}
  for line in rows.splitlines()[1:]:  # the header line's rest, then the rows
    if not (row := ROW.match(line)):
      break
    seconds[row.group(2)] = round(seconds.get(row.group(2), 0.0) + float(row.group(1)), 1)
  return seconds


def durations(log: str) -> dict[str, float]:
  """Seconds per test node id of the suite (`tests/...`) from the log's `slowest N
  durations` tables, each test's longest of them, longest first."""
  seconds: dict[str, float] = {}
  for rows in log.split(" durations ==")[1:]:
    for test, value in _table(rows).items():
      if test.startswith("tests/"):
        seconds[test] = max(value, seconds.get(test, 0.0))
  return dict(sorted(seconds.items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":
  found = durations(pathlib.Path(sys.argv[1]).read_text())
  if not found:
    sys.exit(f"{sys.argv[1]}: no `slowest N durations` table (run pytest with --durations=N)")
  target = pathlib.Path(__file__).with_name("durations.json")
  target.write_text(json.dumps(found, indent=1) + "\n")
  print(f"{target}: {len(found)} tests")
