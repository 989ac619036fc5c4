"""The packed training pass against the padded one, on one model and batch."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from tests.helpers.passes import EOS, PAD, assert_trees_close
from tunix_ppo_ext._src.tunix.learner import passes


def assert_layout_gives_the_padded_pass(model, batch, layout, fused):
  """Log-probs, entropy and the gradient of a weighted loss of both, with the pass's rows
  laid out as `layout` (a `Packing`, a `SharedPrompts`), equal the padded pass's to
  float32 rounding; `batch` is `episodes`' `(prompt, completion, attention, loss)`."""
  prompt, completion, attention, loss = batch

  def run(m, laid_out):
    return passes.compute_per_token_logps(
      m, prompt, completion, pad_id=PAD, eos_id=EOS, attention_mask=attention,
      return_entropy=True, chunk_size=4 if fused else 0, fused_head=fused,
      stop_gradient=False, packing=layout if laid_out else None,
    )  # fmt: skip

  def objective(m, laid_out):
    logps, entropy = run(m, laid_out)
    weights = jnp.linspace(0.5, 1.5, logps.size).reshape(logps.shape)
    return jnp.sum(weights * logps * loss) + 0.3 * jnp.sum(entropy * loss)

  for got, want in zip(run(model, True), run(model, False), strict=True):
    np.testing.assert_allclose(got * attention, want * attention, rtol=2e-5, atol=2e-5)
  grads = [nnx.grad(objective)(model, laid_out) for laid_out in (False, True)]
  assert_trees_close(grads[0], grads[1], atol=5e-5, rtol=1e-5)
