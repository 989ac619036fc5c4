"""tunix-ppo-ext: PPO extensions for Google's tunix."""
