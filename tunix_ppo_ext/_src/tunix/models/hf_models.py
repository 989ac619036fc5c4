"""Hugging Face checkpoints of any supported family as tunix models, through tunix's loaders.

`model.checkpoint=DIR` with a `config.json` (or a GGUF file, or an installed package's
short name, converted into such a directory by `gguf_files.resolve`): `read_hf_config`
reads it, `family_of` picks the tunix model family by its `model_type` (`FAMILIES`:
Qwen2/2.5, Qwen3, Llama 3, Gemma 3), `tunix_config` translates it to that family's
`ModelConfig` (tied embeddings and a padded vocabulary come from the file), refusing with
the key and value named anything tunix 0.1.7 would compute differently from `transformers`
(`check_supported`), and `load_checkpoint` calls the family's own
`create_model_from_safe_tensors`, sharded on the mesh given.

tunix 0.1.7's Llama 3 and Qwen3 attention rotate with theta 1e6 whatever their config says,
and know no RoPE scaling: their configs here are subclasses carrying the checkpoint's
inverse frequencies (`rope_frequencies`: default, `linear` and Llama 3.1's `llama3` RoPE,
as `transformers` computes them), which `compat.use_rope_frequencies` makes the loaded
model's attention use.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.models.gemma3 import model as gemma3
from tunix.models.gemma3 import params_safetensors as gemma3_params
from tunix.models.llama3 import model as llama3
from tunix.models.llama3 import params as llama3_params
from tunix.models.qwen2 import model as qwen2
from tunix.models.qwen2 import params as qwen2_params
from tunix.models.qwen3 import model as qwen3
from tunix.models.qwen3 import params as qwen3_params

from tunix_ppo_ext._src.checks import ConfigError, did_you_mean
from tunix_ppo_ext._src.config.model_spec import (  # noqa: F401 (REMAT_, ATTENTION_CHOICES: here too)
  ATTENTION_CHOICES,
  DTYPE_NAMES,
  REMAT_CHOICES,
  ModelSpec,
)
from tunix_ppo_ext._src.data import gguf_files
from tunix_ppo_ext._src.tunix import compat

CONFIG_FILE = "config.json"
# tunix 0.1.7's Qwen3 and Llama 3 attention call `apply_rope` without the config's theta:
# it is always this default, whatever `ModelConfig.rope_theta` says (a model built from a
# plain tunix config, the toy or a named size, rotates with it).
TUNIX_FIXED_ROPE_THETA = 1_000_000.0
ROPE_TYPES = ("default", "linear", "llama3")  # what `rope_frequencies` computes


def _frozen_as(config_class: type) -> bool:
  """Whether tunix's config dataclass is frozen (a subclass must match it): Llama 3's is
  in tunix 0.1.7 and is not on tunix main (c7d8950f); Qwen3's is in neither."""
  return config_class.__dataclass_params__.frozen


@dataclasses.dataclass(frozen=_frozen_as(llama3.ModelConfig))
class Llama3Config(llama3.ModelConfig):
  """tunix's Llama 3 config plus the inverse RoPE frequencies its attention rotates with."""

  rope_inv_freq: tuple[float, ...] | None = None


@dataclasses.dataclass(slots=True, frozen=_frozen_as(qwen3.ModelConfig))
class Qwen3Config(qwen3.ModelConfig):
  """tunix's Qwen3 config plus the inverse RoPE frequencies its attention rotates with."""

  rope_inv_freq: tuple[float, ...] | None = None


GEMMA3_NORM_EPS = 1e-6  # tunix's Gemma 3 RMSNorm has it hard-coded


@dataclasses.dataclass(frozen=True)
class Family:
  """One tunix model family: its model class, its HF-config translation and its loader."""

  name: str
  model_class: type
  to_config: Callable[[dict[str, Any]], Any]
  load: Callable[..., nnx.Module]  # tunix's create_model_from_safe_tensors(dir, cfg, mesh, dtype)
  checks: Callable[[dict[str, Any]], None]


