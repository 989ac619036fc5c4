"""pytest's hooks and the suite's autouse fixtures; the shared code the test modules import
is in `tests/helpers/`.

Hypothesis: the `ci` profile (the default) is derandomized, so every run of the suite draws
the same examples, and prints the blob that replays a failure; set
`HYPOTHESIS_PROFILE=explore` to draw new random examples locally (more of them).

Lanes: each test module declares its lane (`pytestmark = pytest.mark.fast` or
`pytest.mark.tunix`, tests/helpers/lanes.py); `pytest -m fast` does not even import the
modules that declare no `fast` test.
"""

from __future__ import annotations

import gc
import json
import os
import pathlib
import sys

import pytest
from hypothesis import HealthCheck, settings

from tests.helpers import compile_settings
from tests.helpers.lanes import declares
from tests.helpers.scheduling import by_file_longest_first

# How the suite compiles (the persistent cache, XLA:CPU's flags): set before jax is imported,
# inherited by every subprocess the tests start (tests/helpers/compile_settings.py)
os.environ.update(compile_settings.settings(os.environ))
JAX_CACHE = compile_settings.JAX_CACHE

# The subprocesses the tests start (`tunix-ppo-ext` commands, scripts) run without torch, as
# a user's install does: torch is the `[dev]` extra's, for the tests' own cross-checks with
# transformers. With it installed, importing tunix imports it (tunix's metrics logger ->
# metrax -> tensorboardX, which imports torch when it can): 1.5-3.5 CPU-s in every one of
# the suite's ~90 subprocesses. A `sitecustomize` on PYTHONPATH makes `import torch` raise
# ImportError there; the test processes themselves keep torch (`pytest_configure`).
NO_TORCH_SITE = JAX_CACHE.parent / "subprocess-site"


def pytest_configure(config) -> None:
  """In the processes that run tests (an xdist worker, or pytest without workers), the
  subprocesses they start get `NO_TORCH_SITE` on their PYTHONPATH."""
  if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
    return  # the xdist controller: its workers must keep torch
  NO_TORCH_SITE.mkdir(parents=True, exist_ok=True)
  site = NO_TORCH_SITE / "sitecustomize.py"
  if not site.is_file():
    text = "import sys\n\nsys.modules.setdefault('torch', None)  # import torch: ImportError\n"
    partial = site.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(text)
    partial.replace(site)  # the two workers write it at once
  paths = [str(NO_TORCH_SITE), *filter(None, [os.environ.get("PYTHONPATH")])]
  os.environ["PYTHONPATH"] = os.pathsep.join(paths)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Each test module runs over a frozen heap, and leaves no compiled program loaded.

  tunix collects garbage in full where it builds a cluster or a learner (`gc.collect()` in
  `RLCluster.__init__` and `show_hbm_usage`, and in some passes): a full collection walks
  every object of the xdist worker's heap, which grows with every module it ran (a tenth of
  a worker's samples under py-spy were those collections). The heap a module finds is
  frozen (`gc.freeze`) while its tests run, so those collections walk only what the module
  made; at its end the heap is unfrozen and collected once.

  After each test module JAX's in-memory caches are cleared, which unloads the compiled
  programs the module left loaded. Each loaded XLA:CPU program holds about six memory
  mappings; an xdist worker that kept the whole suite's (about 10,000) passed the kernel's
  65,530 (`vm.max_map_count`) and died loading the next one from the persistent cache (a
  segfault or abort in `compilation_cache.get_executable_and_time`, in all three full runs
  on 2026-12-04). A later module reloads what it needs from that cache."""
  gc.freeze()
  yield
  gc.unfreeze()
  if "jax" in sys.modules:
    sys.modules["jax"].clear_caches()
  gc.collect()


@pytest.fixture(autouse=True)
def _frozen_heap_per_test():
  """Each test starts over a frozen heap too: tunix's full collections during a test walk
  only what the test made, not what the module's earlier tests left (their clusters and
  traced programs). Timed by `gc.callbacks` on `test_learner.py` + `test_shared_prompts.py`
  in one process: 26.3 s in collections with the module's freeze alone, 5.6 s with this
  (peak memory 2.3 -> 2.9 GB: the module's garbage waits for its end). The module's end
  unfreezes and collects it all (above)."""
  gc.freeze()


settings.register_profile(
  "ci",
  derandomize=True,
  print_blob=True,
  deadline=None,
  database=None,
  suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_ignore_collect(collection_path: pathlib.Path, config) -> bool | None:
  """With `-m fast`, the test files that declare no `fast` test are not even imported."""
  fast_lane = config.getoption("markexpr", "") == "fast"
  if fast_lane and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
    return None if declares(collection_path.resolve(), "fast") else True
  return None


def pytest_addoption(parser) -> None:
  parser.addoption(
    "--shuffle-seed",
    type=int,
    default=None,
    help="run the collected tests in an order shuffled with this seed (order-dependence hunts)",
  )


# The suite's test seconds (`tests/durations.json`, from a full run's `--durations=N` on the
# 2-core machine; refresh it with `python tests/durations.py LOG`): the test files run
# longest first, so that xdist's workers end together instead of one of them running a long
# file alone at the end (longest first, as a list scheduler would). Each file's tests stay
# together, in their own order: a file's module-scoped fixtures (a trained run, a loaded
# model) are built once, and its compiled programs are released once (above), where a
# test-by-test order rebuilt them at every change of file (354 changes on one worker).
# Data for the order only: no test reads it.
DURATIONS = pathlib.Path(__file__).with_name("durations.json")


def pytest_collection_modifyitems(config, items):
  """The test files run longest first by their tests' seconds in `DURATIONS`, each file's
  tests together in their collected order. With `--shuffle-seed N` the tests run in an
  order shuffled with `N` instead (reproducible)."""
  seed = config.getoption("shuffle_seed")
  if seed is not None:
    import random

    random.Random(seed).shuffle(items)
    return
  items[:] = by_file_longest_first(items, json.loads(DURATIONS.read_text()))
