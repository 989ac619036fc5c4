"""The PPO learner's step arithmetic without tunix: the rollout phase (`rollout_phase`)
and its advantages (`advantage_step`), functions of an explicit state that the tunix
learners (`_src/tunix/learner/`) call between their models' passes."""
