"""The fused LM head in the training passes (`model.fused_head`, `PpoExtConfig.fused_head`).

With the flag on, every pass's log-probs and entropy come from the final hidden states and the
head's weight (`compat.final_hidden_states`, `compat.head_weight`, `ops.fused_logps_and_entropy`):
they, the losses and the gradients equal the unfused path for each family the package loads
(float32 on XLA:CPU, where the logits' matmul is the one difference: one float32 einsum in the
fused head against tunix's head module; a bfloat16 model's fused passes are exact for its own
hidden states); the compiled actor train step and log-prob pass hold no `[B, T, V]` array;
`plan` compiles them sharded; a two-step CLI run trains.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from tunix.models.gemma3 import model as gemma3_model
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.rollout import base_rollout

from tests.helpers.clusters import toy_policy
from tests.helpers.hf_fixtures import hf_config
from tests.helpers.parity_run import stock_cluster
from tests.helpers.passes import EOS, PAD, assert_trees_close, batch, example, family_model
from tests.helpers.runs import SMOKE
from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer
from tunix_ppo_ext._src.plugins import registry
from tunix_ppo_ext._src.run import cli
from tunix_ppo_ext._src.run.run_config import load_resolved
from tunix_ppo_ext._src.tunix import compat
from tunix_ppo_ext._src.tunix.aot import compile_pieces as abstract
from tunix_ppo_ext._src.tunix.cluster.mesh import make_mesh
from tunix_ppo_ext._src.tunix.learner import loss_fns as tunix_losses
from tunix_ppo_ext._src.tunix.learner import passes
from tunix_ppo_ext._src.tunix.learner.ppo_config import PpoExtConfig
from tunix_ppo_ext._src.tunix.learner.role_passes import ModelInputs, RolePasses
from tunix_ppo_ext._src.tunix.models import hf_models, lora, toy_models

pytestmark = pytest.mark.tunix

# Lane 2 (tunix main, `-m tunix_facing`) runs the tests of what compat does per version (the
# hidden states and head of each family, LoRA through them); the rest is our own code.

Role = rl_cluster_lib.Role
CHUNK = 3  # the completion's 7 positions are no multiple of it


def logps_entropy(model, prompt, completion, attention, fused, stop_gradient=True):
  return passes.compute_per_token_logps(
    model, prompt, completion, pad_id=PAD, eos_id=EOS, attention_mask=attention,
    return_entropy=True, chunk_size=CHUNK, fused_head=fused, stop_gradient=stop_gradient,
  )  # fmt: skip


def grads(model, prompt, completion, attention, fused, wrt=nnx.Param):
  def loss(m):
    logp, ent = logps_entropy(m, prompt, completion, attention, fused, stop_gradient=False)
    weights = jnp.linspace(0.5, 1.5, logp.size).reshape(logp.shape)
    return jnp.sum(weights * logp) + 0.3 * jnp.sum(ent * attention)

  return nnx.grad(loss, argnums=nnx.DiffState(0, wrt))(model)


@pytest.mark.tunix_facing
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama", "gemma3"])
def test_fused_passes_equal_the_unfused_ones_for_every_family(family):
  """Log-probs, entropy and the gradient of a loss of both, w.r.t. every weight (the head's
  included, tied or not), equal tunix's head + `logps_and_entropy` to float32 tolerance."""
  model = family_model(family)
  args = batch(hf_models.vocab_size(model))
  plain, fused = (logps_entropy(model, *args, f) for f in (False, True))
  for x, y in zip(plain, fused, strict=True):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=2e-5, rtol=1e-5)
  assert_trees_close(grads(model, *args, False), grads(model, *args, True), atol=2e-5)
  tied = not hasattr(model, "lm_head")
  assert tied == (family in ("qwen2", "gemma3"))
  assert type(model.embedder) is type(family_model(family).embedder)  # the swap is undone


