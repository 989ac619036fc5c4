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
