"""Tiny random Hugging Face checkpoints written offline with `transformers` + torch (CPU).

Each family at width 32: `write_checkpoint(directory, family, ...)` saves the model and its
`config.json` exactly as `save_pretrained` does; `hf_logits` / `hf_hidden` run the
`transformers` model itself, the independent reference the tunix side is compared with.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

# The same tiny sizes for every family; a vocabulary wider than the tests' tokenizer (a
# padded one, as real Qwen checkpoints have).
SIZES = dict(
  vocab_size=24,
  hidden_size=32,
  intermediate_size=64,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  max_position_embeddings=64,
)
# tunix's own theta for Qwen3 and Llama 3 (tests/tunix/models/test_rope.py covers the others)
TUNIX_ROPE = {"rope_type": "default", "rope_theta": 1e6}
FAMILIES = ("qwen2", "qwen3", "llama", "gemma3")


def hf_config(family: str, **overrides: Any):
  """The `transformers` config of a tiny `family` model (`overrides` win)."""
  import transformers

  settings: dict[str, Any] = {**SIZES}
  if family == "qwen2":
    settings.update(tie_word_embeddings=True)
    cls = transformers.Qwen2Config
  elif family == "qwen3":
    settings.update(head_dim=16, rope_parameters=TUNIX_ROPE, tie_word_embeddings=False)
    cls = transformers.Qwen3Config
  elif family == "llama":
    settings.update(rope_parameters=TUNIX_ROPE, tie_word_embeddings=False)
    cls = transformers.LlamaConfig
  elif family == "gemma3":
    # 6 layers: tunix's pattern of 5 sliding-window layers (window 4) and 1 global one
    settings.update(num_hidden_layers=6, head_dim=16, sliding_window=4, query_pre_attn_scalar=16)
    cls = transformers.Gemma3TextConfig
  else:
    raise ValueError(f"unknown family {family!r}")
  settings.update(overrides)
  return cls(**settings)


def write_checkpoint(
  directory: pathlib.Path, family: str, seed: int = 0, bfloat16: bool = False, **overrides: Any
):
  """Saves a randomly initialised tiny `family` causal LM (float32, or bfloat16 as real
  instruct checkpoints are) in `directory`."""
  import torch
  import transformers

  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(hf_config(family, **overrides))
  with torch.no_grad():  # norms start at 1 (or 0 for Gemma): make them random too
    for name, param in model.named_parameters():
      if "norm" in name:
        param.add_(0.1 * torch.randn_like(param))
  if bfloat16:
    model = model.to(torch.bfloat16)
  model.save_pretrained(directory)
  return directory


def write_config_only(directory: pathlib.Path, family: str, **overrides: Any) -> pathlib.Path:
  """`config.json` plus an empty `model.safetensors`: enough for the config-time checks."""
  hf_config(family, **overrides).save_pretrained(directory)
  (directory / "model.safetensors").write_bytes(b"")
  return directory


def _load(directory: pathlib.Path):
  import torch
  import transformers

  return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def hf_logits(directory: pathlib.Path, tokens: np.ndarray) -> np.ndarray:
  """`transformers`' float32 logits `[B, L, V]` for unpadded tokens `[B, L]` (causal)."""
  import torch

  with torch.no_grad():
    return _load(directory)(torch.as_tensor(tokens)).logits.numpy()


def hf_hidden(directory: pathlib.Path, tokens: np.ndarray) -> np.ndarray:
  """`transformers`' last hidden state `[B, L, D]` (after the final norm) for tokens `[B, L]`."""
  import torch

  with torch.no_grad():
    model = _load(directory)
    return model.model(torch.as_tensor(tokens)).last_hidden_state.numpy()
