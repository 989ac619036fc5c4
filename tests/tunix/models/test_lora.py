"""LoRA through qwix: adapters on the matched projections only, the base arrays shared (not
copied), and the merge `W + alpha/rank * A B` against a NumPy reference written per layout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers.clusters import toy_policy
from tests.helpers.hf_fixtures import hf_config
from tunix_ppo_ext._src.tunix.models import hf_models, lora, role_models, toy_models

pytestmark = pytest.mark.tunix

SPEC = lora.LoraSpec(rank=3, alpha=5.0, target_modules=".*")


def _randomised(model: nnx.Module, seed: int = 0) -> nnx.Module:
  """`model` with every adapter drawn at random (B starts at zero: the merge would be a no-op)."""
  state = nnx.state(model, nnx.LoRAParam)
  leaves, tree = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  drawn = [0.5 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
  nnx.update(model, jax.tree.unflatten(tree, drawn))
  return model


@nnx.jit
def _logits(model, tokens):
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  return model(tokens, positions, None, toy_models.causal_mask(*tokens.shape))[0]


def _reference_delta(path: tuple, a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """`A B` in the weight's layout, from the formula for each tunix projection."""
  name = path[-2]
  if name in ("q_proj", "k_proj", "v_proj", "lm_head"):  # W[D, N, H] (lm_head: W[D, V])
    return np.tensordot(a, b, axes=([1], [0]))  # sum_r A[d, r] B[r, ...]
  if name == "o_proj":  # W[N, H, D]: A[N, H, r], B[r, D]
    return np.tensordot(a, b, axes=([2], [0]))
  return a @ b  # MLP kernels [in, out]


def test_the_merge_is_w_plus_alpha_over_rank_a_b_and_keeps_the_logits():
  base = toy_policy(12)
  adapted = _randomised(lora.apply_lora(base, SPEC, seed=1))
  merged = lora.merged(adapted, SPEC)
  flat = dict(nnx.to_flat_state(nnx.state(adapted, nnx.Param)))
  merged_flat = dict(nnx.to_flat_state(nnx.state(merged, nnx.Param)))
  assert not jax.tree.leaves(nnx.state(merged, nnx.LoRAParam)) and type(merged) is type(base)
  adapted_weights = [p for p in flat if str(p[-1]).endswith("_lora_a")]
  assert len(adapted_weights) == 7 + 1  # q, k, v, o, gate, up, down of the layer; lm_head
  for path in adapted_weights:
    weight = (*path[:-1], str(path[-1])[: -len("_lora_a")])
    a, b = np.asarray(flat[path][...]), np.asarray(flat[(*path[:-1], f"{weight[-1]}_lora_b")][...])
    delta = _reference_delta(weight, a, b)
    expected = np.asarray(flat[weight][...]) + SPEC.alpha / SPEC.rank * delta
    np.testing.assert_allclose(merged_flat[weight][...], expected, rtol=1e-5, atol=1e-5)
  tokens = jnp.array([[1, 4, 7, 2, 9], [3, 3, 11, 0, 5]])
  np.testing.assert_allclose(_logits(merged, tokens), _logits(adapted, tokens), atol=1e-4)
  assert jax.tree.leaves(nnx.state(adapted, nnx.LoRAParam))  # the adapted model keeps its own


def test_gemma3_s_stacked_kv_einsum_merges_too():
  """Gemma 3's `kv_einsum` weight `[2, K, D, H]` contracts its third axis: A is `[D, r]`,
  B `[r, 2, K, H]`, so `A B` must be laid out back around D (qwix's own einsum)."""
  config = hf_models.tunix_config(hf_config("gemma3", num_hidden_layers=1).to_dict())
  base = hf_models.FAMILIES["gemma3_text"].model_class(config, rngs=nnx.Rngs(0))
  spec = lora.LoraSpec(SPEC.rank, SPEC.alpha, ".*(einsum|proj)")  # the tied decode: no adapter
  adapted = _randomised(lora.apply_lora(base, spec, seed=2), seed=3)
  kv = adapted.layers[0].attn.kv_einsum
  a, b = np.asarray(kv.w_lora_a[...]), np.asarray(kv.w_lora_b[...])
  merged = lora.merged(adapted, spec)
  expected = np.asarray(kv.w[...]) + spec.scale * np.einsum("dr,rckh->ckdh", a, b)
  np.testing.assert_allclose(merged.layers[0].attn.kv_einsum.w[...], expected, rtol=1e-5, atol=1e-5)


