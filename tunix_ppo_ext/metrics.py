"""Metrics: the key taxonomy every sink shows, readers of what a run wrote, and its plot.

`published_key` maps tunix's and this package's metric names to the grouped keys
(`train/`, `eval/`, `actor/`, `critic/`, `timing_s/`); `read_jsonl` and `read_tensorboard`
read a run's `metrics.jsonl` and TensorBoard events back; `plot_run` draws `curves.png`.
"""

from tunix_ppo_ext._src.metrics.keys import known_keys, published_key
from tunix_ppo_ext._src.metrics.plot import plot_run, plot_spread
from tunix_ppo_ext._src.metrics.sinks import jsonl_sink, read_jsonl, read_tensorboard

__all__ = [
  "jsonl_sink",
  "known_keys",
  "plot_run",
  "plot_spread",
  "published_key",
  "read_jsonl",
  "read_tensorboard",
]
