"""Local checkpoints of tunix main's pipeline YAML (`tunix-ppo-ext tunix-agentic`).

A role's model config with `model_source: local` (or tunix's `huggingface` naming a local
directory, `compat.cli_models.local_model_ref`) is checked at the config stage
(`check_local_models`) and loaded by `load_local_model`, what tunix's `create_model` does
for its own sources: this package's `hf_models.load_checkpoint` with tunix's model keys,
tunix's LoRA of `lora_config`, `model_display`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flax import nnx

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.data import gguf_files
from tunix_ppo_ext._src.tunix.compat import cli_models
from tunix_ppo_ext._src.tunix.models import hf_models

# tunix's `remat_config` integers: its `RematConfig` members NONE, BLOCK, DECODER
# (`enum.auto()`, from 1), this package's `REMAT_CHOICES` in the same order.
REMAT_BY_VALUE = dict(enumerate(hf_models.REMAT_CHOICES, start=1))
TUNIX_FLASH_BLOCK_SIZE = 1024  # tunix's `create_model` default `flash_attention_block_size`


def check_local_model(key: str, model_config: Mapping[str, Any] | None) -> None:
  """ConfigError naming `key` unless its local checkpoint (if any) exists and has a
  `config.json` of a supported family with nothing in it refused."""
  ref = cli_models.local_model_ref(model_config)
  if ref is None:
    return
  if not ref:
    raise ConfigError(
      f"{key}.model_source={cli_models.LOCAL!r} needs {key}.model_path: a Hugging Face "
      "checkpoint directory (config.json, safetensors, tokenizer), a .gguf file or a GGUF "
      "short name"
    )
  if not cli_models.is_local_ref(ref):
    raise ConfigError(f"{key}.model_path={ref!r} is no local checkpoint (no such directory)")
  try:
    checkpoint = hf_models.validate_checkpoint(ref, {}, None)
  except ConfigError as err:
    raise ConfigError(f"{key}.model_path={ref!r}: {err}") from None
  if checkpoint is None:
    raise ConfigError(f"{key}.model_path={ref!r} has no {hf_models.CONFIG_FILE}")


def check_local_models(config: Mapping[str, Any]) -> None:
  """`check_local_model` for every role's model config; the local tokenizer (if any) must
  have tokenizer files. ConfigError (one line) on the first problem."""
  for key in cli_models.ROLE_KEYS:
    check_local_model(key, config.get(key))
  ref = cli_models.local_tokenizer_ref(config)
  if ref is not None and not hf_models.has_tokenizer(ref):
    files = " or ".join(hf_models.TOKENIZER_FILES)
    raise ConfigError(f"tokenizer_config.tokenizer_path={ref!r} has no {files}")


def load_local_model(
  model_config: Mapping[str, Any], tokenizer_config: Mapping[str, Any], mesh: Any
) -> tuple[nnx.Module, str]:
  """tunix's `create_model(model_config, tokenizer_config, mesh)` for a local checkpoint:
  `(model, tokenizer path)`, the model `hf_models.load_checkpoint`'s on `mesh` with tunix's
  `remat_config`, `use_flash_attention` (splash attention, `flash_attention_block_size`)
  and `load_dtype` (else `dtype`), a Llama 3 taking `output_hidden_states`
  (`cli_models.hidden_states_of`), tunix's LoRA of `lora_config`, `model_display`."""
  from tunix.cli.utils import model as model_lib  # tunix main only

  ref = cli_models.local_model_ref(model_config)
  if not ref:
    raise ConfigError(f"model config {dict(model_config)!r} names no local checkpoint")
  remat = REMAT_BY_VALUE.get(int(model_config.get("remat_config") or 1))
  if remat is None:
    raise ConfigError(f"remat_config={model_config['remat_config']!r} must be 1, 2 or 3")
  model = hf_models.load_checkpoint(
    ref,
    mesh,
    remat=remat,
    attention="splash" if model_config.get("use_flash_attention") else "dense",
    block_size=int(model_config.get("flash_attention_block_size") or TUNIX_FLASH_BLOCK_SIZE),
    dtype=model_config.get("load_dtype") or model_config.get("dtype"),
  )
  model = cli_models.hidden_states_of(model)
  if model_config.get("lora_config"):
    model = model_lib.apply_lora_to_model(
      model, mesh, model_config["lora_config"], rng_seed=model_config.get("rng_seed", 0)
    )
  if model_config.get("model_display"):
    nnx.display(model)
  return model, tokenizer_config.get("tokenizer_path") or gguf_files.resolve(ref)