def test_bfloat16_fused_passes_are_exact_for_the_model_s_own_hidden_states():
  """A bfloat16 Qwen3 (weights and compute): the fused log-probs and entropy equal a float64
  NumPy head over the model's bfloat16 hidden states and weight to float32 rounding, while
  tunix's head rounds the logits to bfloat16 first (so the unfused pass is the one off, by
  about that rounding)."""
  config = dataclasses.replace(
    toy_models.tiny_qwen3_config(24), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16
  )
  model = toy_models.make_policy(config)
  prompt, completion, attention = batch(24)
  plain, fused = (logps_entropy(model, prompt, completion, attention, f) for f in (False, True))
  hidden = passes._forward(model, prompt, completion, PAD, EOS, attention, hidden=True)
  hidden = hidden[:, -completion.shape[1] - 1 : -1]
  assert hidden.dtype == compat.head_weight(model).dtype == jnp.bfloat16
  z = np.asarray(hidden, np.float64) @ np.asarray(compat.head_weight(model), np.float64)
  z -= z.max(-1, keepdims=True)
  log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
  logps = np.take_along_axis(log_probs, np.asarray(completion)[..., None], -1)[..., 0]
  entropy = -(np.exp(log_probs) * log_probs).sum(-1)
  for ours, reference, theirs in zip(fused, (logps, entropy), plain, strict=True):
    np.testing.assert_allclose(np.asarray(ours), reference, atol=1e-5)
    np.testing.assert_allclose(np.asarray(theirs), reference, atol=5e-2)  # bfloat16 logits


@pytest.mark.parametrize(
  "policy_loss_fn, kl_method",
  [("ppo_ext", "low_var_kl"), ("gspo", "low_var_kl"), ("ppo_ext", "full")],
)
def test_the_actor_loss_and_its_update_equal_the_unfused_ones(policy_loss_fn, kl_method):
  """The policy loss (KL in the loss: an estimator, or the exact KL against another model,
  the reference; entropy bonus), its metrics, its gradient and the parameters after one
  Adam step, flag on and off."""
  base = dict(
    policy_loss_fn=policy_loss_fn, entropy_coef=0.01, kl_penalty="loss", kl_loss_coef=0.1,
    logits_chunk_size=CHUNK, kl_method=kl_method,
  )  # fmt: skip
  train_example = example(24)
  reference = nnx.split(toy_policy(24, seed=3)) if kl_method == "full" else None
  results = []
  for fused in (False, True):
    model = toy_policy(24)
    config = PpoExtConfig(**base, fused_head=fused)
    fn = registry.get(registry.POLICY_LOSSES, policy_loss_fn)

    def loss(m, config=config, fn=fn):
      kw = {"ref_model": reference} if reference else {}
      return fn(m, train_example, config, pad_id=PAD, eos_id=EOS, temperature=0.7, **kw)

    (value, metrics), g = nnx.value_and_grad(loss, has_aux=True)(model)
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    optimizer.update(model, g)
    results.append((value, metrics, g, nnx.state(model, nnx.Param)))
  (v0, m0, g0, p0), (v1, m1, g1, p1) = results
  np.testing.assert_allclose(float(v1), float(v0), rtol=1e-5, atol=1e-6)
  for key in m0:
    np.testing.assert_allclose(float(m1[key]), float(m0[key]), rtol=1e-5, atol=1e-6, err_msg=key)
  assert_trees_close(g0, g1, atol=2e-5)
  assert_trees_close(p0, p1, atol=1e-5)


def test_the_learner_s_exact_kl_equals_the_unfused_one_micro_batch_by_micro_batch():
  """The learner's exact KL of the rollout policy to the reference (`kl_method=full`: its
  `actor/kl` and the KL controller's input) through tunix's cluster, one-row micro-batches:
  from hidden states with the flag, from logits without; the reference's weights scaled so
  that the KL is not 0."""
  meshes = dict.fromkeys(rl_cluster_lib.Role, make_mesh((1, 1)))
  rollout = base_rollout.RolloutConfig(
    max_tokens_to_generate=4, max_prompt_length=8, kv_cache_size=16
  )
  cluster = stock_cluster(meshes, rollout, max_steps=1)
  reference = cluster.inference_worker.get_model("reference")
  nnx.update(reference, jax.tree.map(lambda x: x * 1.3, nnx.state(reference, nnx.Param)))
  prompt, completion, attention = batch(CharTokenizer().vocab_size)
  inputs = ModelInputs(prompt, completion, attention, attention.astype(jnp.float32), PAD, EOS, None)
  kls = []
  for fused in (False, True):
    role_passes = RolePasses(cluster, 1, fused_head=fused, chunk_size=CHUNK)
    pair = [role_passes.kl_inputs(inputs, role) for role in (Role.ROLLOUT, Role.REFERENCE)]
    assert isinstance(pair[0], tuple) == fused
    kls.append(passes.exact_kl(*pair, temperature=0.7, chunk_size=CHUNK))
  np.testing.assert_allclose(np.asarray(kls[1]), np.asarray(kls[0]), rtol=1e-5, atol=1e-6)
  assert float(jnp.min(kls[0])) > 1e-4


