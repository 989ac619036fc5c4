"""The optimizer layer: optax transformations and their settings (no tunix)."""
