"""Text environments: the protocol's checks and factory, and the built-in tasks."""
