"""tunix models back to Hugging Face checkpoints: the inverse of tunix's safetensors loaders.

`hf_tensors(model)` names every parameter of a tunix Qwen2 / Qwen3 / Llama 3 / Gemma 3 the way
`transformers` does and lays it out as `transformers` stores it (`[out, in]` matrices, flat
heads); `hf_config(model, source)` is the checkpoint's `config.json` (the run's own file when
the model came from one, else a Qwen3 config for a built-in toy / named-size Qwen3);
`save_hf_checkpoint` writes both. A LoRA model is merged first (`lora.merged`); its
checkpoints hold only the adapters, which `restore_params` restores onto the base weights.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file
from tunix.models.qwen3 import model as qwen3
from tunix.sft import checkpoint_manager
from tunix.sft import utils as sft_utils

from tunix_ppo_ext._src.tunix.models import hf_models

SAFETENSORS_FILE = "model.safetensors"
Layout = Callable[[np.ndarray], list[np.ndarray]]


def _copy(array: np.ndarray) -> list[np.ndarray]:
  return [array]


def _transposed(array: np.ndarray) -> list[np.ndarray]:
  """tunix's `[in, out]` kernel as transformers' `[out, in]` weight."""
  return [array.T]


def _heads_in(array: np.ndarray) -> list[np.ndarray]:
  """tunix's q/k/v `[D, heads, head_dim]` as transformers' `[heads * head_dim, D]`."""
  return [array.reshape(array.shape[0], -1).T]


def _heads_out(array: np.ndarray) -> list[np.ndarray]:
  """tunix's output projection `[heads, head_dim, D]` as transformers' `[D, heads*head_dim]`."""
  return [array.reshape(-1, array.shape[-1]).T]


def _gemma_heads(array: np.ndarray) -> np.ndarray:
  """Gemma 3's `[heads, D, head_dim]` einsum weight as transformers' `[heads * head_dim, D]`."""
  return np.transpose(array, (0, 2, 1)).reshape(-1, array.shape[1])


def _gemma_q(array: np.ndarray) -> list[np.ndarray]:
  return [_gemma_heads(array)]


def _gemma_stacked(array: np.ndarray) -> list[np.ndarray]:
  """Gemma 3's stacked `[n, heads, D, head_dim]` (qkv: n=3, kv: n=2), one matrix each."""
  return [_gemma_heads(part) for part in array]


_LAYER = r"layers\.(\d+)\."
_HF_LAYER = "model.layers.{0}."
# (tunix parameter path regex, transformers name templates, layout); `{0}` is the layer,
# `{1}` the regex's second group. Qwen2, Qwen3 and Llama 3 share tunix's names.
RULES: tuple[tuple[str, tuple[str, ...], Layout], ...] = (
  (r"embedder\.input_embedding", ("model.embed_tokens.weight",), _copy),
  (r"final_norm\.(?:w|scale)", ("model.norm.weight",), _copy),
  (r"lm_head\.w", ("lm_head.weight",), _transposed),
  (_LAYER + r"attn\.(q|k|v)_proj\.w", (_HF_LAYER + "self_attn.{1}_proj.weight",), _heads_in),
  (_LAYER + r"attn\.o_proj\.w", (_HF_LAYER + "self_attn.o_proj.weight",), _heads_out),
  (_LAYER + r"attn\.(q|k|v)_bias", (_HF_LAYER + "self_attn.{1}_proj.bias",), _copy),
  (_LAYER + r"attn\.(q|k)_norm\.w", (_HF_LAYER + "self_attn.{1}_norm.weight",), _copy),
  (_LAYER + r"mlp\.(gate|up|down)_proj\.kernel", (_HF_LAYER + "mlp.{1}_proj.weight",), _transposed),
  (
    _LAYER + r"(input_layernorm|post_attention_layernorm)\.w",
    (_HF_LAYER + "{1}.weight",),
    _copy,
  ),
  # Gemma 3
  (
    _LAYER + r"attn\.qkv_einsum\.w",
    tuple(_HF_LAYER + f"self_attn.{p}_proj.weight" for p in "qkv"),
    _gemma_stacked,
  ),
  (_LAYER + r"attn\.q_einsum\.w", (_HF_LAYER + "self_attn.q_proj.weight",), _gemma_q),
  (
    _LAYER + r"attn\.kv_einsum\.w",
    tuple(_HF_LAYER + f"self_attn.{p}_proj.weight" for p in "kv"),
    _gemma_stacked,
  ),
  (_LAYER + r"attn\.attn_vec_einsum\.w", (_HF_LAYER + "self_attn.o_proj.weight",), _heads_out),
  (_LAYER + r"attn\._(query|key)_norm\.scale", (_HF_LAYER + "self_attn.{1}_norm.weight",), _copy),
  (_LAYER + r"pre_attention_norm\.scale", (_HF_LAYER + "input_layernorm.weight",), _copy),
  (_LAYER + r"post_attention_norm\.scale", (_HF_LAYER + "post_attention_layernorm.weight",), _copy),
  (_LAYER + r"pre_ffw_norm\.scale", (_HF_LAYER + "pre_feedforward_layernorm.weight",), _copy),
  (_LAYER + r"post_ffw_norm\.scale", (_HF_LAYER + "post_feedforward_layernorm.weight",), _copy),
)
_COMPILED = tuple((re.compile(p + "$"), names, layout) for p, names, layout in RULES)
_GEMMA_NORM_NAMES = {"query": "q", "key": "k"}


