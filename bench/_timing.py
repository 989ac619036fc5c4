"""Shared timing helper of the benchmark scripts."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any


def timed(batches: Iterable[Any], stamps: list[float]) -> Iterator[Any]:
  """Yields `batches`, appending `time.perf_counter()` each time tunix draws one."""
  for batch in batches:
    stamps.append(time.perf_counter())
    yield batch
