"""Example tunix-ppo-ext plugin; each entry point lives in its own module (loaded lazily).

- `kl.huber_kl` (group `tunix_ppo_ext.kl_estimators`, name `huber_kl`)
- `advantages.batch_baseline` (group `tunix_ppo_ext.advantage_estimators`)
- `env.EchoEnv` (group `tunix_ppo_ext.environments`, name `echo`)
"""
