"""How the suite spends its time: the order file read from a `--durations` table
(`tests/durations.py`), the order it gives, and the subprocesses started without torch."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tunix

LOG = """\
tests/a.py ....                                                    [100%]
============================= slowest 4 durations ==============================
12.50s call     tests/run/test_x.py::test_slow[a-b]
3.00s setup    tests/run/test_x.py::test_fast
2.25s call     tests/run/test_x.py::test_fast
20.00s call     tests/tunix/test_y.py::test_slowest
0.10s teardown tests/run/test_x.py::test_slow[a-b]
=========================== short test summary info ============================
9.00s call     tests/not/in_the_table.py::test_z
"""


def _durations():
  path = pathlib.Path(__file__).with_name("durations.py")
  spec = importlib.util.spec_from_file_location("durations_script", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.durations


def test_phases_of_a_test_are_summed_and_the_longest_comes_first():
  found = _durations()(LOG)
  assert list(found) == [
    "tests/tunix/test_y.py::test_slowest",
    "tests/run/test_x.py::test_slow[a-b]",
    "tests/run/test_x.py::test_fast",
  ]
  assert found["tests/run/test_x.py::test_slow[a-b]"] == 12.6  # call and teardown
  assert found["tests/run/test_x.py::test_fast"] == 5.2  # setup and call (5.25, rounded)


def test_each_test_keeps_its_longest_of_the_lanes_tables():
  """`.ci/run` prints a table per pytest run: a test skipped in lane 1 (tunix 0.1.7) is
  ordered by its lane-2 seconds; tunix's own swapped-in tests are not the suite's."""
  lane2 = LOG.replace(
    "20.00s call     tests/tunix/test_y.py", "30.00s call     tests/tunix/test_y.py"
  )
  lane2 = lane2.replace("12.50s call", "1.00s call")
  upstream = "== slowest 1 durations ==\n5.00s call     build/ci/ppo_learner_test.py::T::t\n"
  found = _durations()(LOG + lane2 + upstream)
  assert found["tests/tunix/test_y.py::test_slowest"] == 30.0
  assert found["tests/run/test_x.py::test_slow[a-b]"] == 12.6  # lane 1's, the longer
  assert list(found)[0] == "tests/tunix/test_y.py::test_slowest"
  assert not any(test.startswith("build/") for test in found)


def test_a_log_without_the_table_gives_nothing():
  assert _durations()("1 passed in 0.1s\n") == {}


def test_the_suite_runs_file_by_file_longest_file_first():
  """conftest's order: each file's tests together, in their order; files by their summed
  seconds, longest first (a test without seconds counts 0)."""
  from types import SimpleNamespace

  from tests.helpers.scheduling import by_file_longest_first

  ids = ["a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "b.py::t2"]
  seconds = {"a.py::t1": 1.0, "a.py::t2": 1.5, "b.py::t2": 3.0, "c.py::t1": 0.5}
  items = [SimpleNamespace(nodeid=i) for i in ids]
  ordered = [i.nodeid for i in by_file_longest_first(items, seconds)]
  assert ordered == ["b.py::t1", "b.py::t2", "a.py::t1", "a.py::t2", "c.py::t1"]


def test_the_tests_subprocesses_run_without_torch_and_the_tests_with_it():
  """`conftest.NO_TORCH_SITE`: a subprocess cannot import torch (importing tunix would),
  the test's own process can (the cross-checks with transformers need it)."""
  import torch

  assert torch.zeros(2).sum().item() == 0.0
  code = "import sys, tensorboardX; print(sys.modules['torch'])"  # tensorboardX tried it
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert done.stdout.strip() == "None"
  done = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True)
  assert done.returncode != 0 and "import of torch halted" in done.stderr
