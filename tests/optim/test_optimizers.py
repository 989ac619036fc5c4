"""Optimizers from config: schedules and Adam/AdamW + clipping against plain-NumPy
references written from the formulas (Kingma & Ba 2015; Loshchilov & Hutter 2019 for
AdamW and SGDR's cosine; global-norm clipping), and the NaN guard around all of them."""

import doctest

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.numeric import flush_subnormals
from tests.helpers.schedules import reference_lr
from tunix_ppo_ext._src.optim import guards
from tunix_ppo_ext._src.optim.optimizers import OptimizerSpec, build_optimizer, lr_schedule

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
@pytest.mark.parametrize(
  "total, warmup, min_ratio", [(10, 0, 0.0), (10, 3, 0.1), (3, 5, 0.5), (1, 0, 0.0)]
)
def test_schedules_match_the_formulas(schedule, total, warmup, min_ratio):
  spec = OptimizerSpec(schedule=schedule, warmup_steps=warmup, min_lr_ratio=min_ratio)
  fn = lr_schedule(spec, 2e-3, total)
  for step in range(total + 3):  # past the end: stays at the final rate
    expected = reference_lr(schedule, 2e-3, total, warmup, min_ratio, step)
    assert float(fn(jnp.asarray(step))) == pytest.approx(expected, rel=1e-5, abs=1e-12), step


def numpy_adam(params, grads, lr_at, b1, b2, eps, weight_decay, clip):
  """Adam(W) with optional global-norm clipping in NumPy; returns the parameters after
  each step."""
  p, m, v, out = params.copy(), np.zeros_like(params), np.zeros_like(params), []
  for t, g in enumerate(grads, start=1):
    norm = np.sqrt(np.sum(g.astype(np.float64) ** 2))
    if clip is not None and norm > clip:
      g = g * (clip / norm)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    mhat, vhat = m / (1 - b1**t), v / (1 - b2**t)
    lr = lr_at(t - 1)
    p = p - lr * (mhat / (np.sqrt(vhat) + eps) + weight_decay * p)
    out.append(p.copy())
  return out


@pytest.mark.parametrize(
  "spec",
  [
    OptimizerSpec(),
    OptimizerSpec(name="adamw", weight_decay=0.1, clip_grad_norm=1.0, schedule="cosine"),
    OptimizerSpec(name="adamw", weight_decay=0.5, b1=0.5, b2=0.9, eps=1e-3, warmup_steps=2),
    OptimizerSpec(clip_grad_norm=0.05, schedule="linear", warmup_steps=1, min_lr_ratio=0.2),
  ],
  ids=["adam", "adamw_clip_cosine", "adamw_betas_warmup", "adam_clip_linear"],
)
def test_updates_match_numpy_adam(spec):
  rng = np.random.default_rng(0)
  params = rng.normal(size=(5,)).astype(np.float32)
  # awkward gradients: huge (clipped), negative, tiny, zero
  grads = [g.astype(np.float32) for g in (rng.normal(size=5) * 100, -rng.normal(size=5))]
  grads += [np.full(5, 1e-6, np.float32), np.zeros(5, np.float32)]
  total = len(grads)
  optimizer = build_optimizer(spec, 0.01, total)
  state, p, got = optimizer.init(jnp.asarray(params)), jnp.asarray(params), []
  for g in grads:
    updates, state = optimizer.update(jnp.asarray(g), state, p)
    p = p + updates
    got.append(np.asarray(p))
    assert float(state.hyperparams["learning_rate"]) > 0  # what tunix logs as actor/lr
  lr_at = lambda s: reference_lr(  # noqa: E731
    spec.schedule, 0.01, total, spec.warmup_steps, spec.min_lr_ratio, s
  )
  wd = spec.weight_decay if spec.name == "adamw" else 0.0
  expected = numpy_adam(params, grads, lr_at, spec.b1, spec.b2, spec.eps, wd, spec.clip_grad_norm)
  for step, (a, b) in enumerate(zip(got, expected, strict=True)):
    np.testing.assert_allclose(flush_subnormals(a), flush_subnormals(b), rtol=2e-5, atol=1e-6)
    assert np.all(np.isfinite(a)), step


