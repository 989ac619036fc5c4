"""`tunix-ppo-ext plot`: only the panels a run logged, one step axis, spikes off-scale."""

from __future__ import annotations

import json
import pathlib
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
from matplotlib import image

from tunix_ppo_ext._src.metrics import plot

pytestmark = pytest.mark.tunix


def test_robust_limits_keep_the_bulk_and_clip_spikes_only():
  values = list(0.75 + 0.01 * np.sin(np.arange(200)))
  assert plot.robust_limits(values) == plot.robust_limits(values + [0.75])  # no spike: all
  low, high = plot.robust_limits([*values, -300.0, -120.0])
  assert -1.0 < low < 0.74 and 0.76 < high < 1.0  # the spikes do not set the scale
  low, high = plot.robust_limits([1.0, -300.0])  # a short curve shows every point
  assert low < -300.0 and high > 1.0
  assert plot.robust_limits([]) is None and plot.robust_limits([2.0, 2.0])[0] < 2.0


def test_a_block_of_early_outliers_does_not_set_the_scale_but_a_rising_curve_is_whole():
  bulk = [0.1 + 0.01 * (i % 7) for i in range(192)]
  low, high = plot.robust_limits([1000.0] * 8 + bulk)  # 4% of the points, past the 99th
  assert 0.09 < low < 0.1 and 0.16 < high < 0.17
  assert plot.robust_limits(list(np.linspace(0.0, 1.0, 200))) == (-0.1, 1.1)
  noisy = [min(1.0, s / 50) + 0.05 * (s % 3) for s in range(200)]  # learns, then a plateau
  assert plot.robust_limits(noisy)[0] < 0.0
  low, high = plot.robust_limits([-100.0] * 30 + bulk, bounds=(-1.0, 1.0))  # 13.5%: bounds
  assert 0.09 < low < 0.1 and 0.16 < high < 0.17
  assert plot.robust_limits([-5.0, -4.0], bounds=(-1.0, 1.0)) == (-5.1, -3.9)  # none inside


def test_explained_variance_is_scaled_to_its_later_values_and_says_what_it_leaves_off(tmp_path):
  from matplotlib import pyplot as plt

  rows = [{"step": s, "critic/explained_variance": -100.0 + s} for s in range(1, 11)]
  rows += [{"step": s, "critic/explained_variance": 0.05 * (s % 11)} for s in range(11, 101)]
  rows += [
    {"step": s, "critic/vf_loss": 1e3 if s <= 5 else 0.01 * (1 + s % 5)} for s in range(1, 101)
  ]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  figure = plot.draw_run(tmp_path)
  panels = {axis.get_title(): axis for axis in figure.axes}
  explained = panels["explained variance"]
  assert explained.get_ylim() == pytest.approx((-0.05, 0.55))  # the later values fill it
  notes = [text.get_text() for text in explained.texts]
  assert notes == ["off-scale: 10 points below -1 (steps 1-10)"]
  loss = panels["value loss"]  # no bounds: the first updates' 1e3 dwarf the rest
  assert loss.get_ylim() == pytest.approx((0.006, 0.054))
  assert [text.get_text() for text in loss.texts] == [
    "off-scale: 5 points above the axis (steps 1-5)"
  ]
  plt.close(figure)