@pytest.mark.tunix_facing
def test_lora_adapters_train_the_same_and_one_on_the_head_is_refused():
  """qwix's adapters on the projections apply (the call is tunix's intercepted `__call__`);
  an adapter on the LM head, which the fused head would skip, is a one-line error."""
  base = toy_policy(24)
  adapted = lora.apply_lora(base, lora.LoraSpec(rank=2, alpha=4.0), seed=0)
  for path, leaf in nnx.to_flat_state(nnx.state(adapted, nnx.LoRAParam)):  # B = 0 otherwise
    leaf.set_value(jax.random.normal(jax.random.key(len(path)), leaf.shape) * 0.1)
  args = batch(24)
  plain, fused = (logps_entropy(adapted, *args, f) for f in (False, True))
  for x, y in zip(plain, fused, strict=True):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=2e-5, rtol=1e-5)
  assert (
    np.abs(np.asarray(plain[0]) - np.asarray(logps_entropy(base, *args, False)[0])).max() > 1e-3
  )
  g = [grads(adapted, *args, f, wrt=nnx.LoRAParam) for f in (False, True)]
  assert_trees_close(*g, atol=2e-5)
  on_head = lora.apply_lora(base, lora.LoraSpec(rank=2, alpha=4.0, target_modules="lm_head"))
  with pytest.raises(ValueError, match=r"^model\.fused_head: the Qwen3's LM head 'lm_head' "):
    logps_entropy(on_head, *args, True)


@pytest.mark.tunix_facing
def test_a_model_without_a_known_head_is_refused_in_one_line():
  critic = toy_models.critic_from_policy(toy_policy(24))
  with pytest.raises(ValueError, match=r"^model\.fused_head: no fused head for ValueModel \("):
    compat.head_weight(critic)


@pytest.mark.tunix_facing
def test_pinned_heads_are_what_each_family_s_call_applies_last():
  """`PINNED_HEADS`: each family's `__call__` feeds the final norm's output to the head named
  there (untied and tied), which holds the weight named there in the layout named there."""
  hf_names = {"Qwen2": "qwen2", "Qwen3": "qwen3", "Llama3": "llama", "Gemma3": "gemma3"}
  assert {f.__name__ for f in compat.PINNED_HEADS} == set(hf_names)
  assert compat.PINNED_HEADS[gemma3_model.Gemma3] == (
    ("embedder", "decode", "input_embedding", "VD"),
  )
  for family, heads in compat.PINNED_HEADS.items():
    source = inspect.getsource(family.__call__)
    assert "x = self.final_norm(x)" in source, family
    if "skip_lm_head" in inspect.signature(family.__call__).parameters:  # tunix main
      assert "if skip_lm_head:\n      return x, new_cache" in source, family
      source = inspect.getsource(family.compute_final_logits)  # where main applies the head
    tied_flags = (False, True) if len(heads) == 2 else (True,)  # untied first, then tied
    for (attribute, method, weight, layout), tied in zip(heads, tied_flags, strict=True):
      call = f"self.{attribute}(x)" if method == "__call__" else f"self.{attribute}.{method}(x)"
      assert call in source, (family, call)
      hf = hf_config(hf_names[family.__name__], tie_word_embeddings=tied).to_dict()
      model = toy_models.abstract_model(hf_models.tunix_config(hf), family)
      assert hasattr(model, "lm_head") != tied, family
      shape = {"DV": (32, 24), "VD": (24, 32)}[layout]  # [D, V] or [V, D]
      assert getattr(getattr(model, attribute), weight).shape == shape, (family, attribute)


