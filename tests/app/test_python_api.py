"""The docs' "Coming from tunix's PPOLearner" program runs as written, and bad data gets one
clear line."""

from __future__ import annotations

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


pytestmark = pytest.mark.slow  # each test runs a Python program that trains (not the fast lane)


def run(code: str, tmp_path: pathlib.Path) -> subprocess.CompletedProcess:
  script = tmp_path / "program.py"
  script.write_text(code)
  return subprocess.run(
    [sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path
  )


def test_readme_program_is_the_example_and_trains(tmp_path):
  program = readme_program()
  example = (REPO / "examples" / "python_api.py").read_text()
  assert program.strip() in example  # the docs show the example file, verbatim
  done = run(program, tmp_path)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "trained steps: 3" in done.stdout
  assert "apply_if_finite" not in done.stderr  # the example's optimizers are guarded


def test_a_python_list_of_prompts_is_refused_with_the_expected_format(tmp_path):
  program = readme_program().replace('np.array(["say a:", "say b:"])', '["say a:", "say b:"]')
  assert '["say a:", "say b:"]}' in program
  done = run(program, tmp_path)
  assert done.returncode != 0
  last = done.stderr.strip().splitlines()[-1]
  assert "ValueError: training input 'prompts' row 0 is a ndarray" in last
  assert "np.array(['...', '...'])" in last
