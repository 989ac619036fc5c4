"""`model.packing` (`PpoExtConfig.packing`): every training pass on the batch's episodes
packed into fewer rows gives what the padded rows give.

Log-probs, entropy, values, the losses and their gradients are compared packed against
padded on uneven multi-turn episodes (observation tokens, a one-token completion, an empty
completion, an episode filling its whole row) for each family the package loads, one
micro-batch at a time as tunix slices an example; the learner trains the same with packing
as without, micro-batched; a CLI run trains with it. float32 on XLA:CPU: the packed pass
multiplies the same numbers in other shapes, so agreement is to float32 rounding.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.rl import utils as rl_utils

from tests.helpers.clusters import toy_policy
from tests.helpers.learner import PROMPT_LEN, setup
from tests.helpers.packing import assert_layout_gives_the_padded_pass
from tests.helpers.passes import EOS, PAD, assert_trees_close, family_model
from tests.helpers.runs import SMOKE
from tunix_ppo_ext import PpoExtConfig
from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.run import cli
from tunix_ppo_ext._src.run.run_config import load_resolved
from tunix_ppo_ext._src.tunix.learner import loss_fns as tunix_losses
from tunix_ppo_ext._src.tunix.learner import passes
from tunix_ppo_ext._src.tunix.learner.ppo_learner import PpoExtLearner, TrainExample
from tunix_ppo_ext._src.tunix.models import hf_models, toy_models

pytestmark = pytest.mark.tunix

P, T = 4, 9
# (prompt length, completion length) per row: a full row, one token, none, uneven others
LENGTHS = [(4, 9), (2, 1), (3, 0), (1, 6), (4, 3), (2, 8)]


def episodes(vocab: int, lengths=LENGTHS, seed: int = 0):
  """`(prompt [B, P], completion [B, T], attention [B, T], loss mask [B, T])`: left-padded
  prompts, right-padded completions whose third token is an observation (attended, no loss)."""
  rng = np.random.default_rng(seed)
  b = len(lengths)
  prompt, completion = np.full((b, P), PAD), np.full((b, T), PAD)
  attention = np.zeros((b, T), np.int32)
  for row, (pl, cl) in enumerate(lengths):
    prompt[row, P - pl :] = rng.integers(2, vocab, pl)
    completion[row, :cl] = rng.integers(2, vocab, cl)
    attention[row, :cl] = 1
  loss = attention.astype(np.float32)
  loss[:, 2] = 0.0
  return tuple(jnp.asarray(x) for x in (prompt, completion, attention, loss))


def packing(prompt, attention):
  return passes.packing_of(prompt, attention, PAD)


@pytest.mark.tunix_facing
@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("fused", [False, True])
def test_log_probs_entropy_and_their_gradient_equal_the_padded_ones(family, fused):
  model = family_model(family)
  prompt, completion, attention, loss = episodes(hf_models.vocab_size(model))
  pk = packing(prompt, attention)
  assert pk.rows * pk.width < prompt.shape[0] * (P + T)  # fewer slots than the padded rows

  assert_layout_gives_the_padded_pass(model, (prompt, completion, attention, loss), pk, fused)


def test_critic_scores_equal_the_padded_ones():
  critic = toy_models.make_critic(toy_policy(24).config, seed=1)
  prompt, completion, attention, _ = episodes(24)
  real = np.concatenate([np.asarray(prompt) != PAD, np.asarray(attention) != 0], 1)
  kw = dict(pad_id=PAD, eos_id=EOS, attention_mask=attention)
  padded = passes.compute_score(critic, prompt, completion, **kw)
  pk = packing(prompt, attention)
  packed = passes.compute_score(critic, prompt, completion, packing=pk, **kw)
  np.testing.assert_allclose(np.asarray(packed) * real, np.asarray(padded) * real, atol=2e-5)


def example(vocab: int, chunks: list[int] | None):
  """A `TrainExample` of `episodes` (random advantages, old log-probs and values), packed
  per chunk of rows when `chunks` is given."""
  prompt, completion, attention, loss = episodes(vocab)
  rng = np.random.default_rng(3)
  shape = completion.shape
  ex = TrainExample(
    prompt_ids=prompt, prompt_mask=(prompt != PAD).astype(jnp.int32), completion_ids=completion,
    completion_mask=loss, ref_per_token_logps=jnp.asarray(rng.normal(-3, 0.3, shape), jnp.float32),
    advantages=jnp.asarray(rng.normal(0, 1, shape), jnp.float32),
    returns=jnp.asarray(rng.normal(0.5, 0.2, shape), jnp.float32),
    old_per_token_logps=jnp.asarray(rng.normal(-3, 0.3, shape), jnp.float32),
    old_values=jnp.asarray(rng.normal(0.5, 0.2, shape), jnp.float32),
    attention_mask=attention, loss_mask=loss,
  )  # fmt: skip
  if chunks is None:
    return ex
  slots, segment, k, rows = passes.plan_rows(prompt, attention, PAD, chunks)
  starts = jax.nn.one_hot(segment, rows * k).reshape(-1, rows, k)
  return ex.replace(pack_slots=jnp.asarray(slots), pack_rows=starts)


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("policy_loss_fn", ["ppo_ext", "gspo"])
def test_the_losses_and_gradients_equal_the_padded_ones_micro_batch_by_micro_batch(
  policy_loss_fn, loss_agg_mode
):
  """Each micro-batch tunix slices (two of 4 and 2 rows), packed on its own: the actor's
  loss (KL in the loss, entropy bonus), its metrics and gradient, and the critic's loss and
  gradient equal the padded ones."""
  config = PpoExtConfig(
    policy_loss_fn=policy_loss_fn, entropy_coef=0.01, kl_penalty="loss", kl_loss_coef=0.1,
    loss_agg_mode=loss_agg_mode, packing=True,
  )  # fmt: skip
  actor = registry.get(registry.POLICY_LOSSES, policy_loss_fn)
  policy, critic = toy_policy(24), toy_models.make_critic(toy_policy(24).config, seed=1)
  results = []
  for chunks in (None, [4, 2]):
    whole = example(24, chunks)
    for piece in (slice(0, 4), slice(4, 6)):
      ex = rl_utils.get_batch_slice(whole, piece)
      if chunks is not None:
        _, rows, k = ex.pack_rows.shape
        assert rows * k <= ex.completion_ids.shape[0]  # no more batch widths than rows

      def actor_loss(m, ex=ex):
        return actor(m, ex, config, pad_id=PAD, eos_id=EOS, temperature=0.7)

      def critic_loss(m, ex=ex):
        return tunix_losses.ppo_ext_value_loss_fn(m, ex, 0.2, PAD, EOS, loss_agg_mode)

      (a, a_metrics), a_grad = nnx.value_and_grad(actor_loss, has_aux=True)(policy)
      (c, _), c_grad = nnx.value_and_grad(critic_loss, has_aux=True)(critic)
      results.append((a, a_metrics, a_grad, c, c_grad))
  # gradient entries reach about 50 (sums over every token): float32 rounding of such sums
  # is about 5e-6 of them, so 1e-4 absolute
  for padded, packed in zip(results[:2], results[2:], strict=True):
    np.testing.assert_allclose(float(packed[0]), float(padded[0]), rtol=1e-5, atol=1e-6)
    for key in padded[1]:
      np.testing.assert_allclose(
        float(packed[1][key]), float(padded[1][key]), rtol=1e-5, atol=1e-6, err_msg=key
      )
    assert_trees_close(padded[2], packed[2], atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(float(packed[3]), float(padded[3]), rtol=1e-5, atol=1e-6)
    assert_trees_close(padded[4], packed[4], atol=1e-4, rtol=1e-5)


def uneven_source(learner, training_input, mode):
  """Multi-turn episodes of uneven lengths, fixed by the prompts: left-padded prompts of
  2..8 tokens, completions of 1..6 tokens with one observation token."""
  tokenizer = learner.rl_cluster.tokenizer
  rows = len(training_input["prompts"])
  pad = tokenizer.pad_id()
  prompt = np.full((rows, PROMPT_LEN), pad)
  completion = np.full((rows, 10), pad)
  attention = np.zeros((rows, 10), np.int32)
  rewards = np.zeros((rows, 10), np.float32)
  for row, text in enumerate(training_input["prompts"]):
    ids = tokenizer.encode(text)[-(2 + row % 7) :]
    prompt[row, PROMPT_LEN - len(ids) :] = ids
    rng = np.random.default_rng(len(text) + row)
    length = int(rng.integers(1, 7))
    completion[row, :length] = rng.integers(3, 40, length)
    attention[row, :length] = 1
    rewards[row, length - 1] = float(rng.uniform())
  loss = attention.copy()
  loss[:, 1] = 0  # an observation token
  return TrajectoryBatch(
    prompt_ids=prompt,
    completion_ids=completion,
    attention_mask=attention,
    loss_mask=loss,
    token_rewards=rewards,
  )


class RecordingLearner(PpoExtLearner):
  """Keeps the packed row counts of the examples it hands tunix's trainers."""

  def _layout(self, example, chunk_sizes):
    out = super()._layout(example, chunk_sizes)
    self.packed_rows = [*getattr(self, "packed_rows", []), out.pack_rows]
    return out


