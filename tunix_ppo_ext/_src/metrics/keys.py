"""The metrics taxonomy: one table from internal metric names to the keys every sink shows.

tunix's metrics logger emits each scalar as a `jax.monitoring` event `<prefix>/<mode>/<name>`
(`mode` is `train` or `eval`). Its internal name is `<prefix>/<name>`; `TAXONOMY` maps it to
the published key, where `{mode}` stands for the mode. Internal names missing from the
table are published as they are; eval-mode keys without `{mode}` get an `eval/` prefix (so
`actor/pg_loss` evaluated is `eval/actor/pg_loss`). Every key is published at the step
that counts the optimizer updates done (`MetricKeys.step`), the one x-axis of every sink.
`MetricKeys` adds the user's renames and drops (`metrics.rename` / `metrics.drop` in the run
config).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping, Sequence

from tunix_ppo_ext._src.checks import did_you_mean

STATS = ("min", "mean", "max")
# Per-batch statistics the learner computes (internal prefix `batch`; see `batch_stats`).
BATCH_FAMILIES = (
  "old_value",
  "advantage",
  "return",
  "score",
  "reward",
  "episode_return",
  "response_length",
  "num_turns",
)
BATCH_SCALARS = ("truncated_frac", "turn_limit_frac", "success_rate")
BATCH_SCALARS += ("episode_return_std", "in_group_return_std")
# `env/<key>`: an environment's numeric `info` entries (`metrics.episodes`), `{mode}/env/<key>`
ENV_INFO_PREFIX = "env/"
CUSTOM_PREFIX = "custom"
SUMMARY_KEY = "train/episode_return/mean"  # the main job's summary is made of it

# tunix's trainers log these (prefix `actor`/`critic`) at the number of updates done ...
_ACTOR = ("pg_loss", "entropy", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "kl_loss")
_ACTOR += ("grad_norm", "loss")
TUNIX_LOSS_KEYS = frozenset({"actor/loss/entropy"})  # tunix's own `ppo` policy loss's name
_CRITIC = ("vf_loss", "vf_clipfrac", "vpred_mean", "grad_norm", "loss")
TRAINER_PREFIXES = ("actor", "critic")
# ... the learner buffers the rest at tunix's global step, which counts from 0.
_LEARNER_ACTOR = ("kl", "kl_coef", "entropy_coef", "advantage_sq_mean", "advantage_sq_mean_turn")
_LEARNER_ACTOR += ("advantage_noise", "advantage_noise_turn")  # on the true advantage's scale
_LEARNER_ACTOR += ("advantage_noise_trained", "advantage_noise_trained_turn")
_GIGPO = ("gigpo_step_group_size", "gigpo_step_singleton_frac")  # GiGPO's step groups
_LEARNER_ACTOR += _GIGPO
GIGPO_KEYS = frozenset(f"actor/{name}" for name in _GIGPO)
_TIMING = (
  "rollout",
  "old_logp",
  "ref_logp",
  "values",
  "advantages",
  "update_actor",
  "update_critic",
  "step",
  "shadow",  # the shadow estimators' passes (`metrics.shadow_estimators`)
)

ROLLOUT_CORRECTION = ("is_mean", "is_std", "is_max", "is_ess", "is_frac_high", "is_frac_low")
ROLLOUT_CORRECTION += ("rs_masked_frac", "rs_seq_masked_frac")
ROLLOUT_CORRECTION_KEYS = frozenset(f"rollout/{name}" for name in ROLLOUT_CORRECTION)
# DAPO's reward shaping and dynamic sampling (`tunix_ppo_ext._src.run.dapo_section`)
DAPO = ("overlong_penalty", "overlong_frac", "dynamic_sampling_rounds")
DAPO += ("dynamic_sampling_kept_frac", "dynamic_sampling_masked_frac")
DAPO_KEYS = frozenset(f"rollout/{name}" for name in DAPO)
# published only while the feature that makes them is configured (`ppo.rollout_is/rs`, `dapo`,
# tunix's own policy loss, `ppo.critic_warmup_steps`, `ppo.advantage_estimator=gigpo`)
CRITIC_WARMUP_KEYS = frozenset({"critic/warmup", "critic/warmup_steps"})
CONDITIONAL_KEYS = ROLLOUT_CORRECTION_KEYS | DAPO_KEYS | TUNIX_LOSS_KEYS | CRITIC_WARMUP_KEYS
CONDITIONAL_KEYS |= GIGPO_KEYS | {"timing_s/shadow"}

# internal name -> published key (`{mode}`: train/eval); `None` drops the metric by default.
TAXONOMY: dict[str, str | None] = {
  **{f"batch/{f}/{s}": f"{{mode}}/{f}/{s}" for f in BATCH_FAMILIES for s in STATS},
  **{f"batch/{name}": f"{{mode}}/{name}" for name in BATCH_SCALARS},
  **{f"actor/{name}": f"actor/{name}" for name in _ACTOR},
  **{key: key for key in TUNIX_LOSS_KEYS},
  **{f"learner/{name}": f"actor/{name}" for name in _LEARNER_ACTOR},
  "learner/explained_variance": "critic/explained_variance",
  # value pretraining (`tunix_ppo_ext._src.config.critic_warmup`)
  "learner/critic_warmup": "critic/warmup",
  "learner/critic_warmup_steps": "critic/warmup_steps",
  # the NaN guard and non-finite rewards (`tunix_ppo_ext._src.tunix.cluster.nan_guard`)
  "learner/actor_nonfinite_skips": "actor/nonfinite_skips",
  "learner/critic_nonfinite_skips": "critic/nonfinite_skips",
  "learner/dropped_episodes": "{mode}/dropped_episodes",
  "learner/echo_trap": "{mode}/echo_trap",  # `tunix_ppo_ext._src.metrics.collapse`
  "actor/learning_rate": "actor/lr",
  "actor/perplexity": None,  # exp(PPO loss) means nothing
  **{f"critic/{name}": f"critic/{name}" for name in _CRITIC},
  "critic/learning_rate": "critic/lr",
  "critic/perplexity": None,
  "rollout/logprob_diff": "rollout/logprob_diff",
  "rollout/tokens_per_s": "rollout/tokens_per_s",  # agent tokens
  "rollout/completion_tokens_per_s": "rollout/completion_tokens_per_s",  # + observations
  "rollout/chat_template_mismatch": "rollout/chat_template_mismatch",  # tunix.chat
  "rollout/reencoded_turns": "rollout/reencoded_turns",  # the multi-turn rollout's prefills
  # rollout correction (`tunix_ppo_ext._src.ppo.rollout_correction_step`)
  **{f"rollout/{name}": f"rollout/{name}" for name in ROLLOUT_CORRECTION + DAPO},
  **{f"timing_s/{name}": f"timing_s/{name}" for name in _TIMING},
}
# tunix 0.1.7 `PPOLearner`'s own batch metrics, published under their names as well.
TUNIX_NAMES = (
  *(f"rewards/{f}/{s}" for f in ("score", "reward") for s in STATS),
  "rewards/reward_kl_penalty",
  *(f"generation/completions/{s}_length" for s in STATS),
  *(f"advantages/{f}{s}" for f in ("", "returns/", "old_values/") for s in STATS),
)
TAXONOMY |= {name: name for name in TUNIX_NAMES}
MODES = ("train", "eval")


def published_key(internal: str, mode: str) -> str | None:
  """The default key of internal name `prefix/name` in `mode` (None: dropped by default).

  Args:
    internal: the internal metric name, `prefix/name`.
    mode: `"train"` or `"eval"`.

  Returns:
    The published key, or None when the metric is not published by default.
  """
  if internal.startswith(ENV_INFO_PREFIX):  # open-ended: one key per `info` entry
    return f"{mode}/{internal}"
  template = TAXONOMY.get(internal, internal)
  if template is None:
    return None
  if "{mode}" in template:
    return template.format(mode=mode)
  return template if mode == "train" else f"eval/{template}"


def known_keys() -> list[str]:
  """Every default published key of the table, in both modes."""
  keys = {published_key(name, mode) for name in TAXONOMY for mode in MODES}
  return sorted(k for k in keys if k is not None)


@dataclasses.dataclass(frozen=True)
class MetricKeys:
  """Published keys with the user's changes: `rename` (key -> new key), `drop` (keys or globs).

  `key(event)` maps a tunix event to its final key, or `None` when it is dropped or is not
  a training event (JAX's and orbax's own events start with `/`).
  """

  rename: Mapping[str, str] = dataclasses.field(default_factory=dict)
  drop: Sequence[str] = ()
  updates_per_batch: int = 1  # optimizer updates per training batch (epochs x mini-batches)

  def __post_init__(self):
    validate_changes(self.rename, self.drop)
    object.__setattr__(self, "_cache", {})

  def key(self, event: str) -> str | None:
    cache: dict[str, str | None] = self._cache  # type: ignore[attr-defined]
    if event not in cache:
      cache[event] = self._key(event)
    return cache[event]

  def final(self, key: str) -> str | None:
    """A default published key after the user's drops and renames."""
    if any(fnmatch.fnmatchcase(key, pattern) for pattern in self.drop):
      return None
    return self.rename.get(key, key)

  def step(self, event: str, step: int) -> int:
    """The published step: the number of optimizer updates done (tunix's `train_steps`;
    verl's 1-based global step when a batch is one update), for every key alike.

    tunix's trainers already log so (`actor/...`, `critic/...`; an evaluation at the
    updates done before it). The learner's metrics carry tunix's 0-based global step, which
    counts batches: a training batch's metrics go to the first update that trains on it,
    `step * updates_per_batch + 1`, and an evaluation after `step` batches to the updates
    done by then, `step * updates_per_batch`. So every panel of a run shares one x-axis.
    """
    prefix, _, rest = event.partition("/")
    if prefix in TRAINER_PREFIXES:
      return step
    if rest.startswith("train/"):
      return step * self.updates_per_batch + 1
    return step * self.updates_per_batch

  def _key(self, event: str) -> str | None:
    parts = event.split("/", 2)
    if event.startswith("/") or len(parts) < 3 or parts[1] not in MODES:
      return None
    prefix, mode, name = parts
    key = published_key(f"{prefix}/{name}", mode)
    return None if key is None else self.final(key)