def test_lora_models_share_the_base_arrays_instead_of_copying_them():
  base = toy_policy(12)
  spec = lora.LoraSpec(rank=2, alpha=4.0)
  actor, critic, reference = role_models.lora_roles(base, spec, seed=0, critic_lora=True)
  assert reference is base and lora.shares_base(actor, base)
  assert lora.shares_base(critic.backbone, base)
  assert not lora.shares_base(toy_models.critic_from_policy(base).backbone, base)  # a full copy
  trained = {str(p[-1]) for p, _ in nnx.to_flat_state(nnx.state(critic, nnx.LoRAParam))}
  assert {"kernel", "bias"} <= trained  # the value head is trained whole
  counts = lora.parameter_counts(actor)
  adapters = sum(x.size for x in jax.tree.leaves(nnx.state(actor, nnx.LoRAParam)))
  assert counts == {"total": lora.parameter_counts(base)["total"] + adapters, "trainable": adapters}
  held = [nnx.state(m, nnx.Param) for m in (actor, critic, base)]
  assert lora.array_bytes(held) == 4 * counts["total"] + 4 * sum(
    x.size for x in jax.tree.leaves(nnx.state(critic, nnx.LoRAParam))
  )
  tokens = jnp.array([[1, 4, 7, 2]])  # (a graph-mode nnx.jit call hands back new buffers)
  np.testing.assert_allclose(_logits(actor, tokens), _logits(base, tokens), atol=1e-6)  # B = 0


def test_a_pattern_that_adapts_nothing_is_one_line_naming_the_key():
  with pytest.raises(ValueError, match=r"'model.lora.target_modules'='embedder' put no adapter"):
    lora.apply_lora(toy_policy(12), lora.LoraSpec(2, 4.0, "embedder"))


def test_a_lora_run_without_a_checkpoint_holds_the_base_once(tmp_path):
  """The toy policy is initialised on one device, then placed on the mesh: its base arrays
  are placed once for the LoRA actor and the reference (as a checkpoint loaded onto the mesh
  is), so the run holds base + adapters + critic, not two bases."""
  from tests.helpers.runs import SMOKE
  from tunix_ppo_ext._src.run import job
  from tunix_ppo_ext._src.run.run_config import load_resolved

  resolved = load_resolved(str(SMOKE), ["model.lora={rank: 4}", f"output_dir={tmp_path}"])
  cluster = job.build_run(resolved, tmp_path)[0].rl_cluster
  actor, reference = cluster.actor_trainer.model, cluster.inference_worker.get_model("reference")
  assert lora.shares_base(actor, reference)
  report = lora.memory_report(cluster)
  base = lora.array_bytes(nnx.state(reference, nnx.Param))
  adapters = lora.array_bytes(nnx.state(actor, nnx.LoRAParam))
  critic = lora.array_bytes(nnx.state(cluster.critic_trainer.model, nnx.Param))
  assert report["model_bytes"] == base + adapters + critic < report["model_bytes_if_separate"]


