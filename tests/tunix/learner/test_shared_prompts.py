"""Shared prompts (`math.shared_prompts`, `passes.SharedPrompts`): a training pass that runs
each distinct prompt of a batch once, its keys and values handed to every row holding it,
gives what the padded pass gives.

Log-probs, entropy and the gradient of a loss of both are compared shared against padded
for every family the package loads (Gemma 3 takes no such cache: it runs padded), on
groups of rows with one left-padded prompt each and uneven completions (an observation
token, a one-token completion, an empty one, one filling its row). float32 on XLA:CPU:
the shared pass multiplies the same numbers in other shapes, so agreement is to float32
rounding. The host plan is checked against a plain loop.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.rl.rl_cluster import Role

from tests.helpers.learner import setup
from tests.helpers.packing import assert_layout_gives_the_padded_pass
from tests.helpers.passes import assert_trees_close, family_model
from tunix_ppo_ext import PpoExtConfig
from tunix_ppo_ext._src.ops.shared_prompts import plan_shared_prompts
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.learner import passes
from tunix_ppo_ext._src.tunix.learner.ppo_learner import PpoExtLearner
from tunix_ppo_ext._src.tunix.models import hf_models, toy_models

pytestmark = pytest.mark.tunix

PAD, EOS = 0, 1
P, T = 5, 7
# per row: (its group, completion length); groups' prompts are 5, 2 and 3 tokens long
ROWS = [(0, 7), (0, 1), (0, 0), (1, 4), (1, 6), (2, 3), (2, 7), (2, 2)]
PROMPT_LENGTHS = [5, 2, 3]


def episodes(vocab: int, seed: int = 0):
  """`(prompt [B, P], completion [B, T], attention [B, T], loss mask [B, T])`."""
  rng = np.random.default_rng(seed)
  prompts = np.full((len(PROMPT_LENGTHS), P), PAD)
  for g, length in enumerate(PROMPT_LENGTHS):
    prompts[g, P - length :] = rng.integers(2, vocab, length)
  prompt = prompts[[g for g, _ in ROWS]]
  completion, attention = np.full((len(ROWS), T), PAD), np.zeros((len(ROWS), T), np.int32)
  for row, (_, length) in enumerate(ROWS):
    completion[row, :length] = rng.integers(2, vocab, length)
    attention[row, :length] = 1
  loss = attention.astype(np.float32)
  loss[:, 2] = 0.0  # an observation token: attended, no loss
  return tuple(jnp.asarray(x) for x in (prompt, completion, attention, loss))


def reference_plan(prompts: np.ndarray, chunks: list[int]) -> list[list[int]]:
  """Per chunk, the index of each row's prompt among the chunk's distinct prompts in the
  order `np.unique` sorts rows (lexicographic), by a plain loop."""
  out, start = [], 0
  for size in chunks:
    rows = [tuple(r) for r in prompts[start : start + size]]
    order = sorted(set(rows))
    out.append([order.index(r) for r in rows])
    start += size
  return out


@pytest.mark.parametrize("chunks", [[8], [4, 4], [5, 3]])
def test_the_plan_holds_each_row_s_distinct_prompt_within_its_chunk(chunks):
  prompt = np.asarray(episodes(24)[0])
  groups = plan_shared_prompts(prompt, chunks)
  want = reference_plan(prompt, chunks)
  most = max(max(c) + 1 for c in want)
  assert groups is not None and groups.dtype == np.int8
  assert groups.shape[1] == {1: 1, 2: 2, 3: 3}[most]  # a bucket: 1, 2, 3, 4, 6, ...
  assert (groups.sum(1) == 1).all()
  assert groups.argmax(1).tolist() == [i for c in want for i in c]


def test_the_plan_shares_nothing_when_it_would_save_nothing():
  prompt = np.arange(12).reshape(4, 3)  # four distinct prompts in four rows
  assert plan_shared_prompts(prompt) is None
  assert plan_shared_prompts(np.zeros((4, 3)), [2, 2], multiple=2) is None  # 2 columns, 2 rows
  assert plan_shared_prompts(np.zeros((6, 3)), [3, 3], multiple=2).shape == (6, 2)
  assert plan_shared_prompts(np.zeros((6, 0))) is None  # no prompt to share
  with pytest.raises(ValueError, match="do not split 4 rows"):
    plan_shared_prompts(prompt, [3, 3])


@pytest.mark.tunix_facing
@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("fused", [False, True])
def test_log_probs_entropy_and_their_gradient_equal_the_padded_ones(family, fused):
  model = family_model(family)
  prompt, completion, attention, loss = episodes(hf_models.vocab_size(model))
  groups = plan_shared_prompts(np.asarray(prompt))
  assert groups.shape == (len(ROWS), 3)
  assert (compat.kv_cache_dtype(model) is None) == (family == "gemma3")

  layout = passes.SharedPrompts(jnp.asarray(groups))
  assert_layout_gives_the_padded_pass(model, (prompt, completion, attention, loss), layout, fused)


class Recording(PpoExtLearner):
  """Keeps the `prompt_groups` of the examples it hands tunix's trainers, and the layout of
  each role pass's rows (old and reference log-probs, values)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.layouts = []
    layout = self._passes._layout

    def recorded(*layout_args):
      self.layouts.append((layout_args[-1], layout(*layout_args)))
      return self.layouts[-1][1]

    self._passes._layout = recorded

  def _layout(self, example, chunk_sizes):
    out = super()._layout(example, chunk_sizes)
    self.groups = [*getattr(self, "groups", []), out.prompt_groups]
    return out


