"""The Colab quickstart runs end to end (nbclient, a real kernel) at smoke size on CPU."""

from __future__ import annotations

import json
import pathlib

import nbformat
from nbclient import NotebookClient

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_runs_and_shows_the_curves(tmp_path, monkeypatch):
  out = tmp_path / "quickstart"
  monkeypatch.setenv("QUICKSTART_STEPS", "2")
  monkeypatch.setenv("QUICKSTART_OUTPUT_DIR", str(out))
  monkeypatch.setenv("WANDB_MODE", "disabled")
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  client = NotebookClient(
    notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
  )
  client.execute()
  outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  assert any("image/png" in o.get("data", {}) for o in outputs)  # the curves, inline
  summary = json.loads((out / "summary.json").read_text())
  assert summary["steps"] == 1  # 2 updates: one batch, two epochs (ppo.num_iterations=2)
  assert (out / "curves.png").is_file()
  config = json.loads((out / "config.json").read_text())
  assert config["ppo"]["kl_method"] == "low_var_kl" and config["ppo"]["epsilon_c"] == 3.0


def test_notebook_is_published_without_outputs():
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  code = [c for c in notebook.cells if c.cell_type == "code"]
  assert code and all(not c.outputs and c.execution_count is None for c in code)
