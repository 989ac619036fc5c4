"""qwix's LoRA product (`qwix._src.providers.lora`: the adapters tunix's LoRA and
`model.lora` use).

qwix computes each adapter's `x A B` in its private `_compute_lora_delta(lhs, lora_a,
lora_b, lhs_ca, lhs_ba, contract_shape, batch_shape, remain_shape, rank, precision)`,
looked up at trace time. `install_lora_product` replaces it, for the calls of tunix's
projections (one contracting axis, the input's last; no batch axes; one output axis;
default precision), by `math.low_rank.lora_product`: the same product, with a VJP that
transposes no activation (a faster LoRA update on XLA:CPU); every other call goes
to qwix's own. It also wraps `LoraProvider.einsum` and `.dot_general` (public methods of a
private module) so an adapted projection returns its inputs' dtype when both share one: qwix
adds `x A B` to the base's output, and float32 adapters on a bfloat16 base (`model.dtype`)
would promote every adapted projection to float32, which tunix's KV-cache update refuses.
Pinned by tests/tunix/models/test_lora.py, by `PINNED` (its private name, checked with tunix's)
and by the source hash of `_compute_lora_delta` (`tunix_versions.SOURCE_PINS`, on the qwix
of each tested tunix): `_lora_delta` computes the same product for tunix's projections.
An entry of `patches.PATCHES` (`qwix_lora_product`, `qwix_lora_dtype`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from qwix._src.providers import lora as qwix_lora

from tunix_ppo_ext._src.ops.low_rank import lora_product

PINNED: dict[str, tuple[Any, tuple[str, ...]]] = {
  # object the names live on -> (the object, private names used here)
  "qwix._src.providers.lora": (qwix_lora, ("_compute_lora_delta",)),
}
PINNED_INSTANCE_ATTRIBUTES: dict[str, tuple[str, ...]] = {}
QWIX_LORA_DELTA = qwix_lora._compute_lora_delta
QWIX_LORA_METHODS = {n: getattr(qwix_lora.LoraProvider, n) for n in ("einsum", "dot_general")}


def install_lora_product() -> None:
  """Routes qwix's adapter products through `lora_product` and keeps an adapted
  projection in its inputs' dtype (idempotent; process-wide; float32 values unchanged)."""
  qwix_lora._compute_lora_delta = _lora_delta
  for name, method in QWIX_LORA_METHODS.items():
    if getattr(getattr(qwix_lora.LoraProvider, name), "__wrapped__", None) is not method:
      setattr(qwix_lora.LoraProvider, name, _in_input_dtype(method))  # else: installed, kept


def _in_input_dtype(method: Any) -> Any:
  """`method` (qwix's LoRA einsum or dot_general) whose output is cast to its two array
  operands' dtype when they share one and no `preferred_element_type` asks otherwise."""

  @functools.wraps(method)
  def call(self: Any, *args: Any, **kwargs: Any) -> Any:
    out = method(self, *args, **kwargs)
    operands = [a for a in args if isinstance(a, jax.Array)]
    preferred = kwargs.get("preferred_element_type")
    if method.__name__ == "dot_general" and len(args) > 4:
      preferred = args[4]
    if len(operands) == 2 and preferred is None and operands[0].dtype == operands[1].dtype:
      return out.astype(operands[0].dtype)
    return out

  return call


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