@pytest.mark.tunix_facing
def test_the_learner_trains_the_same_packed_micro_batch_by_micro_batch():
  """Two steps of GAE with a critic through tunix's trainers, micro-batches of 2 prompts of
  uneven episodes: the actor's and critic's weights after training equal the padded run's;
  the micro-batches were packed (tunix's split sizes recorded, some example packed into
  fewer rows than it has episodes)."""
  trained = {}
  for packed in (False, True):
    config = PpoExtConfig(beta=0.0, packing=packed)
    cluster, learner, data = setup(
      config, source=uneven_source, mini_batch_size=4, train_micro_batch_size=2,
      learner_cls=RecordingLearner,
    )  # fmt: skip
    learner.train(data)
    assert cluster.actor_trainer.train_steps == 2
    trained[packed] = [
      nnx.state(m, nnx.Param) for m in (cluster.actor_trainer.model, cluster.critic_trainer.model)
    ]
    if packed:
      rows = [r.shape for r in learner.packed_rows]
      assert all(r is not None for r in learner.packed_rows) and len(rows) == 4
      assert all(r[0] == 2 for r in rows) and any(r[1] * r[2] == 1 for r in rows), rows
  for padded, packed in zip(trained[False], trained[True], strict=True):
    assert_trees_close(padded, packed, atol=2e-5, rtol=1e-5)