class Unshared(PpoExtLearner):
  """Hands tunix's trainers the padded examples and runs every role pass padded (the
  feature off, for the comparison)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._passes.share_prompts = False

  def _layout(self, example, chunk_sizes):
    return example


@pytest.mark.tunix_facing
@pytest.mark.parametrize(
  "estimator, micro_batch, rows", [("grpo", None, 4), ("grpo", 1, 2), ("gae", None, 4)]
)
def test_the_learner_trains_the_same_with_shared_prompts(estimator, micro_batch, rows):
  """Two steps (groups of 2 rows on one prompt, KL in the loss, entropy bonus; GRPO, or GAE
  with a critic) through tunix's trainers, whole (2 prompts an example) or in mini- and
  micro-batches of one prompt: each example's rows were grouped by prompt, and the
  actor's (and critic's) weights after training equal the padded run's. The reference's
  log-probs and the critic's values before the update ran each prompt once too."""
  config = PpoExtConfig(
    advantage_estimator=estimator, num_generations=2, kl_penalty="loss", kl_loss_coef=0.1,
    entropy_coef=0.01,
  )  # fmt: skip
  batches = {} if micro_batch is None else {"mini_batch_size": 2, "train_micro_batch_size": 1}
  trained = {}
  for learner_cls in (Unshared, Recording):
    cluster, learner, data = setup(config, num_generations=2, learner_cls=learner_cls, **batches)
    learner.train(data)
    assert cluster.actor_trainer.train_steps == 2
    trainers = [cluster.actor_trainer, cluster.critic_trainer][: 2 if estimator == "gae" else 1]
    trained[learner_cls] = [nnx.state(t.model, nnx.Param) for t in trainers]
  assert learner.groups and all(g is not None for g in learner.groups)
  for groups in learner.groups:
    assert groups.shape == (rows, rows // 2)  # a column per prompt: one or two
    held = np.asarray(groups).argmax(1)
    assert (held[0::2] == held[1::2]).all()  # a group's two rows: one prompt
    assert len(set(held.tolist())) == rows // 2
  shared = {role for role, layout in learner.layouts if isinstance(layout, passes.SharedPrompts)}
  assert {Role.REFERENCE, Role.CRITIC} <= shared, shared
  # Adam scales each gradient entry by its own size: float32 rounding in an entry near zero
  # moves its weight by a fraction of the learning rate (one entry in 1024 by 2.5e-5 seen)
  for padded, shared in zip(trained[Unshared], trained[Recording], strict=True):
    assert_trees_close(padded, shared, atol=1e-4, rtol=1e-5)


@pytest.mark.tunix_facing
def test_models_that_take_no_such_cache_run_padded():
  """Blockwise attention (its cache passes would hold the dense scores it avoids) gives no
  cache dtype: such a pass runs padded, with the padded pass's outputs."""
  model = family_model("qwen3")
  assert compat.kv_cache_dtype(model) == jnp.float32
  compat.use_blockwise_attention(model, 4)
  assert compat.kv_cache_dtype(model) is None
  prompt, completion, attention, _ = episodes(hf_models.vocab_size(model))
  groups = passes.SharedPrompts(jnp.asarray(plan_shared_prompts(np.asarray(prompt))))
  kw = dict(pad_id=PAD, eos_id=EOS, attention_mask=attention)
  shared = passes.compute_per_token_logps(model, prompt, completion, packing=groups, **kw)
  padded = passes.compute_per_token_logps(model, prompt, completion, **kw)
  np.testing.assert_array_equal(np.asarray(shared), np.asarray(padded))


@pytest.mark.tunix_facing
@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_weights_in_one_dtype_computing_in_another_share_in_the_compute_dtype(family):
  """bfloat16 weights (a checkpoint stored so; the LoRA adapters stay float32): the cache
  takes the dtype the projections compute in (Qwen2's config dtype, float32 here; Llama 3's
  weights', bfloat16), and the shared pass gives the padded one's log-probs to bfloat16
  rounding."""
  model = hf_models.cast_params(family_model(family), jnp.bfloat16)
  want = {"qwen2": jnp.float32, "llama": jnp.bfloat16}[family]
  assert compat.kv_cache_dtype(model) == want
  prompt, completion, attention, _ = episodes(hf_models.vocab_size(model))
  groups = passes.SharedPrompts(jnp.asarray(plan_shared_prompts(np.asarray(prompt))))
  kw = dict(pad_id=PAD, eos_id=EOS, attention_mask=attention)
  shared = passes.compute_per_token_logps(model, prompt, completion, packing=groups, **kw)
  padded = passes.compute_per_token_logps(model, prompt, completion, **kw)
  real = np.asarray(attention) != 0
  np.testing.assert_allclose(np.asarray(shared)[real], np.asarray(padded)[real], atol=0.1)


@pytest.mark.tunix_facing
@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2"])
def test_critic_scores_and_their_gradient_equal_the_padded_ones(family):
  """A value model (`models.critic_from_policy`) runs its backbone through the prompt's
  cache as the policy does: scores and the gradient of a loss of them equal the padded
  pass's at every real position."""
  critic = toy_models.critic_from_policy(family_model(family), seed=1)
  assert compat.kv_cache_dtype(critic) == jnp.float32
  prompt, completion, attention, _ = episodes(hf_models.vocab_size(critic.backbone))
  real = np.concatenate([np.asarray(prompt) != PAD, np.asarray(attention) != 0], 1)
  groups = passes.SharedPrompts(jnp.asarray(plan_shared_prompts(np.asarray(prompt))))
  kw = dict(pad_id=PAD, eos_id=EOS, attention_mask=attention, stop_gradient=False)

  def scores(m, shared):
    return passes.compute_score(m, prompt, completion, packing=groups if shared else None, **kw)

  def objective(m, shared):
    return jnp.sum(jnp.square(scores(m, shared) - 0.5) * real)

  padded, shared = (np.asarray(scores(critic, s)) for s in (False, True))
  np.testing.assert_allclose(shared * real, padded * real, atol=2e-5, rtol=1e-5)
  grads = [nnx.grad(objective)(critic, s) for s in (False, True)]
  assert_trees_close(grads[0], grads[1], atol=5e-5, rtol=1e-5)


@pytest.mark.tunix_facing
def test_a_cluster_subclass_s_own_pass_is_called_where_tunix_calls_it():
  """A tunix user's `RLCluster` subclass overriding `get_values`: with rows sharing
  prompts, tunix's learner calls that method for the values, and so does this one (the
  critic's pass then runs padded, through it); the reference's pass still shares."""
  config = PpoExtConfig(
    advantage_estimator="gae", num_generations=2, kl_penalty="loss", kl_loss_coef=0.1
  )
  cluster, learner, data = setup(config, num_generations=2, learner_cls=Recording)
  calls = []

  class OwnValues(type(cluster)):
    def get_values(self, prompt, *args, **kwargs):
      calls.append(prompt.shape)
      return super().get_values(prompt, *args, **kwargs)

  cluster.__class__ = OwnValues
  learner.train(data)
  assert cluster.critic_trainer.train_steps == 2
  assert len(calls) == 2, calls  # one a step, on the whole batch of 4 rows
  shared = {role for role, layout in learner.layouts if isinstance(layout, passes.SharedPrompts)}
  assert Role.REFERENCE in shared and Role.CRITIC not in shared, shared
