"""Toy tunix clusters and learners of the learner tests: `setup` (a `PpoExtLearner` on toy Qwen3
models) and tunix's own contract scenarios' cluster (`make_cluster`).
"""

from __future__ import annotations

import jax.numpy as jnp
import optax
from flax import nnx
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl import utils as rl_utils
from tunix.rl.rollout import base_rollout
from tunix.tests import test_common as tc

from tests.helpers.clusters import toy_cluster
from tests.helpers.toy_data import make_prompts_dataset
from tunix_ppo_ext import PpoExtLearner
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.tunix.cluster.mesh import make_mesh

TRAIN_STEPS, EVAL_EVERY = 4, 2


BATCH = 4


PROMPT_LEN = 8


GEN_LEN = 6


def integer_reward(prompts, completions, answer, **_):
  """Matched characters of the answer: integer-valued, so stock tunix does not truncate it."""
  return [
    float(sum(a == b for a, b in zip(c, str(t), strict=False)))
    for c, t in zip(completions, answer, strict=True)
  ]


def setup(
  config,
  *,
  steps=2,
  reward=integer_reward,
  learner_cls=PpoExtLearner,
  seed=0,
  source=None,
  num_generations=1,
  metric_fns=None,
  **cluster_kwargs,
):
  """`(cluster, learner, data)`: a `toy_cluster` of `steps` steps (`cluster_kwargs` go to
  it: `with_critic`, `build_cluster`'s options), `learner_cls` on it, `2 * steps` batches."""
  tokenizer = CharTokenizer(eos_id=0)
  cluster = toy_cluster(
    tokenizer,
    seed,
    prompt_len=PROMPT_LEN,
    tokens_per_call=GEN_LEN,
    max_steps=steps,
    batch=BATCH,
    **cluster_kwargs,
  )
  kwargs = {"trajectory_source": source} if source is not None else {}
  if metric_fns is not None:
    kwargs["metric_fns"] = metric_fns
  learner = learner_cls(cluster, config, reward_fns=None if source else reward, **kwargs)
  data = make_prompts_dataset(steps * 2, BATCH // num_generations, seed=seed)
  return cluster, learner, data


def length_reward(completions, **_):
  return jnp.arange(len(completions), dtype=jnp.float32)


def toy(vocab, seed: int) -> tc.ToyTransformer:
  return tc.ToyTransformer(
    config=tc.ModelConfig(vocab_size=vocab.GetPieceSize()), rngs=nnx.Rngs(seed)
  )


def make_cluster(*, reward_model: bool, eval_temperature: float | None, grad_acc=None, mesh=None):
  vocab = tc.MockVocab()
  actor, reference = toy(vocab, 0), toy(vocab, 0)
  critic = rl_utils.create_critic_model(actor)
  reward = tc.ToyTransformerWithScoreHead(toy(vocab, 2), nnx.Rngs(1)) if reward_model else None
  mesh = make_mesh() if mesh is None else mesh  # one device, Auto axes
  rollout = base_rollout.RolloutConfig(
    max_tokens_to_generate=10, max_prompt_length=256, kv_cache_size=1024
  )
  if eval_temperature is not None:
    other = base_rollout.RolloutConfig(
      max_tokens_to_generate=10,
      max_prompt_length=256,
      kv_cache_size=1024,
      temperature=eval_temperature,
    )
    rollout = {rl_cluster_lib.Mode.TRAIN: rollout, rl_cluster_lib.Mode.EVAL: other}
  config = rl_cluster_lib.ClusterConfig(
    role_to_mesh=dict.fromkeys(rl_cluster_lib.Role, mesh),
    rollout_engine="vanilla",
    offload_to_cpu=False,
    training_config=rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=optax.sgd(1e-3),
      critic_optimizer=optax.sgd(1e-3),
      eval_every_n_steps=EVAL_EVERY,
      max_steps=TRAIN_STEPS,
      gradient_accumulation_steps=grad_acc,
    ),
    rollout_config=rollout,
  )
  cluster = rl_cluster_lib.RLCluster(
    actor=actor,
    critic=critic,
    reference=reference,
    reward=reward,
    tokenizer=vocab,
    cluster_config=config,
  )
  return cluster, actor, critic
