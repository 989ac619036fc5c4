"""Fault probes (issue #61): features tried with bad values, interrupted runs, read-only
and full disks, and reruns with another config; writes `docs/probes/fault_probes.md`.

  python tools/fault_probes.py [--only ID ...] [--python PY] [--main-python PY]

Every probe runs the command a user would type (`tunix-ppo-ext ...`, a bench script, a
Python line) and records its exit status and the first line of its error (or of its
output), then checks it against what a user should expect: for bad input one error line
naming the culprit (no traceback, exit 2), for a run the files it must leave. `--python`
runs this tree's package with tunix 0.1.7 (default: this interpreter), `--main-python` with
tunix main (the agentic learner's probes; default: `/work/main/.venv-main/bin/python`).
The agentic probes need tunix main, the disk probes `mount` (root): without them those
rows say so. Runs go to `/tmp/fault_probes` (`$P` in the table), emptied first.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
TABLE = REPO / "docs" / "probes" / "fault_probes.md"
P = pathlib.Path(os.environ.get("PROBES_DIR", "/tmp/fault_probes"))
RESULTS = P.with_name(P.name + ".json")  # every probe's last row (`--only` keeps the rest)
SMOKE = "configs/smoke.yaml"
MAIN_PYTHON = "/work/main/.venv-main/bin/python"
# the probes a fix made pass: id -> (the commit, what the probe observed before it)
FIXED: dict[str, tuple[str, str]] = {
  "D10": (
    "9109e74",
    "exit 1: traceback: safetensors_rust.SafetensorError: Error while serializing: I/O er...",
  ),
  "G04": ("94661e8", "exit 0: /dev/full"),
  "B12": ("a96cb66", "exit None: no exit within the time allowed (a hang)"),
  "A22": ("bbb1d89", "exit 0: (no output)"),
  "A23": ("bbb1d89", "exit 0: (no output)"),
  "AC01": ("60f6d52", "exit 1: ValueError: Config $P/agentic/missing.yaml not found."),
  "AC02": ("60f6d52", "exit 1: ParserError: while parsing a flow sequence"),
  "AC03": (
    "60f6d52",
    "exit 1: KeyValidationError: ListConfig indices must be integers or slices, not str",
  ),
  "AC04": (
    "60f6d52",
    "exit 1: OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': ...",
  ),
  "AC08": ("9827d9d", "exit 1: TypeError: 'int' object is not iterable"),
  "AC09": (
    "bbb1d89",
    "exit 1: OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': ...",
  ),
  "AC11": (
    "60f6d52",
    "exit 1: OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': ...",
  ),
  "AC12": (
    "60f6d52",
    "exit 1: OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': ...",
  ),
  "AC13": (
    "60f6d52",
    "exit 1: OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': ...",
  ),
  "AC15": ("60f6d52", "exit 1: IsADirectoryError: [Errno 21] Is a directory: '$P/agentic'"),
  "AC16": (
    "60f6d52",
    "exit 1: ValueError: Key gae_lambda was passed at the command line but isn't in config.",
  ),
  "AC19": (
    "60f6d52",
    "exit 1: ValueError: Key no_such_key was passed at the command line but isn't in con...",
  ),
  "B03": (
    "425571b",
    "exit 1: traceback: tunix_ppo_ext._src.checks.ConfigError: high=0 is invalid: must b...",
  ),
  "B04": (
    "425571b",
    "exit 1: traceback: tunix_ppo_ext._src.checks.ConfigError: high=1 is invalid: must b...",
  ),
  "B05": (
    "425571b",
    "exit 1: traceback: tunix_ppo_ext._src.checks.ConfigError: max_turns=0 is invalid: m...",
  ),
  "B06": (
    "425571b",
    "exit 1: traceback: tunix_ppo_ext._src.checks.ConfigError: turn_penalty=0.5 is inval...",
  ),
  "B07": (
    "425571b",
    "exit 1: traceback: tunix_ppo_ext._src.checks.ConfigError: valid_reward=-1.0 is inva...",
  ),
  "B08": ("425571b", "exit 0: \\| policy \\| critic, lambda 2 \\| grpo, 4 \\| rloo, 4 \\|"),
  "B09": ("425571b", "exit 0: \\| policy \\| critic, lambda nan \\| grpo, 4 \\| rloo, 4 \\|"),
  "B10": ("425571b", "exit None: no exit within the time allowed (a hang)"),
  "C18": ("bbb1d89", "exit 0: tunix-ppo-ext: $P/cfg/C18: 4 updates (4 batches) in 29.3 s"),
  "C19": ("bbb1d89", "exit 0: tunix-ppo-ext: $P/cfg/C19: 4 updates (4 batches) in 17.4 s"),
  "C20": ("bbb1d89", "exit 0: tunix-ppo-ext: $P/cfg/C20: 4 updates (4 batches) in 14.8 s"),
  "C32": (
    "bbb1d89",
    "exit 1: ValueError: environment 'guess', turn 0: observation 'I am thinking of a wh...",
  ),
  "C46": (
    "bbb1d89",
    "exit 2: --topology 'v5e:2x4' has 8 chips but JAX started with 1 CPU devices: set XL...",
  ),
  "D01": ("5040bb4", "exit 1: OSError: [Errno 30] Read-only file system: '$P/mnt/d01/run'"),
  "D02": ("5040bb4", "exit 1: OSError: [Errno 30] Read-only file system: '$P/mnt/d02/.lock'"),
  "D06": ("5040bb4", "exit 1: OSError: [Errno 30] Read-only file system: '$P/mnt/d06/run/.lock'"),
  "D11": ("5040bb4", "exit 1: NotADirectoryError: [Errno 20] Not a directory: '$P/d11/afile/run'"),
  "F13": ("5040bb4", "exit 1: AttributeError: 'int' object has no attribute 'get'"),
  "F14": ("5040bb4", "exit 1: AttributeError: 'str' object has no attribute 'get'"),
  "F15": (
    "5040bb4",
    "exit 1: JSONDecodeError: Expecting property name enclosed in double quotes: line 76...",
  ),
  "F16": (
    "5040bb4",
    "exit 0: tunix-ppo-ext: $P/F16 is already complete (4 updates in 84.5 s; summary.jso...",
  ),
  "F24": ("bbb1d89", "exit 0: tunix-ppo-ext: $P/warmup_all: 4 updates (4 batches) in 96.7 s"),
  "R01": (
    "425571b",
    "exit 1: --baseline-from: no $P/bm/missing/seed0/result.json nor seed 0 in $P/bm/mis...",
  ),
  "R02": (
    "425571b",
    "exit 1: traceback: UnboundLocalError: cannot access local variable 'results' where ...",
  ),
  "R03": ("425571b", "exit None: no exit within the time allowed (a hang)"),
  "R04": (
    "425571b",
    "exit 1: traceback: tunix_ppo_ext._src.checks.ConfigError: --config '$P/bm/missing.y...",
  ),
  "R05": (
    "425571b",
    "exit 1: traceback: tunix_ppo_ext._src.checks.ConfigError: unknown config key 'ppo.g...",
  ),
  "R07": (
    "425571b",
    "exit 1: traceback: json.decoder.JSONDecodeError: Expecting property name enclosed i...",
  ),
  "R08": (
    "425571b",
    "exit 1: traceback: tunix_ppo_ext._src.checks.ConfigError: config key 'train.steps'=...",
  ),
  "R09": (
    "425571b",
    "exit 1: traceback: tunix_ppo_ext._src.checks.ConfigError: config key 'seed'=-1 is i...",
  ),
  "C48": (
    "5e3f197",
    "exit 1: ValueError: environment 'guess', turn 0: observation 'I am thinking of a wh...",
  ),
}
# `python -c` that runs the installed command's entry point from this tree
ENTRY = "import sys; from tunix_ppo_ext.jobs import console_main; sys.argv[0] = 'tunix-ppo-ext'; "
ENTRY += "sys.exit(console_main())"


@dataclasses.dataclass
class Observed:
  code: int | None  # None: it did not end within its time
  out: str
  err: str
  note: str = ""  # what a probe's own check saw (files, summary figures)

  @property
  def traceback(self) -> bool:
    return "Traceback (most recent call last)" in self.err + self.out

  def first_line(self) -> str:
    """The line a user reads: a traceback's last line, else the first error line, else the
    first line of the output."""
    if self.code is None:
      return "no exit within the time allowed (a hang)"
    text = self.err + self.out
    if self.traceback:
      lines = [ln for ln in text.splitlines() if ln.strip()]
      tail = [ln for ln in lines if re.match(r"^\w[\w.]*(Error|Exception|Exit)\b", ln)]
      return "traceback: " + (tail[-1] if tail else lines[-1])
    lines = self.err.splitlines()
    for pattern in (r"\berror:", r"\berror\b|Error\b"):  # an error line before a warning
      for line in lines:
        if re.search(pattern, line):
          return line.strip()
    for line in (self.out + "\n" + self.err).splitlines():
      if line.strip() and not line.startswith(("usage:", "  ")):
        return line.strip()
    return "(no output)"


@dataclasses.dataclass
class Probe:
  id: str
  shown: str  # the input, as a user types it
  expected: str
  run: Callable[[], Observed]
  check: Callable[[Observed], str | None]  # the problem, or None
  needs: str = ""  # "main": tunix main; "mount": a tmpfs mount


PROBES: list[Probe] = []
PYTHON = sys.executable


def probe(id_: str, shown: str, expected: str, run, check, needs: str = "") -> None:
  assert all(p.id != id_ for p in PROBES), id_
  PROBES.append(Probe(id_, shown, expected, run, check, needs))


# ----- running -----


def sh(argv: list[str], timeout: float = 600, env: dict | None = None, **kwargs) -> Observed:
  """Runs `argv` from the repository root; `None` as the code when it outlives `timeout`."""
  # this tree's package first (a bench script's own folder is first on its path)
  environ = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO), **(env or {})}
  try:
    done = subprocess.run(
      argv, cwd=REPO, env=environ, capture_output=True, text=True, timeout=timeout, **kwargs
    )
  except subprocess.TimeoutExpired as err:
    out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
    return Observed(None, out, err.stderr.decode() if isinstance(err.stderr, bytes) else "")
  return Observed(done.returncode, done.stdout, done.stderr)


def cli(*args: str, python: str | None = None, timeout: float = 600, env=None) -> Observed:
  """`tunix-ppo-ext ARGS` of this tree."""
  return sh([python or PYTHON, "-c", ENTRY, *args], timeout=timeout, env=env)


def bench(script: str, *args: str, timeout: float = 120) -> Observed:
  return sh([PYTHON, f"bench/{script}", *args], timeout=timeout)


def pyline(code: str, python: str | None = None, timeout: float = 300) -> Observed:
  """A Python line as a user runs it (its exception printed as Python prints it)."""
  return sh([python or PYTHON, "-c", code], timeout=timeout)


_BATCHES: dict[str, dict[str, Observed]] = {}


def batched(group: str, python_of: Callable[[], str], items: dict[str, str]) -> None:
  """Registers Python snippets run in one process per group (imports shared): each
  snippet's exception as `Type: message`, or what it printed."""
  _BATCH_ITEMS[group] = (python_of, items)


