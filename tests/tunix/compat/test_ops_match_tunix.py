"""The math layer against tunix's own functions where tunix has one (GAE, the three KL
names, log-probs and entropy from logits, loss aggregation). Kept out of tests/ops so that
the math's tests import no tunix (the fast lane)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from tunix.rl import common as tunix_common
from tunix.rl.common import selective_log_softmax

from tests.helpers.advantages import TOL, B, T
from tests.helpers.logits import ATOL, RTOL, logp_ent, make_inputs
from tests.helpers.losses import RTOL as LOSS_RTOL
from tests.helpers.losses import random_batch, random_logps
from tunix_ppo_ext._src.ops import kl_methods as names
from tunix_ppo_ext._src.ops import ppo_losses as losses
from tunix_ppo_ext._src.ops.advantages import compute_gae_advantages
from tunix_ppo_ext._src.tunix.compat import compute_entropy_from_logits  # moved in tunix main

pytestmark = pytest.mark.tunix


def test_gae_matches_tunix_on_prefix_masks():
  from tunix.rl.algo_core import compute_gae_advantages as tunix_gae

  rng = np.random.default_rng(3)
  r = rng.normal(size=(B, T)).astype(np.float32)
  v = rng.normal(size=(B, T)).astype(np.float32)
  lengths = rng.integers(1, T + 1, size=B)
  m = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
  adv, ret = compute_gae_advantages(r, v, m, 0.95, 0.9, whiten=True)
  t_adv, t_ret = tunix_gae(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m), 0.95, 0.9)
  on = m > 0
  np.testing.assert_allclose(np.asarray(adv)[on], np.asarray(t_adv)[on], **TOL)
  np.testing.assert_allclose(np.asarray(ret)[on], np.asarray(t_ret)[on], **TOL)


@pytest.mark.parametrize("method", ["kl", "mse_kl", "low_var_kl"])
def test_matches_tunix_for_its_three_methods(method):
  logp, ref = random_logps(6)
  np.testing.assert_allclose(
    names.compute_kl_divergence(logp, ref, method),
    tunix_common.compute_kl_divergence(jnp.asarray(logp), jnp.asarray(ref), method),
    rtol=1e-5,
    atol=1e-6,
  )


@pytest.mark.parametrize("chunk", [0, 1, 5, 64])
def test_matches_tunix(chunk):
  logits, _, ids, _, _ = make_inputs(2, 13, 47, seed=6)
  logp, ent = logp_ent(logits, ids, 1.0, chunk)
  np.testing.assert_allclose(logp, selective_log_softmax(logits, ids), rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(ent, compute_entropy_from_logits(logits), rtol=RTOL, atol=ATOL)


def test_aggregate_accepts_tunix_alias_and_matches_tunix():
  RTOL = LOSS_RTOL
  _, _, x, mask, _, _ = random_batch(1)
  ours = losses.aggregate_loss(x, mask, "sequence-mean-token-mean")
  theirs = tunix_common.aggregate_loss(
    jnp.asarray(x), jnp.asarray(mask), "sequence-mean-token-mean"
  )
  np.testing.assert_allclose(ours, theirs, rtol=RTOL)
  for mode in ["token-mean", "seq-mean-token-sum"]:
    np.testing.assert_allclose(
      losses.aggregate_loss(x, mask, mode),
      tunix_common.aggregate_loss(jnp.asarray(x), jnp.asarray(mask), mode),
      rtol=RTOL,
    )
