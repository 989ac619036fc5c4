"""The application: the run config resolved, the `tunix-ppo-ext` command line, the jobs,
multi-host start, resume."""
