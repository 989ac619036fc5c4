"""Configuration sections checked without jax or tunix."""
