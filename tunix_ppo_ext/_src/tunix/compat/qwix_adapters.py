"""qwix's LoRA product (`qwix._src.providers.lora`: the adapters tunix's LoRA and
`model.lora` use).

qwix computes each adapter's `x A B` in its private `_compute_lora_delta(lhs, lora_a,
lora_b, lhs_ca, lhs_ba, contract_shape, batch_shape, remain_shape, rank, precision)`,
looked up at trace time. `install_lora_product` replaces it, for the calls of tunix's
projections (one contracting axis, the input's last; no batch axes; one output axis;
default precision), by `math.low_rank.lora_product`: the same product, with a VJP that
transposes no activation (a faster LoRA update on XLA:CPU); every other call goes
to qwix's own. Pinned by tests/tunix/test_lora.py (qwix is not tunix: `check_tunix` does not
look at it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from qwix._src.providers import lora as qwix_lora

from tunix_ppo_ext._src.math.low_rank import lora_product

QWIX_LORA_DELTA = qwix_lora._compute_lora_delta


def install_lora_product() -> None:
  """Routes qwix's adapter products through `lora_product` (idempotent; process-wide, the
  values unchanged)."""
  qwix_lora._compute_lora_delta = _lora_delta


def _lora_delta(
  lhs: jax.Array, lora_a: jax.Array, lora_b: jax.Array, lhs_ca: Sequence[int],
  lhs_ba: Sequence[int], contract_shape: Sequence[int], batch_shape: Sequence[int],
  remain_shape: Sequence[int], rank: int, precision: Any = None,
) -> jax.Array:  # fmt: skip
  """qwix's `_compute_lora_delta`, by `lora_product` where tunix's projections call it."""
  args = (lhs, lora_a, lora_b, lhs_ca, lhs_ba, contract_shape, batch_shape, remain_shape, rank)
  plain = tuple(lhs_ca) == (lhs.ndim - 1,) and not batch_shape and not lhs_ba
  if not plain or len(contract_shape) != 1 or len(remain_shape) != 1 or precision is not None:
    return QWIX_LORA_DELTA(*args, precision=precision)
  a = jnp.reshape(lora_a, (contract_shape[0], rank))
  b = jnp.reshape(lora_b, (rank, remain_shape[0]))
  return lora_product(lhs, a, b)
