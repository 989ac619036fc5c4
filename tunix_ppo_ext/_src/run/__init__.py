"""The application: the run config, `tunix-ppo-ext` command line, multi-host start, resume."""
