"""LoRA adapters through tunix's own LoRA support (qwix), and merging them back.

`apply_lora(model, spec)` is what tunix's CLI does (`qwix.LoraProvider` +
`qwix.apply_lora_to_model` on the model's dummy input): every module whose `/`-joined path
(`layers/0/attn/q_proj`) fully matches `spec.target_modules` gains `nnx.LoRAParam`s A and B
next to its frozen weight, and computes `x W + (alpha / rank) x A B` (B starts at zero, so
the adapted model starts equal to the base). The adapted model is a clone that shares every
base array with `model`: tunix's `RLCluster` then lets the base model serve as the reference
without a second copy (its backbone sharing), its trainers train and checkpoint only the
`LoRAParam`s (`PeftTrainer`'s `_lora_enabled`), and `merged(model, spec)` folds the adapters
into the weights (`W + alpha / rank * A B`, as qwix computes it) for `export`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import qwix
from flax import nnx
from tunix.sft import hooks

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.config.run_sections import DEFAULT_TARGET_MODULES
from tunix_ppo_ext._src.config.run_sections import LORA_KEY as KEY
from tunix_ppo_ext._src.tunix import compat


@dataclasses.dataclass(frozen=True)
class LoraSpec:
  """Rank `r`, scale numerator `alpha` (updates are scaled by `alpha / r`, Hu et al. 2021,
  "LoRA: Low-Rank Adaptation of Large Language Models") and the regex of adapted modules."""

  rank: int
  alpha: float
  target_modules: str = DEFAULT_TARGET_MODULES

  @property
  def scale(self) -> float:
    """`alpha / rank`, the factor qwix applies to `x A B`."""
    return self.alpha / self.rank


def projection_paths(model: nnx.Module) -> list[str]:
  """`/`-joined paths (qwix's module paths) of the modules that own a weight of 2 or more
  dimensions directly: the candidates for adapters (an abstract model works too)."""
  paths = []
  for path, module in model.iter_modules():
    own = [v for v in vars(module).values() if isinstance(v, nnx.Param)]
    if any(len(v.shape) >= 2 for v in own):
      paths.append("/".join(map(str, path)))
  return paths


def check_targets(pattern: str, paths: Iterable[str], what: str) -> None:
  """ValueError naming `model.lora.target_modules` when `pattern` is no regex or fully matches
  none of `paths` (the projections of `what`, e.g. "the Qwen3 policy")."""
  key = f"config key '{KEY}.target_modules'={pattern!r}"
  if not pattern:
    raise ConfigError(f"{key} is empty: give a regex of module paths, e.g. '.*q_proj'")
  try:
    regex = re.compile(pattern)
  except re.error as err:
    raise ConfigError(f"{key} is not a regular expression: {err}") from None
  paths = list(paths)
  if not any(regex.fullmatch(p) for p in paths):
    shown = sorted({re.sub(r"/\d+/", "/N/", p) for p in paths})
    raise ConfigError(
      f"{key} matches no module of {what} (it must match a whole path; its projections are {shown})"
    )


def _dummy_inputs(model: nnx.Module) -> dict[str, Any]:
  """Inputs for the one call qwix makes to create the adapters: a tunix model's own
  `get_model_input()`, or two tokens for a value model."""
  if hasattr(model, "get_model_input"):
    return model.get_model_input()
  tokens = jnp.ones((2, 1), jnp.int32)
  return {"input_tokens": tokens, "positions": tokens, "attention_mask": jnp.ones((2, 1, 1), bool)}


def apply_lora(model: nnx.Module, spec: LoraSpec, seed: int = 0) -> nnx.Module:
  """A clone of `model` with qwix LoRA adapters on the modules `spec.target_modules` matches;
  every other array is shared with `model` (not copied). A is He-uniform from `seed`, B zero.
  ValueError naming `model.lora.target_modules` when no adapter was created.

  Args:
    model: the tunix model to adapt (left unchanged).
    spec: the adapters' rank, alpha and target-module regex.
    seed: seeds the A matrices' initialisation.

  Returns:
    The adapted model.
  """
  compat.install()  # qwix: the adapters' products with a lean VJP (same values)
  provider = qwix.LoraProvider(module_path=spec.target_modules, rank=spec.rank, alpha=spec.alpha)
  adapted = qwix.apply_lora_to_model(model, provider, rngs=nnx.Rngs(seed), **_dummy_inputs(model))
  if not jax.tree.leaves(nnx.state(adapted, nnx.LoRAParam)):
    raise ConfigError(
      f"config key '{KEY}.target_modules'={spec.target_modules!r} put no adapter on the "
      f"{type(model).__name__}: qwix adapts modules that multiply by a weight (einsum or "
      f"dot_general), e.g. {projection_paths(model)[-1]!r}"
    )
  return adapted


def parameter_counts(model: nnx.Module) -> dict[str, int]:
  """`{"total", "trainable"}` parameter counts: every `nnx.Param` (adapters included), and
  what a tunix trainer updates (the `LoRAParam`s when there are any, else every `Param`)."""
  total = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  lora = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))
  return {"total": total, "trainable": lora or total}


def array_bytes(tree: Any) -> int:
  """Bytes of the distinct arrays in `tree` (an array held twice counts once)."""
  arrays = {id(x): x for x in jax.tree.leaves(tree) if hasattr(x, "nbytes")}
  return sum(int(x.nbytes) for x in arrays.values())


def merged(model: nnx.Module, spec: LoraSpec) -> nnx.Module:
  """A new model of `model`'s tunix class (qwix's interception undone) and config whose weights
  are `model`'s with each adapter folded in (`W + alpha/rank * A B`, laid out as the weight),
  and no adapters: an ordinary tunix model computing what `model` computes.

  Args:
    model: a model with LoRA adapters (`apply_lora`).
    spec: the `LoraSpec` the adapters were made with (its `alpha / rank` scale).

  Returns:
    The merged model.
  """
  values = {path: v[...] for path, v in nnx.to_flat_state(nnx.state(model))}
  for path, module in model.iter_modules():
    for attr in [n for n in vars(module) if n.endswith("_lora_a")]:
      name = attr[: -len("_lora_a")]
      a, b = getattr(module, attr)[...], getattr(module, f"{name}_lora_b")[...]
      weight = values[(*path, name)]
      delta = lora_delta(a, b, weight.shape, module, name)
      values[(*path, name)] = (weight + spec.scale * delta).astype(weight.dtype)
  cls = getattr(type(model), "_unquantized_type", type(model))
  plain = nnx.eval_shape(lambda: cls(model.config, rngs=nnx.Rngs(0)))
  paths = [path for path, _ in nnx.to_flat_state(nnx.state(plain))]
  nnx.update(plain, nnx.State.from_flat_path({p: values[p] for p in paths}))
  return plain


def lora_delta(
  a: jax.Array, b: jax.Array, shape: tuple[int, ...], module: nnx.Module, name: str
) -> jax.Array:
  """`A B` laid out as the weight of `shape`. For a tunix `Einsum` (`BTD,DNH->BTNH`) qwix
  stores the adapter's einsum (`BTD,Dr,rNH->BTNH`) on the module: `W`'s subscripts (`DNH`)
  from `einsum_str`, A's and B's from qwix's give `einsum('Dr,rNH->DNH', A, B)`. For a
  `Linear` (dot_general, kernel `[in, out]`): A `[in, r]`, B `[r, out]`, so `A @ B`."""
  einsum_str = getattr(module, "einsum_str", None)
  stored = getattr(module, f"{name}_lora_einsum_str", None)
  if einsum_str is not None and stored is not None:
    weight_subscripts = einsum_str.replace(" ", "").split("->")[0].split(",")[1]
    a_sub, b_sub = stored.split("->")[0].split(",")[1:]
    return jnp.einsum(f"{a_sub},{b_sub}->{weight_subscripts}", a, b)
  if a.ndim == 2 and b.ndim == 2 and len(shape) == 2:
    return a @ b
  raise ConfigError(f"cannot merge the LoRA adapter of {name!r} of shape {shape}")


def memory_report(cluster: Any) -> dict[str, Any]:
  """What the cluster's models hold, counted from its live arrays: per trainer (`actor`,
  `critic` if any) `params` (`parameter_counts`) and `optimizer_state_bytes` (its optax
  state), and over actor, critic and reference `model_bytes` (each distinct parameter array
  once) next to `model_bytes_if_separate` (each model's parameters counted on their own)."""
  trainers = {"actor": cluster.actor_trainer}
  if getattr(cluster, "critic_trainer", None) is not None:
    trainers["critic"] = cluster.critic_trainer
  report: dict[str, Any] = {}
  held = [trainer.model for trainer in trainers.values()]
  for role, trainer in trainers.items():
    report[role] = {
      "params": parameter_counts(trainer.model),
      "optimizer_state_bytes": array_bytes(trainer.optimizer.opt_state),
    }
  try:
    held.append(cluster.inference_worker.get_model("reference"))
  except ValueError:  # a run without reference model
    pass
  states = [nnx.state(m, nnx.Param) for m in held]
  report["model_bytes"] = array_bytes(states)
  report["model_bytes_if_separate"] = sum(array_bytes(s) for s in states)
  return report


FROZEN = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))