def test_nan_guard_wraps_every_configured_optimizer():
  spec = OptimizerSpec(name="adamw", weight_decay=0.01, clip_grad_norm=1.0, schedule="cosine")
  optimizer = build_optimizer(spec, 0.01, 10)
  params = jnp.ones(3)
  state = optimizer.init(params)
  updates, state = optimizer.update(jnp.array([1.0, jnp.nan, 0.0]), state, params)
  np.testing.assert_array_equal(np.asarray(params + updates), np.ones(3))  # skipped
  assert guards.skip_counts(state) == guards.SkipCounts(consecutive=1, total=1)
  updates, state = optimizer.update(jnp.ones(3), state, params)
  assert np.all(np.asarray(updates) < 0)  # the next finite gradient is applied
  assert guards.skip_counts(state) == guards.SkipCounts(consecutive=0, total=1)


@pytest.mark.parametrize(
  "spec, message",
  [
    (OptimizerSpec(name="sgd"), r"'optim.actor.name'='sgd' unknown"),
    (
      OptimizerSpec(schedule="cosin"),
      r"'optim.actor.schedule'='cosin' unknown; did you mean 'cosine'",
    ),
    (
      OptimizerSpec(weight_decay=0.01),
      r"'optim.actor.weight_decay'=0.01 needs 'optim.actor.name'=adamw",
    ),
    (OptimizerSpec(name="adamw", weight_decay=-1.0), r"'optim.actor.weight_decay'=-1.0 is invalid"),
    (OptimizerSpec(b2=1.0), r"'optim.actor.b2'=1.0 is invalid"),
    (OptimizerSpec(eps=0.0), r"'optim.actor.eps'=0.0 is invalid"),
    (OptimizerSpec(clip_grad_norm=float("nan")), r"'optim.actor.clip_grad_norm'=nan is invalid"),
    (OptimizerSpec(warmup_steps=-1), r"'optim.actor.warmup_steps'=-1 is invalid"),
    (OptimizerSpec(min_lr_ratio=1.5), r"'optim.actor.min_lr_ratio'=1.5 is invalid"),
  ],
)
def test_bad_optimizer_settings_name_the_key(spec, message):
  with pytest.raises(ValueError, match=message):
    spec.validate("optim.actor")


def test_the_guard_s_counter_arithmetic_runs_its_examples():
  finder, runner = doctest.DocTestFinder(recurse=False), doctest.DocTestRunner()
  for fn in (guards.new_skips, guards.stuck_at_end):
    for example in finder.find(fn, globs=vars(guards)):
      assert example.examples, fn.__name__
      assert runner.run(example).failed == 0, fn.__name__


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
  st.dictionaries(
    st.sampled_from(["actor", "critic"]),
    st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(0, 20), st.integers(1, 30)),
  ),
  st.integers(1, 25),
)
def test_the_guard_s_counters_against_a_walk_over_the_roles(trainers, max_consecutive):
  """Each role as (consecutive, extra total, seen, updates made): the stop rules written
  out role by role, from the NanGuard's docstring."""
  counts = {r: guards.SkipCounts(c, c + extra) for r, (c, extra, _, _) in trainers.items()}
  seen = {r: s for r, (_, _, s, _) in trainers.items()}
  made = {r: m for r, (_, _, _, m) in trainers.items()}
  for role, (consecutive, extra, last_seen, updates) in trainers.items():
    assert guards.new_skips(counts, seen)[role] == consecutive + extra - last_seen
    assert (role in guards.stuck(counts, max_consecutive)) == (consecutive >= max_consecutive)
    ended_untrained = consecutive > 0 and consecutive / updates >= 0.5
    assert (role in guards.stuck_at_end(counts, made)) == ended_untrained
  assert guards.new_skips(counts, {}) == {r: c.total for r, c in counts.items()}