_BATCH_ITEMS: dict[str, tuple[Callable[[], str], dict[str, str]]] = {}


def from_batch(group: str, key: str) -> Callable[[], Observed]:
  def run() -> Observed:
    if group not in _BATCHES:
      python_of, items = _BATCH_ITEMS[group]
      script = WORKER + f"\nrun_all({json.dumps(items)!r})\n"
      done = sh([python_of(), "-c", script], timeout=900)
      results = {}
      for line in done.out.splitlines():
        if line.startswith("@@"):
          row = json.loads(line[2:])
          results[row["id"]] = Observed(row["code"], row["out"], row["err"])
      if not results:
        results = {k: Observed(done.code, done.out, done.err) for k in items}
      _BATCHES[group] = results
    return _BATCHES[group].get(key) or Observed(None, "", "the batch did not run it")

  return run


WORKER = r"""
import contextlib, io, json, sys, traceback
def run_all(items):
  items = json.loads(items)
  for key, code in items.items():
    out, err = io.StringIO(), io.StringIO()
    status = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        exec(compile(code, key, "exec"), {"__name__": "__probe__"})
      except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
      except BaseException as e:
        status = 1
        text = str(e).splitlines()[0] if str(e).strip() else ""
        err.write(f"{type(e).__name__}: {text}\n")
    row = {"id": key, "code": status, "out": out.getvalue(), "err": err.getvalue()}
    print("@@" + json.dumps(row))
"""


# ----- checks -----


def one_line(code: int = 2, *names: str) -> Callable[[Observed], str | None]:
  """Bad input: exit `code`, no traceback, one error line naming every one of `names`."""

  def check(obs: Observed) -> str | None:
    if obs.code is None:
      return "hung"
    if obs.traceback:
      return "a traceback"
    if obs.code != code:
      return f"exit {obs.code}, not {code}"
    errors = [ln for ln in obs.err.splitlines() if re.search(r"error:|Error:", ln)]
    if len(errors) != 1:
      return f"{len(errors)} error lines"
    missing = [n for n in names if n not in errors[0]]
    return f"the line does not name {missing}" if missing else None

  return check


def raises(kind: str, *names: str) -> Callable[[Observed], str | None]:
  """A Python call: `kind` raised, its message naming every one of `names`."""

  def check(obs: Observed) -> str | None:
    line = obs.first_line()
    if not line.startswith(f"{kind}:") and not line.startswith(f"traceback: {kind}:"):
      return f"not {kind}"
    missing = [n for n in names if n not in line]
    return f"does not name {missing}" if missing else None

  return check


def succeeds(*needles: str) -> Callable[[Observed], str | None]:
  """A correct run: exit 0, no traceback, its output holding every one of `needles`."""

  def check(obs: Observed) -> str | None:
    if obs.code != 0 or obs.traceback:
      return f"exit {obs.code}" + (" with a traceback" if obs.traceback else "")
    missing = [n for n in needles if n not in obs.out + obs.err + obs.note]
    return f"missing {missing}" if missing else None

  return check


def both(*checks: Callable[[Observed], str | None]) -> Callable[[Observed], str | None]:
  def check(obs: Observed) -> str | None:
    for one in checks:
      problem = one(obs)
      if problem:
        return problem
    return None

  return check


def noted(expected: str) -> Callable[[Observed], str | None]:
  """The probe's own file check (`Observed.note`) says `expected`."""
  return lambda obs: None if expected in obs.note else f"files: {obs.note}"


# ----- fixtures: runs and disks -----


def tree_digest(root: pathlib.Path) -> dict[str, str]:
  """Every file under `root` with its content's hash (not `.lock`: a killed run's stale
  lock, which the next command takes over and releases, holds no data)."""
  digest = {}
  for path in sorted(root.rglob("*")):
    if path.is_file() and path.name != ".lock":
      digest[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
  return digest


_FINISHED: list[pathlib.Path] = []


def finished() -> pathlib.Path:
  """A finished smoke run (4 steps, checkpoints at 2 and 4), trained once."""
  if not _FINISHED and (P / "base" / "finished" / "summary.json").is_file():
    _FINISHED.append(P / "base" / "finished")
  if not _FINISHED:
    out = P / "base" / "finished"
    obs = cli("train", "--config", SMOKE, "--output-dir", str(out))
    if obs.code != 0:
      raise RuntimeError(f"the base run failed: {obs.first_line()}\n{obs.err[-2000:]}")
    _FINISHED.append(out)
  return _FINISHED[0]


def copy_of_finished(name: str) -> pathlib.Path:
  target = P / name
  shutil.rmtree(target, ignore_errors=True)
  shutil.copytree(finished(), target)
  return target


def mount_tmpfs(path: pathlib.Path, size: str = "4m", readonly: bool = False) -> bool:
  path.mkdir(parents=True, exist_ok=True)
  options = f"size={size}" + (",ro" if readonly else "")
  done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=False)
  return done.returncode == 0


def remount_readonly(path: pathlib.Path) -> bool:
  return subprocess.run(["mount", "-o", "remount,ro", str(path)], check=False).returncode == 0


def unmount_all() -> None:
  mounts = pathlib.Path("/proc/mounts").read_text().splitlines()
  for line in reversed(mounts):
    point = line.split()[1]
    if point.startswith(str(P)):
      subprocess.run(["umount", "-l", point], check=False)


def can_mount() -> bool:
  test = P / ".mount-test"
  ok = mount_tmpfs(test, "1m")
  if ok:
    subprocess.run(["umount", str(test)], check=False)
  return ok


# ----- interrupted runs -----


def interrupted(
  name: str, when: Callable[[pathlib.Path, str], bool], sig: int, *extra: str
) -> tuple[pathlib.Path, Observed]:
  """Starts the smoke run into `$P/name`, sends `sig` once `when(out, stderr so far)` holds,
  and returns the run's directory and what the stopped command printed."""
  out = P / name
  shutil.rmtree(out, ignore_errors=True)
  log = P / f"{name}.log"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
  with log.open("w") as stderr:
    process = subprocess.Popen(
      [PYTHON, "-c", ENTRY, "train", "--config", SMOKE, "--output-dir", str(out), *extra],
      cwd=REPO,
      env=env,
      stdout=subprocess.PIPE,
      stderr=stderr,
      text=True,
    )
  deadline = time.monotonic() + 600
  while process.poll() is None and not when(out, log.read_text()):
    if time.monotonic() > deadline:
      break
    time.sleep(0.01)
  if process.poll() is None:
    process.send_signal(sig)
  try:
    out_text, _ = process.communicate(timeout=120)
    code = process.returncode
  except subprocess.TimeoutExpired:
    process.kill()
    out_text, code = "", None
  return out, Observed(code, out_text, log.read_text())


def metric_steps(out: pathlib.Path) -> list[int]:
  path = out / "metrics.jsonl"
  if not path.is_file():
    return []
  steps = []
  for line in path.read_text().splitlines():
    with contextlib.suppress(ValueError):
      steps.append(json.loads(line)["step"])
  return steps


def summary_of(out: pathlib.Path) -> dict[str, Any]:
  try:
    return json.loads((out / "summary.json").read_text())
  except (OSError, ValueError):
    return {}


def whole_run(out: pathlib.Path, steps: int = 4) -> str:
  """What a resumed run must leave: every step once in metrics.jsonl, the summary's steps
  and updates, its parts' wall times summing to its wall_s."""
  got = metric_steps(out)
  summary = summary_of(out)
  parts = summary.get("parts") or []
  wall = round(sum(p.get("wall_s") or 0 for p in parts), 1)
  ok = (  # step 0: the evaluation before the first update
    set(range(1, steps + 1)) <= set(got) <= set(range(steps + 1))
    and len(got) == len(set(got))
    and summary.get("updates") == steps
    and abs(wall - (summary.get("wall_s") or 0)) <= 0.2
  )
  what = f"metrics steps {sorted(set(got))}{' (repeated)' if len(got) != len(set(got)) else ''}"
  what += f"; summary updates {summary.get('updates')}, resumes {summary.get('resumes')}"
  what += f", wall_s {summary.get('wall_s')} = parts {wall}"
  return ("whole run: " if ok else "NOT whole: ") + what


# ----- the table -----


