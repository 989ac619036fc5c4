"""`AgenticPpoConfig`: tunix's agentic config plus the PPO keys of `PpoExtConfig`.

The PPO keys (`PPO_FIELDS`) keep `PpoExtConfig`'s names, defaults and meaning; they are
validated by building the `PpoExtConfig` they describe (`ppo_ext_config`), so every check
and error message is that config's (naming `AgenticPpoConfig`). tunix's agentic keys
(`max_response_length`, `num_generations`, `off_policy_steps`, `use_rollout_logps`, ...)
are `AgenticRLConfig`'s.
"""

from __future__ import annotations

import dataclasses

from tunix.rl.agentic import agentic_rl_learner

from tunix_ppo_ext._src.checks import ConfigError, FieldKeys, check_integer, check_number
from tunix_ppo_ext._src.ops import kl_methods as names
from tunix_ppo_ext._src.tunix.learner.ppo_config import PpoExtConfig

# how PpoExtConfig's checks name the shared keys: `AgenticPpoConfig.<field>`
_KEYS = FieldKeys(owner="AgenticPpoConfig")
# the keys shared with `PpoExtConfig` (same names, defaults and checks)
PPO_FIELDS = (
  "advantage_estimator",
  "policy_loss_fn",
  "value_loss_fn",
  "gamma",
  "gae_lambda",
  "critic_lambda",
  "gamma_turn",
  "adaptive_lambda_alpha",
  "norm_adv_by_std",
  "gigpo_step_weight",
  "gigpo_norm_by_std",
  "whiten_advantages",
  "epsilon",
  "epsilon_low",
  "epsilon_high",
  "epsilon_c",
  "entropy_coef",
  "beta",
  "kl_method",
  "kl_penalty",
  "kl_loss_coef",
  "kl_ctrl",
  "kl_target",
  "kl_horizon",
  "kl_clamp_value",
  "loss_agg_mode",
  "value_loss_agg_mode",
  "clip_range_value",
  "logits_chunk_size",
  "logps_temperature",
  "num_generations",
  "num_iterations",
  "critic_warmup_steps",
  "critic_warmup_lambda",
  "rollout_is",
  "rollout_is_threshold",
  "rollout_rs",
  "rollout_rs_threshold",
  "rollout_rs_threshold_lower",
)