def hf_names(path: str) -> tuple[tuple[str, ...], Layout]:
  """The transformers names of tunix parameter `path` (dotted) and how to lay it out;
  ValueError naming the path when no rule knows it."""
  for regex, templates, layout in _COMPILED:
    match = regex.match(path)
    if match:
      groups = [_GEMMA_NORM_NAMES.get(g, g) for g in match.groups()]
      return tuple(t.format(*groups) for t in templates), layout
  raise ValueError(f"no Hugging Face name for tunix parameter {path!r}")


def hf_tensors(model: nnx.Module) -> dict[str, np.ndarray]:
  """Every `nnx.Param` of `model` under its transformers name, in transformers' layout
  (gathered to host memory, in the parameter's own dtype)."""
  tensors: dict[str, np.ndarray] = {}
  for path, value in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    dotted = ".".join(str(p) for p in path)
    names, layout = hf_names(dotted)
    for name, array in zip(names, layout(np.asarray(value[...])), strict=True):
      tensors[name] = np.ascontiguousarray(array)
  return tensors


def toy_qwen3_hf_config(config: qwen3.ModelConfig) -> dict[str, Any]:
  """A transformers `Qwen3Config` dict for a tunix Qwen3 built without a `config.json`.

  tunix 0.1.7's Qwen3 attention always rotates with theta 1e6 whatever `config.rope_theta`
  says, so the file says 1e6: what the model computes.
  """
  return {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": config.vocab_size,
    "hidden_size": config.embed_dim,
    "intermediate_size": config.hidden_dim,
    "num_hidden_layers": config.num_layers,
    "num_attention_heads": config.num_heads,
    "num_key_value_heads": config.num_kv_heads,
    "head_dim": config.head_dim,
    "hidden_act": "silu",
    "rms_norm_eps": config.norm_eps,
    "rope_theta": hf_models.TUNIX_FIXED_ROPE_THETA,
    "rope_scaling": None,
    "attention_bias": False,
    "tie_word_embeddings": bool(config.use_tied_embedding),
    "max_position_embeddings": 32768,
    "torch_dtype": "float32",
  }


def hf_config(model: nnx.Module, source: dict[str, Any] | None) -> dict[str, Any]:
  """The exported `config.json`: the source checkpoint's own (sizes and family unchanged by
  training), else a Qwen3 config for a tunix Qwen3 (ValueError for anything else); its
  `torch_dtype` (and `dtype`, where the source has it) the weights' own."""
  if source is not None:
    config = dict(source)
  elif isinstance(model, qwen3.Qwen3):
    config = toy_qwen3_hf_config(model.config)
  else:
    raise ValueError(f"cannot write a config.json for a {type(model).__name__} without its source")
  weights = jax.tree.leaves(nnx.state(model, nnx.Param))
  dtype = str(np.dtype(weights[0].dtype)) if weights else "float32"
  for key in {"torch_dtype"} | ({"dtype"} & config.keys()):
    config[key] = dtype
  return config


def save_hf_checkpoint(
  model: nnx.Module, directory: str | pathlib.Path, source: dict[str, Any] | None
) -> pathlib.Path:
  """Writes `config.json` and `model.safetensors` of `model` into `directory` (created).

  Args:
    model: the tunix model to export.
    directory: the output directory.
    source: the source checkpoint's `config.json` (`read_hf_config`); None: a Qwen3
      config from a tunix Qwen3's own (ValueError for any other model).

  Returns:
    `directory`.
  """
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  config = hf_config(model, source)
  save_file(hf_tensors(model), str(directory / SAFETENSORS_FILE), metadata={"format": "pt"})
  (directory / hf_models.CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
  return directory


def restore_params(model: nnx.Module, role_dir: str | pathlib.Path, step: int) -> nnx.Module:
  """`model` with the parameters of the orbax checkpoint `role_dir/<step>` that tunix's
  trainer wrote (e.g. a run's `checkpoints/actor`), restored in place by tunix's own
  checkpoint manager (only the `LoRAParam`s of a model with adapters: all such a trainer
  saves); RuntimeError when that step cannot be restored."""
  manager = checkpoint_manager.CheckpointManager(str(pathlib.Path(role_dir).resolve()))
  restored, _ = manager.maybe_restore(
    model, step=step, restore_only_lora_params=sft_utils.is_lora_enabled(model)
  )
  if restored != step:
    raise RuntimeError(f"checkpoint step {step} in {str(role_dir)!r} was not restored")
  return model