def test_qwix_products_go_through_lora_product_with_the_same_values_and_gradients():
  """The seam in `compat`: qwix's private `_compute_lora_delta` keeps the signature it is
  replaced under, and a LoRA model's logits and adapter gradients are qwix's own with it
  installed (the replacement is only a lean VJP)."""
  import inspect

  from qwix._src.providers import lora as qwix_lora

  from tunix_ppo_ext._src.tunix import compat
  from tunix_ppo_ext._src.tunix.compat import qwix_adapters

  params = list(inspect.signature(compat.QWIX_LORA_DELTA).parameters)
  assert params == [
    "lhs", "lora_a", "lora_b", "lhs_ca", "lhs_ba", "contract_shape", "batch_shape",
    "remain_shape", "rank", "precision",
  ]  # fmt: skip
  model = _randomised(lora.apply_lora(toy_policy(16), SPEC))
  assert qwix_lora._compute_lora_delta is qwix_adapters._lora_delta  # apply_lora installed it
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 16, (2, 6)), jnp.int32)
  graphdef, adapters, rest = nnx.split(model, nnx.LoRAParam, ...)

  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)

  def loss(adapters):  # traced anew by each value_and_grad below: qwix's lookup is at trace
    policy = nnx.merge(graphdef, adapters, rest)
    return jnp.sum(jnp.sin(policy(tokens, positions, None, toy_models.causal_mask(2, 6))[0]))

  def value_and_grads():
    return jax.value_and_grad(loss)(adapters)

  ours = value_and_grads()
  calls = []

  def counted(*args, **kwargs):
    calls.append(args[0].shape)
    return compat.QWIX_LORA_DELTA(*args, **kwargs)

  qwix_lora._compute_lora_delta = counted  # qwix's own, as before the replacement
  try:
    theirs = value_and_grads()
  finally:
    compat.install_lora_product()
  assert calls  # the model's products went through the function the seam replaces
  for got, want in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


def test_an_adapted_projection_keeps_its_inputs_dtype_with_float32_adapters():
  """The seam in `compat`: qwix's public `LoraProvider.einsum` / `.dot_general` keep the
  signatures they are wrapped under; a bfloat16 base with float32 adapters (`model.dtype`)
  computes in bfloat16, near qwix's own float32-promoted result."""
  import inspect

  from qwix._src.providers import lora as qwix_lora

  from tunix_ppo_ext._src.tunix import compat
  from tunix_ppo_ext._src.tunix.compat import qwix_adapters

  einsum, dot_general = (compat.QWIX_LORA_METHODS[n] for n in ("einsum", "dot_general"))
  assert list(inspect.signature(einsum).parameters) == ["self", "einsum_str", "operands", "kwargs"]
  assert list(inspect.signature(dot_general).parameters)[:6] == [
    "self", "lhs", "rhs", "dimension_numbers", "precision", "preferred_element_type",
  ]  # fmt: skip
  config = hf_models.with_dtype(
    toy_models.tiny_qwen3_config(16, num_layers=1, embed_dim=32), "bfloat16"
  )
  model = hf_models.cast_params(toy_models.make_policy(config, seed=7), jnp.bfloat16)
  model = _randomised(lora.apply_lora(model, SPEC))
  hf_models.train_in_float32(model)
  assert qwix_lora.LoraProvider.einsum.__wrapped__ is einsum  # apply_lora installed it
  tokens = jnp.asarray(np.random.default_rng(1).integers(1, 16, (2, 6)), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(6), tokens.shape)
  mask = toy_models.causal_mask(2, 6)
  ours = model(tokens, positions, None, mask)[0]
  for name, method in compat.QWIX_LORA_METHODS.items():
    setattr(qwix_lora.LoraProvider, name, method)  # qwix's own
  try:
    theirs = model(tokens, positions, None, mask)[0]
  finally:
    compat.install_lora_product()

  def bfloat16_valued(x):  # tunix's Qwen3 returns float32 logits: what they hold tells
    return bool(jnp.all(x.astype(jnp.bfloat16).astype(x.dtype) == x))

  assert bfloat16_valued(ours) and not bfloat16_valued(theirs)
  scale = float(jnp.max(theirs) - jnp.min(theirs))
  assert float(jnp.max(jnp.abs(ours.astype(jnp.float32) - theirs))) <= 0.03 * scale
  assert qwix_adapters._in_input_dtype(einsum).__wrapped__ is einsum
  for name, method in compat.QWIX_LORA_METHODS.items():  # installed again after qwix's own
    assert getattr(qwix_lora.LoraProvider, name).__wrapped__ is method, name