# ----------------------------------------------------------------------------
# No [B, T, V] buffer in the compiled train step and log-prob pass
# ----------------------------------------------------------------------------

B, P, T, V = 2, 2, 254, 32768  # one float32 [B, P + T, V] buffer: 64 MiB; a weight: 4 MiB


def _big_policy():
  config = toy_models.tiny_qwen3_config(V, num_layers=1, embed_dim=32, hidden_dim=64, num_heads=2,
                                    head_dim=16, num_kv_heads=1)  # fmt: skip
  return toy_models.abstract_model(config)


def _vocabulary_arrays(compiled) -> list[str]:
  """The shapes in the optimised HLO with the vocabulary axis and a sequence-sized axis."""
  shapes = re.findall(r"[a-z]+[0-9]*\[([0-9,]+)\]", compiled.as_text())
  found = []
  for dims in set(shapes):
    sizes = [int(d) for d in dims.split(",") if d]
    if V in sizes and any(s >= T for s in sizes if s != V):
      found.append(dims)
  return found


@pytest.mark.parametrize("fused", [False, True])
def test_no_pass_allocates_a_batch_by_sequence_by_vocabulary_array_with_the_fused_head(fused):
  """The actor's train step and the log-prob pass, compiled (XLA:CPU) at a shape where one
  float32 `[B, T, V]` buffer is larger than everything else together, as `plan` compiles them
  (`compile_pieces`: its memory analysis) and once more for their optimised HLO: with the flag
  off the temporaries exceed half of it and the HLO has `[.., T, .., V]` arrays; with it on
  there is none, and the temporaries stay under a quarter of it (a few `[B, chunk, V]`)."""
  chunk = 8
  config = PpoExtConfig(logits_chunk_size=chunk, fused_head=fused, kl_penalty="loss",
                        kl_loss_coef=0.1, entropy_coef=0.01)  # fmt: skip
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
  model = _big_policy()
  optimizer = abstract.abstract_optimizer(model, optax.adam(1e-3))
  train_example = abstract.train_example(mesh, B, P, T, kl_in_loss=True)
  static = dict(algo_config=config, pad_id=PAD, eos_id=EOS, temperature=1.0)
  loss_fn = tunix_losses.ppo_ext_policy_loss_fn
  pieces = [
    abstract.compile_train_step(
      model, optimizer, loss_fn, {"train_example": train_example}, static, mesh, role="actor"
    ),
    abstract.compile_logps_pass(
      model, mesh, B, P, T, role="reference", chunk_size=chunk, fused_head=fused
    ),  # fmt: skip
  ]
  graphdef, state = nnx.split(model)

  def grads(state, example):
    return nnx.grad(loss_fn, has_aux=True)(nnx.merge(graphdef, state), example, **static)

  def logps(state, example):
    return logps_entropy(nnx.merge(graphdef, state), example.prompt_ids,
                         example.completion_ids, example.attention_mask, fused)  # fmt: skip

  full = B * (P + T) * V * 4
  for piece, fn in zip(pieces, (grads, logps), strict=True):
    arrays = _vocabulary_arrays(jax.jit(fn).lower(state, train_example).compile())
    if fused:
      assert not arrays, (piece.name, arrays)
      assert piece.temp_bytes < full / 4, (piece.name, piece.temp_bytes, full)
    else:
      assert arrays and piece.temp_bytes >= full / 2, (piece.name, piece.temp_bytes, full)


# ----------------------------------------------------------------------------
# The run config and the CLI
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
  ("overrides", "message"),
  [
    (["model.fused_head=2"], "config key 'model.fused_head' must be bool, got 2"),
    (["model.fused_head=true", "ppo.logits_chunk_size=0"],
     "config key 'model.fused_head'=True is invalid: must be used with ppo.logits_chunk_size > 0"),
    (["ppo.fused_head=true"], "config key 'ppo.fused_head': set model.fused_head instead"),
    (["model.fused_head=true", "ppo.logits_chunk_size=8", "model.lora={target_modules: '.*'}"],
     "config key 'model.fused_head'=True: model.lora.target_modules adapts the LM head 'lm_head'"),
  ],
)  # fmt: skip
def test_bad_fused_head_settings_are_one_line_naming_the_key(overrides, message):
  with pytest.raises(ConfigError) as err:
    load_resolved(None, overrides)
  assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


