"""`PpoExtConfig`: tunix's `PPOConfig` plus every knob of tunix-ppo-ext, validated eagerly.

Validation runs in `__post_init__`, before any JAX work, and raises `ConfigError`
naming the field, the value and what is allowed: as `PpoExtConfig.<field>`, or by the key
the caller's `keys` (`checks.FieldKeys`) names it (the run config's `ppo.<field>`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from tunix.rl.ppo import ppo_learner

from tunix_ppo_ext._src.checks import (
  ConfigError,
  FieldKeys,
  did_you_mean,
)
from tunix_ppo_ext._src.config import ppo_section
from tunix_ppo_ext._src.config.loss_options import validate_toolbox
from tunix_ppo_ext._src.ops import kl_methods as names
from tunix_ppo_ext._src.ops import ppo_losses as losses
from tunix_ppo_ext._src.plugins import protocols, registry
from tunix_ppo_ext._src.tunix import compat

OWN_KEYS = FieldKeys(owner="PpoExtConfig")  # messages of a config built in Python


@dataclasses.dataclass(slots=True, kw_only=True)
class PpoExtConfig(ppo_learner.PPOConfig):
  """PPO configuration; with no arguments it behaves like tunix's `PPOConfig()`.

  Attributes (beyond `PPOConfig`'s):
    kl_method: per-token estimator (`kl`/`k1`, `abs`, `mse_kl`/`mse`/`k2`, `low_var_kl`/`k3`,
      a plugin's, any of them with a `+` suffix for the straight-through k2 gradient) or
      `full` for the exact full-vocabulary KL (loss placement only).
    kl_penalty: where the KL to the reference goes: `reward` (coefficient `beta`, as tunix),
      `loss` (coefficient `kl_loss_coef`) or `none`.
    kl_ctrl: `fixed` or `adaptive` (Ziegler et al. 2019) controller of the active coefficient.
    kl_target, kl_horizon: the adaptive controller's target KL and horizon.
    loss_agg_mode, value_loss_agg_mode: `token-mean`, `seq-mean-token-sum`,
      `seq-mean-token-mean` or `seq-mean-token-sum-norm`.
    advantage_estimator: `gae`, `turn_gae`, `grpo`, `rloo`, `reinforce_plus_plus`,
      `gigpo`, a plugin's (entry
      points, `tunix_ppo_ext._src.plugins.registry`), or a name in tunix's `function_registry`.
    policy_loss_fn, value_loss_fn: `ppo_ext`, a plugin's, or a name in tunix's registry.
    Plugin names may be pinned to a distribution, `name@distribution`.
    norm_adv_by_std: divide group advantages by the group std (`False` is Dr. GRPO).
    gigpo_step_weight: GiGPO's weight of the step advantage, `omega` (`ops.
      compute_gigpo_advantages`); used only by `advantage_estimator="gigpo"`.
    gigpo_norm_by_std: GiGPO divides its episode and step advantages by their groups' std
      (the paper's and verl-agent's default `mean_std_norm`; False: `mean_norm`).
    whiten_advantages: whiten GAE advantages over the loss mask.
    critic_lambda: GAE lambda of the critic's value targets (`returns`); `None`: `gae_lambda`,
      one lambda for both as in verl and tunix. VC-PPO (arXiv:2503.01491) decouples them:
      1.0 for the critic, below 1 (`gae_lambda`) for the policy's advantages.
    adaptive_lambda_alpha: VAPO's length-adaptive policy lambda (arXiv:2504.05118): each
      row's advantages use `1 - 1 / (alpha * l)` (clipped to [0, 1]) for its `l` agent
      tokens instead of `gae_lambda`; `None`: off (VAPO: 0.05).
    gamma_turn: the discount between agent turns: the step of GAE from one turn's last agent
      token to the next turn's first (RAGEN's bi-level `high_level_gamma`), or per turn of
      the turn-level estimator `turn_gae`; `None`: `gamma`.
    critic_warmup_steps: at most this many first steps train only the critic (value
      pretraining, VC-PPO / VAPO): the actor's loss is 0 and the policy stays the initial
      one, so the critic fits the initial policy's returns.
    critic_warmup_lambda: the GAE lambda of the value targets during the warm-up (1.0:
      Monte Carlo returns, as VC-PPO's value pretraining).
    critic_warmup_until_ev: end the warm-up early, after the first step whose explained
      variance of the critic's values (before that step's update) against the warm-up's
      targets reaches this; `None`: no such end.
    critic_warmup_patience: end the warm-up early, after this many steps in a row without a
      new best explained variance (a plateau); `None`: no such end.
    logits_chunk_size: sequence chunk for log-prob/entropy/KL over logits (0: unchunked).
    fused_head: compute every pass's log-probs and entropy (and the exact KL,
      `kl_method="full"`) from the final hidden states and the LM head's weight,
      `logits_chunk_size` positions at a time (the fused head,
      `ops.fused_logps_and_entropy`, `ops.fused_full_kl_divergence`): no pass holds the
      `[B, T, V]` logits. Needs `logits_chunk_size > 0`; the run config's
      `model.fused_head`.
    packing: run every model pass (log-probs, values, the actor's and critic's updates) on
      the batch's episodes packed into fewer, twice as wide rows (`ops.plan_packing`:
      each episode keeps its positions and attends only to itself), the outputs back in
      the padded layout: the same results with less compute on padding. Needs this
      package's (or a plugin's) policy and value losses; the run config's
      `model.packing`.
    recompute_old_logps: run the old-log-prob pass even where the update's own pass gives
      the old log-probs exactly (one epoch in one optimizer step, nothing reading them
      before the update: `rollout_phase.old_logps_in_update`), e.g. for the sampler-trainer
      gap metric `rollout/logprob_diff`, logged only where the pass runs. False saves that
      forward pass (as tunix's GRPO with one iteration).
    num_generations: samples per prompt; consecutive samples of one prompt form a group for
      the group-based estimators (`grpo`, `rloo`).
    max_nonfinite_steps: consecutive optimizer updates of the actor or the critic skipped
      for a NaN/inf loss or gradient after which the run stops (`NonFiniteTrainingError`,
      with a checkpoint of the last good state); see `tunix_ppo_ext._src.tunix.cluster.nan_guard`.
    logps_temperature: what the trainer divides logits by for log-probs, entropy and KL.
      `None` is tunix 0.1.7's convention (policy log-probs at 1, the reference through
      tunix's pass at the train rollout temperature); a number puts every pass at it
      (verl divides by the rollout temperature; the main job sets it so).
    nonfinite_rewards: what a NaN/inf reward from a reward function, environment or
      trajectory source does: `error` (ValueError naming the episode) or `drop` (the
      episode's loss mask and rewards are zeroed and it is counted, `dropped_episodes`).
    tau_pos, tau_neg, clip_cov_ratio, clip_cov_lb, clip_cov_ub, kl_cov_ratio, ppo_kl_coef:
      knobs of verl's `sapo`, `clip_cov` and `kl_cov` policy losses (verl's defaults;
      `tunix_ppo_ext._src.tunix.learner.verl_loss_fns`).
    rollout_is, rollout_is_threshold, rollout_rs, rollout_rs_threshold,
      rollout_rs_threshold_lower: rollout correction of the sampler-trainer gap, verl's
      `algorithm.rollout_correction` (`tunix_ppo_ext._src.ppo.rollout_correction_step`; checks in
      `tunix_ppo_ext._src.config.loss_options`).

  `keys` (init-only, not a field): how the checks' messages name the fields
  (`checks.FieldKeys`; None: `PpoExtConfig.<field>`).
  """

  policy_loss_fn: str = "ppo_ext"
  value_loss_fn: str = "ppo_ext"
  kl_penalty: str = "reward"
  kl_loss_coef: float = 0.0
  kl_ctrl: str = "fixed"
  kl_target: float = 0.1
  kl_horizon: float = 10000.0
  loss_agg_mode: str = "token-mean"
  value_loss_agg_mode: str = "token-mean"
  norm_adv_by_std: bool = True
  gigpo_step_weight: float = 1.0
  gigpo_norm_by_std: bool = True
  whiten_advantages: bool = True
  critic_lambda: float | None = None
  adaptive_lambda_alpha: float | None = None
  gamma_turn: float | None = None
  critic_warmup_steps: int = 0
  critic_warmup_lambda: float = 1.0
  critic_warmup_until_ev: float | None = None
  critic_warmup_patience: int | None = None
  logits_chunk_size: int = 0
  fused_head: bool = False
  packing: bool = False
  recompute_old_logps: bool = False
  num_generations: int = 1
  max_nonfinite_steps: int = 10
  nonfinite_rewards: str = "error"
  logps_temperature: float | None = None
  tau_pos: float = 1.0
  tau_neg: float = 1.05
  clip_cov_ratio: float = 0.0002
  clip_cov_lb: float = 1.0
  clip_cov_ub: float = 5.0
  kl_cov_ratio: float = 0.0002
  ppo_kl_coef: float = 0.1
  rollout_is: str | None = None
  rollout_is_threshold: float = 2.0
  rollout_rs: str | None = None
  rollout_rs_threshold: float = 2.0
  rollout_rs_threshold_lower: float | None = None
  keys: dataclasses.InitVar[FieldKeys | None] = None

  def __post_init__(self, keys: FieldKeys | None = None):
    # PPOConfig's own __post_init__ refuses every KL method beyond its three, so it is
    # replaced, not extended; its defaulting of the clip ranges is kept.
    if self.epsilon_low is None:
      self.epsilon_low = self.epsilon
    if self.epsilon_high is None:
      self.epsilon_high = self.epsilon
    if self.entropy_coef is None:
      self.entropy_coef = 0.0
    self._validate(keys or OWN_KEYS)
    self.print_config()

  @property
  def uses_critic(self) -> bool:
    """Whether the advantage estimator takes critic values (`gae`), so a critic is built,
    trained and checkpointed; the group estimators (`grpo`, `rloo`, `reinforce_plus_plus`)
    take none, and then no critic exists (as in verl)."""
    return estimator_takes_values(self.advantage_estimator)

  @property
  def target_lambda(self) -> float:
    """The GAE lambda of the critic's value targets after the warm-up (`critic_lambda`,
    else `gae_lambda`)."""
    return self.gae_lambda if self.critic_lambda is None else self.critic_lambda

  @property
  def turn_discount(self) -> float:
    """The discount between agent turns (`gamma_turn`, else `gamma`)."""
    return self.gamma if self.gamma_turn is None else self.gamma_turn

  @property
  def kl_coef(self) -> float:
    """Initial coefficient of the active KL placement (`beta` or `kl_loss_coef`; 0 for none)."""
    return {"reward": self.beta, "loss": self.kl_loss_coef, "none": 0.0}[self.kl_penalty]

  def _validate(self, keys: FieldKeys) -> None:
    values = {name: getattr(self, name) for name in ppo_section.FIELDS}
    for name, value in ppo_section.check_ppo_values(values, keys).items():
      setattr(self, name, value)  # each field alone (the numbers as floats)
    try:
      self.kl_method = names.canonical_kl_method(self.kl_method, include_full=True)
    except ValueError as e:
      raise ConfigError(f"{keys.subject('kl_method')}: {e}") from None
    problem = fused_head_problem(self.fused_head, self.logits_chunk_size, keys)
    if problem:
      _fail(keys, "fused_head", self.fused_head, problem)
    if self.kl_method == names.FULL_KL and self.kl_penalty != "loss":
      penalty = keys.key("kl_penalty")
      _fail(
        keys,
        "kl_method",
        self.kl_method,
        f"used with {penalty}='loss' (the exact KL needs the policy's logits inside the "
        f"loss step); {penalty} is {self.kl_penalty!r}",
      )
    for name in ("loss_agg_mode", "value_loss_agg_mode"):
      try:
        setattr(self, name, losses.canonical_loss_agg_mode(getattr(self, name)))
      except ValueError as e:
        raise ConfigError(f"{keys.subject(name)}: {e}") from None
    for name, kind in _REGISTRY_FIELDS:
      _registry_choice(self, keys, name, kind)
    if self.fused_head and not registry.has(registry.POLICY_LOSSES, self.policy_loss_fn):
      _fail(
        keys,
        "fused_head",
        self.fused_head,
        f"used with a policy loss of this package or a plugin ({keys.key('policy_loss_fn')}="
        f"{self.policy_loss_fn!r} is tunix's, whose pass computes the whole logits)",
      )
    _check_packing(self, keys)
    validate_toolbox(self, keys)
    _check_tunix_losses(self, keys)
    _check_critic_keys(self, keys)
    check_groups(self.advantage_estimator, self.num_generations, keys)


def _check_critic_keys(config: PpoExtConfig, keys: FieldKeys) -> None:
  """The critic's keys need an estimator that takes values; the early end of the warm-up
  needs a warm-up."""
  if not config.uses_critic:
    for name, unset in _CRITIC_KEYS:
      if getattr(config, name) != unset:
        _fail(
          keys,
          name,
          getattr(config, name),
          f"{unset!r} with {keys.key('advantage_estimator')}={config.advantage_estimator!r}, "
          "which uses no critic",
        )
  for name in ("critic_warmup_until_ev", "critic_warmup_patience"):
    if getattr(config, name) is not None and not config.critic_warmup_steps:
      _fail(
        keys,
        name,
        getattr(config, name),
        f"None without a warm-up ({keys.key('critic_warmup_steps')} is 0; it caps the warm-up)",
      )


# critic keys and their value when unset
_CRITIC_KEYS = (("critic_warmup_steps", 0), ("critic_lambda", None))


def _check_tunix_losses(config: PpoExtConfig, keys: FieldKeys) -> None:
  """Refuses, naming both keys, what tunix's own losses (a name only tunix's registry
  holds, e.g. `ppo`) would silently not do: tunix's policy loss takes the KL in the loss
  as k1 on the reference log-probs with the initial `kl_loss_coef` (no other estimator, no
  exact KL, no controller), averages over tokens, and applies no rollout correction;
  tunix's value loss always clips and averages over tokens."""
  policy = config.policy_loss_fn
  if not registry.has(registry.POLICY_LOSSES, policy):
    own = f"used with {keys.key('policy_loss_fn')}={policy!r} (tunix's own loss"
    coef = keys.key("kl_loss_coef")
    if config.kl_penalty == "loss" and config.kl_method != "kl":
      _fail(keys, "kl_method", config.kl_method, f"'kl' {own}: k1 in the loss, whatever is set)")
    if config.kl_penalty == "loss" and config.kl_ctrl != "fixed":
      _fail(keys, "kl_ctrl", config.kl_ctrl, f"'fixed' {own}: the initial {coef} throughout)")
    if config.loss_agg_mode != "token-mean":
      _fail(keys, "loss_agg_mode", config.loss_agg_mode, f"'token-mean' {own}: its only mode)")
    for name in ("rollout_is", "rollout_rs"):
      if getattr(config, name) is not None:
        _fail(keys, name, getattr(config, name), f"None {own}: it applies no correction)")
  value = config.value_loss_fn
  if not registry.has(registry.VALUE_LOSSES, value):
    own = f"used with {keys.key('value_loss_fn')}={value!r} (tunix's own value loss"
    if config.clip_range_value is None:
      _fail(keys, "clip_range_value", None, f"a number > 0 {own}: it always clips)")
    if config.value_loss_agg_mode != "token-mean":
      mode = config.value_loss_agg_mode
      _fail(keys, "value_loss_agg_mode", mode, f"'token-mean' {own}: its only mode)")


def tunix_own_losses(config: Any) -> list[tuple[str, str]]:
  """`(field, name)` of the config's losses (`policy_loss_fn`, `value_loss_fn`) that only
  tunix's registry holds: tunix runs their model pass, on the padded rows."""
  kinds = (("policy_loss_fn", registry.POLICY_LOSSES), ("value_loss_fn", registry.VALUE_LOSSES))
  values = [(name, kind, getattr(config, name)) for name, kind in kinds]
  return [(name, value) for name, kind, value in values if not registry.has(kind, value)]


def _check_packing(config: PpoExtConfig, keys: FieldKeys) -> None:
  """`packing` needs losses whose pass this package runs (tunix's own run theirs)."""
  if not config.packing:
    return
  for name, value in tunix_own_losses(config):
    _fail(
      keys,
      "packing",
      True,
      f"used with a {name.split('_')[0]} loss of this package or a plugin "
      f"({keys.key(name)}={value!r} is tunix's, whose pass runs on the padded rows)",
    )


def fused_head_problem(fused_head: bool, chunk_size: int, keys: FieldKeys = OWN_KEYS) -> str | None:
  """Why the fused head cannot run with this chunk size (None: it can).

  Args:
    fused_head: whether the fused head is on.
    chunk_size: `logits_chunk_size`.
    keys: how the message names `logits_chunk_size`.

  Returns:
    What the fused head must be used with, or None.
  """
  if fused_head and chunk_size == 0:
    chunk = keys.key("logits_chunk_size")
    return f"used with {chunk} > 0 (positions of logits per chunk, e.g. 128)"
  return None


def estimator_takes_values(name: str) -> bool:
  """Whether advantage estimator `name` takes critic values (the learner builds a critic).

  A plugin-registry estimator does when its registration says so (`needs_critic`: the
  built-ins' table, `register(..., needs_critic=)`), or else when its signature names
  `values` or takes `**kwargs` (`registry.needs_critic`); tunix's own estimators always
  get values (tunix's signature).
  """
  if not registry.has(registry.ADVANTAGE_ESTIMATORS, name):
    return True
  return registry.needs_critic(name)


def estimator_takes_groups(name: str) -> bool:
  """Whether advantage estimator `name` compares the episodes of a group (its signature
  names `group_ids`, as `grpo` and `rloo`): with groups of one it has no baseline."""
  if not registry.has(registry.ADVANTAGE_ESTIMATORS, name):
    return False
  wanted = protocols.wanted_inputs(registry.get(registry.ADVANTAGE_ESTIMATORS, name))
  return wanted is not None and "group_ids" in wanted


def groups_of_one_problem(estimator: str, num_generations: int) -> str | None:
  """Why `num_generations` episodes per prompt cannot feed `estimator` (None: they can):
  a group estimator's group of one has no baseline, its advantage the episode's own score
  (tunix's GRPO refuses it too)."""
  if num_generations == 1 and estimator_takes_groups(estimator):
    return (
      f"at least 2 with advantage_estimator={estimator!r}: its groups of one episode have no "
      "baseline (each advantage would be the episode's own score); use reinforce_plus_plus "
      "or gae for one episode per prompt"
    )
  return None


def check_groups(estimator: str, num_generations: int, keys: FieldKeys = OWN_KEYS) -> None:
  """ConfigError naming `num_generations` when its groups cannot feed `estimator`
  (`groups_of_one_problem`): the one check of `PpoExtConfig`, the run config and
  `AgenticPpoConfig`."""
  problem = groups_of_one_problem(estimator, num_generations)
  if problem:
    _fail(keys, "num_generations", num_generations, problem)


_REGISTRY_FIELDS = (
  ("advantage_estimator", registry.ADVANTAGE_ESTIMATORS),
  ("policy_loss_fn", registry.POLICY_LOSSES),
  ("value_loss_fn", registry.VALUE_LOSSES),
)


def _registry_choice(config: PpoExtConfig, keys: FieldKeys, name: str, kind: str) -> None:
  """`config.<name>` must resolve in the plugin registry (first) or in tunix's registry.

  A plugin name is loaded and checked here; `PpoExtLearner` puts it into tunix's registry.
  """
  value = getattr(config, name)
  if not registry.has(kind, value) and compat.tunix_holds(kind, value):
    return
  try:
    compat.check_no_clash(kind, value, registry.get(kind, value))
  except registry.UnknownNameError as err:
    if isinstance(value, str) and "@" in value:
      _fail(keys, name, value, f"a registered name ({err})")
    _choice(config, keys, name, sorted({*registry.names(kind), *compat.tunix_names(kind)}))
  except (registry.PluginError, ValueError) as err:
    raise ConfigError(f"{keys.subject(name)}={value!r} is invalid: {err}") from None


def _fail(keys: FieldKeys, name: str, value: object, allowed: str) -> None:
  raise ConfigError(f"{keys.subject(name)}={value!r} is invalid: must be {allowed}.")


def _choice(config: PpoExtConfig, keys: FieldKeys, name: str, accepted: Iterable[str]) -> None:
  value = getattr(config, name)
  accepted = list(accepted)
  if value not in accepted:
    _fail(keys, name, value, f"one of {accepted}{did_you_mean(value, accepted)}")
