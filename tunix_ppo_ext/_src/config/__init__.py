"""The run config without JAX, tunix or transformers: its sections with their checks
(`run_sections`, `recipe_sections`, `rollout_sections`, `ppo_section`, ...) and the loader
that reads a YAML file and overrides into a checked `RunConfig` (`loader`)."""