def test_the_flag_is_resolved_once_into_the_ppo_config():
  resolved = load_resolved(None, ["model.fused_head=true", "ppo.logits_chunk_size=8"])
  assert resolved.ppo.fused_head is True and resolved.run.model.fused_head is True
  assert load_resolved(None, []).ppo.fused_head is False  # off by default
  with pytest.raises(ConfigError, match=r"PpoExtConfig\.fused_head=True is invalid: must be used "):
    PpoExtConfig(fused_head=True)


def test_a_two_step_cli_run_trains_with_the_fused_head(tmp_path, monkeypatch):
  """The smoke config (tunix's cluster, a toy Qwen3, GAE with a critic, KL in the loss) with
  the exact KL, for two steps with the flag on: it finishes, its metrics are finite and the
  actor was updated; every pass it traced went through the fused head, none through the
  logits."""
  traced = []
  hidden_states = compat.final_hidden_states

  def counted(model, *args, **kwargs):
    traced.append(type(model).__name__)
    return hidden_states(model, *args, **kwargs)

  def no_logits(*args, **kwargs):
    raise AssertionError("an unfused log-prob pass ran")

  monkeypatch.setattr(compat, "final_hidden_states", counted)
  monkeypatch.setattr(passes, "_completion_logits", no_logits)
  out = tmp_path / "run"
  args = ["train", "--config", str(SMOKE), "--output-dir", str(out), "train.steps=2"]
  args += ["train.eval_every=100", "model.fused_head=true", "ppo.logits_chunk_size=4"]
  args += ["ppo.kl_method=full"]  # in the loss (the smoke config) and the learner's own KL
  assert cli.main(args) == 0
  rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  values = {k: v for row in rows for k, v in row.items() if k != "step"}
  assert all(math.isfinite(v) for v in values.values() if isinstance(v, float)), values
  assert values["actor/grad_norm"] > 0 and "actor/entropy" in values
  assert values["actor/kl"] > 0  # the exact KL of the rollout policy to the reference
  assert json.loads((out / "config.json").read_text())["model"]["fused_head"] is True
  assert len(traced) >= 2 and set(traced) == {"Qwen3"}  # the actor's step and the passes


def test_plan_compiles_the_sharded_step_and_pass_with_the_fused_head_and_remat(tmp_path):
  """`plan` (CPU compiler, the default `v5e:2x4` topology: fsdp=8) builds and compiles the
  actor's train step and the reference pass with `model.fused_head` and `model.remat` on."""
  out = tmp_path / "plan.json"
  command = [sys.executable, "-m", "tunix_ppo_ext._src.run.cli", "plan", "--compiler", "cpu"]
  command += ["--pieces", "actor/train_step,reference/logps_pass", "--json", str(out)]
  command += ["model.fused_head=true", "ppo.logits_chunk_size=8", "model.remat=decoder"]
  result = subprocess.run(command, capture_output=True, text=True, timeout=1200)
  assert result.returncode == 0, result.stderr[-3000:]
  plan = json.loads(out.read_text())
  assert plan["mesh"]["fsdp"] == 8
  assert [(p["role"], p["name"]) for p in plan["pieces"]] == [
    ("actor", "train_step"),
    ("reference", "logps_pass"),
  ]


def test_a_policy_loss_of_tunix_s_own_registry_is_refused_with_the_fused_head():
  """tunix's own policy losses compute the whole logits in their pass: one line."""
  from tunix.rl import function_registry

  names = [n for n in ("grpo", "ppo", "dapo") if compat.tunix_holds(registry.POLICY_LOSSES, n)]
  if not names or registry.has(registry.POLICY_LOSSES, names[0]):
    pytest.skip("no policy loss of tunix's own registry to try")
  assert function_registry.get_policy_loss_fn(names[0]) is not None
  with pytest.raises(ConfigError, match=r"PpoExtConfig\.fused_head=True is invalid: must be used "):
    PpoExtConfig(fused_head=True, logits_chunk_size=8, policy_loss_fn=names[0])
