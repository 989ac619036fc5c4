"""Refreshes `tests/durations.json` (the order `conftest.py` starts the slowest tests in)
from the `--durations` table of a full run's log:

  python -m pytest -n 2 --durations=120 > run.log; python tests/durations.py run.log

A test's setup, call and teardown seconds are summed; the file lists them longest first.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

ROW = re.compile(r"\s*([\d.]+)s (?:call|setup|teardown)\s+(\S+)")


def durations(log: str) -> dict[str, float]:
  """Seconds per test node id from the log's `slowest N durations` table (its rows, up to
  the first line that is not one), longest first."""
  _, _, table = log.partition(" durations ==")
  seconds: dict[str, float] = {}
  for line in table.splitlines()[1:]:  # the header line's rest, then the rows
    if not (row := ROW.match(line)):
      break
    seconds[row.group(2)] = round(seconds.get(row.group(2), 0.0) + float(row.group(1)), 1)
  return dict(sorted(seconds.items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":
  found = durations(pathlib.Path(sys.argv[1]).read_text())
  if not found:
    sys.exit(f"{sys.argv[1]}: no `slowest N durations` table (run pytest with --durations=N)")
  target = pathlib.Path(__file__).with_name("durations.json")
  target.write_text(json.dumps(found, indent=1) + "\n")
  print(f"{target}: {len(found)} tests")
