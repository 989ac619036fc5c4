"""The docs' "Coming from tunix's PPOLearner" program runs as written, and bad data gets one
clear line."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def readme_program() -> str:
  """The program the docs page includes (`literalinclude` of the example file)."""
  page = (REPO / "docs" / "getting_started" / "from_tunix.md").read_text()
  assert "```{literalinclude} ../../examples/python_api.py" in page
  return (REPO / "examples" / "python_api.py").read_text()


# each test runs a Python program that trains (not the fast lane)
pytestmark = [pytest.mark.tunix, pytest.mark.slow]


def run(code: str, tmp_path: pathlib.Path) -> subprocess.CompletedProcess:
  """`code` as a user's program in `tmp_path`, importing this checkout's package."""
  script = tmp_path / "program.py"
  script.write_text(code)
  path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
  return subprocess.run(
    [sys.executable, str(script)],
    capture_output=True,
    text=True,
    timeout=600,
    cwd=tmp_path,
    env={**os.environ, "PYTHONPATH": path},
  )


def test_readme_program_is_the_example_and_trains(tmp_path):
  program = readme_program()
  example = (REPO / "examples" / "python_api.py").read_text()
  assert program.strip() in example  # the docs show the example file, verbatim
  done = run(program, tmp_path)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "trained steps: 3" in done.stdout
  assert "apply_if_finite" not in done.stderr  # the example's optimizers are guarded
  # tunix's TPU notices, which a CPU user takes for errors (the mesh of CPUs drops them)
  assert "Skipping non-TPU device" not in done.stderr, done.stderr[-3000:]
  assert "Resharding model from None" not in done.stderr, done.stderr[-3000:]


def test_a_python_list_of_prompts_is_refused_with_the_expected_format(tmp_path):
  program = readme_program().replace('np.array(["say a:", "say b:"])', '["say a:", "say b:"]')
  assert '["say a:", "say b:"]}' in program
  done = run(program, tmp_path)
  assert done.returncode != 0
  last = done.stderr.strip().splitlines()[-1]
  assert "ValueError: training input 'prompts' row 0 is a ndarray" in last
  assert "np.array(['...', '...'])" in last