class SharedBase(hooks.TrainingHooks):
  """A trainer's hooks (`inner`, called as before) that before and after every train step
  point the frozen weights of `part(trainer.model)` back at the base model's own arrays.

  Every graph-mode `nnx.jit` call over the model in tunix 0.1.7 (its train step; also a pass
  between two updates: measured, the actor and critic no longer shared the base at the
  second step's start) hands back every array of the model, the frozen ones too, as new
  buffers of the same values: a LoRA actor would stop sharing the base with the reference,
  and two copies would stay. With this hook a second copy lives only from such a call to
  the next train step's start or end, not across steps."""

  def __init__(self, inner: Any, base: nnx.Module, part: Callable[[nnx.Module], nnx.Module]):
    self.inner, self.part = inner, part
    self.base = dict(nnx.to_flat_state(nnx.state(base, nnx.Param)))

  def repoint(self, model: nnx.Module) -> None:
    """`part(model)`'s frozen arrays := the base's (same values, so nothing changes but
    which buffers are held)."""
    module = self.part(model)
    paths = [path for path, _ in nnx.to_flat_state(nnx.state(module, FROZEN))]
    nnx.update(module, nnx.State.from_flat_path({p: self.base[p] for p in paths}))

  def on_train_step_end(self, train_ctx: Any, train_step: int, train_loss: Any) -> None:
    self.repoint(train_ctx.model)
    if self.inner is not None:
      self.inner.on_train_step_end(train_ctx, train_step, train_loss)

  def on_train_start(self, train_ctx: Any) -> None:
    if self.inner is not None:
      self.inner.on_train_start(train_ctx)

  def on_train_end(self, train_ctx: Any) -> None:
    if self.inner is not None:
      self.inner.on_train_end(train_ctx)

  def on_train_step_start(self, train_ctx: Any) -> None:
    self.repoint(train_ctx.model)
    if self.inner is not None:
      self.inner.on_train_step_start(train_ctx)

  def on_eval_step_start(self, train_ctx: Any) -> None:
    if self.inner is not None:
      self.inner.on_eval_step_start(train_ctx)

  def on_eval_step_end(self, train_ctx: Any, eval_loss: Any) -> None:
    if self.inner is not None:
      self.inner.on_eval_step_end(train_ctx, eval_loss)


def shares_base(module: nnx.Module, base: nnx.Module) -> bool:
  """Whether every frozen weight of `module` is the very array `base` holds at that path."""
  held = dict(nnx.to_flat_state(nnx.state(base, nnx.Param)))
  own = list(nnx.to_flat_state(nnx.state(module, FROZEN)))
  return bool(own) and all(p in held and v[...] is held[p][...] for p, v in own)


def keep_base_shared(cluster: Any) -> list[str]:
  """Installs `SharedBase` on the trainers whose model shares the reference's base arrays
  (the LoRA actor; a LoRA critic's backbone); returns their roles."""
  try:
    reference = cluster.inference_worker.get_model("reference")
  except ValueError:  # no reference model: nothing to share with
    return []
  parts = {"actor": lambda m: m, "critic": lambda m: m.backbone}
  trainers = {"actor": cluster.actor_trainer, "critic": getattr(cluster, "critic_trainer", None)}
  shared = []
  for role, trainer in trainers.items():
    if trainer is None or not hasattr(trainer.model, "backbone") and role == "critic":
      continue
    if shares_base(parts[role](trainer.model), reference):
      trainer.with_training_hooks(SharedBase(trainer.training_hooks, reference, parts[role]))
      shared.append(role)
  return shared
