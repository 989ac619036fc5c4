"""Nothing lost, nothing cryptic: kills at awkward moments, reruns with other configs, locks.

Each kill test runs `tunix-ppo-ext train` in a subprocess, SIGKILLs it at the moment named,
reruns the same command (in the test's process: only the kill needs a process of its own) and
checks that every step's `train/`, `actor/` and `critic/`
rows are in `metrics.jsonl` and `summary.json` counts every step.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import pathlib
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
import types
import warnings

import jax
import optax
import pytest

from tests.helpers.runs import (
  SMOKE,
  common_checkpoints,
  run_lock_holder,
  smoke_args,
  subprocess_env,
  train_command,
)
from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.metrics import sinks
from tunix_ppo_ext._src.metrics.sinks import read_jsonl
from tunix_ppo_ext._src.run import cli, run_dir
from tunix_ppo_ext._src.run.run_config import config_dict, load_run_config

pytestmark = pytest.mark.tunix

STEPS = 6


class SafetensorError(Exception):
  """What safetensors raises for a write the disk refuses (not an OSError)."""


EVERY = 2  # checkpoint and evaluation at the same steps (as the default config does)


def run_overrides(steps: int) -> tuple[str, ...]:
  """A run of `steps` steps, checkpointed and evaluated every `EVERY`."""
  return (f"train.steps={steps}", f"train.checkpoint_every={EVERY}", f"train.eval_every={EVERY}")


OVERRIDES = run_overrides(STEPS)
SECTIONS = ("train/", "actor/", "critic/")


def kill_when(out: pathlib.Path, env: dict[str, str], ready, log: pathlib.Path) -> None:
  """Starts the run; SIGKILLs it as soon as `ready()` holds (polled every 20 ms)."""
  with log.open("w") as stderr:
    process = subprocess.Popen(
      train_command(out, *OVERRIDES), env=env, stdout=stderr, stderr=stderr
    )
  deadline = time.monotonic() + 600
  try:
    while not ready():
      assert process.poll() is None, f"run ended before the kill:\n{log.read_text()[-3000:]}"
      assert time.monotonic() < deadline, "the moment never came"
      time.sleep(0.02)
  finally:
    process.send_signal(signal.SIGKILL)
    process.wait()


def rerun_and_check(out: pathlib.Path, steps: int = STEPS) -> None:
  """The same command again (`steps` steps), in this process (what it checks needs no
  process of its own: the kill was the subprocess's), then every step's rows and the
  summary."""
  assert cli.main(smoke_args(out, *run_overrides(steps))) == 0
  rows = {row["step"]: row for row in read_jsonl(out / "metrics.jsonl")}
  for step in range(1, steps + 1):
    for section in SECTIONS:
      assert any(k.startswith(section) for k in rows.get(step, {})), (step, section)
  assert json.loads((out / "summary.json").read_text())["steps"] == steps


def test_kill_right_after_a_checkpoint_that_coincides_with_an_evaluation(tmp_path):
  out, env = tmp_path / "run", subprocess_env(tmp_path)
  kill_when(out, env, lambda: EVERY in common_checkpoints(out), tmp_path / "killed.log")
  rows = {row["step"]: row for row in read_jsonl(out / "metrics.jsonl")}
  for section in SECTIONS:  # on disk before the checkpoint: nothing to lose
    assert any(k.startswith(section) for k in rows.get(EVERY, {})), section
  rerun_and_check(out)
  # the killed part's wall time counts (until its last metric), beside the rerun's
  summary = json.loads((out / "summary.json").read_text())
  killed, rerun = summary["parts"]
  assert killed["from_step"] == 0 and killed["wall_s"] > 0 and summary["resumes"] == [EVERY]
  assert summary["wall_s"] == pytest.approx(killed["wall_s"] + rerun["wall_s"], abs=0.11)


def test_kill_after_the_final_checkpoint(tmp_path):
  out, env = tmp_path / "run", subprocess_env(tmp_path)
  kill_when(out, env, lambda: STEPS in common_checkpoints(out), tmp_path / "killed.log")
  rerun_and_check(out)


def test_a_kill_during_a_rewrite_leaves_the_old_file(tmp_path, monkeypatch):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1, "a": 1.0}\n{"step": 1, "b": 2.0}\n')
  before = path.read_text()

  def killed(*_):
    raise KeyboardInterrupt  # the process dies between writing and renaming

  monkeypatch.setattr(os, "replace", killed)
  with pytest.raises(KeyboardInterrupt):
    sinks.compact_jsonl(path)
  assert path.read_text() == before
  monkeypatch.undo()
  assert sinks.compact_jsonl(path) == 1 and read_jsonl(path) == [{"step": 1, "a": 1.0, "b": 2.0}]


def test_a_write_through_a_link_replaces_the_file_it_points_to(tmp_path):
  """`plan --json LINK` replaced the link with a regular file, the target keeping its old
  content."""
  (tmp_path / "real").mkdir()
  target = tmp_path / "real" / "plan.json"
  target.write_text("old")
  absolute, relative, chained = tmp_path / "a.json", tmp_path / "r.json", tmp_path / "c.json"
  absolute.symlink_to(target)
  relative.symlink_to(pathlib.Path("real") / "plan.json")
  chained.symlink_to("a.json")
  for number, link in enumerate((absolute, relative, chained)):
    sinks.write_atomically(link, f"new {number}")
    assert link.is_symlink() and target.read_text() == f"new {number}"
  assert [p.name for p in (tmp_path / "real").iterdir()] == ["plan.json"]  # no temporary
  dangling = tmp_path / "d.json"
  dangling.symlink_to(tmp_path / "real" / "later.json")
  sinks.write_atomically(dangling, "created")
  assert dangling.is_symlink() and (tmp_path / "real" / "later.json").read_text() == "created"


def test_a_fifo_is_written_directly_not_replaced(tmp_path):
  """A FIFO (as a character device such as `/dev/null`) was replaced by a regular file:
  nothing reached the reader."""
  fifo = tmp_path / "plan.json"
  os.mkfifo(fifo)
  reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
  try:
    sinks.write_atomically(fifo, '{"figures": 1}')
    assert reader.communicate(timeout=30)[0] == '{"figures": 1}'
  finally:
    reader.kill()
    reader.wait()
  assert stat.S_ISFIFO(fifo.lstat().st_mode) and sorted(os.listdir(tmp_path)) == ["plan.json"]


def test_a_link_to_stdout_appends_to_what_the_command_printed(tmp_path):
  """`--json /dev/stdout` wrote a regular file in place of the link and nothing reached
  stdout; redirected to a file, stdout keeps the lines printed before the JSON. A link in
  `tmp_path` to `/dev/stdout` stands for it (the old code replaced the link it was given)."""
  link = tmp_path / "stdout.json"
  link.symlink_to("/dev/stdout")
  script = (
    "import sys; from tunix_ppo_ext._src.metrics import sinks; print('table', flush=True); "
    "sinks.write_atomically(sys.argv[1], '{}')"
  )
  for redirect in ("pipe", "file"):
    captured = tmp_path / "captured.txt"
    with captured.open("w") as file:
      stdout = subprocess.PIPE if redirect == "pipe" else file
      done = subprocess.run(
        [sys.executable, "-c", script, str(link)], stdout=stdout, text=True, check=True
      )
    written = done.stdout if redirect == "pipe" else captured.read_text()
    assert written == "table\n{}", redirect
    assert link.is_symlink() and os.readlink(link) == "/dev/stdout"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> pathlib.Path:
  """A finished two-step smoke run (in this process)."""
  out = tmp_path_factory.mktemp("finished") / "run"
  smoke = str(pathlib.Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")
  assert cli.main(["train", "--config", smoke, "--output-dir", str(out), "train.steps=2"]) == 0
  return out


def test_a_rerun_with_another_model_is_refused_before_anything_is_overwritten(finished, capsys):
  saved = (finished / "config.json").read_text()
  code = cli.main(smoke_args(finished, "train.steps=2", "model.embed_dim=48"))
  assert code == cli.EXIT_BAD_INPUT
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert "holds checkpoints of another run (model.embed_dim: 32 -> 48)" in err
  assert (finished / "config.json").read_text() == saved


def test_a_lora_run_saved_with_its_given_lora_keys_resumes_and_a_changed_key_is_refused(tmp_path):
  # `config.json` holds the `model.lora` keys that differ from the defaults (as before
  # `model.lora` became a section), so an earlier run resumes; a change is still refused
  optimizers = (optax.adam(1e-3), optax.adam(1e-3))
  requested = config_dict(load_run_config(None, ["model.lora={rank: 4}"]))
  assert requested["model"]["lora"] == {"rank": 4}
  _saved_run(tmp_path, requested)
  assert run_dir.rerun_changes(tmp_path, {"train": {"steps": 4}, **requested}, 4, optimizers) == {}
  other = config_dict(load_run_config(None, ["model.lora={rank: 4, alpha: 8}"]))
  with pytest.raises(ConfigError, match=r"model.lora.alpha: 16.0 -> 8.0"):
    run_dir.rerun_changes(tmp_path, {"train": {"steps": 4}, **other}, 4, optimizers)


def test_a_lora_run_saved_with_keys_at_their_defaults_resumes(tmp_path):
  # `configs/smollm2.yaml` gives `lora: {rank: 8, alpha: 16}`, the defaults: a run saved
  # before 2026-12-07 holds them, the rerun's `config.json` omits them; at 2026-12-07's
  # first change the rerun was refused ("model.lora.alpha: 16 -> None")
  optimizers = (optax.adam(1e-3), optax.adam(1e-3))
  requested = config_dict(load_run_config(None, ["model.lora={rank: 8, alpha: 16}"]))
  assert requested["model"]["lora"] == {}
  saved = {**requested, "model": {**requested["model"], "lora": {"rank": 8, "alpha": 16}}}
  _saved_run(tmp_path, saved)
  assert run_dir.rerun_changes(tmp_path, {"train": {"steps": 4}, **requested}, 4, optimizers) == {}


@pytest.mark.parametrize(
  "override, listed",
  [
    ("envs=[{name: memory, groups: 8}]", "envs: [] -> [{'name': 'memory'"),
    ("validation.envs=[{name: memory, groups: 8}]", "validation.envs: [] -> [{'name': 'memory'"),
  ],
)
def test_a_rerun_onto_another_task_is_refused_naming_the_key(finished, capsys, override, listed):
  """It continued on the other environments; only `config_history.jsonl` recorded it."""
  saved = (finished / "config.json").read_text()
  assert cli.main(smoke_args(finished, "train.steps=2", override)) == cli.EXIT_BAD_INPUT
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert f"holds checkpoints of another run ({listed}" in err, err
  assert (finished / "config.json").read_text() == saved


def _saved_run(out: pathlib.Path, config: dict) -> dict:
  """`config` saved as a run's `config.json` (with the steps a rerun needs); returns it."""
  config = {"train": {"steps": 4}, **config}
  (out / run_dir.CONFIG).write_text(json.dumps(config))
  return config


def test_every_key_of_the_task_is_fixed_on_resume(tmp_path):
  optimizers = (optax.adam(1e-3), optax.adam(1e-3))
  entry = {"name": "guess", "kwargs": {"high": 10}, "groups": 2, "tag": None}
  validation = {"env": None, "kwargs": None, "seed": None, "group_size": None, "envs": [entry]}
  saved = _saved_run(tmp_path, {"envs": [entry], "validation": validation})
  other = {**entry, "kwargs": {"high": 32}}
  for key, requested in [
    ("envs", {**saved, "envs": [other]}),
    ("envs", {**saved, "envs": [entry, {**entry, "tag": "b"}]}),
    ("validation.envs", {**saved, "validation": {**validation, "envs": [other]}}),
    ("validation.env", {**saved, "validation": {**validation, "env": "memory"}}),
    ("validation.kwargs", {**saved, "validation": {**validation, "kwargs": {"high": 5}}}),
  ]:
    with pytest.raises(ConfigError, match=rf"holds checkpoints of another run \({key}: "):
      run_dir.rerun_changes(tmp_path, requested, 4, optimizers)
  changed = {**saved, "validation": {**validation, "seed": 7}}  # the same task: allowed
  assert run_dir.rerun_changes(tmp_path, changed, 4, optimizers) == {"validation.seed": (None, 7)}


def test_a_run_saved_before_a_fixed_key_existed_resumes_with_it_unset(tmp_path):
  optimizers = (optax.adam(1e-3), optax.adam(1e-3))
  saved = _saved_run(tmp_path, {"env": {"name": "memory"}})  # no envs, no validation
  unset = {**saved, "envs": [], "validation": {"env": None, "kwargs": None, "envs": []}}
  assert run_dir.rerun_changes(tmp_path, unset, 4, optimizers) == {
    "envs": (None, []),
    "validation.envs": (None, []),
  }
  with pytest.raises(ConfigError, match=r"\(envs: None -> \[\{'name': 'memory'"):
    run_dir.rerun_changes(tmp_path, {**unset, "envs": [{"name": "memory"}]}, 4, optimizers)


@pytest.mark.parametrize(
  "override, listed",
  [
    ("optim.actor.clip_grad_norm=1.0", "optim.actor.clip_grad_norm: None -> 1.0"),
    ("optim.critic.name=adamw", "optim.critic.name: 'adam' -> 'adamw'"),
    ("batch.gradient_accumulation_steps=2", "batch.gradient_accumulation_steps: None -> 2"),
  ],
)
def test_a_rerun_that_changes_the_optimizer_state_s_structure_is_refused(
  finished, capsys, override, listed
):
  """orbax could not restore such a state: refused before anything is touched, never
  taken for a damaged checkpoint (which would set every checkpoint aside)."""
  saved = (finished / "config.json").read_text()
  assert cli.main(smoke_args(finished, "train.steps=2", override)) == cli.EXIT_BAD_INPUT
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert f"({listed} changes the optimizer state's structure)" in err, err
  assert (finished / "config.json").read_text() == saved
  assert not (finished / "checkpoints" / "damaged").exists()


def test_a_rerun_asking_for_fewer_steps_than_done_is_refused(finished, capsys):
  assert cli.main(smoke_args(finished, "train.steps=1")) == cli.EXIT_BAD_INPUT
  assert "'train.steps'=1 is below the checkpoint" in capsys.readouterr().err


def _tree(out: pathlib.Path) -> dict[str, bytes]:
  return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_directory_that_is_not_a_run_is_refused_untouched(tmp_path, capsys):
  """A Hugging Face checkpoint's directory: `train` exited 0, its `config.json` replaced,
  its `metrics.jsonl` emptied, its `summary.json` overwritten."""
  out = tmp_path / "hf"
  out.mkdir()
  (out / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}')
  (out / "metrics.jsonl").write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.1}\n')
  (out / "summary.json").write_text('{"eval_loss": 2.0}')
  before = _tree(out)
  assert cli.main(smoke_args(out, "train.steps=1")) == cli.EXIT_BAD_INPUT
  (line,) = capsys.readouterr().err.strip().splitlines()
  assert line == (
    f"tunix-ppo-ext: error: output dir {str(out)!r} is not empty and holds no tunix-ppo-ext run "
    "(no run's config.json, no checkpoints; it holds config.json, metrics.jsonl, summary.json): "
    "nothing was written; train into a new or empty directory"
  )
  assert _tree(out) == before and sorted(os.listdir(out)) == sorted(before)


