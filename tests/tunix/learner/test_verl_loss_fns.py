"""verl's other policy losses, rollout correction and DAPO: through the CLI and on a real model.

`test_cli_trains_with_the_registered_losses`: the smoke config (tunix's learner, cluster and
toy Qwen3), one update with three registered losses in one process; `gspo` with rollout
correction on (a sampling temperature of 0.7 against log-probs at 1.0: a real
sampler-trainer gap), `cispo` with DAPO's overlong penalty and dynamic sampling; the metrics
are finite and the conditional `rollout/` ones there and in range.
`test_registered_loss_is_the_ops_loss_of_the_policy_pass` checks every entry point's loss
value against the ops function on a real toy Qwen3 (so the CLI runs cover the wiring and
the conditional metrics, not each loss again).
"""

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers.clusters import toy_policy
from tests.helpers.runs import SMOKE
from tunix_ppo_ext._src.metrics import keys as metric_keys
from tunix_ppo_ext._src.ops import verl_losses as pl
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.run import cli
from tunix_ppo_ext._src.tunix.learner import loss_fns as tunix_losses
from tunix_ppo_ext._src.tunix.learner import passes
from tunix_ppo_ext._src.tunix.learner.ppo_config import PpoExtConfig
from tunix_ppo_ext._src.tunix.learner.ppo_learner import TrainExample
from tunix_ppo_ext._src.tunix.learner.verl_loss_fns import NAMES, clip_cov_key

# tunix_facing: also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.tunix, pytest.mark.tunix_facing]

CORRECTION = ["ppo.rollout_is=token", "ppo.rollout_rs=token_k1", "ppo.rollout_rs_threshold=1.5"]
# a sampling temperature of 0.7 against log-probs at 1.0: a real sampler-trainer gap
CORRECTION += ["train.temperature=0.7", "ppo.logps_temperature=1.0", "ppo.kl_penalty=loss"]
DAPO = ["dapo.overlong_buffer.enable=true", "dapo.overlong_buffer.len=6"]
DAPO += ["dapo.filter_groups.enable=true", "dapo.filter_groups.max_num_gen_batches=2"]
EXTRA = {"gspo": CORRECTION, "cispo": DAPO}  # one loss with each, to keep the test short
CHEAP = ["train.steps=1", "train.batch_size=4", "train.eval_batches=0", "train.eval_every=100"]
CHEAP += ["ppo.advantage_estimator=grpo", "ppo.num_generations=2", "ppo.kl_penalty=none"]


CLI_NAMES = ("gspo", "cispo", "kl_cov")  # a sequence-level ratio, a clipped weight, a selection


def test_cli_trains_with_the_registered_losses(tmp_path):
  """One update of the smoke config per loss of `CLI_NAMES` (one process, one after the
  other; group estimator, no critic, no KL); finite metrics. `gspo` runs with rollout
  correction on (token-level TIS and IcePop-style rejection), `cispo` with DAPO's overlong
  penalty and dynamic sampling: their metrics are there and in range."""
  assert set(CLI_NAMES) <= set(NAMES)
  runs = {}
  for name in CLI_NAMES:
    out = tmp_path / name
    args = ["train", "--config", str(SMOKE), "--output-dir", str(out), *CHEAP]
    args += [f"ppo.policy_loss_fn={name}", *EXTRA.get(name, [])]
    assert cli.main(args) == 0, name
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    values = {k: v for row in rows for k, v in row.items() if k != "step"}
    assert all(math.isfinite(v) for v in values.values()), (name, values)
    assert {"actor/pg_loss", "actor/ppo_kl", "actor/entropy", "actor/grad_norm"} <= set(values)
    conditional = {k for k in values if k in metric_keys.CONDITIONAL_KEYS}
    expected = {"gspo": metric_keys.ROLLOUT_CORRECTION_KEYS, "cispo": metric_keys.DAPO_KEYS}
    assert conditional == expected.get(name, set()), name
    runs[name] = values
  gspo, cispo = runs["gspo"], runs["cispo"]
  assert gspo["rollout/logprob_diff"] > 0  # the temperature gap is real
  assert 0 < gspo["rollout/is_ess"] <= 1 and gspo["rollout/is_max"] > 0
  assert 0 <= gspo["rollout/rs_masked_frac"] <= 1 and 0 <= gspo["rollout/rs_seq_masked_frac"] <= 1
  assert -1 <= cispo["rollout/overlong_penalty"] <= 0 <= cispo["rollout/overlong_frac"] <= 1
  assert cispo["rollout/dynamic_sampling_rounds"] in (1, 2)
  for key in ("kept_frac", "masked_frac"):
    assert 0 <= cispo[f"rollout/dynamic_sampling_{key}"] <= 1, key