def test_a_run_without_critic_or_success_keys_plots_only_its_panels(tmp_path):
  rows = [
    {"step": s, "train/episode_return/mean": s / 10, "actor/entropy": 1.0 / s, "actor/kl": 0.1}
    for s in range(1, 31)
  ]
  (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  out = plot.plot_run(tmp_path)
  height, width = image.imread(out).shape[:2]
  assert width == 3 * 450 and height == 280  # three panels with data, in one row


def _plot_error(run_dir, capsys) -> str:
  from tunix_ppo_ext._src.run import cli

  assert cli.main(["plot", str(run_dir)]) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1, lines
  return lines[0]


def test_bad_run_files_are_one_line_naming_the_file_or_key(tmp_path, capsys):
  good = json.dumps({"step": 1, "actor/entropy": 1.0}) + "\n"
  cases = {
    "bytes": (b"\x88\x01\xff" * 10, None, "metrics.jsonl: not UTF-8 text"),
    "word": (
      json.dumps({"step": 3, "actor/entropy": "high"}) + "\n",
      None,
      "step 3: 'actor/entropy' is 'high'",
    ),
    "cut_config": (good, '{"metrics":\n', "config.json: not JSON"),
    "list_config": (good, "[1, 2]", "config.json: a run's config must be a JSON object"),
  }
  for name, (metrics, config, message) in cases.items():
    run = tmp_path / name
    run.mkdir()
    mode = "wb" if isinstance(metrics, bytes) else "w"
    with open(run / "metrics.jsonl", mode) as handle:
      handle.write(metrics)
    if config is not None:
      (run / "config.json").write_text(config)
    assert message in _plot_error(run, capsys), name
    assert not (run / plot.FILENAME).exists()


def _run_dir(path: pathlib.Path) -> pathlib.Path:
  path.mkdir()
  rows = [{"step": s, "actor/entropy": 1.0 / s, "actor/kl": 0.01 * s} for s in range(1, 31)]
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


# the CLI's `main`, twice: into RUN_DIR, then with `--out`; each exit code printed
TWO_PLOTS = (
  "import sys; from tunix_ppo_ext._src.run import cli; "
  "print(cli.main(['plot', sys.argv[1]]), flush=True); "
  "print(cli.main(['plot', sys.argv[1], '--out', sys.argv[2]]))"
)


def _plot_read_only(run: pathlib.Path, out: pathlib.Path) -> subprocess.CompletedProcess:
  """`TWO_PLOTS` in a fresh process that cannot write `run`: mode 0o555 where that stops
  writes (not root), else a read-only bind mount of it in a user namespace (`unshare`)."""
  command = [sys.executable, "-c", TWO_PLOTS, str(run), str(out)]
  run.chmod(0o555)
  try:
    (run / ".probe").touch()  # root writes through the mode
  except PermissionError:
    pass
  else:
    (run / ".probe").unlink()
    run.chmod(0o755)
    if shutil.which("unshare") is None:
      pytest.skip("running as root without unshare: no read-only directory to be had")
    where = shlex.quote(str(run))
    mount = f'mount --bind {where} {where} && mount -o remount,bind,ro {where} && exec "$@"'
    command = ["unshare", "-rm", "sh", "-c", mount, "sh", *command]
  cwd = pathlib.Path(__file__).resolve().parents[2]  # this checkout's package first
  result = subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=300)
  run.chmod(0o755)
  if result.returncode and "mount" in result.stderr and "Traceback" not in result.stderr:
    pytest.skip(f"no read-only bind mount here: {result.stderr.strip()}")
  return result


def test_a_read_only_run_directory_is_one_line_naming_the_png_and_out(tmp_path):
  run, out = _run_dir(tmp_path / "run"), tmp_path / "elsewhere.png"
  result = _plot_read_only(run, out)
  assert result.stdout.splitlines() == ["2", str(out), "0"], result
  (line,) = result.stderr.strip().splitlines()  # one line, no traceback
  target = repr(str(run / plot.FILENAME))
  assert line in [
    f"tunix-ppo-ext: error: cannot write {target} ({reason}); pass --out PATH to write it elsewhere"
    for reason in ("read-only file system", "permission denied")
  ], line
  assert not (run / plot.FILENAME).exists()
  assert image.imread(out).shape[:2] == (280, 2 * 450)  # entropy and KL, written elsewhere


def test_any_write_failure_is_the_same_one_line_and_out_takes_a_directory(tmp_path, capsys):
  from tunix_ppo_ext._src.run import cli

  run = _run_dir(tmp_path / "run")
  (run / plot.FILENAME).mkdir()  # a directory where the PNG goes
  (tmp_path / "file").write_text("a regular file")
  cases = {
    (): (run / plot.FILENAME, "is a directory"),
    ("--out", str(tmp_path / "file" / "c.png")): (tmp_path / "file" / "c.png", "not a directory"),
  }
  for extra, (target, reason) in cases.items():
    assert cli.main(["plot", str(run), *extra]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
      f"tunix-ppo-ext: error: cannot write {str(target)!r} ({reason}); pass --out PATH to "
      "write it elsewhere\n"
    )
    assert not captured.out
  assert cli.main(["plot", str(run), "--out", str(tmp_path)]) == 0  # a directory: DIR/curves.png
  assert capsys.readouterr().out == f"{tmp_path / plot.FILENAME}\n"
  assert image.imread(tmp_path / plot.FILENAME).shape[:2] == (280, 2 * 450)


