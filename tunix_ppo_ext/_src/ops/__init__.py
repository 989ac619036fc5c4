"""Pure JAX math: masked reductions, log-probs and entropy, KL estimators, losses, advantages."""