def _example(weights=None):
  """A `TrainExample` of 3 rows on a 16-token vocabulary: an empty loss row, a one-token row."""
  rng = np.random.default_rng(0)
  prompt = jnp.asarray(rng.integers(3, 16, (3, 4)), jnp.int32)
  completion = jnp.asarray(rng.integers(3, 16, (3, 5)), jnp.int32)
  mask = jnp.asarray([[1, 1, 0, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], jnp.float32)
  return TrainExample(
    prompt_ids=prompt,
    prompt_mask=jnp.ones_like(prompt),
    completion_ids=completion,
    completion_mask=mask,
    ref_per_token_logps=None,
    advantages=jnp.asarray(rng.normal(0, 1, (3, 5)), jnp.float32),
    returns=jnp.zeros((3, 5)),
    old_per_token_logps=jnp.asarray(rng.normal(-2.8, 0.3, (3, 5)), jnp.float32),
    old_values=jnp.zeros((3, 5)),
    attention_mask=jnp.ones_like(completion),
    loss_mask=mask,
    rollout_is_weights=weights,
  )


@pytest.mark.parametrize("name", NAMES)
def test_registered_loss_is_the_ops_loss_of_the_policy_pass(name):
  """The entry point's `pg_loss` is the ops function on the model's log-probs, with the
  config's knobs; constant rollout weights of 2 double it; the entropy term is added."""
  model = toy_policy(16)
  config = PpoExtConfig(policy_loss_fn=name, entropy_coef=0.01, epsilon_high=0.28, tau_neg=2.0)
  config.clip_cov_ratio = config.kl_cov_ratio = 0.5
  example = _example()
  fn = registry.get(registry.POLICY_LOSSES, name)
  loss, metrics = fn(model, example, config, pad_id=0, eos_id=2)
  logps = tunix_losses.policy_pass(model, example, config, 0, 2, 1.0, None)["logps"]
  args = (logps, example.old_per_token_logps, example.advantages, example.loss_mask)
  expected = {
    "gspo": lambda: pl.gspo_loss(*args, epsilon_high=0.28),
    "sapo": lambda: pl.sapo_loss(*args, tau_neg=2.0),
    "geo_mean": lambda: pl.geo_mean_loss(*args, epsilon_high=0.28),
    "cispo": lambda: pl.cispo_loss(*args, epsilon_high=0.28),
    "gpg": lambda: pl.gpg_loss(*args),
    "clip_cov": lambda: pl.clip_cov_loss(
      *args, clip_cov_key(example.completion_ids), epsilon_high=0.28, clip_cov_ratio=0.5
    ),
    "kl_cov": lambda: pl.kl_cov_loss(*args, kl_cov_ratio=0.5),
  }[name]()[0]
  np.testing.assert_allclose(float(metrics["pg_loss"]), float(expected), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(
    float(loss), float(expected) - 0.01 * float(metrics["entropy"]), rtol=1e-5, atol=1e-7
  )
  doubled = fn(model, _example(jnp.full((3, 5), 2.0)), config, pad_id=0, eos_id=2)[1]
  np.testing.assert_allclose(float(doubled["pg_loss"]), 2 * float(expected), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["ppo_ext", "gspo"])
def test_a_warm_up_example_skips_only_the_policy_s_backward_pass(name):
  """An example with `actor_scale` runs the pass through `loss_fns.backward_unless_zero`: at
  scale 1 and 0.5 its loss, metrics and gradient are those of the same example without a
  scale (plain autodiff) times the scale; at 0 (a critic warm-up step) the loss and the
  gradient are 0 and the metrics are the same."""
  model = toy_policy(16)
  config = PpoExtConfig(policy_loss_fn=name, entropy_coef=0.01, epsilon_high=0.28)
  fn = registry.get(registry.POLICY_LOSSES, name)
  grad = nnx.value_and_grad(lambda m, e: fn(m, e, config, pad_id=0, eos_id=2), has_aux=True)
  (loss, metrics), grads = grad(model, _example())
  assert any(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(grads))
  for scale in (1.0, 0.5, 0.0):
    example = dataclasses.replace(_example(), actor_scale=jnp.full((3,), scale, jnp.float32))
    (scaled_loss, scaled_metrics), scaled_grads = grad(model, example)
    np.testing.assert_allclose(float(scaled_loss), scale * float(loss), rtol=1e-5, atol=1e-7)
    for key, value in metrics.items():
      np.testing.assert_allclose(scaled_metrics[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
    for plain, gated in zip(jax.tree.leaves(grads), jax.tree.leaves(scaled_grads), strict=True):
      np.testing.assert_allclose(gated, scale * np.asarray(plain), rtol=1e-5, atol=1e-7)
  graphdef, state = nnx.split(model)  # the backward pass sits behind a `cond` on the scale
  traced = jax.make_jaxpr(lambda s, e: grad(nnx.merge(graphdef, s), e))(state, example)
  assert "cond[" in str(traced)
  assert "cond[" not in str(
    jax.make_jaxpr(lambda s: grad(nnx.merge(graphdef, s), _example()))(state)
  )


@pytest.mark.parametrize("name", ["ppo_ext", "gspo", "cispo"])
def test_an_example_without_old_logps_trains_on_the_rollout_policy_exactly(name):
  """With no old log-probs on the example (`old_logps_in_update`) the loss takes the pass's
  own under stop_gradient: loss, metrics and gradient equal those of the same example
  carrying the policy's log-probs from a separate pass (the old-log-prob pass it saves)."""
  model = toy_policy(16)
  config = PpoExtConfig(policy_loss_fn=name, entropy_coef=0.01, epsilon_high=0.28)
  fn = registry.get(registry.POLICY_LOSSES, name)
  example = _example()
  separate = passes.compute_per_token_logps(
    model, example.prompt_ids, example.completion_ids, pad_id=0, eos_id=2,
    attention_mask=example.attention_mask,
  )  # fmt: skip
  with_old = dataclasses.replace(example, old_per_token_logps=separate)
  without = dataclasses.replace(example, old_per_token_logps=None)

  def loss(model, example):
    return fn(model, example, config, pad_id=0, eos_id=2)

  (value, metrics), grads = nnx.value_and_grad(loss, has_aux=True)(model, without)
  (expected, expected_metrics), expected_grads = nnx.value_and_grad(loss, has_aux=True)(
    model, with_old
  )
  np.testing.assert_allclose(float(value), float(expected), rtol=1e-6, atol=1e-7)
  for key, metric in expected_metrics.items():
    np.testing.assert_allclose(float(metrics[key]), float(metric), rtol=1e-5, atol=1e-6)
  assert float(metrics["ppo_kl"]) == 0.0 and float(metrics["pg_clipfrac"]) == 0.0
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads), strict=True):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-6)