def validate_changes(rename: Mapping[str, str], drop: Sequence[str]) -> None:
  """Raises ValueError for a rename of an unknown key, an empty target or an idle drop."""
  known = known_keys()

  def is_known(key: str) -> bool:
    env_info = any(key.startswith(f"{mode}/{ENV_INFO_PREFIX}") for mode in MODES)
    custom = key.split("/")[0] == CUSTOM_PREFIX or key.startswith("eval/custom/")
    return key in known or custom or env_info

  for source, target in rename.items():
    if not is_known(source):
      raise ValueError(f"metrics.rename: unknown metric {source!r}{_suggest(source, known)}")
    if not isinstance(target, str) or not target or target.startswith("/"):
      raise ValueError(
        f"metrics.rename[{source!r}] must be a non-empty key not starting with '/', got {target!r}"
      )
  targets = list(rename.values())
  for source, target in rename.items():
    if targets.count(target) > 1:
      raise ValueError(f"metrics.rename: two metrics renamed to {target!r}; one would be lost")
    if target in known and target not in rename and target != source:
      raise ValueError(
        f"metrics.rename[{source!r}] = {target!r}: that key is already published (it would "
        f"be overwritten); rename {target!r} too, or choose another name"
      )
  for pattern in drop:
    if not isinstance(pattern, str) or not pattern:
      raise ValueError(f"metrics.drop entries must be non-empty strings, got {pattern!r}")
    if not (any(fnmatch.fnmatchcase(k, pattern) for k in known) or is_known(pattern)):
      raise ValueError(f"metrics.drop: {pattern!r} matches no metric{_suggest(pattern, known)}")


def _suggest(name: str, names: Sequence[str]) -> str:
  return did_you_mean(name, names, n=3)


def custom_name(name: str) -> str:
  """Where a user metric function's `name` lands: `custom/<name>` unless it names a section."""
  return name if "/" in name else f"{CUSTOM_PREFIX}/{name}"
