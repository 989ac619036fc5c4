"""One short PPO run for the parity tests; prints its actor and critic losses as JSON.

Run as a script in its own process (`XLA_FLAGS=--xla_force_host_platform_device_count=4`):
`python parity_run.py VARIANT`, VARIANT one of `shared`, `role_meshes`, `offload`,
`micro1`, `micro2`, `micro4`. Not a test module (no `test_` prefix); `stock_cluster`, the
cluster it trains on, is also the one `test_role_parity` builds in-process.
"""

import json
import sys

import jax
import numpy as np
import optax
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.rollout import base_rollout

from tunix_ppo_ext import PpoExtConfig, PpoExtLearner
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.tunix.cluster.mesh import make_mesh
from tunix_ppo_ext._src.tunix.models import toy_models

Role = rl_cluster_lib.Role


def reward(prompts, completions, **_):
  return [c.count("a") / max(len(c), 1) for c in completions]


def stock_cluster(
  role_to_mesh: dict[Role, jax.sharding.Mesh],
  rollout: base_rollout.RolloutConfig,
  *,
  max_steps: int,
  offload: bool = False,
  logps_micro_batch_size: int | None = None,
) -> rl_cluster_lib.RLCluster:
  """tunix's own `RLCluster`, built without this package's builders: a one-layer toy Qwen3
  with a critic and a reference, SGD at 1e-2 for both trainers, `offload_to_cpu=offload`."""
  tokenizer = CharTokenizer()
  config = toy_models.tiny_qwen3_config(tokenizer.vocab_size, num_layers=1, embed_dim=32)
  policy, critic, reference = toy_models.with_critic_and_reference(
    toy_models.make_policy(config, 0)
  )
  return rl_cluster_lib.RLCluster(
    actor=policy,
    critic=critic,
    reference=reference,
    tokenizer=tokenizer,
    cluster_config=rl_cluster_lib.ClusterConfig(
      role_to_mesh=role_to_mesh,
      rollout_engine="vanilla",
      offload_to_cpu=offload,
      training_config=rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optax.sgd(1e-2),
        critic_optimizer=optax.sgd(1e-2),
        eval_every_n_steps=100,
        max_steps=max_steps,
        compute_logps_micro_batch_size=logps_micro_batch_size,
      ),
      rollout_config=rollout,
    ),
  )


def main(variant: str) -> None:
  devices = jax.devices()
  shared = make_mesh((1, 1), devices=devices[:1])
  meshes = dict.fromkeys(Role, shared)
  if variant == "role_meshes":  # actor and rollout, critic, reference: three meshes
    meshes[Role.CRITIC] = make_mesh((1, 1), devices=devices[1:2])
    meshes[Role.REFERENCE] = make_mesh((1, 1), devices=devices[2:3])
    meshes[Role.REWARD] = meshes[Role.REFERENCE]
  micro = int(variant.removeprefix("micro")) if variant.startswith("micro") else None
  rollout = base_rollout.RolloutConfig(
    max_tokens_to_generate=6, max_prompt_length=16, kv_cache_size=32, temperature=1.0
  )
  cluster = stock_cluster(
    meshes, rollout, max_steps=2, offload=variant == "offload", logps_micro_batch_size=micro
  )
  learner = PpoExtLearner(cluster, PpoExtConfig(beta=0.04), reward_fns=reward)
  batch = {"prompts": np.array(["say a:", "say b:", "say c:", "say d:"])}
  learner.train([batch, batch])
  history = {
    "actor": cluster.actor_trainer.metrics_logger.get_metric_history("actor", "loss", "train"),
    "critic": cluster.critic_trainer.metrics_logger.get_metric_history("critic", "loss", "train"),
  }
  print("PARITY " + json.dumps({k: [float(x) for x in v] for k, v in history.items()}))


if __name__ == "__main__":
  main(sys.argv[1])