@dataclasses.dataclass(slots=True, kw_only=True)
class AgenticPpoConfig(agentic_rl_learner.AgenticRLConfig):
  """tunix's `AgenticRLConfig` with PPO: a critic's values, the project's advantage
  estimators and PPO losses over tunix's agentic episodes (`AgenticPpoLearner`).

  The PPO keys are `PpoExtConfig`'s (same names, defaults and checks; `PPO_FIELDS`):
  `advantage_estimator` (`gae`, `turn_gae`, `grpo`, `rloo`, `reinforce_plus_plus`,
  `gigpo` with `gigpo_step_weight` and `gigpo_norm_by_std`, a plugin's or one registered in
  tunix's `function_registry`; Dr. GRPO is `grpo` with `norm_adv_by_std=False`), `gamma`,
  `gae_lambda`,
  `critic_lambda`, `gamma_turn`, `adaptive_lambda_alpha`, `whiten_advantages`, the clip
  ranges `epsilon`, `epsilon_low`, `epsilon_high`, `epsilon_c`, `entropy_coef`, the KL
  (`beta`, `kl_method`, `kl_penalty`, `kl_loss_coef`, `kl_ctrl`, `kl_target`,
  `kl_horizon`, `kl_clamp_value`), `loss_agg_mode`, `value_loss_agg_mode`,
  `clip_range_value`, the losses `policy_loss_fn` / `value_loss_fn` (default `ppo_ext`),
  `logits_chunk_size`, `logps_temperature` (None: the train rollout's temperature, at
  which the sampler's log-probs were taken) and the critic warm-up of a fixed length
  (`critic_warmup_steps`, `critic_warmup_lambda`: the first steps train only the critic)
  and rollout correction (`rollout_is`, `rollout_is_threshold`, `rollout_rs`,
  `rollout_rs_threshold`, `rollout_rs_threshold_lower`: importance weights and rejection
  from the trainer's old log-probs against the sampler's; it needs
  `use_rollout_logps=False`, so that the old log-probs are the trainer's own, and the
  rollout's `return_logprobs=True`). Not here: the exact KL (`kl_method="full"`), the
  fused head, `PpoExtConfig.packing` and the warm-up's early ends (`critic_warmup_until_ev`,
  `critic_warmup_patience`: tunix scores a step's groups one call at a time, so a step has
  no one explained variance to end it on). Sequence packing is tunix's own
  (`max_seq_token_per_tpu` in the training config): the updates run on tunix's packed
  rows, every loss aggregation mode per episode (`learner.agentic_packing`); it needs this
  package's or a plugin's losses.

  tunix's keys keep their meaning: `num_generations` episodes per prompt form a group,
  `max_response_length` is the width of an episode's tokens (it must equal the rollout's
  `max_tokens_to_generate`), `use_rollout_logps` makes the sampler's log-probs the
  old (behaviour) log-probs, so an off-policy batch (`off_policy_steps`) is corrected
  with the policy it was sampled with.

  `max_tokens_per_turn` (this learner's, not tunix's; None by default): the most tokens one
  model call (one agent turn) may generate, an integer in `[1, max_response_length]`.
  tunix's loop gives each call what is left of the episode's `max_response_length`, so one
  long reply can spend the budget of every later turn; with a cap, each turn gets at most
  `min(max_tokens_per_turn, what is left)` (as `max_tokens_to_generate` bounds a reply in
  single-turn tunix). A reply cut at the cap ends without its end-of-sequence token and is
  trained as it was sampled. None: tunix's behaviour.
  """

  algo_variant: str = "agentic_ppo"
  advantage_estimator: str = "gae"
  policy_loss_fn: str = "ppo_ext"
  value_loss_fn: str = "ppo_ext"
  gamma: float = 1.0
  gae_lambda: float = 0.95
  critic_lambda: float | None = None
  gamma_turn: float | None = None
  adaptive_lambda_alpha: float | None = None
  norm_adv_by_std: bool = True
  gigpo_step_weight: float = 1.0
  gigpo_norm_by_std: bool = True
  whiten_advantages: bool = True
  epsilon: float = 0.2
  epsilon_low: float | None = None
  epsilon_high: float | None = None
  epsilon_c: float | None = None
  entropy_coef: float | None = None
  beta: float = 0.04
  kl_method: str = "low_var_kl"
  kl_penalty: str = "reward"
  kl_loss_coef: float = 0.0
  kl_ctrl: str = "fixed"
  kl_target: float = 0.1
  kl_horizon: float = 10000.0
  loss_agg_mode: str = "token-mean"
  value_loss_agg_mode: str = "token-mean"
  clip_range_value: float | None = 0.2
  logits_chunk_size: int = 0
  logps_temperature: float | None = None
  critic_warmup_steps: int = 0
  critic_warmup_lambda: float = 1.0
  rollout_is: str | None = None
  rollout_is_threshold: float = 2.0
  rollout_rs: str | None = None
  rollout_rs_threshold: float = 2.0
  rollout_rs_threshold_lower: float | None = None
  max_tokens_per_turn: int | None = None

  def __post_init__(self):
    self._check_agentic_keys()
    # AlgorithmConfig's own check allows tunix's estimator and loss names only: replaced
    ppo = self.ppo_ext_config()
    for name in PPO_FIELDS:  # defaults filled in and names made canonical, as PpoExtConfig's
      setattr(self, name, getattr(ppo, name))
    if self.kl_method == names.FULL_KL:
      raise ConfigError(
        "AgenticPpoConfig.kl_method='full' is invalid: must be a per-token estimator "
        "(the exact KL is PpoExtLearner's)."
      )
    for key in ("rollout_is", "rollout_rs"):
      if getattr(self, key) is not None and self.use_rollout_logps:
        raise ConfigError(
          f"AgenticPpoConfig.{key}={getattr(self, key)!r} needs use_rollout_logps=False: "
          "with the sampler's log-probs as the old ones every weight is 1."
        )
    self._check_turn_budget()

  def _check_agentic_keys(self) -> None:
    """ConfigError (one line, naming the key) for tunix's agentic keys that tunix's own
    config accepts and its loop cannot run: `max_response_length` and `max_concurrency`
    below 1 (episodes cut at once; no episode ever runs), `off_policy_steps` below 0
    (no prompt is ever queued: the loop waits forever), an `episode_timeout` that is not a
    positive finite number of seconds (at 0 or below every episode times out at once)."""
    check_integer("AgenticPpoConfig.max_response_length", self.max_response_length, 1)
    check_integer("AgenticPpoConfig.max_concurrency", self.max_concurrency, 1)
    check_integer("AgenticPpoConfig.off_policy_steps", self.off_policy_steps, 0)
    check_number("AgenticPpoConfig.episode_timeout", self.episode_timeout, 0.0, low_open=True)

  def _check_turn_budget(self) -> None:
    """ConfigError (one line) unless `max_tokens_per_turn` is None or an integer in
    `[1, max_response_length]` (a cap above the episode's budget never binds)."""
    cap = self.max_tokens_per_turn
    if cap is None:
      return
    name = "AgenticPpoConfig.max_tokens_per_turn"
    check_integer(name, cap, 1)
    if cap > self.max_response_length:
      raise ConfigError(
        f"{name}={cap!r} is invalid: must be at most "
        f"max_response_length={self.max_response_length} (the episode's whole budget)."
      )

  def ppo_ext_config(self) -> PpoExtConfig:
    """The `PpoExtConfig` of the PPO keys (validated as it is built): what the project's
    losses and estimators read. A bad key raises ConfigError naming `AgenticPpoConfig`."""
    values = {name: getattr(self, name) for name in PPO_FIELDS}
    return PpoExtConfig(**values, keys=_KEYS)
