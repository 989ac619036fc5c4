"""Metrics: the key taxonomy every sink shows, readers of what a run wrote, and its plot.

`published_key` maps tunix's and this package's metric names to the grouped keys
(`train/`, `eval/`, `actor/`, `critic/`, `timing_s/`); `read_jsonl` and `read_tensorboard`
read a run's `metrics.jsonl` and TensorBoard events back; `plot_run` draws `curves.png`,
`plot_spread` curves of several seeds with their spread, smoothed by `trailing_mean`.
`EchoTrapRule` and `echo_trap_step` detect RAGEN's multi-turn collapse in a run's rows
(`EchoTrapWatch` does it while the main job trains, warning with `EchoTrapWarning`).
`signal_coefficients` and `common_scale_noise` put every advantage estimator's noise on the
true advantage's scale (the metrics guide, "The advantages' noise").
"""

from tunix_ppo_ext._src.metrics.collapse import (
  EchoTrapRule,
  EchoTrapWarning,
  EchoTrapWatch,
  echo_trap_step,
)
from tunix_ppo_ext._src.metrics.keys import known_keys, published_key
from tunix_ppo_ext._src.metrics.plot import plot_run, plot_spread
from tunix_ppo_ext._src.metrics.signal import common_scale_noise, signal_coefficients
from tunix_ppo_ext._src.metrics.sinks import jsonl_sink, read_jsonl, read_tensorboard
from tunix_ppo_ext._src.metrics.stats import trailing_mean

__all__ = [
  "EchoTrapRule",
  "EchoTrapWarning",
  "EchoTrapWatch",
  "echo_trap_step",
  "jsonl_sink",
  "known_keys",
  "plot_run",
  "plot_spread",
  "published_key",
  "common_scale_noise",
  "signal_coefficients",
  "read_jsonl",
  "read_tensorboard",
  "trailing_mean",
]
