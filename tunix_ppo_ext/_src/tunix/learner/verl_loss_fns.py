"""verl's other policy losses in tunix's policy-loss signature, registered under verl's names.

`gspo`, `sapo`, `geo_mean`, `cispo`, `clip_cov`, `kl_cov`, `gpg` (entry points of the
`tunix_ppo_ext.policy_losses` group, selected with `ppo.policy_loss_fn`): each runs the same
policy pass as `ppo_ext` (`tunix.losses.policy_pass`), computes its policy-gradient term
with `tunix_ppo_ext._src.ops.verl_losses`, and adds the entropy bonus and the KL-in-loss term
exactly as `ppo_ext` does. Their own knobs are `PpoExtConfig` fields (`tau_pos`, `tau_neg`,
`clip_cov_ratio`, `clip_cov_lb`, `clip_cov_ub`, `kl_cov_ratio`, `ppo_kl_coef`; the clip
ranges are `epsilon_low` / `epsilon_high`), read with verl's defaults when the config is
tunix's plain `PPOConfig`. Rollout-correction weights on the example multiply the
per-token loss (`tunix.rollout_correction`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from tunix_ppo_ext._src.ops import verl_losses as pl
from tunix_ppo_ext._src.ops.ppo_losses import add_regularizers
from tunix_ppo_ext._src.tunix.learner import loss_fns as tunix_losses

# verl's defaults (`ActorConfig`, `PolicyLossConfig`) for configs without these fields.
DEFAULTS = {
  "tau_pos": 1.0,
  "tau_neg": 1.05,
  "clip_cov_ratio": 0.0002,
  "clip_cov_lb": 1.0,
  "clip_cov_ub": 5.0,
  "kl_cov_ratio": 0.0002,
  "ppo_kl_coef": 0.1,
}
CLIP_COV_KEY_SEED = 0  # Clip-Cov's key: this seed folded with a checksum of the batch's tokens


def _knob(config: Any, name: str) -> Any:
  return getattr(config, name, DEFAULTS.get(name))


def _clip(config: Any) -> dict[str, float]:
  return {"epsilon_low": config.epsilon_low, "epsilon_high": config.epsilon_high}


def _agg(config: Any) -> dict[str, str]:
  return {"loss_agg_mode": getattr(config, "loss_agg_mode", "token-mean")}


def clip_cov_key(completion_ids: jax.Array) -> jax.Array:
  """Clip-Cov's PRNG key for a batch: `CLIP_COV_KEY_SEED` folded with a position-weighted
  checksum of the tokens, so a rerun on the same batch draws the same tokens and another
  batch draws others (the learner passes no step counter to the loss)."""
  ids = jnp.asarray(completion_ids, jnp.uint32).reshape(-1)
  weights = jnp.arange(1, ids.size + 1, dtype=jnp.uint32) * jnp.uint32(2654435761)
  return jax.random.fold_in(jax.random.key(CLIP_COV_KEY_SEED), jnp.sum(ids * weights))


# name -> pg term `(logp, old_logp, advantages, mask, is_weights, config, example)`
_PG_TERMS: dict[str, Callable[..., tuple[jax.Array, dict[str, jax.Array]]]] = {
  "gspo": lambda *a, w, c, e: pl.gspo_loss(*a, is_weights=w, **_clip(c)),
  "sapo": lambda *a, w, c, e: pl.sapo_loss(
    *a, is_weights=w, tau_pos=_knob(c, "tau_pos"), tau_neg=_knob(c, "tau_neg")
  ),
  "geo_mean": lambda *a, w, c, e: pl.geo_mean_loss(*a, is_weights=w, **_clip(c)),
  "cispo": lambda *a, w, c, e: pl.cispo_loss(*a, is_weights=w, **_clip(c), **_agg(c)),
  "gpg": lambda *a, w, c, e: pl.gpg_loss(*a, is_weights=w, **_agg(c)),
  "clip_cov": lambda *a, w, c, e: pl.clip_cov_loss(
    *a,
    clip_cov_key(e.completion_ids),
    is_weights=w,
    clip_cov_ratio=_knob(c, "clip_cov_ratio"),
    clip_cov_lb=_knob(c, "clip_cov_lb"),
    clip_cov_ub=_knob(c, "clip_cov_ub"),
    **_clip(c),
    **_agg(c),
  ),
  "kl_cov": lambda *a, w, c, e: pl.kl_cov_loss(
    *a,
    is_weights=w,
    kl_cov_ratio=_knob(c, "kl_cov_ratio"),
    ppo_kl_coef=_knob(c, "ppo_kl_coef"),
    **_agg(c),
  ),
}
NAMES = tuple(_PG_TERMS)


def _loss_of_pass(
  name: str, terms: dict[str, Any], train_example: Any, algo_config: Any
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """`pg + entropy and KL terms` of loss `name` on one policy pass's terms (the module doc).

  `loss = pg - entropy_coef * agg(entropy) + kl_coef * agg(KL)`, `agg` the configured
  `loss_agg_mode`.
  """
  mask, agg = terms["loss_mask"], _agg(algo_config)["loss_agg_mode"]
  loss, metrics = _PG_TERMS[name](
    terms["logps"],
    terms["old_logps"],
    train_example.advantages,
    mask,
    w=terms["is_weights"],
    c=algo_config,
    e=train_example,
  )
  entropy_coef = algo_config.entropy_coef or 0.0
  return add_regularizers(
    loss,
    metrics,
    mask,
    agg,
    terms["entropy"],
    entropy_coef,
    terms["per_token_kl"],
    terms["kl_coef"],
  )


def _registered(name: str) -> tunix_losses.PolicyLoss:
  """Loss `name` in tunix's policy-loss signature (one function per entry point)."""
  summary = f"verl's `{name}` policy loss over one policy pass (`_loss_of_pass`)."
  loss_of_pass = functools.partial(_loss_of_pass, name)
  loss_fn = tunix_losses.tunix_policy_loss(f"{name}_policy_loss_fn", summary, loss_of_pass)
  loss_fn.__module__ = __name__  # where its name is defined (pickles by reference)
  return loss_fn


gspo_policy_loss_fn = _registered("gspo")  # GSPO, Zheng et al. 2025
sapo_policy_loss_fn = _registered("sapo")  # SAPO, Gao et al. 2025
geo_mean_policy_loss_fn = _registered("geo_mean")  # GMPO, Zhao et al. 2025
cispo_policy_loss_fn = _registered("cispo")  # CISPO, MiniMax-M1 2025
gpg_policy_loss_fn = _registered("gpg")  # GPG, Chu et al. 2025
clip_cov_policy_loss_fn = _registered("clip_cov")  # Clip-Cov, Cui et al. 2025
kl_cov_policy_loss_fn = _registered("kl_cov")  # KL-Cov, Cui et al. 2025
