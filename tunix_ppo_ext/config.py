"""Names in a configuration resolved to callables, once (`names`)."""

from tunix_ppo_ext._src.math.kl_methods import (
  FULL_KL,
  KL_METHOD_ALIASES,
  KlMethod,
  canonical_kl_method,
  compute_kl_divergence,
  kl_method_names,
  resolve_kl_method,
)

__all__ = [
  "FULL_KL",
  "KL_METHOD_ALIASES",
  "KlMethod",
  "canonical_kl_method",
  "compute_kl_divergence",
  "kl_method_names",
  "resolve_kl_method",
]