def test_what_counts_as_a_run_directory(tmp_path):
  """Reads only: a missing or empty directory, a killed run's lock and temporary, a run's
  `config.json` or its checkpoints are runs (or none yet); anything else is refused."""
  run_dir.check_output_dir(tmp_path / "missing")
  out = tmp_path / "run"
  out.mkdir()
  run_dir.check_output_dir(out)
  (out / run_dir.LOCK).write_text("12345")
  (out / ".config.json.tmp").write_text("{")  # a kill before the first rename
  (out / "train.log").write_text("")  # a shell's `2> OUT/train.log`, made before the run
  run_dir.check_output_dir(out)
  (out / "notes.txt").write_text("mine")
  with pytest.raises(ConfigError, match=r"holds no tunix-ppo-ext run .*it holds notes.txt\)"):
    run_dir.check_output_dir(out)
  (out / "checkpoints" / "actor").mkdir(parents=True)  # config.json lost: check_rerun says so
  run_dir.check_output_dir(out)
  (out / "checkpoints" / "actor").rmdir()
  (out / run_dir.CONFIG).write_text(json.dumps({"seed": 0, "model": {}, "env": {}, "train": {}}))
  run_dir.check_output_dir(out)
  for other in ('{"seed": 0, "model": {}, "env": "memory", "train": {}}', "[]", "{"):
    (out / run_dir.CONFIG).write_text(other)
    with pytest.raises(ConfigError, match="holds no tunix-ppo-ext run"):
      run_dir.check_output_dir(out)
  assert sorted(os.listdir(out)) == [
    ".config.json.tmp",
    run_dir.LOCK,
    "checkpoints",
    "config.json",
    "notes.txt",
    "train.log",
  ]


