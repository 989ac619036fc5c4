"""`train`'s persistent XLA compilation cache (`_src/run/compile_cache.py`): on by default
in the package's cache directory, the user's own JAX settings kept."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from tunix_ppo_ext._src.run import cli, compile_cache, job

pytestmark = pytest.mark.tunix

# In a fresh interpreter (JAX reads its cache settings from the environment once):
# `use_compile_cache()`, then one compilation; prints what JAX was left with.
PROBE = """
import json, jax
from tunix_ppo_ext._src.run.compile_cache import use_compile_cache
directory, why = use_compile_cache()
jax.jit(lambda x: x * 3 + 1)(jax.numpy.arange(4.0)).block_until_ready()
print(json.dumps({"directory": directory and str(directory), "why": why,
                  "jax_dir": jax.config.jax_compilation_cache_dir,
                  "max_size": jax.config.jax_compilation_cache_max_size,
                  "min_s": jax.config.jax_persistent_cache_min_compile_time_secs}))
"""


def _probe(tmp_path: pathlib.Path, **env: str) -> dict:
  """What `PROBE` printed, and its stderr under `"stderr"`."""
  ours = ("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE")  # the suite's own cache settings
  environ = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
  environ |= {
    "TUNIX_PPO_EXT_CACHE": str(tmp_path / "root"),
    "JAX_PLATFORMS": "cpu",
    **env,
  }
  done = subprocess.run(
    [sys.executable, "-c", PROBE], env=environ, capture_output=True, text=True, check=False
  )
  assert done.returncode == 0, done.stderr[-2000:]
  return json.loads(done.stdout.strip().splitlines()[-1]) | {"stderr": done.stderr}


def test_by_default_compiled_programs_go_to_the_package_cache_directory(tmp_path):
  result = _probe(tmp_path)  # JAX's defaults otherwise (it caches from 1 s of compiling)
  directory = tmp_path / "root" / "xla"
  assert result | {"stderr": ""} == {
    "directory": str(directory),
    "why": "",
    "jax_dir": str(directory),
    "max_size": compile_cache.MAX_BYTES,
    "min_s": 0.0,  # even this tiny program
    "stderr": "",
  }
  assert [p for p in directory.iterdir() if p.name.endswith("-cache")]  # the program


def test_a_directory_the_user_chose_is_kept_with_jax_s_own_settings(tmp_path):
  own = tmp_path / "own"
  result = _probe(
    tmp_path, JAX_COMPILATION_CACHE_DIR=str(own), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="2"
  )
  assert result | {"stderr": ""} == {
    "directory": str(own),
    "why": "",
    "jax_dir": str(own),
    "max_size": -1,
    "min_s": 2.0,  # theirs: the tiny program is not worth caching
    "stderr": "",
  }
  assert not (tmp_path / "root").exists()


def test_a_cache_the_user_turned_off_stays_off(tmp_path):
  result = _probe(tmp_path, JAX_ENABLE_COMPILATION_CACHE="false")
  assert result["directory"] is None and not result["jax_dir"] and not result["why"]
  assert not (tmp_path / "root").exists()


def test_a_cache_directory_that_cannot_be_made_turns_the_cache_off_with_the_reason(tmp_path):
  (tmp_path / "file").write_text("")  # TUNIX_PPO_EXT_CACHE names a file, not a directory
  result = _probe(tmp_path, TUNIX_PPO_EXT_CACHE=str(tmp_path / "file"))
  assert result["directory"] is None
  assert result["why"].startswith(f"cannot create {tmp_path / 'file' / 'xla'} (")
  assert "compilation cache" not in result["stderr"]  # JAX would warn for every program


def test_train_turns_the_cache_on_before_it_builds_and_names_the_directory(
  tmp_path, monkeypatch, capsys
):
  built = []

  def stop_before_building(resolved, meshes):  # the models and the run are not under test
    built.append(jax.config.jax_compilation_cache_dir)
    raise KeyboardInterrupt

  monkeypatch.setattr(job, "train", stop_before_building)
  # --debug: no process-wide quieting of absl and sys.unraisablehook in this test worker
  code = cli.main(["train", "--debug", "--output-dir", str(tmp_path / "run"), "wandb=disabled"])
  assert code == cli.EXIT_INTERRUPTED
  # this suite's own cache (tests/conftest.py sets JAX_COMPILATION_CACHE_DIR): kept as set
  assert built == [os.environ["JAX_COMPILATION_CACHE_DIR"]]
  assert f"kept in {built[0]} for the next run" in capsys.readouterr().err


def test_a_truncated_entry_a_killed_run_left_is_compiled_again(tmp_path):
  """JAX warns and compiles; it never rewrites the entry (deleting `xla/` clears it)."""
  _probe(tmp_path)
  entries = [p for p in (tmp_path / "root" / "xla").iterdir() if p.name.endswith("-cache")]
  for entry in entries:  # as a run killed while writing it would leave it
    entry.write_bytes(entry.read_bytes()[:100])
  assert _probe(tmp_path)["directory"] == str(tmp_path / "root" / "xla")  # compiled, ran


def test_a_directory_of_the_user_s_that_cannot_be_used_is_said_not_kept(tmp_path):
  """`JAX_COMPILATION_CACHE_DIR` naming a file (or a path through one) was announced as
  "kept in ... for the next run", and JAX warned at the first program."""
  (tmp_path / "file").write_text("")
  for own in (tmp_path / "file", tmp_path / "file" / "sub"):
    result = _probe(tmp_path, JAX_COMPILATION_CACHE_DIR=str(own))
    assert result["directory"] is None and not result["jax_dir"]
    assert result["why"].startswith(f"JAX_COMPILATION_CACHE_DIR={str(own)!r} cannot be used ("), (
      result["why"]
    )
    assert "compilation cache" not in result["stderr"], result["stderr"]
  assert not (tmp_path / "root").exists()
