"""Pure JAX math (jax, numpy and chex only): every function takes arrays and callables.

Masked reductions; log-probs, entropy and the full-vocabulary KL from logits, and
log-probs and entropy from hidden states through a fused LM head; per-token
KL estimators and KL controllers; PPO policy and value losses with verl's aggregation
modes; verl's other policy losses (GSPO, SAPO, GMPO, CISPO, Clip-Cov, KL-Cov, GPG);
advantage estimators (GAE, turn-level GAE, GRPO, RLOO, REINFORCE++, GiGPO); rollout
correction (verl's `rollout_is` / `rollout_rs`); DAPO's overlong penalty and informative
groups; score normalization; segment-masked attention computed blockwise
(`segment_attention`, never a
`[T, T]` array; segment ids from an attention mask or packed episode lengths, the mask
tunix's TPU splash kernel takes); packing a batch's episodes into fewer rows and back
(`plan_packing`, `pack`, `unpack`, `packed_model_inputs`). Nothing here knows tunix;
`kl_divergence` takes the estimator as a callable (the by-name form, tunix's signature, is
`tunix_ppo_ext.compute_kl_divergence`).
"""

from tunix_ppo_ext._src.ops.advantages import (
  compute_gae_advantages,
  compute_gigpo_advantages,
  compute_grpo_advantages,
  compute_reinforce_plus_plus_advantages,
  compute_rloo_advantages,
  compute_turn_gae_advantages,
  length_adaptive_lambda,
)
from tunix_ppo_ext._src.ops.attention import (
  packed_segment_ids,
  segment_attention,
  segment_ids_from_mask,
)
from tunix_ppo_ext._src.ops.kl import (
  AdaptiveKLController,
  FixedKLController,
  kl_abs,
  kl_divergence,
  kl_k1,
  kl_k2,
  kl_k3,
  make_kl_controller,
)
from tunix_ppo_ext._src.ops.logits import (
  full_kl_divergence,
  fused_full_kl_divergence,
  fused_logps_and_entropy,
  logps_and_entropy,
)
from tunix_ppo_ext._src.ops.masked import masked_mean, masked_sum, masked_whiten
from tunix_ppo_ext._src.ops.overlong import informative_groups, overlong_penalty
from tunix_ppo_ext._src.ops.packing import Packing, pack, packed_model_inputs, plan_packing, unpack
from tunix_ppo_ext._src.ops.ppo_losses import (
  aggregate_loss,
  entropy_from_logits,
  policy_loss,
  value_loss,
)
from tunix_ppo_ext._src.ops.rollout_correction import rollout_is_weights, rollout_rejection_mask
from tunix_ppo_ext._src.ops.score_norm import normalize_scores, top_spread_groups
from tunix_ppo_ext._src.ops.verl_losses import (
  cispo_loss,
  clip_cov_loss,
  geo_mean_loss,
  gpg_loss,
  gspo_loss,
  kl_cov_loss,
  sapo_loss,
)

__all__ = [
  "AdaptiveKLController",
  "FixedKLController",
  "Packing",
  "aggregate_loss",
  "cispo_loss",
  "clip_cov_loss",
  "compute_gae_advantages",
  "compute_gigpo_advantages",
  "compute_grpo_advantages",
  "compute_reinforce_plus_plus_advantages",
  "compute_rloo_advantages",
  "compute_turn_gae_advantages",
  "entropy_from_logits",
  "full_kl_divergence",
  "fused_full_kl_divergence",
  "fused_logps_and_entropy",
  "geo_mean_loss",
  "gpg_loss",
  "gspo_loss",
  "informative_groups",
  "kl_abs",
  "kl_divergence",
  "kl_cov_loss",
  "kl_k1",
  "kl_k2",
  "kl_k3",
  "length_adaptive_lambda",
  "logps_and_entropy",
  "make_kl_controller",
  "masked_mean",
  "masked_sum",
  "masked_whiten",
  "normalize_scores",
  "overlong_penalty",
  "pack",
  "packed_model_inputs",
  "packed_segment_ids",
  "plan_packing",
  "policy_loss",
  "rollout_is_weights",
  "rollout_rejection_mask",
  "sapo_loss",
  "segment_attention",
  "segment_ids_from_mask",
  "top_spread_groups",
  "unpack",
  "value_loss",
]