def test_a_second_run_on_the_same_directory_is_refused(tmp_path, capsys):
  out = tmp_path / "run"
  out.mkdir()
  with run_lock_holder(out) as holder:
    assert cli.main(smoke_args(out, "train.steps=1")) == cli.EXIT_BAD_INPUT
    assert f"in use by another run (pid {holder.pid})" in capsys.readouterr().err
    os.kill(holder.pid, signal.SIGKILL)  # killed holding it: the kernel releases the lock
    holder.join()
    assert (out / run_dir.LOCK).read_text() == str(holder.pid)
    with run_dir.RunLock(out):
      assert (out / run_dir.LOCK).read_text() == str(os.getpid())
  assert not (out / run_dir.LOCK).exists()


RACERS, TRIALS = 3, 100


def _race(dirs: list[pathlib.Path], index: int, start, tried, took) -> None:
  """One racer: each trial, once every racer is ready, tries to take that trial's lock and
  holds what it took until every racer has tried (so two holders would overlap)."""
  for trial, out in enumerate(dirs):
    lock = run_dir.RunLock(out)
    start.wait()
    try:
      lock.__enter__()
    except ConfigError:
      pass
    else:
      took[trial * RACERS + index] = 1
    tried.wait()
    lock.__exit__(None, None, None)


