"""The implementation (private: import from the public modules `tunix_ppo_ext`, `.ops`, `.envs`,
`.plugins`, `.config`, `.data`, `.metrics`, `.rollout`, `.models`).

Its layers, lowest first (`LAYERS`; the tunix layer's parts: `TUNIX_PARTS`): a module imports
only its own layer and lower ones. `tests/test_layout.py` checks it and
`docs/reference/layout.md` states it, both from these two tuples.
"""

LAYERS = (
  "checks",  # ConfigError and the value checks: stdlib only
  "names",  # the fixed vocabularies config keys choose from: stdlib only
  "plugins",  # the plugin registry and protocols: stdlib only
  "ops",  # the math (public `tunix_ppo_ext.ops`): jax, numpy, chex
  "data",  # trajectories, rewards, tokenizers, checkpoint files
  "envs",  # the built-in environments
  "metrics",  # metric names, statistics, sinks, plots
  "config",  # the run config: sections, their checks and the loader, without JAX
  "optim",  # the optax optimizers and their NaN guard
  "ppo",  # the rollout phase: advantages, KL shaping, warm-up, over an explicit state
  "tunix",  # everything that imports tunix (or qwix)
  "run",  # the command line and the jobs
)
TUNIX_PARTS = ("compat", "models", "cluster", "rollout", "learner", "aot")
