"""tunix's `rl/common.py` functions that this package extends keep tunix's signatures:
`tunix_ppo_ext.compute_kl_divergence` against tunix's own, on every name."""

from __future__ import annotations

import inspect

import jax.numpy as jnp
import numpy as np
import pytest
from tunix.rl import common as tunix_common

import tunix_ppo_ext
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext.config import kl_method_names

LOGP = jnp.asarray([[-0.1, -2.0, -30.0, 0.0], [-5.0, -0.5, -1e-3, -12.0]], jnp.float32)
REF = jnp.asarray([[-0.3, -0.5, -1.0, -25.0], [-5.0, -4.0, -2.0, -0.1]], jnp.float32)
# the three tunix knows, written from Schulman's estimators (independent of both codes)
NUMPY = {
  "kl": lambda lp, ref: lp - ref,
  "mse_kl": lambda lp, ref: 0.5 * (lp - ref) ** 2,
  "low_var_kl": lambda lp, ref: np.expm1(np.clip(ref - lp, -20, 20)) - np.clip(ref - lp, -20, 20),
}

# tunix_facing: also run on tunix main (.ci/run, lane 2)
pytestmark = [pytest.mark.tunix, pytest.mark.tunix_facing]


def test_the_signature_is_tunixs():
  theirs = inspect.signature(tunix_common.compute_kl_divergence)
  ours = inspect.signature(tunix_ppo_ext.compute_kl_divergence)
  assert list(ours.parameters) == list(theirs.parameters)
  for name, parameter in theirs.parameters.items():
    assert ours.parameters[name].default == parameter.default, name


@pytest.mark.parametrize("method", sorted(NUMPY))
@pytest.mark.parametrize("clamp_value", [None, 3.0])
def test_tunixs_names_give_tunixs_values(method, clamp_value):
  ours = tunix_ppo_ext.compute_kl_divergence(LOGP, REF, method=method, clamp_value=clamp_value)
  theirs = tunix_common.compute_kl_divergence(LOGP, REF, method=method, clamp_value=clamp_value)
  expected = NUMPY[method](np.asarray(LOGP, np.float64), np.asarray(REF, np.float64))
  if clamp_value is not None:
    expected = np.clip(expected, -clamp_value, clamp_value)
  np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)
  finite = np.abs(np.asarray(REF) - np.asarray(LOGP)) < 20  # tunix's k3 does not clip
  np.testing.assert_allclose(np.asarray(ours)[finite], np.asarray(theirs)[finite], rtol=1e-5)


def test_every_built_in_name_and_a_plugin_name_work():
  @registry.register(registry.KL_ESTIMATORS, "half_k1_for_test")
  def half_k1(logp, ref_logp):
    """Half of k1."""
    return 0.5 * (logp - ref_logp)

  try:
    for method in kl_method_names():
      value = tunix_ppo_ext.compute_kl_divergence(LOGP, REF, method=method)
      assert value.shape == LOGP.shape and bool(jnp.all(jnp.isfinite(value))), method
    for name in ("half_k1_for_test", "half_k1_for_test+"):
      got = tunix_ppo_ext.compute_kl_divergence(LOGP, REF, method=name)
      np.testing.assert_allclose(got, 0.5 * (np.asarray(LOGP) - np.asarray(REF)), rtol=1e-6)
  finally:
    registry.unregister(registry.KL_ESTIMATORS, "half_k1_for_test")
  with pytest.raises(ValueError, match="Unknown KL method 'low_var'"):
    tunix_ppo_ext.compute_kl_divergence(LOGP, REF, method="low_var")