def test_racing_processes_never_hold_a_run_lock_together(tmp_path):
  """Two processes racing over a stale lock both held it in 44 of 200 trials: one removed
  the other's fresh lock after reading the stale pid, and a lock created but not yet
  written read as stale. Each trial starts from such a file: a dead process's pid, or
  empty."""
  dead = subprocess.Popen(["true"])
  dead.wait()
  dirs = [tmp_path / str(trial) for trial in range(TRIALS)]
  for trial, out in enumerate(dirs):
    out.mkdir()
    (out / run_dir.LOCK).write_text(str(dead.pid) if trial % 2 else "")
  context = multiprocessing.get_context("fork")
  start, tried = context.Barrier(RACERS, timeout=60), context.Barrier(RACERS, timeout=60)
  took = context.Array("i", RACERS * TRIALS)
  racers = [
    context.Process(target=_race, args=(dirs, index, start, tried, took)) for index in range(RACERS)
  ]
  with warnings.catch_warnings():  # the racers run no JAX: JAX's threads are no danger
    warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
    for racer in racers:
      racer.start()
  for racer in racers:
    racer.join(120)
  assert [racer.exitcode for racer in racers] == [0] * RACERS
  holders = [sum(took[trial * RACERS : (trial + 1) * RACERS]) for trial in range(TRIALS)]
  assert holders == [1] * TRIALS
  assert not any((out / run_dir.LOCK).exists() for out in dirs)


