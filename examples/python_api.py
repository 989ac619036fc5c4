"""PpoExtLearner from Python: tunix's own RLCluster and ClusterConfig, a tiny Qwen3, a reward.

Run it with `python examples/python_api.py` (CPU, about a minute). The docs page
"Coming from tunix's PPOLearner" shows this file; `tests/run/test_python_api.py` runs it.
"""

import numpy as np
from flax import nnx
from tunix.models.qwen3 import model as qwen3
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl import utils as rl_utils
from tunix.rl.rollout import base_rollout

from tunix_ppo_ext import PpoExtConfig, PpoExtLearner
from tunix_ppo_ext.data import CharTokenizer
from tunix_ppo_ext.models import guarded_adam, make_mesh

# 1. A tokenizer and a tiny tunix Qwen3 (any tunix model and tokenizer work the same way).
tokenizer = CharTokenizer()  # built-in characters; a Hugging Face tokenizer works too
config = qwen3.ModelConfig(
  num_layers=1, vocab_size=tokenizer.vocab_size, embed_dim=32, hidden_dim=64, num_heads=2,
  head_dim=16, num_kv_heads=1, rope_theta=10_000, norm_eps=1e-6, use_tied_embedding=False,
)  # fmt: skip
actor = qwen3.Qwen3(config, rngs=nnx.Rngs(0))
reference = qwen3.Qwen3(config, rngs=nnx.Rngs(0))
critic = rl_utils.create_critic_model(actor)  # tunix's value head on the policy's backbone

# 2. tunix's cluster, exactly as for tunix's own PPOLearner.
mesh = make_mesh()  # jax.make_mesh with Auto axis types, one device here
cluster = rl_cluster_lib.RLCluster(
  actor=actor,
  critic=critic,
  reference=reference,
  tokenizer=tokenizer,
  cluster_config=rl_cluster_lib.ClusterConfig(
    role_to_mesh=dict.fromkeys(rl_cluster_lib.Role, mesh),
    rollout_engine="vanilla",
    offload_to_cpu=False,
    training_config=rl_cluster_lib.RLTrainingConfig(
      # optax's Adam behind a NaN guard: a NaN or inf update is skipped, not applied
      actor_optimizer=guarded_adam(1e-3),
      critic_optimizer=guarded_adam(1e-3),
      eval_every_n_steps=10,
      max_steps=3,
    ),
    rollout_config=base_rollout.RolloutConfig(
      max_tokens_to_generate=8, max_prompt_length=16, kv_cache_size=32, temperature=1.0
    ),
  ),
)


# 3. A reward function with tunix's signature: prompts, completions, the batch's other keys.
def count_a(prompts, completions, **kwargs):
  return [c.count("a") / max(len(c), 1) for c in completions]


# 4. Data in the format tunix expects: an iterable of batches, each a dict of NumPy arrays
#    (one string per row under "prompts"; a Python list is refused with a clear error).
train_ds = [{"prompts": np.array(["say a:", "say b:"])} for _ in range(3)]

# 5. The two lines a tunix user changes: PPOConfig -> PpoExtConfig, PPOLearner -> PpoExtLearner.
learner = PpoExtLearner(
  rl_cluster=cluster,
  ppo_config=PpoExtConfig(kl_method="low_var_kl", entropy_coef=0.01, epsilon_c=3.0),
  reward_fns=count_a,
)
learner.train(train_ds)
print("trained steps:", cluster.actor_trainer.train_steps)