def show(text: str) -> str:
  text = text.replace(str(P), "$P").replace(str(REPO) + "/", "").replace(str(REPO), ".")
  text = text.replace("`", "'").replace("|", "\\|").replace("\n", " ")
  return text


def render(rows: dict[str, dict[str, str]]) -> str:
  """The page: one row per probe (`rows[id]`: input, expected, observed, verdict)."""
  good = sum(1 for r in rows.values() if r["verdict"] == "ok" or r["verdict"].startswith("fixed"))
  fixed = sum(1 for r in rows.values() if r["verdict"].startswith("fixed"))
  lines = [
    "# Fault probes",
    "",
    "Issue #61's fault probes of these features (tunix main's agentic",
    "learner and its `tunix-agentic` command, the critic studies' keys and bench scripts, a",
    "finished run's rerun, `parts.json`, `plot --out`, `export`) tried with nonsense values,",
    "interrupted runs, read-only and full disks and reruns with another config. Each row is",
    "the command (`$P` a scratch directory), what a user should expect, what was observed",
    "(the exit status and the first line of the error, or of the output; for runs, the files",
    "left) and the verdict: `ok`, or `fixed in <commit>` for a probe that failed before that",
    "commit. `python tools/fault_probes.py` runs every probe again and rewrites this page",
    "(`--only ID ...` reruns some and keeps the other rows).",
    "",
    f"{len(rows)} probes: {good} ok, of which {fixed} after a fix.",
    "",
    "| id | input | expected | observed | verdict |",
    "| --- | --- | --- | --- | --- |",
  ]
  for id_, row in rows.items():
    cells = [id_, f"`{row['input']}`", row["expected"], f"`{row['observed']}`", row["verdict"]]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def row_of(item: Probe, obs: Observed | None, verdict: str) -> dict[str, str]:
  observed = verdict if obs is None else f"exit {obs.code}: {obs.first_line()}"
  if obs is not None and item.id.startswith("A") and item.id[1:].isdigit():  # a Python call
    observed = f"raises {obs.first_line()}" if obs.code else obs.first_line()
  if obs is not None and obs.note:
    observed += f"; {obs.note}"
  return {
    "input": show(item.shown),
    "expected": show(item.expected),
    "observed": show(observed),
    "verdict": show(verdict),
  }


def main() -> None:
  global PYTHON, MAIN_PYTHON
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", nargs="+", metavar="ID", help="run these probes (prefixes)")
  parser.add_argument("--python", default=sys.executable, help="tunix 0.1.7's interpreter")
  parser.add_argument("--main-python", default=MAIN_PYTHON, help="tunix main's interpreter")
  parser.add_argument("--render", action="store_true", help="rewrite the page, run nothing")
  args = parser.parse_args()
  if args.render:
    args.only = ["-"]  # no probe id starts with it: the stored rows only
  PYTHON, MAIN_PYTHON = args.python, args.main_python
  unmount_all()
  if not args.only:
    shutil.rmtree(P, ignore_errors=True)
  P.mkdir(parents=True, exist_ok=True)
  mountable = can_mount()
  has_main = pathlib.Path(MAIN_PYTHON).is_file()
  register()
  chosen = [p for p in PROBES if not args.only or any(p.id.startswith(o) for o in args.only)]
  stored = json.loads(RESULTS.read_text()) if args.only and RESULTS.is_file() else {}
  try:
    for item in chosen:
      start = time.monotonic()
      obs = None
      if item.needs == "main" and not has_main:
        verdict = "not run: no tunix main interpreter"
      elif item.needs == "mount" and not mountable:
        verdict = "not run: mount refused (needs root)"
      else:
        try:
          obs = item.run()
          problem = item.check(obs)
        except Exception as err:
          obs = Observed(None, "", traceback.format_exc())
          problem = f"the probe's set-up failed: {type(err).__name__}: {err}"
        verdict = "ok" if problem is None else f"FAIL: {problem}"
      stored[item.id] = row_of(item, obs, verdict)
      RESULTS.write_text(json.dumps(stored, indent=1))
      line = obs.first_line()[:90] if obs else ""
      print(f"{item.id:6} {time.monotonic() - start:6.1f}s {verdict[:50]:50} {line}", flush=True)
  finally:
    unmount_all()
  rows = {p.id: dict(stored.get(p.id) or row_of(p, None, "not run")) for p in PROBES}
  for id_, row in rows.items():
    if row["verdict"] == "ok" and id_ in FIXED:  # what it was, and the commit that fixed it
      row["verdict"] = f"fixed in {FIXED[id_][0]}; before it: `{FIXED[id_][1]}`"
  TABLE.parent.mkdir(parents=True, exist_ok=True)
  TABLE.write_text(render(rows))
  print(f"{len(rows)} probes -> {TABLE}")


# ----- the probes -----

TRAIN = f"tunix-ppo-ext train --config {SMOKE}"


def cfg_argv(id_: str, *overrides: str) -> list[str]:
  return ["train", "--config", SMOKE, "--output-dir", str(P / "cfg" / id_), *overrides]


def agentic_yaml(path: pathlib.Path, section: dict | None = None, **top: Any) -> pathlib.Path:
  """A tunix pipeline config with `training_mode: agentic_ppo` (tunix's keys; the model is
  never loaded by these probes: each fails, or is meant to fail, before)."""
  import yaml

  model = {
    "model_name": "qwen3-0.6b",
    "model_source": "huggingface",
    "model_id": "Qwen/Qwen3-0.6B",
    "intermediate_ckpt_dir": str(P / "unused"),
    "mesh": {"shape": "(1,1)", "axis_names": "('fsdp','tp')"},
  }
  config = {
    "training_mode": "agentic_ppo",
    "model_config": model,
    **{f"{role}_model_config": model for role in ("actor", "reference", "rollout", "critic")},
    "tokenizer_config": {
      "tokenizer_path": str(P / "no-tokenizer"),
      "tokenizer_type": "huggingface",
      "add_bos": False,
      "add_eos": False,
    },
    "rl_training_config": {"max_steps": 2},
    "rollout_config": {"total_generation_steps": 64, "max_prompt_length": 32},
    "agentic_ppo_config": section if section is not None else {"num_generations": 2},
    "agent_class_path": "tunix.rl.agentic.agents.model_agent.ModelAgent",
    "env_class_path": "tunix.rl.agentic.environments.task_environment.TaskEnvironment",
    "env_kwargs": {"max_steps": 1},
    **top,
  }
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(yaml.safe_dump(config))
  return path


def run_main_line(argv: list[str]) -> str:
  """A batch snippet: the command's `main(argv)` (its exit status as SystemExit)."""
  return f"import sys\nfrom tunix_ppo_ext.jobs import main\nsys.exit(main({argv!r}))\n"


def register() -> None:
  _agentic_config_probes()
  _agentic_command_probes()
  _config_probes()
  _bench_probes()
  _run_probes()
  _plot_export_probes()
  _disk_probes()
  _signal_probes()


def _agentic_config_probes() -> None:
  """`AgenticPpoConfig(...)` with one bad key each (tunix main)."""
  cases = [  # id, keyword arguments, the names the error must hold
    ("A01", "gae_lambda=2", ("gae_lambda", "2")),
    ("A02", "gae_lambda=float('nan')", ("gae_lambda", "nan")),
    ("A03", "gamma=-0.1", ("gamma", "-0.1")),
    ("A04", "critic_lambda=1.5", ("critic_lambda", "1.5")),
    ("A05", "gamma_turn='high'", ("gamma_turn", "high")),
    ("A06", "adaptive_lambda_alpha=0", ("adaptive_lambda_alpha",)),
    ("A07", "advantage_estimator='gea'", ("advantage_estimator", "gea")),
    ("A08", "kl_method='full'", ("kl_method", "full")),
    ("A09", "kl_method='k9'", ("kl_method", "k9")),
    ("A10", "loss_agg_mode='mean'", ("loss_agg_mode", "mean")),
    ("A11", "epsilon=0", ("epsilon",)),
    ("A12", "epsilon_low=1.0", ("epsilon_low",)),
    ("A13", "num_generations=0", ("num_generations", "0")),
    ("A14", "num_iterations=0", ("num_iterations", "0")),
    ("A15", "logits_chunk_size=-1", ("logits_chunk_size", "-1")),
    ("A16", "beta=-1", ("beta", "-1")),
    ("A17", "clip_range_value=0", ("clip_range_value",)),
    ("A18", "entropy_coef=float('inf')", ("entropy_coef", "inf")),
    ("A19", "norm_adv_by_std='yes'", ("norm_adv_by_std", "yes")),
    ("A20", "gamma=True", ("gamma", "True")),
    ("A21", "critic_lambda=0.9, advantage_estimator='grpo', num_generations=2", ("critic_lambda",)),
    ("A22", "advantage_estimator='grpo', num_generations=1", ("num_generations", "grpo")),
    ("A23", "advantage_estimator='rloo', num_generations=1", ("num_generations", "rloo")),
    ("A24", "critic_warmup_steps=5", ("critic_warmup_steps",)),
    ("A25", "value_loss_fn='ppo', clip_range_value=None", ("clip_range_value",)),
    ("A26", "policy_loss_fn='nope'", ("policy_loss_fn", "nope")),
  ]
  items = {}
  for id_, kwargs, names in cases:
    code = "from tunix_ppo_ext import AgenticPpoConfig\n"
    code += f"AgenticPpoConfig(max_response_length=64, {kwargs})\n"
    items[id_] = code
    kind = "TypeError" if id_ == "A24" else "ConfigError"
    expected = (
      f"{kind} naming the key and the value"
      if id_ != "A24"
      else ("TypeError naming the key (the critic warm-up is PpoExtLearner's only)")
    )
    if id_ in ("A22", "A23"):
      expected = "ConfigError: a group estimator needs groups of 2 or more samples"
    probe(
      id_,
      f"AgenticPpoConfig(max_response_length=64, {kwargs})  # Python, tunix main",
      expected,
      from_batch("agentic_config", id_),
      raises(kind, *names),
      needs="main",
    )
  ok = "from tunix_ppo_ext import AgenticPpoConfig\n"
  ok += "c = AgenticPpoConfig(max_response_length=64, advantage_estimator='turn_gae', "
  ok += "gae_lambda=0.5, critic_lambda=1.0, num_generations=2)\n"
  ok += "print(c.advantage_estimator, c.gae_lambda, c.critic_lambda)\n"
  items["A27"] = ok
  probe(
    "A27",
    "AgenticPpoConfig(max_response_length=64, advantage_estimator='turn_gae', "
    "gae_lambda=0.5, critic_lambda=1.0, num_generations=2)",
    "accepted, the keys kept",
    from_batch("agentic_config", "A27"),
    succeeds("turn_gae 0.5 1.0"),
    needs="main",
  )
  batched("agentic_config", lambda: MAIN_PYTHON, items)


