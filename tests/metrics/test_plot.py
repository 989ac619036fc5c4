"""`tunix-ppo-ext plot`: only the panels a run logged, one step axis, spikes off-scale."""

from __future__ import annotations

import json

import numpy as np
from matplotlib import image

from tunix_ppo_ext._src.metrics import plot


def test_robust_limits_keep_the_bulk_and_clip_spikes_only():
  values = list(0.75 + 0.01 * np.sin(np.arange(200)))
  assert plot.robust_limits(values) == plot.robust_limits(values + [0.75])  # no spike: all
  low, high = plot.robust_limits([*values, -300.0, -120.0])
  assert -1.0 < low < 0.74 and 0.76 < high < 1.0  # the spikes do not set the scale
  low, high = plot.robust_limits([1.0, -300.0])  # a short curve shows every point
  assert low < -300.0 and high > 1.0
  assert plot.robust_limits([]) is None and plot.robust_limits([2.0, 2.0])[0] < 2.0


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
  from tunix_ppo_ext._src.run import cli  # noqa: PLC0415

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


def test_the_collapse_signals_have_panels_and_the_echo_trap_a_line_on_each(tmp_path, monkeypatch):
  from matplotlib.axes import Axes  # noqa: PLC0415

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
  from matplotlib.axes import Axes  # noqa: PLC0415

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
  from matplotlib.axes import Axes  # noqa: PLC0415

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
