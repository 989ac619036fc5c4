"""Ahead-of-time compilation of a PPO step's pieces (tunix-ppo-ext plan)."""
