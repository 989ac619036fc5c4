"""The only layer that imports tunix.

Sub-layers, lowest first: `compat` (every private tunix name, pinned) < `models` < `cluster`
< `learner` < `rollout` < `aot`.
"""