def _agentic_command_probes() -> None:
  """`tunix-ppo-ext tunix-agentic CONFIG.yaml [KEY=VALUE ...]` (tunix main; 0.1.7 refuses)."""
  d = P / "agentic"
  good = d / "agentic_ppo.yaml"
  cmd = "tunix-ppo-ext tunix-agentic"
  items: dict[str, str] = {}

  def add(id_, argv_shown, argv, expected, check, setup=None, group="agentic_cli", lane="main"):
    if setup is not None:
      setups.append(setup)
    items_of[group][id_] = run_main_line(["tunix-agentic", *argv])
    probe(id_, f"{cmd} {argv_shown}", expected, from_batch(group, id_), check, needs=lane)

  setups: list[Callable[[], Any]] = []
  items_of: dict[str, dict[str, str]] = {"agentic_cli": items, "agentic_017": {}}
  bad_yaml = d / "bad.yaml"
  listed = d / "list.yaml"
  add(
    "AC01",
    "$P/agentic/missing.yaml",
    [str(d / "missing.yaml")],
    "exit 2, one line naming the missing file",
    one_line(2, "missing.yaml"),
  )
  add(
    "AC02",
    "$P/agentic/bad.yaml  # 'rollout_config: [1, 2'",
    [str(bad_yaml)],
    "exit 2, one line: invalid YAML in bad.yaml",
    one_line(2, "bad.yaml"),
  )
  add(
    "AC03",
    "$P/agentic/list.yaml  # a YAML list",
    [str(listed)],
    "exit 2, one line: the config must be a mapping",
    one_line(2, "list.yaml"),
  )
  add(
    "AC04",
    "agentic_ppo.yaml training_mode=agentic_ppoo",
    [str(good), "training_mode=agentic_ppoo"],
    "exit 2, one line naming training_mode and its value",
    one_line(2, "training_mode", "agentic_ppoo"),
  )
  add(
    "AC05",
    "agentic_ppo.yaml agentic_ppo_config.gae_lamda=0.9",
    [str(good), "agentic_ppo_config.gae_lamda=0.9"],
    "exit 2, one line naming gae_lamda, suggesting gae_lambda",
    one_line(2, "gae_lamda", "gae_lambda"),
  )
  add(
    "AC06",
    "agentic_ppo.yaml agentic_ppo_config.gae_lambda=2",
    [str(good), "agentic_ppo_config.gae_lambda=2"],
    "exit 2, one line naming gae_lambda=2",
    one_line(2, "gae_lambda=2"),
  )
  add(
    "AC07",
    "agentic_ppo.yaml agentic_ppo_config.gae_lambda=abc",
    [str(good), "agentic_ppo_config.gae_lambda=abc"],
    "exit 2, one line naming gae_lambda and 'abc'",
    one_line(2, "gae_lambda", "abc"),
  )
  add(
    "AC08",
    "agentic_ppo.yaml agentic_ppo_config=5",
    [str(good), "agentic_ppo_config=5"],
    "exit 2, one line: agentic_ppo_config must be a mapping",
    one_line(2, "agentic_ppo_config"),
  )
  add(
    "AC09",
    "agentic_ppo.yaml agentic_ppo_config.advantage_estimator=grpo "
    "agentic_ppo_config.num_generations=1",
    [
      str(good),
      "agentic_ppo_config.advantage_estimator=grpo",
      "agentic_ppo_config.num_generations=1",
    ],
    "exit 2, one line: grpo needs groups of 2 or more",
    one_line(2, "num_generations", "grpo"),
  )
  add(
    "AC10",
    "agentic_ppo.yaml agentic_ppo_config.kl_method=full",
    [str(good), "agentic_ppo_config.kl_method=full"],
    "exit 2, one line naming kl_method='full'",
    one_line(2, "kl_method"),
  )
  add(
    "AC11",
    "agentic_ppo.yaml env_class_path=no.such.Env  # tokenizer path missing too",
    [str(good), "env_class_path=no.such.Env"],
    "exit 2, one line naming env_class_path, before any tokenizer or model loads",
    one_line(2, "env_class_path", "no.such.Env"),
  )
  add(
    "AC12",
    "agentic_ppo.yaml agent_class_path=tunix.rl.agentic.agents.model_agent.NoAgent",
    [str(good), "agent_class_path=tunix.rl.agentic.agents.model_agent.NoAgent"],
    "exit 2, one line naming agent_class_path",
    one_line(2, "agent_class_path", "NoAgent"),
  )
  add(
    "AC13",
    "agentic_ppo.yaml agentic_ppo_config.max_response_length=32  # rollout: 64",
    [str(good), "agentic_ppo_config.max_response_length=32"],
    "exit 2, one line naming max_response_length and the rollout's 64 before a model loads",
    one_line(2, "max_response_length", "64"),
  )
  add(
    "AC14",
    "agentic_ppo.yaml agentic_ppo_config.critic_warmup_steps=2",
    [str(good), "agentic_ppo_config.critic_warmup_steps=2"],
    "exit 2, one line: not an AgenticPpoConfig key",
    one_line(2, "critic_warmup_steps"),
  )
  add(
    "AC15",
    "$P/agentic (a directory)",
    [str(d)],
    "exit 2, one line naming the path",
    one_line(2, "agentic"),
  )
  add(
    "AC16",
    "agentic_ppo.yaml gae_lambda  # no '='",
    [str(good), "gae_lambda"],
    "exit 2, argparse's one line: unrecognized arguments",
    one_line(2, "gae_lambda"),
  )
  add(
    "AC19",
    "agentic_ppo.yaml no_such_key=1",
    [str(good), "no_such_key=1"],
    "exit 2, one line naming no_such_key",
    one_line(2, "no_such_key"),
  )
  add(
    "AC17",
    "agentic_ppo.yaml  # on tunix 0.1.7",
    [str(good)],
    "exit 2, one line: needs tunix main",
    one_line(2, "tunix main"),
    group="agentic_017",
    lane="",
  )
  add(
    "AC18",
    "$P/agentic/missing.yaml  # on tunix 0.1.7",
    [str(d / "missing.yaml")],
    "exit 2, one line: needs tunix main",
    one_line(2, "tunix main"),
    group="agentic_017",
    lane="",
  )

  def prepare() -> str:
    agentic_yaml(good)
    bad_yaml.write_text("rollout_config: [1, 2\n")
    listed.write_text("- 1\n- 2\n")
    return MAIN_PYTHON

  def prepare_017() -> str:
    agentic_yaml(good)
    return PYTHON

  batched("agentic_cli", prepare, items)
  batched("agentic_017", prepare_017, items_of["agentic_017"])


