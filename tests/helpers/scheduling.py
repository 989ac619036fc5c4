"""The order the suite runs its test files in (longest first, by `tests/durations.json`),
and how that order is cut between xdist's workers."""

from __future__ import annotations

from typing import Any


def by_file_longest_first(items: list, seconds: dict[str, float]) -> list:
  """`items` grouped by file, the files longest first (the sum of their tests' `seconds`,
  by node id; a test not there counts 0), each file's tests in their given order."""
  files = _files(items)
  total = {name: _seconds(tests, seconds) for name, tests in files.items()}
  return [i for name in sorted(files, key=lambda name: -total[name]) for i in files[name]]


def for_work_stealing(items: list, seconds: dict[str, float], workers: int) -> list:
  """`by_file_longest_first`'s files dealt into one block per worker, the blocks one after
  the other, each block as many tests as xdist's `worksteal` scheduler first sends that
  worker (`worker_blocks`).

  That scheduler cuts the collection into contiguous blocks by count and lets an idle
  worker steal the back half of another's queue: a long test at the front of a queue stays
  with its worker. Longest first alone put lane 2's three real-model files (about 400 of
  its 700 test-seconds) at the front of the first block, so one worker ran them back to
  back while the other, done, idled (2026-12-07: a 125 s tail at one core). Here each file
  in turn (longest first) goes to the block with the fewest seconds so far that has room,
  what does not fit to the next such block: the long files lead different blocks, and
  stealing evens out the short ones behind them."""
  ordered = by_file_longest_first(items, seconds)
  if workers < 2:
    return ordered
  sizes = worker_blocks(len(ordered), workers)
  blocks: list[list[Any]] = [[] for _ in sizes]
  load = [0.0] * workers
  for tests in _files(ordered).values():
    left = list(tests)
    while left:
      open_blocks = [b for b in range(workers) if len(blocks[b]) < sizes[b]]
      block = min(open_blocks, key=lambda b: (load[b], b))
      placed, left = (
        left[: sizes[block] - len(blocks[block])],
        left[sizes[block] - len(blocks[block]) :],
      )
      blocks[block] += placed
      load[block] += _seconds(placed, seconds)
  return [i for block in blocks for i in block]


def worker_blocks(count: int, workers: int) -> list[int]:
  """How many of `count` tests xdist's `worksteal` scheduler first sends each of `workers`
  idle workers, in order: each the pending tests over the workers left, rounded down."""
  sizes, left = [], count
  for remaining in range(workers, 0, -1):
    sizes.append(left // remaining)
    left -= sizes[-1]
  return sizes


def _files(items: list) -> dict[str, list]:
  files: dict[str, list] = {}
  for item in items:
    files.setdefault(item.nodeid.split("::")[0], []).append(item)
  return files


def _seconds(tests: list, seconds: dict[str, float]) -> float:
  return sum(seconds.get(i.nodeid, 0.0) for i in tests)