def test_allowed_changes_are_applied_and_recorded(finished):
  assert cli.main(smoke_args(finished, "train.steps=3", "train.lr=0.0005")) == 0
  history = [json.loads(line) for line in (finished / run_dir.HISTORY).read_text().splitlines()]
  changed = history[-1]["changed"]
  assert changed["train.lr"]["to"] == 0.0005 and changed["train.steps"] == {"from": 2, "to": 3}
  assert json.loads((finished / "summary.json").read_text())["steps"] == 3


def test_ctrl_c_is_one_line_exit_130_and_the_rerun_resumes(tmp_path):
  # The interrupted run is far longer than the wait for its first checkpoint: orbax may show
  # step EVERY's checkpoint finalized only as the next save starts, and runs of 6 and then
  # 12 steps ended first (exit 0) on a loaded machine (2026-12-06, twice). The rerun asks
  # for fewer steps, two checkpoints past the newest one, as a user may.
  out, env = tmp_path / "run", subprocess_env(tmp_path)
  log = tmp_path / "interrupted.log"
  with log.open("w") as stderr:
    process = subprocess.Popen(
      train_command(out, *run_overrides(1000)),
      env=env,
      stdout=stderr,
      stderr=stderr,
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
  deadline = time.monotonic() + 600
  while EVERY not in common_checkpoints(out):
    assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
    time.sleep(0.02)
  process.send_signal(signal.SIGINT)
  assert process.wait(timeout=600) == cli.EXIT_INTERRUPTED
  text = log.read_text()
  assert "Traceback" not in text and "run the same command to resume" in text
  assert not (out / run_dir.LOCK).exists()
  rerun_and_check(out, max(common_checkpoints(out)) + 2 * EVERY)


# `train` in a process of its own whose first checkpoint manager to close says so and waits
# for a line on stdin first: the test presses Ctrl-C again while the save is held there.
# With a file PRESS present, the main thread presses Ctrl-C itself inside orbax's save:
# as it enters `run_sync` (PRESS holds "save"), or once it has started one of the save's
# threads, before the manager knows of it ("thread").
HELD_CLOSE = """
import os, pathlib, signal, sys, threading
from orbax.checkpoint._src import asyncio_utils
from orbax.checkpoint._src.futures import future
from tunix.sft import checkpoint_manager
from tunix_ppo_ext._src.run import cli

close, held = checkpoint_manager.CheckpointManager.close, []
run_sync, start = asyncio_utils.run_sync, future._SignalingThread.start
press = pathlib.Path(os.environ["PRESS"])


def held_close(self):
  if not held:
    held.append(self)
    print("closing the checkpoint manager", file=sys.stderr, flush=True)
    sys.stdin.readline()
  close(self)


def press_in(where):
  main = threading.current_thread() is threading.main_thread()
  if main and press.exists() and press.read_text() == where:
    press.unlink()
    os.kill(os.getpid(), signal.SIGINT)


def pressing_run_sync(coro):
  press_in("save")
  return run_sync(coro)


def pressing_start(self):
  start(self)
  press_in("thread")


checkpoint_manager.CheckpointManager.close = held_close
asyncio_utils.run_sync = pressing_run_sync
future._SignalingThread.start = pressing_start
sys.argv = ["tunix-ppo-ext", *sys.argv[1:]]
cli.console_main()
"""


def wait_for(ready, process: subprocess.Popen, log: pathlib.Path) -> None:
  """Polls `ready()` every 20 ms while `process` runs (an assertion once it has ended)."""
  deadline = time.monotonic() + 600
  while not ready():
    assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
    time.sleep(0.02)


@pytest.mark.parametrize("where", ["outside", "save", "thread"])
def test_ctrl_c_twice_while_checkpoints_are_written_is_one_line_and_nothing_is_lost(
  tmp_path, where
):
  """Ctrl-C into a run that checkpoints every step ended with orbax's commit threads
  still writing under the interpreter's exit: "cannot schedule new futures after
  interpreter shutdown" tracebacks after the interrupted line (5 runs of 8, 2026-12-07),
  the likely cause of the segmentation faults (exit -11) issue #71 reports; landing inside
  orbax's save, it left an event loop half-built and coroutines never awaited, whose
  complaints followed the line, or a save's thread its manager never knew of. Now the
  saves in flight end (the checkpoint managers closed, then the threads left waited for)
  before the command exits, a second Ctrl-C meanwhile held back, and what the interrupt
  left half-made is freed quietly: one line, exit 130, and the rerun resumes."""
  out, press = tmp_path / "run", tmp_path / "press"
  env = {**subprocess_env(tmp_path), "PRESS": str(press)}
  log = tmp_path / "interrupted.log"
  every = ("train.steps=1000", "train.checkpoint_every=1", "train.eval_every=1")
  with log.open("w") as stderr:
    process = subprocess.Popen(
      [sys.executable, "-c", HELD_CLOSE, *smoke_args(out, *every)],
      env=env,
      stdin=subprocess.PIPE,
      stdout=stderr,
      stderr=stderr,
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
  wait_for(lambda: len(common_checkpoints(out)) >= 2, process, log)  # the next one underway
  if where == "outside":
    process.send_signal(signal.SIGINT)
  else:
    press.write_text(where)  # the next save presses it there
  wait_for(lambda: "closing the checkpoint manager" in log.read_text(), process, log)
  process.send_signal(signal.SIGINT)  # again, while the save is held
  process.stdin.write(b"\n")
  process.stdin.close()
  assert process.wait(timeout=600) == cli.EXIT_INTERRUPTED, log.read_text()[-3000:]
  text = log.read_text()
  errors = [line for line in text.splitlines() if "error" in line.lower()]
  assert len(errors) == 1 and "interrupted" in errors[0], text[-3000:]
  for noise in ("Traceback", "Exception ignored", "ERROR:absl", "also failed", "Warning"):
    assert noise not in text, text[-3000:]
  assert not press.exists() and not (out / run_dir.LOCK).exists()
  rerun_and_check(out, max(common_checkpoints(out)) + 2)


def test_while_saves_end_ctrl_c_is_held_back_once_and_a_second_press_ends_the_wait():
  from tunix_ppo_ext._src.run import job

  before = signal.getsignal(signal.SIGINT)
  with pytest.raises(KeyboardInterrupt), job._deferred_interrupts() as pressed:
    signal.raise_signal(signal.SIGINT)  # held: the saves go on
    assert pressed == [signal.SIGINT]
    signal.raise_signal(signal.SIGINT)  # again: a way out of a wait that never ends
    pytest.fail("the second press did not end the block")
  assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_while_the_command_exits_is_ignored(tmp_path):
  """A second Ctrl-C as the interpreter ran its exit handlers printed jax's `clear_backends`
  traceback ("Exception ignored in atexit callback"): the command is over by then, so the
  console script ignores it. The press comes from an exit handler, as jax's runs."""
  program = (
    "import atexit, os, signal\n"
    "from tunix_ppo_ext._src.run import cli\n"
    "def pressed():\n"
    "  os.kill(os.getpid(), signal.SIGINT)\n"
    "  print('the exit handler ran on', flush=True)\n"
    "atexit.register(pressed)\n"
    "cli._main = lambda argv, own_process: cli.EXIT_INTERRUPTED\n"
    "cli.console_main()\n"
  )
  done = subprocess.run(
    [sys.executable, "-c", program],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=tmp_path,
    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
  )
  assert done.returncode == cli.EXIT_INTERRUPTED
  assert "the exit handler ran on" in done.stdout and "Traceback" not in done.stderr, done.stderr


# A thread left waiting for ever: a plain one; and a thread-pool worker busy for ever, started
# from a daemon thread, so a daemon itself, which the interpreter's exit still joins
# (`concurrent.futures` joins every worker): tunix's agentic loop runs its prompt queue's
# `get` on such a worker, and `tunix-agentic` stopped by Ctrl-C never exited.
WAITING_THREADS = {
  "thread": "threading.Thread(target=threading.Event().wait).start()\n",
  "pool_worker_of_a_daemon": (
    "def start_pool():\n"
    "  pool = concurrent.futures.ThreadPoolExecutor(1)\n"
    "  pool.submit(threading.Event().wait)\n"
    "threading.Thread(target=start_pool, daemon=True).start()\n"
  ),
}


@pytest.mark.parametrize("waiting", WAITING_THREADS)
def test_the_command_exits_after_a_failure_even_with_a_thread_left_waiting(tmp_path, waiting):
  """A worker thread that waits for ever (as one of tunix's or orbax's can after Ctrl-C)
  would hold the interpreter's exit: the console script leaves it after the grace."""
  start = textwrap.indent(WAITING_THREADS[waiting], "  ")
  program = (
    "import concurrent.futures, threading, time\n"
    "from tunix_ppo_ext._src.run import cli\n"
    "cli.EXIT_GRACE_S = 1.0\n"
    "def interrupted_run():\n"
    f"{start}"
    "  time.sleep(0.1)  # the worker has taken its work item\n"
    "  return cli.EXIT_INTERRUPTED\n"
    "cli._main = lambda argv, own_process: interrupted_run()\n"
    "cli.console_main()\n"
  )
  done = subprocess.run([sys.executable, "-c", program], timeout=300, cwd=tmp_path)
  assert done.returncode == cli.EXIT_INTERRUPTED


def test_a_damaged_newest_checkpoint_falls_back_to_the_older_one(tmp_path, capsys):
  out = tmp_path / "run"
  every = ("train.checkpoint_every=2", "train.eval_every=2")
  assert cli.main(smoke_args(out, "train.steps=4", *every)) == 0
  newest = max(common_checkpoints(out))
  assert len(common_checkpoints(out)) >= 2, common_checkpoints(out)  # an older one to use
  for file in (out / "checkpoints" / "actor" / str(newest)).rglob("*"):
    if file.is_file():  # every file of the actor's newest step cut in half
      file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
  assert cli.main(smoke_args(out, "train.steps=6", *every)) == 0
  err = capsys.readouterr().err
  assert f"checkpoint step {newest} cannot be restored" in err
  assert (out / "checkpoints" / "damaged" / "actor" / str(newest)).is_dir()  # kept, aside
  assert json.loads((out / "summary.json").read_text())["steps"] == 6
  steps = [row["step"] for row in read_jsonl(out / "metrics.jsonl")]
  assert steps == sorted(set(steps)) and max(steps) == 6


# ----- plan: the family and dtype the checkpoint says -----


def _checkpoint_config(directory: pathlib.Path, family: str, **keys: object) -> pathlib.Path:
  """A tiny `family` checkpoint's `config.json` (no weights: plan needs none), plus `keys`."""
  from tests.helpers.hf_fixtures import write_config_only

  write_config_only(directory, family)
  hf = {**json.loads((directory / "config.json").read_text()), **keys}
  (directory / "config.json").write_text(json.dumps(hf))
  return directory


def test_plan_builds_the_checkpoint_s_family_in_its_dtype(tmp_path):
  """A Gemma 3 checkpoint is planned as a Gemma 3 (not a Qwen3 of its sizes), its weights in
  the `dtype` transformers >= 4.56 writes (float32 here: 4 bytes a parameter)."""
  from flax import nnx

  from tunix_ppo_ext._src.run import plan
  from tunix_ppo_ext._src.run.run_config import load_run_config
  from tunix_ppo_ext._src.tunix.models import hf_models

  directory = _checkpoint_config(tmp_path, "gemma3", dtype="float32", torch_dtype=None)
  run = load_run_config(str(SMOKE), [f"model.checkpoint={directory}"], need_files=False)
  result = plan.plan(run, "v5e:1x1", ["reference/logps_pass"], "cpu")
  hf = hf_models.read_hf_config(directory)
  gemma = nnx.eval_shape(
    lambda: hf_models.family_of(hf).model_class(hf_models.tunix_config(hf), rngs=nnx.Rngs(0))
  )
  expected = sum(x.size for x in jax.tree.leaves(nnx.state(gemma, nnx.Param)))
  assert "(gemma3, float32 weights)" in result.model_source
  assert result.parameters == expected
  assert result.resident["reference weights"] == 4 * expected


def test_plan_reads_dtype_then_torch_dtype_and_refuses_others(tmp_path):
  from tunix_ppo_ext._src.run import plan

  file = tmp_path / "config.json"
  assert (
    plan.checkpoint_dtype({"dtype": "float32", "torch_dtype": "bfloat16"}, file)[0] == "float32"
  )
  assert plan.checkpoint_dtype({"torch_dtype": "float16"}, file)[0] == "float16"
  assert plan.checkpoint_dtype({}, file)[0] == "bfloat16"
  with pytest.raises(ValueError, match=r"config.json': dtype='int8' is not a weight dtype"):
    plan.checkpoint_dtype({"dtype": "int8"}, file)


def test_plan_refuses_a_topology_with_a_zero_side(capsys):
  assert cli.main(["plan", "--topology", "v5e:0x4"]) == 2
  (line,) = capsys.readouterr().err.splitlines()
  assert "--topology 'v5e:0x4': expected GENERATION:AxB[xC]" in line and "sides >= 1" in line


# ----- export: nothing half-written, a damaged newest checkpoint skipped, a live run refused -----


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory) -> pathlib.Path:
  """A finished smoke run with actor checkpoints at steps 2 and 4 (in this process)."""
  out = tmp_path_factory.mktemp("four") / "run"
  assert cli.main(smoke_args(out, "train.steps=4", "train.checkpoint_every=2")) == 0
  return out


def _export(run: pathlib.Path, out: pathlib.Path, capsys) -> tuple[int, list[str]]:
  code = cli.main(["export", str(run), str(out)])
  return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize(
  "error, code, message",
  [
    (OSError(28, "No space left on device"), 2, "cannot be written (No space left on device)"),
    # safetensors' own error for a full disk (was its traceback)
    (SafetensorError("I/O error: No space left on device (os error 28)"), 2, "(I/O error: No s"),
    (KeyboardInterrupt(), 130, "interrupted; nothing was left in OUT_DIR"),
  ],
)
def test_a_failed_export_leaves_nothing_and_the_retry_works(
  four_steps, tmp_path, monkeypatch, capsys, error, code, message
):
  from tunix_ppo_ext._src.tunix.models import hf_export

  original = hf_export.save_file

  def half_then_fail(tensors, path, metadata=None):
    pathlib.Path(path).write_bytes(b"\0" * 100)  # a truncated model.safetensors
    raise error

  monkeypatch.setattr(hf_export, "save_file", half_then_fail)
  out = tmp_path / "exported"
  exit_code, err = _export(four_steps, out, capsys)
  assert exit_code == code and len(err) == 1 and message in err[0], err
  assert list(tmp_path.iterdir()) == []  # neither OUT_DIR nor a partial sibling
  monkeypatch.setattr(hf_export, "save_file", original)
  assert _export(four_steps, out, capsys)[0] == 0  # the retry is not refused
  assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


def test_export_skips_a_damaged_newest_checkpoint(four_steps, tmp_path, capsys):
  run = tmp_path / "run"
  shutil.copytree(four_steps, run)
  for file in (run / "checkpoints" / "actor" / "4").rglob("*"):
    if file.is_file():  # every file of the actor's newest step cut in half
      file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
  code, err = _export(run, tmp_path / "exported", capsys)
  assert code == 0, err
  assert any("actor checkpoint step 4 cannot be restored" in line for line in err), err
  assert any("exporting step 2 instead" in line for line in err)
  assert (tmp_path / "exported" / "model.safetensors").is_file()
  assert not (run / "checkpoints" / "damaged").exists()  # export only reads the run


def test_export_of_a_run_still_training_is_refused(four_steps, tmp_path, capsys):
  with run_lock_holder(four_steps) as holder:
    code, err = _export(four_steps, tmp_path / "exported", capsys)
  assert code == 2 and len(err) == 1
  assert f"is in use by a running train (pid {holder.pid})" in err[0]
  assert not (tmp_path / "exported").exists()


@pytest.mark.parametrize(
  ("text", "reason"),
  [(None, "it is missing"), ('{"model": {', "JSONDecodeError"), ("[1, 2]", "not a JSON object")],
)
def test_a_rerun_beside_checkpoints_without_a_readable_config_json_is_refused(
  tmp_path, text, reason
):
  """Without it the rerun's settings could not be checked: another model's rerun took the
  checkpoints for damaged ones and set them all aside (missing), or the rerun ended on
  JSONDecodeError's line without the file's name (cut short)."""
  if text is not None:
    (tmp_path / run_dir.CONFIG).write_text(text)
  with pytest.raises(ConfigError, match=rf"its config.json cannot be read \({reason}"):
    run_dir.rerun_changes(tmp_path, {"train": {"steps": 4}}, 4, ())
  assert run_dir.rerun_changes(tmp_path, {"train": {"steps": 4}}, None, ()) == {}  # a new run


@pytest.mark.parametrize("text", ["[1, 2]", '{"from_step": 0}', "null", "[{}, 3]"])
def test_a_parts_json_of_another_shape_is_read_as_none(tmp_path, text):
  """An AttributeError's traceback ('int' object has no attribute 'get') before."""
  (tmp_path / run_dir.SUMMARY).write_text('{"wall_s": 7.5}')
  (tmp_path / run_dir.PARTS).write_text(text)
  assert run_dir.earlier_parts(tmp_path, resuming=True) == [{"from_step": 0, "wall_s": 7.5}]


def test_an_output_dir_that_cannot_be_written_is_one_line_naming_it(tmp_path, monkeypatch):
  """`OSError: [Errno 30] Read-only file system: '.../.lock'` (exit 1) before."""
  (tmp_path / "afile").write_text("x")
  with pytest.raises(ConfigError, match=r"'output_dir' \(--output-dir\) .* cannot be written"):
    run_dir.make_output_dir(tmp_path / "afile" / "run")

  def read_only(path, *args):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

  monkeypatch.setattr(run_dir, "os", types.SimpleNamespace(**{**vars(os), "open": read_only}))
  with pytest.raises(ConfigError, match=r"cannot be written \(read-only file system: .*\.lock\)"):
    run_dir.RunLock(tmp_path).__enter__()