def _config_probes() -> None:
  """`tunix-ppo-ext train --config configs/smoke.yaml KEY=VALUE`: the critic studies' keys."""
  guess = ("env.name=guess", "train.max_prompt_length=128")
  cases = [  # id, overrides, expected, names
    ("C01", ("ppo.gae_lambda=1.5",), ("gae_lambda", "1.5")),
    ("C02", ("ppo.gae_lambda=-0.1",), ("gae_lambda", "-0.1")),
    ("C03", ("ppo.gae_lambda=abc",), ("gae_lambda", "abc")),
    ("C04", ("ppo.gae_lambda=.nan",), ("gae_lambda", "nan")),
    ("C05", ("ppo.critic_lambda=2",), ("critic_lambda", "2")),
    (
      "C06",
      ("ppo.critic_lambda=0.9", "ppo.advantage_estimator=grpo", "ppo.num_generations=2"),
      ("critic_lambda", "grpo"),
    ),
    ("C07", ("ppo.critic_warmup_steps=-1",), ("critic_warmup_steps", "-1")),
    (
      "C08",
      ("ppo.critic_warmup_steps=2", "ppo.advantage_estimator=rloo", "ppo.num_generations=2"),
      ("critic_warmup_steps", "rloo"),
    ),
    ("C09", ("ppo.critic_warmup_until_ev=0.5",), ("critic_warmup_until_ev", "critic_warmup_steps")),
    (
      "C10",
      ("ppo.critic_warmup_until_ev=2", "ppo.critic_warmup_steps=2"),
      ("critic_warmup_until_ev", "2"),
    ),
    (
      "C11",
      ("ppo.critic_warmup_until_ev=-.inf", "ppo.critic_warmup_steps=2"),
      ("critic_warmup_until_ev", "inf"),
    ),
    (
      "C12",
      ("ppo.critic_warmup_patience=0", "ppo.critic_warmup_steps=2"),
      ("critic_warmup_patience", "0"),
    ),
    ("C13", ("ppo.critic_warmup_steps=true",), ("critic_warmup_steps", "True")),
    ("C14", ("ppo.advantage_estimator=turn_ga",), ("turn_ga", "turn_gae")),
    ("C15", ("ppo.gamma_turn=1.5",), ("gamma_turn", "1.5")),
    ("C16", ("ppo.num_generations=0",), ("num_generations", "0")),
    ("C17", ("ppo.num_generations=3",), ("batch_size", "num_generations=3")),
    ("C18", ("ppo.advantage_estimator=grpo", "ppo.num_generations=1"), ("num_generations", "grpo")),
    ("C19", ("ppo.advantage_estimator=rloo", "ppo.num_generations=1"), ("num_generations", "rloo")),
    (
      "C20",
      ("ppo.advantage_estimator=grpo", "ppo.norm_adv_by_std=false", "ppo.num_generations=1"),
      ("num_generations", "grpo"),
    ),
    ("C21", ("ppo.adaptive_lambda_alpha=0",), ("adaptive_lambda_alpha", "0")),
    ("C22", ("ppo.critic_warmup_lambda=1.5",), ("critic_warmup_lambda", "1.5")),
    ("C23", (*guess, "env.kwargs.high=0"), ("high", "0")),
    ("C24", (*guess, "env.kwargs.low=5", "env.kwargs.high=5"), ("high", "5")),
    ("C25", (*guess, "env.kwargs.low=-1"), ("low", "-1")),
    ("C26", (*guess, "env.kwargs.info_gain_reward=-1"), ("info_gain_reward", "-1")),
    ("C27", (*guess, "env.kwargs.info_gain_reward=.nan"), ("info_gain_reward", "nan")),
    ("C28", (*guess, "env.kwargs.info_gain_reward=.inf"), ("info_gain_reward", "inf")),
    ("C29", (*guess, "env.kwargs.info_gain_reward=lots"), ("info_gain_reward", "lots")),
    ("C30", (*guess, "env.kwargs.max_turns=0"), ("max_turns", "0")),
    ("C31", (*guess, "env.kwargs.max_turns=10"), ("turn_penalty", "max_turns")),
    (
      "C32",
      (*guess, "model.alphabet=null", "env.kwargs.max_turns=6", "env.kwargs.turn_penalty=0.1"),
      ("env.max_turns", "max_turns=6"),
    ),
    ("C33", (*guess, "env.kwargs.hgh=32"), ("hgh",)),
    ("C34", (*guess, "env.kwargs.high=32.5"), ("high", "32.5")),
    ("C35", (*guess, "env.kwargs.high=true"), ("high", "True")),
    ("C36", (*guess, "env.kwargs.turn_penalty=0.5"), ("turn_penalty", "0.5")),
    ("C37", ("env.kwargs=5",), ("env.kwargs", "5")),
    (
      "C38",
      ("metrics.drop=[actor/advantage_sq_mean_tur]",),
      ("actor/advantage_sq_mean_tur", "actor/advantage_sq_mean_turn"),
    ),
    ("C39", ("metrics.rename={actor/advantage_sq_mean: actor/entropy}",), ("actor/entropy",)),
    ("C40", ("ppo.gae_lambda=",), ("gae_lambda", "None")),
    ("C41", ("ppo=5",), ("ppo", "5")),
    ("C42", ("train.steps=0",), ("train.steps", "0")),
    (
      "C43",
      ("ppo.critic_lambda=0.9", "ppo.advantage_estimator=reinforce_plus_plus"),
      ("critic_lambda", "reinforce_plus_plus"),
    ),
    ("C48", guess, ("model.alphabet", "'G'")),
  ]
  items = {}
  for id_, overrides, names in cases:
    items[id_] = run_main_line(cfg_argv(id_, *overrides))
    key = names[0]
    expected = f"exit 2, one line naming {key}"
    if id_ in ("C18", "C19", "C20"):
      expected = "exit 2, one line: a group estimator with groups of one has no baseline"
    if id_ == "C31":
      expected = "exit 2, one line naming turn_penalty and why: 10 turns"
    if id_ == "C48":
      expected = "exit 2 before any model is built, one line naming model.alphabet"
    if id_ == "C32":
      expected = "exit 2, one line: the game's 6 guesses would be cut at env.max_turns=4"
    probe(
      id_,
      f"{TRAIN} {' '.join(overrides)}",
      expected,
      from_batch("config", id_),
      one_line(2, *names),
    )
  extra = [
    (
      "C44",
      ["train", "--config", str(P / "cfg" / "missing.yaml")],
      "--config $P/cfg/missing.yaml",
      ("missing.yaml",),
    ),
    ("C45", ["plan", "--config", SMOKE, "ppo.gae_lambda=2"], "", ("gae_lambda",)),
    (
      "C46",
      ["plan", "--config", SMOKE, "ppo.advantage_estimator=grpo", "ppo.num_generations=1"],
      "",
      ("num_generations", "grpo"),
    ),
    ("C47", ["train", "--config", SMOKE, "ppo.gae_lambda"], "", ("ppo.gae_lambda",)),
  ]
  for id_, argv, shown, names in extra:
    items[id_] = run_main_line(argv)
    text = f"tunix-ppo-ext {' '.join(argv)}" if not shown else f"tunix-ppo-ext train {shown}"
    probe(
      id_,
      text,
      f"exit 2, one line naming {names[0]}",
      from_batch("config", id_),
      one_line(2, *names),
    )
  batched("config", lambda: PYTHON, items)


def _bench_probes() -> None:
  """The critic studies' scripts: `bench/critic_ceiling.py` and `bench/real_model.py`."""
  ceiling = [  # id, arguments, expected, check
    ("B01", ["--noise"], "the noise table", succeeds("| policy |", "critic, lambda 0.5")),
    ("B02", ["--noise", "--group", "1"], "exit 2, one line naming --group", one_line(2, "--group")),
    ("B03", ["--high", "0"], "exit 2, one line naming --high", one_line(2, "--high")),
    ("B04", ["--high", "1"], "exit 2, one line naming --high", one_line(2, "--high")),
    (
      "B05",
      ["--max-turns", "0"],
      "exit 2, one line naming --max-turns",
      one_line(2, "--max-turns"),
    ),
    (
      "B06",
      ["--turn-penalty", "0.5"],
      "exit 2, one line naming --turn-penalty",
      one_line(2, "--turn-penalty"),
    ),
    (
      "B07",
      ["--valid-reward", "-1"],
      "exit 2, one line naming --valid-reward",
      one_line(2, "--valid-reward"),
    ),
    (
      "B08",
      ["--noise", "--lambdas", "2"],
      "exit 2, one line: a lambda is in [0, 1]",
      one_line(2, "--lambdas"),
    ),
    (
      "B09",
      ["--noise", "--lambdas", "nan"],
      "exit 2, one line naming --lambdas",
      one_line(2, "--lambdas"),
    ),
    (
      "B10",
      ["--high", "32", "--max-turns", "5", "--policies", "uniform"],
      "exit 2 at once, one line: too many episodes to enumerate (not hours of work)",
      one_line(2, "--policies"),
    ),
    (
      "B11",
      ["--policies", "bogus"],
      "exit 2, argparse's line naming --policies",
      one_line(2, "--policies"),
    ),
    (
      "B12",
      ["--high", "32", "--max-turns", "5", "--policies", "bisect", "consistent", "--noise"],
      "the docstring's 32 and 5 for these two: the table, or one line if too large",
      one_line(2, "consistent 32528704"),
    ),
    (
      "B13",
      ["--high", "32", "--max-turns", "5", "--policies", "bisect", "--noise"],
      "the noise table of bisect (32 episodes)",
      succeeds("| bisect |"),
    ),
  ]
  for id_, args, expected, check in ceiling:
    probe(
      id_,
      f"python bench/critic_ceiling.py {' '.join(args)}",
      expected,
      (lambda a=args: bench("critic_ceiling.py", *a, timeout=90)),
      check,
    )
  results = P / "bm"
  real = [
    (
      "R01",
      ["--baseline-from", "$P/bm/missing", "--seed-ids", "0", "--out", "$P/bm/r01"],
      "exit 2 before any run, one line naming --baseline-from",
      one_line(2, "--baseline-from"),
    ),
    (
      "R02",
      ["--seeds", "0", "--out", "$P/bm/r02"],
      "exit 2, one line naming --seeds",
      one_line(2, "--seeds"),
    ),
    (
      "R03",
      ["--steps", "0", "--out", "$P/bm/r03"],
      "exit 2 before the baseline trains, one line naming train.steps",
      one_line(2, "train.steps"),
    ),
    (
      "R04",
      ["--config", "$P/bm/missing.yaml", "--out", "$P/bm/r04"],
      "exit 2, one line naming the config",
      one_line(2, "missing.yaml"),
    ),
    (
      "R05",
      ["--out", "$P/bm/r05", "ppo.gae_lamda=0.5"],
      "exit 2, one line naming ppo.gae_lamda",
      one_line(2, "gae_lamda"),
    ),
    (
      "R06",
      ["--report", "$P/bm/empty", "--out", "$P/bm/r06"],
      "exit 2, one line: no results.json",
      one_line(2, "results.json"),
    ),
    (
      "R07",
      ["--report", "$P/bm/corrupt", "--out", "$P/bm/r07"],
      "exit 2, one line naming the unreadable results.json",
      one_line(2, "results.json"),
    ),
    (
      "R08",
      ["--baseline-steps", "0", "--out", "$P/bm/r08"],
      "exit 2 before any run, one line naming train.steps",
      one_line(2, "train.steps"),
    ),
    (
      "R09",
      ["--seed-ids", "-1", "--out", "$P/bm/r09"],
      "exit 2, one line naming the seed",
      one_line(2, "seed"),
    ),
  ]

  def run_real(args: list[str]) -> Observed:
    (results / "empty").mkdir(parents=True, exist_ok=True)
    (results / "corrupt").mkdir(parents=True, exist_ok=True)
    (results / "corrupt" / "results.json").write_text('{"args": {"config": "x"}, "seeds": {')
    args = [a.replace("$P", str(P)) for a in args]
    return bench("real_model.py", *args, timeout=120)

  for id_, args, expected, check in real:
    probe(
      id_,
      f"python bench/real_model.py {' '.join(args)}",
      expected,
      (lambda a=args: run_real(a)),
      check,
    )


