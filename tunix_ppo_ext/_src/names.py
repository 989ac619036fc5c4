"""The fixed vocabularies that config keys choose from and lower layers dispatch on (stdlib
only): a config section checks a choice against the same tuple the math reads, without
importing the math (the light configuration layer, `tunix_ppo_ext._src.config`)."""

from __future__ import annotations

# `shaping.method`: `ops.normalize_scores`' methods
SCORE_NORMALIZATIONS = ("identity", "mean", "mean_std", "asym_clip")
# `shaping.grouping`: the episodes a score is normalized among (`data.score_shaping`)
GROUPINGS = ("group", "batch", "state")
# `dapo.filter_groups.metric`: the score dynamic sampling keeps groups by
SCORE_METRICS = ("seq_reward", "episode_return")
# `ppo.nonfinite_rewards`: what a NaN/inf reward does (`data.rewards`)
NONFINITE_REWARD_MODES = ("error", "drop")
# `ppo.rollout_is`: the level of verl's truncated importance weights (`ops.rollout_correction`)
ROLLOUT_IS_LEVELS = ("token", "sequence")
# `ppo.rollout_rs`, rejection sampling's mode `<level>_<statistic>`: level token / seq_sum /
# seq_mean / seq_max; statistic of the log-ratio l = p - q: k1 = -l (two-sided band),
# k2 = l^2 / 2, k3 = e^l - 1 - l (upper only).
ROLLOUT_RS_MODES = (
  "token_k1",
  "token_k2",
  "token_k3",
  "seq_sum_k1",
  "seq_sum_k2",
  "seq_sum_k3",
  "seq_mean_k1",
  "seq_mean_k2",
  "seq_mean_k3",
  "seq_max_k2",
  "seq_max_k3",
)
