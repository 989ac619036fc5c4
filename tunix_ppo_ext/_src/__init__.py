"""The implementation (private: import from the public modules `tunix_ppo_ext`, `.ops`, `.envs`,
`.plugins`, `.config`, `.data`, `.metrics`, `.rollout`, `.models`).

Layers, lowest first; a module imports only its own layer and lower ones:
`checks` < `plugins` < `math` < `data` < `envs` < `config` < `metrics` < `tunix` < `run`.
"""