def _unchanged(before: dict[str, str], out: pathlib.Path) -> str:
  after = tree_digest(out)
  changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
  return "nothing changed" if not changed else f"changed: {changed[:4]}"


def _rerun(name: str, *overrides: str, prepare=None, steps: int | None = None) -> Observed:
  """A finished run's copy rerun with `overrides` (after `prepare(out)`); the note says
  whether its files changed, or (`steps`) whether the run is whole."""
  out = copy_of_finished(name)
  if prepare is not None:
    prepare(out)
  before = tree_digest(out)
  obs = cli("train", "--config", SMOKE, "--output-dir", str(out), *overrides)
  obs.note = whole_run(out, steps) if steps else _unchanged(before, out)
  return obs


def _run_probes() -> None:
  """A finished run, rerun as it is and with other configs; its files damaged first."""
  run = f"{TRAIN} --output-dir $P/run"

  def first() -> Observed:
    out = P / "base" / "finished"
    shutil.rmtree(out, ignore_errors=True)
    _FINISHED.clear()
    obs = cli("train", "--config", SMOKE, "--output-dir", str(out))
    if obs.code == 0:
      _FINISHED.append(out)
    obs.note = whole_run(out)
    return obs

  probe(
    "F01",
    f"{TRAIN} --output-dir $P/base/finished",
    "a run of 4 steps: the bar compiles "
    "first, the end names the directory and plot; metrics, summary, parts",
    first,
    both(succeeds("compiling", "plot"), noted("whole run")),
  )
  cases = [  # id, overrides, prepare, expected, check
    (
      "F02",
      (),
      None,
      "exit 0, one line: finished; nothing on disk changes",
      both(succeeds("already"), noted("nothing changed")),
    ),
    (
      "F03",
      ("model.num_layers=2",),
      None,
      "exit 2, one line naming model.num_layers; nothing changes",
      both(one_line(2, "model.num_layers"), noted("nothing changed")),
    ),
    (
      "F04",
      ("env.name=guess", "model.alphabet=null", "train.max_prompt_length=128"),
      None,
      "exit 2, one line naming env.name; nothing changes",
      both(one_line(2, "env.name"), noted("nothing changed")),
    ),
    (
      "F05",
      ("ppo.advantage_estimator=grpo", "ppo.num_generations=2"),
      None,
      "exit 2, one line naming both keys; nothing changes",
      both(one_line(2, "advantage_estimator", "num_generations"), noted("nothing changed")),
    ),
    (
      "F06",
      ("ppo.gae_lambda=0.5", "ppo.critic_lambda=1.0"),
      None,
      "exit 0, one line: finished (nothing to train with the new lambdas); nothing changes",
      both(succeeds("already"), noted("nothing changed")),
    ),
    (
      "F07",
      ("train.steps=2",),
      None,
      "exit 2, one line naming train.steps; nothing changes",
      both(one_line(2, "train.steps"), noted("nothing changed")),
    ),
    (
      "F08",
      ("seed=1",),
      None,
      "exit 2, one line naming seed; nothing changes",
      both(one_line(2, "seed"), noted("nothing changed")),
    ),
    (
      "F09",
      ("ppo.critic_warmup_steps=1",),
      None,
      "exit 0, one line: finished (a warm-up changes nothing trained); nothing changes",
      both(succeeds("already"), noted("nothing changed")),
    ),
    (
      "F10",
      ("model.fused_head=true", "ppo.logits_chunk_size=8"),
      None,
      "exit 0, one line: finished (compute-only keys); nothing changes",
      both(succeeds("already"), noted("nothing changed")),
    ),
  ]
  for id_, overrides, prepare, expected, check in cases:
    probe(
      id_,
      f"{run} {' '.join(overrides)}  # $P/run: a finished run's copy",
      expected,
      (lambda i=id_, o=overrides, p=prepare: _rerun(i, *o, prepare=p)),
      check,
    )

  def remove(*names: str):
    def prepare(out: pathlib.Path) -> None:
      for name in names:
        target = out / name
        if target.is_dir():
          shutil.rmtree(target)
        else:
          target.unlink()

    return prepare

  def write(name: str, text: str, also=None):
    def prepare(out: pathlib.Path) -> None:
      (out / name).write_text(text)
      if also is not None:
        also(out)

    return prepare

  def cut(name: str, also=None):
    def prepare(out: pathlib.Path) -> None:
      text = (out / name).read_text()
      (out / name).write_text(text[: len(text) // 2])
      if also is not None:
        also(out)

    return prepare

  whole = noted("whole run")
  damaged = [  # id, what is done first, overrides, prepare, expected, check, steps
    (
      "F11",
      "rm summary.json",
      (),
      remove("summary.json"),
      "exit 0: the summary written again from the kept metrics, the run whole",
      both(succeeds(), whole),
      4,
    ),
    (
      "F12",
      "summary.json cut in half",
      (),
      cut("summary.json"),
      "exit 0: the summary written again, the run whole",
      both(succeeds(), whole),
      4,
    ),
    (
      "F13",
      "parts.json is '[1, 2]'; rm summary.json",
      (),
      write("parts.json", "[1, 2]", remove("summary.json")),
      "exit 0: an unreadable parts.json read as none, the summary whole",
      both(succeeds(), whole),
      4,
    ),
    (
      "F14",
      "parts.json is '{\"from_step\": 0}'; rm summary.json",
      (),
      write("parts.json", '{"from_step": 0}', remove("summary.json")),
      "exit 0: an unreadable parts.json read as none, the summary whole",
      both(succeeds(), whole),
      4,
    ),
    (
      "F15",
      "config.json cut in half",
      (),
      cut("config.json"),
      "exit 2, one line naming config.json",
      one_line(2, "config.json"),
      None,
    ),
    (
      "F16",
      "rm config.json",
      ("model.num_layers=2",),
      remove("config.json"),
      "exit 2, one line: no config.json to check another model against; no checkpoint moved",
      both(one_line(2, "config.json"), noted("nothing changed")),
      None,
    ),
    (
      "F17",
      "rm metrics.jsonl",
      (),
      remove("metrics.jsonl"),
      "exit 0, one line: finished; nothing changes",
      both(succeeds("already"), noted("nothing changed")),
      None,
    ),
    (
      "F18",
      "echo 1 > .lock  # pid 1 is alive",
      (),
      write(".lock", "1"),
      "exit 2, one line: in use by pid 1; nothing changes",
      both(one_line(2, "pid 1"), noted("nothing changed")),
      None,
    ),
    (
      "F19",
      "echo garbage > .lock",
      (),
      write(".lock", "garbage"),
      "exit 0, one line: finished (a lock that names no process is stale)",
      succeeds("already"),
      None,
    ),
    (
      "F20",
      "rm -r checkpoints/actor/4 summary.json",
      (),
      remove("checkpoints/actor/4", "summary.json"),
      "exit 0: critic step 4 moved aside, resumed from step 2, the run whole",
      both(succeeds("resuming from step 2"), whole),
      4,
    ),
    (
      "F21",
      "",
      ("train.steps=6",),
      None,
      "exit 0: resumed at step 4 to 6; the summary counts both parts",
      both(succeeds("resuming from step 4"), whole),
      6,
    ),
    (
      "F22",
      "rm -r checkpoints",
      (),
      remove("checkpoints"),
      "exit 0: no checkpoint to resume from, a new run of 4 steps, the summary of it alone",
      both(succeeds(), whole),
      4,
    ),
  ]
  for id_, done_first, overrides, prepare, expected, check, steps in damaged:
    shown = f"{run} {' '.join(overrides)}  # $P/run: a finished run's copy"
    if done_first:
      shown += f", then: {done_first}"
    probe(
      id_,
      shown,
      expected,
      (lambda i=id_, o=overrides, p=prepare, s=steps: _rerun(i, *o, prepare=p, steps=s)),
      check,
    )

  def turn_gae() -> Observed:
    out = P / "turn_gae"
    obs = cli(
      "train",
      "--config",
      SMOKE,
      "--output-dir",
      str(out),
      "ppo.advantage_estimator=turn_gae",
      "ppo.gae_lambda=0.5",
      "ppo.critic_lambda=1.0",
      "ppo.critic_warmup_steps=2",
      "ppo.critic_warmup_until_ev=0.5",
    )
    rows = (
      [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
      if (out / "metrics.jsonl").is_file()
      else []
    )
    keys = {k for row in rows for k in row}
    wanted = ["actor/advantage_sq_mean", "actor/advantage_sq_mean_turn", "critic/warmup"]
    obs.note = f"{whole_run(out)}; logged: {[k for k in wanted if k in keys]}"
    return obs

  probe(
    "F23",
    f"{TRAIN} --output-dir $P/turn_gae ppo.advantage_estimator=turn_gae "
    "ppo.gae_lambda=0.5 ppo.critic_lambda=1.0 ppo.critic_warmup_steps=2 "
    "ppo.critic_warmup_until_ev=0.5",
    "a run of 4 steps logging actor/advantage_sq_mean, "
    "actor/advantage_sq_mean_turn and critic/warmup",
    turn_gae,
    both(succeeds(), noted("whole run"), noted("critic/warmup']")),
  )

  def warmup_whole_run() -> Observed:
    out = P / "warmup_all"
    obs = cli("train", "--config", SMOKE, "--output-dir", str(out), "ppo.critic_warmup_steps=10")
    obs.note = whole_run(out)
    return obs

  probe(
    "F24",
    f"{TRAIN} --output-dir $P/warmup_all ppo.critic_warmup_steps=10  # 4 steps",
    "a run of 4 critic-only steps, with one warning line that the actor never trains",
    warmup_whole_run,
    both(succeeds("never trains"), noted("whole run")),
  )


def _plot_export_probes() -> None:
  """`plot` and `export` on a finished run's copy and on odd directories."""

  def plot(*args: str, prepare=None) -> Callable[[], Observed]:
    def run() -> Observed:
      if prepare is not None:
        prepare()
      return cli("plot", *[a.replace("$P", str(P)) for a in args])

    return run

  def run_copy(name: str, change=None):
    def prepare():
      out = copy_of_finished(name)
      if change is not None:
        change(out)

    return prepare

  def partial(out: pathlib.Path) -> None:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])

  def bad_middle(out: pathlib.Path) -> None:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:20]
    (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")

  def empty_metrics(out: pathlib.Path) -> None:
    (out / "metrics.jsonl").write_text("")

  def nan_metrics(out: pathlib.Path) -> None:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
      for key in row:
        if key != "step":
          row[key] = float("nan")
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

  def dirs():
    (P / "plots" / "outdir").mkdir(parents=True, exist_ok=True)
    (P / "plots" / "empty").mkdir(parents=True, exist_ok=True)
    (P / "plots" / "afile").write_text("x")

  cases = [
    (
      "G01",
      ["$P/g01"],
      run_copy("g01"),
      "exit 0, the PNG's path; curves.png written",
      succeeds("curves.png"),
    ),
    (
      "G02",
      ["$P/g02", "--out", "$P/plots/no/such/dir/c.png"],
      run_copy("g02"),
      "exit 2, one line naming the path and --out",
      one_line(2, "c.png", "--out"),
    ),
    (
      "G03",
      ["$P/g03", "--out", "$P/plots/outdir"],
      lambda: (run_copy("g03")(), dirs()),
      "exit 0: $P/plots/outdir/curves.png",
      succeeds("outdir/curves.png"),
    ),
    (
      "G04",
      ["$P/g04", "--out", "/dev/full"],
      run_copy("g04"),
      "exit 2, one line: no space left, --out",
      one_line(2, "/dev/full"),
    ),
    (
      "G05",
      ["$P/plots/empty"],
      dirs,
      "exit 2, one line: no metrics.jsonl",
      one_line(2, "metrics.jsonl"),
    ),
    (
      "G06",
      ["$P/plots/nonexistent"],
      None,
      "exit 2, one line: no metrics.jsonl",
      one_line(2, "metrics.jsonl"),
    ),
    (
      "G07",
      ["$P/g07"],
      run_copy("g07", partial),
      "exit 0: the steps before the cut-off last line drawn",
      succeeds("curves.png"),
    ),
    (
      "G08",
      ["$P/g08"],
      run_copy("g08", bad_middle),
      "exit 2, one line naming metrics.jsonl's line 2",
      one_line(2, "metrics.jsonl:2"),
    ),
    (
      "G09",
      ["$P/g09"],
      run_copy("g09", empty_metrics),
      "exit 2, one line: none of the plotted keys",
      one_line(2, "plotted keys"),
    ),
    ("G10", ["$P/plots/afile"], dirs, "exit 2, one line naming RUN_DIR", one_line(2, "afile")),
    (
      "G11",
      ["$P/g11"],
      run_copy("g11", nan_metrics),
      "exit 0: every value NaN, empty panels, no error",
      succeeds("curves.png"),
    ),
    (
      "G12",
      ["$P/g12", "--out", "$P/plots/afile/c.png"],
      lambda: (run_copy("g12")(), dirs()),
      "exit 2, one line naming the path under a file",
      one_line(2, "afile/c.png"),
    ),
  ]
  for id_, args, prepare, expected, check in cases:
    probe(
      id_, f"tunix-ppo-ext plot {' '.join(args)}", expected, plot(*args, prepare=prepare), check
    )

  def export(run: str, out: str, prepare=None, left: str | None = None) -> Callable[[], Observed]:
    def go() -> Observed:
      if prepare is not None:
        prepare()
      obs = cli("export", run.replace("$P", str(P)), out.replace("$P", str(P)))
      target = pathlib.Path(out.replace("$P", str(P)))
      partials = sorted(p.name for p in target.parent.glob(f"{target.name}.partial-*"))
      files = sorted(p.name for p in target.iterdir()) if target.is_dir() else []
      obs.note = f"OUT_DIR holds {files}; partial dirs left: {partials}"
      return obs

    return go

  def export_dirs():
    (P / "exp" / "full").mkdir(parents=True, exist_ok=True)
    (P / "exp" / "full" / "x").write_text("x")
    (P / "exp" / "afile").write_text("x")
    (P / "exp" / "empty").mkdir(parents=True, exist_ok=True)

  nothing = noted("partial dirs left: []")
  exports = [
    (
      "E01",
      "$P/e01",
      "$P/exp/e01",
      run_copy("e01"),
      "exit 0: config.json and model.safetensors",
      both(succeeds(), noted("model.safetensors"), nothing),
    ),
    (
      "E02",
      "$P/exp/empty",
      "$P/exp/e02",
      export_dirs,
      "exit 2, one line: no config.json",
      both(one_line(2, "config.json"), nothing),
    ),
    (
      "E03",
      "$P/e03",
      "$P/exp/full",
      lambda: (run_copy("e03")(), export_dirs()),
      "exit 2, one line: OUT_DIR not empty",
      both(one_line(2, "not empty"), nothing),
    ),
    (
      "E04",
      "$P/e04",
      "$P/exp/afile/out",
      lambda: (run_copy("e04")(), export_dirs()),
      "exit 2, one line naming OUT_DIR; nothing left",
      both(one_line(2, "afile"), nothing),
    ),
    (
      "E05",
      "$P/e05",
      "$P/exp/e05",
      run_copy("e05", cut("config.json")),
      "exit 2, one line naming config.json",
      both(one_line(2, "config.json"), nothing),
    ),
    (
      "E06",
      "$P/exp/afile",
      "$P/exp/e06",
      export_dirs,
      "exit 2, one line naming RUN_DIR",
      both(one_line(2, "afile"), nothing),
    ),
    (
      "E07",
      "$P/e07",
      "$P/exp/e07",
      run_copy("e07", remove_all_checkpoints),
      "exit 2, one line: no finalized actor checkpoint",
      both(one_line(2, "checkpoint"), nothing),
    ),
    (
      "E08",
      "$P/e08",
      "$P/e08",
      run_copy("e08"),
      "exit 2, one line: OUT_DIR not empty (the run)",
      one_line(2, "not empty"),
    ),
    (
      "E09",
      "$P/e09",
      "$P/exp/e09",
      run_copy("e09", other_model_config),
      "exit 2, one line: the checkpoint does not fit config.json's model",
      both(one_line(2, "e09"), nothing),
    ),
  ]
  for id_, run, out, prepare, expected, check in exports:
    probe(id_, f"tunix-ppo-ext export {run} {out}", expected, export(run, out, prepare), check)


def cut(name: str):
  def change(out: pathlib.Path) -> None:
    text = (out / name).read_text()
    (out / name).write_text(text[: len(text) // 2])

  return change


def remove_all_checkpoints(out: pathlib.Path) -> None:
  shutil.rmtree(out / "checkpoints")


def other_model_config(out: pathlib.Path) -> None:
  config = json.loads((out / "config.json").read_text())
  config["model"]["num_layers"] = 2
  (out / "config.json").write_text(json.dumps(config))


def _disk_probes() -> None:
  """Read-only and full disks (tmpfs mounts of their own) and a file-size limit."""

  def readonly_copy(name: str) -> pathlib.Path:
    """A finished run's copy on a tmpfs remounted read-only."""
    mount = P / "mnt" / name
    if not mount_tmpfs(mount, "64m"):
      raise RuntimeError("mount refused")
    shutil.copytree(finished(), mount / "run")
    if not remount_readonly(mount):
      raise RuntimeError("remount refused")
    return mount / "run"

  def d01() -> Observed:
    mount = P / "mnt" / "d01"
    if not mount_tmpfs(mount, "4m", readonly=True):
      raise RuntimeError("mount refused")
    return cli("train", "--config", SMOKE, "--output-dir", str(mount / "run"))

  def d02() -> Observed:
    mount = P / "mnt" / "d02"
    if not mount_tmpfs(mount, "4m", readonly=True):
      raise RuntimeError("mount refused")
    return cli("train", "--config", SMOKE, "--output-dir", str(mount))

  def d03() -> Observed:
    mount = P / "mnt" / "d03"
    if not mount_tmpfs(mount, "1m"):
      raise RuntimeError("mount refused")
    obs = cli("train", "--config", SMOKE, "--output-dir", str(mount / "run"))
    obs.note = f"left: {sorted(p.name for p in (mount / 'run').iterdir())}"
    return obs

  def d04() -> Observed:
    out = P / "d04"
    argv = [PYTHON, "-c", ENTRY, "train", "--config", SMOKE, "--output-dir", str(out)]
    return sh(["bash", "-c", 'ulimit -f 16 && exec "$@"', "bash", *argv])

  def d05() -> Observed:
    run = readonly_copy("d05")
    before = tree_digest(run)
    obs = cli("train", "--config", SMOKE, "--output-dir", str(run))
    obs.note = _unchanged(before, run)
    return obs

  def d06() -> Observed:
    run = readonly_copy("d06")
    return cli("train", "--config", SMOKE, "--output-dir", str(run), "train.steps=6")

  def d07() -> Observed:
    run = readonly_copy("d07")
    return cli("plot", str(run))

  def d08() -> Observed:
    run = readonly_copy("d08")
    (P / "d08out").mkdir(exist_ok=True)
    return cli("plot", str(run), "--out", str(P / "d08out"))

  def d09() -> Observed:
    mount = P / "mnt" / "d09"
    if not mount_tmpfs(mount, "4m", readonly=True):
      raise RuntimeError("mount refused")
    obs = cli("export", str(finished()), str(mount / "out"))
    return obs

  def d10() -> Observed:
    mount = P / "mnt" / "d10"
    if not mount_tmpfs(mount, "16k"):
      raise RuntimeError("mount refused")
    obs = cli("export", str(finished()), str(mount / "out"))
    obs.note = f"left: {sorted(p.name for p in mount.iterdir())}"
    return obs

  def d11() -> Observed:
    out = P / "d11" / "run"
    out.parent.mkdir(parents=True, exist_ok=True)
    (P / "d11" / "afile").write_text("x")
    return cli("train", "--config", SMOKE, "--output-dir", str(P / "d11" / "afile" / "run"))

  def d12() -> Observed:
    run = readonly_copy("d12")
    return cli("export", str(run), str(P / "exp" / "d12"))

  cases = [
    (
      "D01",
      f"{TRAIN} --output-dir $P/ro/run  # $P/ro: a read-only mount",
      d01,
      "exit 2, one line naming the directory: read-only",
      one_line(2, "read-only"),
    ),
    (
      "D02",
      f"{TRAIN} --output-dir $P/ro  # the read-only mount itself",
      d02,
      "exit 2, one line naming the directory: read-only",
      one_line(2, "read-only"),
    ),
    (
      "D03",
      f"{TRAIN} --output-dir $P/small/run  # a 1 MiB tmpfs",
      d03,
      "exit 1, one line: no room for a checkpoint (the disk guard), before step 1",
      one_line(1, ""),
    ),
    (
      "D04",
      f"ulimit -f 16 && {TRAIN} --output-dir $P/d04",
      d04,
      "exit 1, one line naming the file too large",
      one_line(1, "file too large"),
    ),
    (
      "D05",
      f"{TRAIN} --output-dir $P/ro/run  # a finished run on a read-only mount",
      d05,
      "exit 0, one line: finished (a finished run is only read)",
      both(succeeds("already"), noted("nothing changed")),
    ),
    (
      "D06",
      f"{TRAIN} --output-dir $P/ro/run train.steps=6  # finished, read-only",
      d06,
      "exit 2, one line naming the directory: read-only",
      one_line(2, "read-only"),
    ),
    (
      "D07",
      "tunix-ppo-ext plot $P/ro/run  # read-only",
      d07,
      "exit 2, one line naming curves.png and --out",
      one_line(2, "--out"),
    ),
    (
      "D08",
      "tunix-ppo-ext plot $P/ro/run --out $P/d08out  # read-only run",
      d08,
      "exit 0: $P/d08out/curves.png",
      succeeds("d08out/curves.png"),
    ),
    (
      "D09",
      "tunix-ppo-ext export $P/base/finished $P/ro/out  # read-only mount",
      d09,
      "exit 2, one line naming OUT_DIR",
      one_line(2, "OUT_DIR"),
    ),
    (
      "D10",
      "tunix-ppo-ext export $P/base/finished $P/small/out  # a 16 KiB tmpfs",
      d10,
      "exit 2, one line naming OUT_DIR: no space; nothing left",
      both(one_line(2, "OUT_DIR"), noted("left: []")),
    ),
    (
      "D11",
      f"{TRAIN} --output-dir $P/d11/afile/run  # afile: a file",
      d11,
      "exit 2, one line naming output_dir",
      one_line(2, "afile"),
    ),
    (
      "D12",
      "tunix-ppo-ext export $P/ro/run $P/exp/d12  # a finished run on a read-only mount",
      d12,
      "exit 0: the run is only read",
      succeeds(),
    ),
  ]
  for id_, shown, run, expected, check in cases:
    needs = "" if id_ in ("D04", "D11") else "mount"
    probe(id_, shown, expected, run, check, needs=needs)


def _signal_probes() -> None:
  """Ctrl-C, SIGKILL and SIGTERM at awkward moments; each run then rerun."""

  def compiling(out: pathlib.Path, err: str) -> bool:
    return "building the models" in err and time.sleep(2) is None

  def checkpointing(out: pathlib.Path, err: str) -> bool:
    actor = out / "checkpoints" / "actor"
    return actor.is_dir() and any(actor.iterdir())

  def evaluating(out: pathlib.Path, err: str) -> bool:
    return (out / "samples.jsonl").is_file()

  def stepped(out: pathlib.Path, err: str) -> bool:  # step 0: the evaluation before it
    return any(step >= 1 for step in metric_steps(out))

  def checkpointed(out: pathlib.Path, err: str) -> bool:  # step 2's checkpoint, then step 3
    return any(step >= 3 for step in metric_steps(out))

  def stop_then_rerun(name, when, sig, rerun=(), steps=4):
    def run() -> Observed:
      out, stopped = interrupted(name, when, sig)
      again = cli("train", "--config", SMOKE, "--output-dir", str(out), *rerun)
      again.note = (
        f"stopped: exit {stopped.code}: {stopped.first_line()}; rerun: {whole_run(out, steps)}"
      )
      return again

    return run

  def stopped_only(name, when, sig):
    def run() -> Observed:
      return interrupted(name, when, sig)[1]

    return run

  def refused_after_kill() -> Observed:
    out, _ = interrupted("s08", checkpointed, signal.SIGKILL)
    before = tree_digest(out)
    obs = cli("train", "--config", SMOKE, "--output-dir", str(out), "model.num_layers=2")
    obs.note = _unchanged(before, out)
    return obs

  def two_at_once() -> Observed:
    out = P / "s10"
    second: list[Observed] = []

    def when(out_: pathlib.Path, err: str) -> bool:
      if (out_ / ".lock").is_file() and not second:
        second.append(cli("train", "--config", SMOKE, "--output-dir", str(out_)))
      return bool(second)

    interrupted("s10", when, signal.SIGKILL)
    del out
    return second[0]

  run = f"{TRAIN} --output-dir $P/s"
  cases = [
    (
      "S01",
      f"{run}, Ctrl-C while it compiles",
      stopped_only("s01", compiling, signal.SIGINT),
      "exit 130, one line: interrupted, what was checkpointed is kept",
      one_line(130, "interrupted"),
    ),
    (
      "S02",
      f"{run}, Ctrl-C while it compiles, then the same command",
      stop_then_rerun("s02", compiling, signal.SIGINT),
      "the rerun: exit 0, the run whole",
      both(succeeds(), noted("rerun: whole run")),
    ),
    (
      "S03",
      f"{run}, SIGKILL while it compiles, then the same command",
      stop_then_rerun("s03", compiling, signal.SIGKILL),
      "the rerun: exit 0 (the stale lock taken over), the run whole",
      both(succeeds(), noted("rerun: whole run")),
    ),
    (
      "S04",
      f"{run}, Ctrl-C as the first checkpoint is written, then the same command",
      stop_then_rerun("s04", checkpointing, signal.SIGINT),
      "exit 130 then exit 0, the run whole",
      both(succeeds(), noted("rerun: whole run"), noted("stopped: exit 130")),
    ),
    (
      "S05",
      f"{run}, SIGKILL as the first checkpoint is written, then the same command",
      stop_then_rerun("s05", checkpointing, signal.SIGKILL),
      "the rerun: exit 0, the run whole",
      both(succeeds(), noted("rerun: whole run")),
    ),
    (
      "S06",
      f"{run}, SIGKILL during the first evaluation, then the same command",
      stop_then_rerun("s06", evaluating, signal.SIGKILL),
      "the rerun: exit 0, the run whole",
      both(succeeds(), noted("rerun: whole run")),
    ),
    (
      "S07",
      f"{run}, SIGTERM after the first step, then the same command",
      stop_then_rerun("s07", stepped, signal.SIGTERM),
      "the rerun: exit 0, the run whole",
      both(succeeds(), noted("rerun: whole run")),
    ),
    (
      "S08",
      f"{run}, SIGKILL after its first checkpoint (step 2), then: ... model.num_layers=2",
      refused_after_kill,
      "exit 2, one line naming model.num_layers; nothing changes",
      both(one_line(2, "model.num_layers"), noted("nothing changed")),
    ),
    (
      "S09",
      f"{run}, SIGKILL after the first step, then: ... train.steps=6",
      stop_then_rerun("s09", stepped, signal.SIGKILL, ("train.steps=6",), steps=6),
      "exit 0: resumed, 6 steps whole, both parts in the summary",
      both(succeeds(), noted("rerun: whole run")),
    ),
    (
      "S10",
      f"{run} twice at once (the second as the first takes the lock)",
      two_at_once,
      "the second: exit 2, one line: in use by another run",
      one_line(2, "in use"),
    ),
    (
      "S11",
      f"{run}, Ctrl-C during the first evaluation, then ... ppo.gae_lambda=0.5",
      stop_then_rerun("s11", evaluating, signal.SIGINT, ("ppo.gae_lambda=0.5",)),
      "exit 0: resumed with the new lambda (recorded in config_history.jsonl), the run whole",
      both(succeeds(), noted("rerun: whole run")),
    ),
  ]
  for id_, shown, run_, expected, check in cases:
    probe(id_, shown, expected, run_, check)


if __name__ == "__main__":
  main()
