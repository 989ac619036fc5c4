"""The only layer that imports tunix: model passes, learner, rollout, cluster, meshes, models,
checkpoints, tokenizer, guards, and `compat` (every private tunix name, pinned)."""
