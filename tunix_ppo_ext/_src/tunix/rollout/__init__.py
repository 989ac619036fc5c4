"""Multi-turn episodes through tunix's rollout engine; tunix's agentic environments."""