def test_a_cli_run_trains_with_packing(tmp_path):
  out = tmp_path / "run"
  args = ["train", "--config", str(SMOKE), "train.steps=2", "train.eval_every=100"]
  assert cli.main([*args, "model.packing=true", f"output_dir={out}"]) == 0
  summary = json.loads((out / "summary.json").read_text())
  assert summary["steps"] == 2
  rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  losses = [r["actor/loss"] for r in rows if "actor/loss" in r]
  assert len(losses) == 2 and all(np.isfinite(losses))


@pytest.mark.parametrize(
  "overrides, message",
  [
    (["model.packing=3"], "config key 'model.packing' must be bool, got 3"),
    (["ppo.packing=true"], "config key 'ppo.packing': set model.packing instead"),
    (
      ["model.packing=true", "ppo.policy_loss_fn=ppo"],
      "config key 'model.packing'=True is invalid: must be used with a policy loss of this",
    ),
    (
      ["model.packing=true", "ppo.value_loss_fn=ppo"],
      "config key 'model.packing'=True is invalid: must be used with a value loss of this",
    ),
  ],
)
def test_bad_packing_settings_are_one_line_naming_the_key(overrides, message):
  with pytest.raises(ConfigError) as raised:
    load_resolved(str(SMOKE), overrides)
  assert message in str(raised.value) and "\n" not in str(raised.value)
