"""Qwen3 policies from Hugging Face-layout safetensors checkpoints, through tunix's loader.

`load_qwen3_checkpoint` is tunix's own `create_model_from_safe_tensors`; it reads what
`models.save_hf_checkpoint` (the export) writes, which is how the tests make checkpoints.
"""

from __future__ import annotations

import pathlib

import jax
from tunix.models.qwen3 import model as qwen3
from tunix.models.qwen3 import params as qwen3_params


def load_qwen3_checkpoint(
  directory: str | pathlib.Path, config: qwen3.ModelConfig, mesh: jax.sharding.Mesh | None = None
) -> qwen3.Qwen3:
  """tunix's `Qwen3` with the weights of the `*.safetensors` files in `directory`."""
  directory = pathlib.Path(directory)
  if not directory.is_dir() or not list(directory.glob("*.safetensors")):
    raise ValueError(f"checkpoint directory {str(directory)!r} holds no *.safetensors file")
  return qwen3_params.create_model_from_safe_tensors(str(directory), config, mesh)