@pytest.mark.skipif(not pathlib.Path("/dev/full").exists(), reason="no /dev/full here")
def test_a_write_refused_only_when_the_file_closes_is_the_same_one_line(tmp_path, capsys):
  """/dev/full takes writes and refuses them at close (a full disk can do the same):
  matplotlib's own writing let that pass, and plot printed the path of a PNG never written."""
  from tunix_ppo_ext._src.run import cli

  assert cli.main(["plot", str(_run_dir(tmp_path / "run")), "--out", "/dev/full"]) == 2
  captured = capsys.readouterr()
  assert captured.err == (
    "tunix-ppo-ext: error: cannot write '/dev/full' (no space left on device); pass --out PATH "
    "to write it elsewhere\n"
  )
  assert not captured.out


def test_the_collapse_signals_have_panels_and_the_echo_trap_a_line_on_each(tmp_path, monkeypatch):
  from matplotlib.axes import Axes

  rows = [
    {"step": s, "train/episode_return/mean": 0.1, "actor/grad_norm": 1.0 + s % 3}
    | {"train/in_group_return_std": 1.0 / s}
    | ({"train/echo_trap": 1.0} if s == 12 else {})
    for s in range(1, 31)
  ]
  (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  lines: list[tuple[str, float]] = []
  draw = Axes.axvline

  def recorded(axis, x=0, *args, **kwargs):
    lines.append((axis.get_ylabel() or axis.get_title(), x))
    return draw(axis, x, *args, **kwargs)

  monkeypatch.setattr(Axes, "axvline", recorded)
  out = plot.plot_run(tmp_path)
  height, width = image.imread(out).shape[:2]
  assert width == 3 * 450 and height == 280  # return, return spread, gradient norm
  assert [x for _, x in lines] == [12, 12, 12]  # one dashed line per panel


def test_the_critic_warmup_is_shaded_on_every_panel(tmp_path, monkeypatch):
  from matplotlib.axes import Axes

  rows = [
    {"step": s, "train/episode_return/mean": 0.1 * s, "critic/explained_variance": 0.02 * s}
    | {"critic/warmup": float(s <= 4), "critic/warmup_steps": float(min(s, 4))}
    for s in range(1, 11)
  ]
  (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  spans: list[tuple[float, float]] = []
  draw = Axes.axvspan

  def recorded(axis, low, high, *args, **kwargs):
    spans.append((low, high))
    return draw(axis, low, high, *args, **kwargs)

  monkeypatch.setattr(Axes, "axvspan", recorded)
  plot.plot_run(tmp_path)
  assert spans == [(0.5, 4.5), (0.5, 4.5)]  # return and explained variance panels
  assert plot.warmup_span(rows[4:], plot.MetricKeys()) is None


def test_spread_band_is_the_mean_min_and_max_per_step_over_curves_cut_to_the_shortest():
  runs = [[1.0, -2.0, 4.0, 9.0], [3.0, 0.5, -1.0], [2.0, 2.0, 2.0, 2.0, 2.0]]
  mean, low, high = plot.spread_band(runs)
  for step in range(3):  # the shortest curve has 3 points
    column = [run[step] for run in runs]
    assert mean[step] == sum(column) / 3
    assert (low[step], high[step]) == (min(column), max(column))
  assert len(mean) == len(low) == len(high) == 3
  assert plot.spread_band([[1.0], []]) is None and plot.spread_band([]) is None


def test_plot_spread_draws_each_band_and_the_reference_min_max_and_mean(tmp_path, monkeypatch):
  from matplotlib.axes import Axes

  drawn: dict[str, list] = {"fill_between": [], "axhspan": [], "axhline": [], "plot": []}
  for name in drawn:
    original = getattr(Axes, name)

    def recorded(axis, *args, _name=name, _original=original, **kwargs):
      drawn[_name].append((args, kwargs.get("label")))
      return _original(axis, *args, **kwargs)

    monkeypatch.setattr(Axes, name, recorded)
  curves = {"a": [[0.0, 1.0, 2.0], [2.0, 3.0]], "empty": [[], [1.0]]}
  out = plot.plot_spread(curves, tmp_path / "s.png", "success", ("baseline", [0.1, 0.4, 0.25]))
  assert image.imread(out).shape[:2] == (400, 700)
  (((steps, mean), label),) = drawn["plot"]  # the empty run draws nothing
  assert list(steps) == [1, 2] and list(mean) == [1.0, 2.0] and label == "a (mean of 2)"
  (((_, low, high), _),) = drawn["fill_between"]
  assert list(low) == [0.0, 1.0] and list(high) == [2.0, 3.0]
  assert drawn["axhspan"] == [((0.1, 0.4), "baseline (min-max)")]
  (((level,), label),) = drawn["axhline"]
  assert abs(level - 0.25) < 1e-12 and label == "baseline (mean)"