def read_hf_config(directory: str | pathlib.Path) -> dict[str, Any] | None:
  """The checkpoint's `config.json` as a dict (a multimodal one's `text_config` merged in),
  or None when the directory has none (a GGUF reference: its converted directory's).

  Args:
    directory: a Hugging Face checkpoint directory or a `.gguf` file.

  Returns:
    The config dict, or None.
  """
  file = pathlib.Path(gguf_files.resolve(directory)) / CONFIG_FILE
  if not file.is_file():
    return None
  try:
    data = json.loads(file.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as err:
    raise ConfigError(f"config key 'model.checkpoint': {str(file)!r} is not JSON: {err}") from None
  if not isinstance(data, dict):
    raise ConfigError(f"config key 'model.checkpoint': {str(file)!r} is not a JSON object")
  if isinstance(data.get("text_config"), dict):  # e.g. Gemma3ForConditionalGeneration
    data = {**data, **data["text_config"], "model_type": data["text_config"].get("model_type")}
  return data


def _key(hf: dict[str, Any], name: str) -> Any:
  if name not in hf or hf[name] is None:
    raise ConfigError(
      f"checkpoint config.json has no {name!r} (model_type {hf.get('model_type')!r})"
    )
  return hf[name]


def rope(hf: dict[str, Any], layer_type: str | None = None) -> dict[str, Any]:
  """The RoPE parameters `{rope_theta, rope_type, factor?, ...}`: transformers 5 writes
  `rope_parameters` (per layer type for Gemma 3), older files `rope_theta` + `rope_scaling`."""
  params = dict(hf.get("rope_parameters") or {})
  if layer_type is not None and isinstance(params.get(layer_type), dict):
    params = dict(params[layer_type])
  # the legacy `rope_scaling` of a Gemma 3 applies to its global layers only
  scaling = {} if layer_type == "sliding_attention" else hf.get("rope_scaling") or {}
  params.setdefault("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
  for name, value in scaling.items():
    params.setdefault(name, value)
  if params.get("rope_theta") is None:
    legacy = "rope_local_base_freq" if layer_type == "sliding_attention" else "rope_theta"
    params["rope_theta"] = hf.get(legacy)
  return params


def head_dim(hf: dict[str, Any]) -> int:
  """`head_dim`, else `hidden_size // num_attention_heads` (what transformers defaults to)."""
  return hf.get("head_dim") or _key(hf, "hidden_size") // _key(hf, "num_attention_heads")


def _common(hf: dict[str, Any]) -> dict[str, Any]:
  """The sizes every family shares, under tunix's names."""
  return {
    "num_layers": _key(hf, "num_hidden_layers"),
    "embed_dim": _key(hf, "hidden_size"),
    "hidden_dim": _key(hf, "intermediate_size"),
    "num_heads": _key(hf, "num_attention_heads"),
    "head_dim": head_dim(hf),
    "num_kv_heads": hf.get("num_key_value_heads") or _key(hf, "num_attention_heads"),
  }


def _rope_decoder(hf: dict[str, Any], norm_eps: float) -> dict[str, Any]:
  """`_common` plus what Qwen 2, Qwen 3 and Llama 3 also share: the vocabulary, RoPE's
  theta and the RMS-norm epsilon (`norm_eps` where config.json leaves it out)."""
  return {
    **_common(hf),
    "vocab_size": _key(hf, "vocab_size"),
    "rope_theta": float(rope(hf)["rope_theta"] or 10_000.0),
    "norm_eps": float(hf.get("rms_norm_eps", norm_eps)),
  }


def _tied(hf: dict[str, Any]) -> bool:
  return bool(hf.get("tie_word_embeddings", False))


def _refuse(hf: dict[str, Any], key: str, value: Any, why: str) -> None:
  raise ConfigError(
    f"checkpoint config.json ({hf.get('model_type')}): {key}={value!r} is not supported: {why}"
  )


def _check_plain_rope(hf: dict[str, Any], layer_type: str | None = None) -> None:
  params = rope(hf, layer_type)
  kind = params.get("rope_type", "default")
  if kind != "default":
    _refuse(hf, "rope_type", kind, "tunix 0.1.7 implements only the default RoPE (no scaling)")


def _check_rope_frequencies(hf: dict[str, Any]) -> None:
  """Qwen3 / Llama 3: any theta, and the RoPE types `rope_frequencies` computes."""
  kind = rope(hf).get("rope_type", "default")
  if kind not in ROPE_TYPES:
    _refuse(hf, "rope_type", kind, f"the RoPE types supported here are {list(ROPE_TYPES)}")
  rope_frequencies(hf)  # a missing scaling key is named


def rope_frequencies(hf: dict[str, Any]) -> tuple[float, ...]:
  """The `head_dim // 2` inverse frequencies `transformers` rotates with (its
  `ROPE_INIT_FUNCTIONS` for `default`, `linear` and `llama3`), as float32 values."""
  params = rope(hf)
  dim = head_dim(hf)
  theta = float(params.get("rope_theta") or 10_000.0)
  inv = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
  kind = params.get("rope_type", "default")
  if kind == "linear":
    inv = inv / float(_rope_key(hf, params, "factor"))
  elif kind == "llama3":
    inv = _llama3_frequencies(hf, params, inv)
  return tuple(float(v) for v in inv.astype(np.float32))


def _rope_key(hf: dict[str, Any], params: dict[str, Any], name: str) -> Any:
  if params.get(name) is None:
    _refuse(hf, "rope_parameters", params, f"rope_type {params.get('rope_type')!r} needs {name!r}")
  return params[name]


def _llama3_frequencies(hf: dict[str, Any], params: dict[str, Any], inv: np.ndarray) -> np.ndarray:
  """Llama 3.1's scaling: long wavelengths divided by `factor`, short ones kept, the band
  between interpolated (transformers' `_compute_llama3_parameters`)."""
  factor = float(_rope_key(hf, params, "factor"))
  low = float(_rope_key(hf, params, "low_freq_factor"))
  high = float(_rope_key(hf, params, "high_freq_factor"))
  old = float(_rope_key(hf, params, "original_max_position_embeddings"))
  wavelen = 2 * np.pi / inv
  scaled = np.where(wavelen > old / low, inv / factor, inv)
  smooth = (old / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= old / high) & (wavelen <= old / low)
  return np.where(medium, smoothed, scaled)


def _check_no_bias(hf: dict[str, Any]) -> None:
  for key in ("attention_bias", "mlp_bias"):
    if hf.get(key):
      _refuse(hf, key, hf[key], "tunix's model has no such biases")


def _check_qwen2(hf: dict[str, Any]) -> None:
  _check_plain_rope(hf)
  if hf.get("use_sliding_window"):
    _refuse(hf, "use_sliding_window", True, "tunix's Qwen2 attends to the whole context")


def _check_qwen3(hf: dict[str, Any]) -> None:
  _check_rope_frequencies(hf)
  _check_no_bias(hf)
  if hf.get("use_sliding_window"):
    _refuse(hf, "use_sliding_window", True, "tunix's Qwen3 attends to the whole context")
  if hf.get("num_experts"):
    _refuse(hf, "num_experts", hf["num_experts"], "use a dense Qwen3 (MoE is not wired here)")


def _check_llama(hf: dict[str, Any]) -> None:
  _check_rope_frequencies(hf)
  _check_no_bias(hf)


def gemma3_layer_types(num_layers: int) -> list[str]:
  """tunix's fixed Gemma 3 pattern (5 sliding, 1 global, repeated) under HF's names."""
  pattern = [
    "full_attention" if kind == gemma3.AttentionType.GLOBAL else "sliding_attention"
    for kind in gemma3.GEMMA3_ATTENTION_PATTERN
  ]
  return [pattern[i % len(pattern)] for i in range(num_layers)]


def _check_gemma3(hf: dict[str, Any]) -> None:
  layers = hf.get("layer_types") or gemma3_layer_types(_key(hf, "num_hidden_layers"))
  if layers != gemma3_layer_types(_key(hf, "num_hidden_layers")):
    _refuse(hf, "layer_types", layers, "tunix's Gemma 3 repeats 5 sliding then 1 global layer")
  pattern = hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", 6))
  if pattern != len(gemma3.GEMMA3_ATTENTION_PATTERN) and not hf.get("layer_types"):
    _refuse(hf, "sliding_window_pattern", pattern, "tunix's Gemma 3 has a global layer every 6th")
  for key in ("attn_logit_softcapping", "final_logit_softcapping"):
    if hf.get(key) is not None:
      _refuse(hf, key, hf[key], "tunix's Gemma 3 does not soft-cap")
  if float(hf.get("rms_norm_eps", GEMMA3_NORM_EPS)) != GEMMA3_NORM_EPS:
    _refuse(hf, "rms_norm_eps", hf["rms_norm_eps"], f"tunix's Gemma 3 uses {GEMMA3_NORM_EPS}")
  if hf.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
    _refuse(hf, "hidden_activation", hf["hidden_activation"], "tunix uses tanh-approximate GELU")
  _check_no_bias(hf)
  _gemma3_query_norm(hf)
  _check_plain_rope(hf, "sliding_attention")
  kind = rope(hf, "full_attention").get("rope_type", "default")
  if kind not in ("default", "linear"):
    _refuse(hf, "rope_type", kind, "tunix's Gemma 3 implements default and linear RoPE only")


def _gemma3_query_norm(hf: dict[str, Any]) -> gemma3.QueryPreAttentionNormalisation:
  """Gemma 3 scales queries by `query_pre_attn_scalar ** -0.5`; tunix knows two scalars."""
  norm = gemma3.QueryPreAttentionNormalisation
  scalar = hf.get("query_pre_attn_scalar", head_dim(hf))
  if scalar == head_dim(hf):
    return norm.BY_ONE_OVER_SQRT_HEAD_DIM
  if scalar == hf["hidden_size"] // hf["num_attention_heads"]:
    return norm.BY_ONE_OVER_SQRT_EMBED_DIM_DIV_NUM_HEADS
  _refuse(hf, "query_pre_attn_scalar", scalar, "tunix supports head_dim or hidden/heads only")
  raise AssertionError  # unreachable: _refuse raises


def _qwen2_config(hf: dict[str, Any]) -> qwen2.ModelConfig:
  return qwen2.ModelConfig(**_rope_decoder(hf, 1e-6), use_tied_embedding=_tied(hf))


def _qwen3_config(hf: dict[str, Any]) -> Qwen3Config:
  return Qwen3Config(
    **_rope_decoder(hf, 1e-6),
    rope_inv_freq=rope_frequencies(hf),
    use_tied_embedding=_tied(hf),
    dtype=jnp.float32,
    param_dtype=jnp.float32,
  )


def _llama_config(hf: dict[str, Any]) -> Llama3Config:
  return Llama3Config(
    **_rope_decoder(hf, 1e-5), rope_inv_freq=rope_frequencies(hf), weight_tying=_tied(hf)
  )


def _gemma3_config(hf: dict[str, Any]) -> gemma3.ModelConfig:
  sizes = _common(hf)
  global_rope = rope(hf, "full_attention")
  return gemma3.ModelConfig(
    **sizes,
    num_embed=_key(hf, "vocab_size"),
    sliding_window_size=hf.get("sliding_window"),
    local_base_frequency=float(rope(hf, "sliding_attention")["rope_theta"] or 10_000),
    global_base_frequency=float(global_rope["rope_theta"] or 1_000_000),
    global_scale_factor=float(global_rope.get("factor", 1.0)),
    query_pre_attn_norm=_gemma3_query_norm(hf),
    param_dtype=jnp.float32,
  )


FAMILIES: dict[str, Family] = {  # HF `model_type` -> family
  "qwen2": Family(
    "qwen2", qwen2.Qwen2, _qwen2_config, qwen2_params.create_model_from_safe_tensors, _check_qwen2
  ),
  "qwen3": Family(
    "qwen3", qwen3.Qwen3, _qwen3_config, qwen3_params.create_model_from_safe_tensors, _check_qwen3
  ),
  "llama": Family(
    "llama3",
    llama3.Llama3,
    _llama_config,
    llama3_params.create_model_from_safe_tensors,
    _check_llama,
  ),
  "gemma3_text": Family(
    "gemma3",
    gemma3.Gemma3,
    _gemma3_config,
    gemma3_params.create_model_from_safe_tensors,
    _check_gemma3,
  ),
}


def family_of(hf: dict[str, Any]) -> Family:
  """The family for the config's `model_type`; ValueError naming it (with suggestions)."""
  model_type = hf.get("model_type")
  if model_type == "gemma3":  # a multimodal Gemma 3's config: its text model is read
    model_type = "gemma3_text"
  if model_type not in FAMILIES:
    hint = did_you_mean(str(model_type), list(FAMILIES), n=2)
    raise ConfigError(
      f"checkpoint config.json: model_type {model_type!r} is not supported{hint} "
      f"(supported: {sorted(FAMILIES)})"
    )
  return FAMILIES[model_type]


def tunix_config(hf: dict[str, Any]) -> Any:
  """The family's tunix `ModelConfig` for a checkpoint's config dict, after the refusals."""
  family = family_of(hf)
  for name in (*SIZE_KEYS.values(), "vocab_size"):  # a quoted "2" fails deep in tunix
    value = hf.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
      raise ConfigError(f"checkpoint config.json {name}={value!r}: must be an integer >= 1")
  family.checks(hf)
  return family.to_config(hf)


# The ModelSection size keys and the config.json key each one corresponds to.
SIZE_KEYS = {
  "num_layers": "num_hidden_layers",
  "embed_dim": "hidden_size",
  "hidden_dim": "intermediate_size",
  "num_heads": "num_attention_heads",
  "head_dim": "head_dim",
  "num_kv_heads": "num_key_value_heads",
}


def check_sizes(hf: dict[str, Any], given: dict[str, int]) -> None:
  """Each `model.<size>` the user gave must equal the checkpoint's; ValueError naming both."""
  sizes = _common(hf)
  for key, value in given.items():
    if sizes[key] != value:
      raise ConfigError(
        f"config key 'model.{key}'={value} differs from the checkpoint's config.json "
        f"{SIZE_KEYS[key]}={sizes[key]} (drop model.{key}: it is read from config.json)"
      )


def vocab_size(model: nnx.Module) -> int:
  """Rows of the model's output vocabulary (tunix names it differently per family)."""
  return config_vocab_size(model.config)


def config_vocab_size(config: Any) -> int:
  """Rows of the output vocabulary of a model of `config` (any family's `ModelConfig`)."""
  return config.num_embed if hasattr(config, "num_embed") else config.vocab_size


# `model.remat`: tunix's `RematConfig` of every family (Qwen2, Qwen3, Llama 3, Gemma 3), by
# name: none (every activation kept), block (the attention and MLP blocks recomputed in the
# backward), decoder (each whole decoder layer recomputed): `model_spec.REMAT_CHOICES`


def with_remat(config: Any, remat: str) -> Any:
  """`config` (any family's tunix `ModelConfig`) with its `remat_config` set to `remat`, one
  of `REMAT_CHOICES`, as its family's own `RematConfig` member."""
  return dataclasses.replace(config, remat_config=type(config.remat_config)[remat.upper()])


# `model.attention`: how the training passes attend. dense: tunix's `[T, T]` scores (every
# family); splash: tunix's TPU splash kernel (Qwen3 and Qwen2: `use_flash_attention`), which
# never forms `[T, T]` and keeps padding out through the segment ids the passes give;
# blockwise: `ops.segment_attention` on any backend (Qwen3: `compat.use_blockwise_attention`):
# `model_spec.ATTENTION_CHOICES`


def _tunix_family(config: Any) -> str:
  """`qwen3`, `llama3`, ...: the tunix module of `config`'s class or of the tunix class it
  extends (this module's `Llama3Config` adds RoPE fields to tunix's)."""
  for cls in type(config).__mro__:
    parts = cls.__module__.split(".")
    if parts[:2] == ["tunix", "models"] and len(parts) > 2:
      return parts[2]
  return type(config).__name__


def with_attention(config: Any, attention: str, block_size: int) -> Any:
  """`config` with tunix's splash attention on in blocks of `block_size` tokens when
  `attention` is `splash` (`ATTENTION_CHOICES`); ConfigError naming the key for a family
  whose tunix model has none."""
  family = _tunix_family(config)
  if attention == "dense" or (attention == "blockwise" and family == "qwen3"):
    return config  # blockwise: the layers change (`attend_blockwise`), not the config
  if attention == "blockwise" or not hasattr(config, "use_flash_attention"):
    have = "tunix's qwen3 has" if attention == "blockwise" else "tunix's qwen3 and qwen2 have"
    raise ConfigError(
      f"config key 'model.attention'={attention!r}: not for tunix's {family} model ({have} "
      "it); use model.attention=dense"
    )
  return dataclasses.replace(
    config, use_flash_attention=True, flash_attention_block_size=block_size
  )


def attend_blockwise(models: Any, block_size: int) -> None:
  """Each of `models` (policies or value models, None skipped) attends blockwise, in blocks
  of `block_size` keys, on its cache-free passes (`model.attention: blockwise`)."""
  for model in models:
    if model is not None:
      compat.use_blockwise_attention(model, block_size)


# `model.dtype`: the frozen weights held and computed in bfloat16 or float32, and every
# weight the run trains kept in float32 (its master copy: an optimizer step on bfloat16
# weights rounds away updates below 2^-8 of the weight); unset, every weight stays as the
# checkpoint stores it (a toy model: float32). A config with a compute `dtype` field (Qwen3,
# Qwen2) computes in it; the others (Llama 3, Gemma 3) in their weights' dtype.
DTYPES = {name: getattr(jnp, name) for name in DTYPE_NAMES}  # `model.dtype`'s choices


def with_dtype(config: Any, dtype: str | None) -> Any:
  """`config` (any family's tunix `ModelConfig`) computing in `dtype` (a `DTYPES` name;
  None: unchanged) where it has a compute `dtype` field; its weights are cast after they
  are built or loaded (`cast_params`), so a toy model draws the same weights either way."""
  if dtype is None or "dtype" not in {f.name for f in dataclasses.fields(config)}:
    return config
  return dataclasses.replace(config, dtype=DTYPES[dtype])


def cast_params(model: nnx.Module, dtype: Any, kind: type = nnx.Param) -> nnx.Module:
  """`model` with every floating variable of `kind` (`nnx.Param`: every weight, adapters
  included) cast to `dtype` in place; returns `model`.

  Args:
    model: the model, changed in place.
    dtype: the target dtype, e.g. `jnp.float32`.
    kind: the variable type to cast (`nnx.Param`, or e.g. `nnx.LoRAParam`).

  Returns:
    `model`.
  """
  weights = nnx.state(model, kind)

  def cast(x: Any) -> Any:
    return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

  nnx.update(model, jax.tree.map(cast, weights))
  return model


def train_in_float32(*roles: nnx.Module | None) -> None:
  """What each trained role (actor, critic; None skipped) trains, in float32: its adapters
  (`nnx.LoRAParam`, a LoRA critic's value head too) when it has any, else every weight.

  Args:
    *roles: the trained models, cast in place; None entries are skipped.
  """
  for model in roles:
    if model is not None:
      adapted = bool(jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))
      cast_params(model, jnp.float32, nnx.LoRAParam if adapted else nnx.Param)


def configured(config: Any, spec: ModelSpec) -> Any:
  """`config` with the run's `model.remat`, `model.attention` (with its block size) and
  `model.dtype` (`with_dtype`).

  Args:
    config: a tunix `ModelConfig` of any family.
    spec: the run's model settings.

  Returns:
    The configured `ModelConfig`.
  """
  config = with_dtype(config, spec.dtype)
  return with_attention(with_remat(config, spec.remat), spec.attention, spec.block_size)


def load_checkpoint(
  directory: str | pathlib.Path,
  mesh: jax.sharding.Mesh | None = None,
  remat: str = "none",
  attention: str = "dense",
  block_size: int = 512,
  dtype: str | None = None,
) -> nnx.Module:
  """The tunix model of the checkpoint in `directory`, loaded by its family's own tunix
  loader straight onto `mesh` (sharded; None: the first device), in `dtype`
  (`DTYPES`; None: the file's), with tunix's activation rematerialisation `remat`
  (`REMAT_CHOICES`) and attention `attention` (`ATTENTION_CHOICES`, blocks of
  `block_size`): `load_model` with these as its `ModelSpec`.

  Args:
    directory: a Hugging Face checkpoint directory (or a `.gguf` file).
    mesh: the mesh the weights are sharded onto; None: the first device.
    remat: the rematerialisation, one of `REMAT_CHOICES`.
    attention: the attention implementation, one of `ATTENTION_CHOICES`.
    block_size: the block size of blockwise and splash attention.
    dtype: the weights' dtype (`"bfloat16"`, `"float32"`); None: the file's.

  Returns:
    The tunix model.
  """
  return load_model(directory, mesh, ModelSpec(remat, attention, block_size, dtype))


def load_model(
  directory: str | pathlib.Path, mesh: jax.sharding.Mesh | None, spec: ModelSpec
) -> nnx.Module:
  """The tunix model of the checkpoint in `directory`, loaded by its family's own tunix
  loader straight onto `mesh` (sharded; None: the first device), built as `spec` says.

  Args:
    directory: a Hugging Face checkpoint directory (or a `.gguf` file).
    mesh: the mesh the weights are sharded onto; None: the first device.
    spec: the run's model settings (`model.remat`, `model.attention`, `model.dtype`).

  Returns:
    The tunix model.
  """
  hf = read_hf_config(directory)
  if hf is None:
    where = gguf_files.resolve(directory)
    raise ConfigError(f"checkpoint directory {str(where)!r} has no {CONFIG_FILE}")
  config = configured(tunix_config(hf), spec)
  return load_family_model(directory, family_of(hf), config, mesh, spec.dtype)


def load_family_model(
  directory: str | pathlib.Path,
  family: Family,
  config: Any,
  mesh: jax.sharding.Mesh | None,
  dtype: str | None = None,
) -> nnx.Module:
  """The checkpoint in `directory` (a GGUF reference: its weights converted first) as a
  model of `family` and its tunix `config` (`configured` already), loaded by the family's
  own tunix loader straight onto `mesh` (sharded; None: the first device), in `dtype`
  (`DTYPES`; None: the file's).

  Args:
    directory: a Hugging Face checkpoint directory (or a `.gguf` file).
    family: the checkpoint's family (`family_of` its `config.json`).
    config: the family's tunix `ModelConfig` for it.
    mesh: the mesh the weights are sharded onto; None: the first device.
    dtype: the weights' dtype (`"bfloat16"`, `"float32"`); None: the file's.

  Returns:
    The tunix model.
  """
  directory = gguf_files.resolve(directory, weights=True)
  try:
    model = family.load(str(directory), config, mesh, DTYPES.get(dtype))
  except (ValueError, TypeError, KeyError, OSError) as err:  # tunix's loader names no file
    detail = str(err).splitlines()[0] if str(err) else ""
    raise ConfigError(
      f"checkpoint {str(directory)!r} cannot be loaded ({type(err).__name__}: {detail[:200]}): "
      f"its weight files are damaged or disagree with its {CONFIG_FILE}"
    ) from err
  return compat.use_rope_frequencies(model)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def has_tokenizer(directory: str | pathlib.Path) -> bool:
  """Whether a checkpoint directory also holds its Hugging Face tokenizer."""
  directory = pathlib.Path(gguf_files.resolve(directory))
  return any((directory / name).is_file() for name in TOKENIZER_FILES)


class CheckpointModel(NamedTuple):
  """What a checkpoint's `config.json` says of its model: the file's dict (`hf`), its
  family and the family's tunix `ModelConfig`."""

  hf: dict[str, Any]
  family: Family
  config: Any


def validate_checkpoint(
  directory: str | pathlib.Path, given: dict[str, int], config_name: str | None
) -> CheckpointModel | None:
  """Config-time check of `model.checkpoint`: with a `config.json`, its family is supported,
  nothing in it is refused, `given` sizes (`model.<size>` keys the user set) agree with it
  and no `model.config_name` competes with it. Returns its `CheckpointModel` (None: no
  file)."""
  hf = read_hf_config(directory)
  if hf is None:
    return None
  config = tunix_config(hf)
  check_sizes(hf, given)
  if config_name is not None:
    check_named_config(config, config_name)
  return CheckpointModel(hf, family_of(hf), config)


def check_named_config(config: Any, config_name: str) -> None:
  """`model.config_name` next to a `config.json` (older run configs name both): the named
  tunix Qwen3 config must have the file's sizes; ValueError naming the first that differs."""
  if not config_name.startswith("qwen3_") or not hasattr(qwen3.ModelConfig, config_name):
    return  # an unknown name: the config check names it, with suggestions
  named = getattr(qwen3.ModelConfig, config_name)()
  fields = ("num_layers", "vocab_size", "embed_dim", "hidden_dim", "num_heads", "head_dim")
  for field in ("num_kv_heads", *fields) if isinstance(config, qwen3.ModelConfig) else ():
    if getattr(named, field) != getattr(config, field):
      raise ConfigError(
        f"config key 'model.config_name'={config_name!r} has {field}={getattr(named, field)} "
        f"but the checkpoint's {CONFIG_FILE} gives {getattr(config, field)} (drop "
        "model.config_name: the sizes are read from the file)"
      )
  if not isinstance(config, qwen3.ModelConfig):
    raise ConfigError(
      f"config key 'model.config_name'={config_name!r} names a Qwen3 size but the checkpoint's "
      f"{CONFIG_FILE} is not a Qwen3 (drop model.config_name)"
    )


def check_vocabulary(model_vocab: int, tokenizer_vocab: int) -> None:
  """A tokenizer may have fewer ids than the model's (padded) vocabulary, never more."""
  if tokenizer_vocab > model_vocab:
    raise ConfigError(
      f"the tokenizer has {tokenizer_vocab} ids but the checkpoint's vocab_size is "
      f"{model_vocab}: use the checkpoint's own tokenizer (model.tokenizer)"
    )
