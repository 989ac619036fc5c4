"""The Colab quickstart runs end to end (nbclient, a real kernel) at smoke size on CPU: the toy
run with its curves, and "Your own model" on a tiny random Qwen2 checkpoint with a ChatML
tokenizer written on the spot; one progress bar per run; the install cell's messages."""

from __future__ import annotations

import json
import os
import pathlib
import string
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from tunix_ppo_ext._src.envs.countdown import COUNTDOWN_ALPHABET
from tunix_ppo_ext._src.metrics.sinks import read_jsonl

pytestmark = pytest.mark.tunix

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"
# every character of the ChatML template's text and of countdown_multiturn's observations
CHAT_ALPHABET = "".join(sorted(set(COUNTDOWN_ALPHABET + string.ascii_lowercase + "\n")))
# the stream text (stdout/stderr, progress bars included) of the whole notebook at smoke size;
# its first run alone held 2591 characters with tunix's own actor and critic bars, 908 without
MAX_STREAM_CHARS = 6000


def _own_checkpoint(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
  """`(checkpoint, tokenizer)`: a tiny random Qwen2 whose vocabulary is exactly a ChatML
  character tokenizer's (in its own directory, as `test_chat` explains)."""
  pytest.importorskip("torch")
  from tests.helpers.chat import STYLES, save_chat_tokenizer
  from tests.helpers.hf_fixtures import write_checkpoint

  tokenizer = save_chat_tokenizer(directory / "tokenizer", STYLES["chatml"], alphabet=CHAT_ALPHABET)
  checkpoint = write_checkpoint(
    directory / "ckpt", "qwen2", seed=1, vocab_size=len(tokenizer), max_position_embeddings=128
  )
  return checkpoint, directory / "tokenizer"


def _stream_text(notebook) -> str:
  cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
  return "".join(o.text for cell in cells for o in cell.outputs if o.output_type == "stream")


def test_quickstart_notebook_runs_and_shows_the_curves(tmp_path, monkeypatch):
  out = tmp_path / "quickstart"
  checkpoint, tokenizer = _own_checkpoint(tmp_path)
  monkeypatch.setenv("QUICKSTART_STEPS", "2")
  monkeypatch.setenv("QUICKSTART_OUTPUT_DIR", str(out))
  monkeypatch.setenv("QUICKSTART_CHECKPOINT_DIR", str(checkpoint))
  monkeypatch.setenv("QUICKSTART_TOKENIZER_DIR", str(tokenizer))
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
  # "Your own model": the checkpoint, chat-templated, on countdown_multiturn, token-exact
  own = tmp_path / "own_model"
  config = json.loads((own / "config.json").read_text())
  assert config["model"]["checkpoint"] == str(checkpoint) and config["env"]["chat_template"]
  assert config["env"]["name"] == "countdown_multiturn" and config["model"]["lora"]["rank"] == 16
  memory = json.loads((own / "summary.json").read_text())["memory"]
  assert 0 < memory["actor"]["params"]["trainable"] < memory["actor"]["params"]["total"]
  rows = read_jsonl(own / "metrics.jsonl")
  mismatches = [
    r["rollout/chat_template_mismatch"] for r in rows if "rollout/chat_template_mismatch" in r
  ]
  assert mismatches and not any(mismatches)
  # one progress bar per run: tunix's own trainers' bars are off
  text = _stream_text(notebook)
  assert "Actor Training" not in text and "Critic Training" not in text
  assert text.count("2/2 [") >= 2 and len(text) < MAX_STREAM_CHARS, len(text)


def _run_install_cell(tmp_path: pathlib.Path, source: str | None) -> str:
  """The install cell's output, run by a Python without site-packages (`-S`), where
  tunix-ppo-ext is not importable, from a directory without the checkout."""
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  (cell,) = [c for c in notebook.cells if "install" in c.metadata.get("tags", [])]
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TUNIX_PPO_EXT_SOURCE")}
  env |= {"TUNIX_PPO_EXT_SOURCE": source} if source is not None else {}
  command = [sys.executable, "-S", "-c", cell.source]
  done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
  assert done.returncode == 0, done.stderr
  return done.stdout


def test_install_cell_says_what_to_set_instead_of_failing_on_pypi(tmp_path):
  (line,) = _run_install_cell(tmp_path, None).splitlines()
  assert "not installed and not on PyPI: set TUNIX_PPO_EXT_SOURCE" in line
  missing = str(tmp_path / "missing")
  (line,) = _run_install_cell(tmp_path, missing).splitlines()
  assert line == f"TUNIX_PPO_EXT_SOURCE={missing!r} is neither an existing path nor a Git URL"


def test_notebook_is_published_without_outputs():
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  code = [c for c in notebook.cells if c.cell_type == "code"]
  assert code and all(not c.outputs and c.execution_count is None for c in code)
