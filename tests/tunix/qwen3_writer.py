"""A tunix Qwen3 written as a Hugging Face-layout safetensors checkpoint, offline, for the
tests that load one (`load_qwen3_checkpoint`, tunix's own loader, reads it back).

`save_qwen3_safetensors` inverts tunix's loader mapping (`compat.qwen3_key_mapping`, the
one seam to tunix's private table): each tunix tensor gets its Hugging Face name and shape.
"""

from __future__ import annotations

import pathlib
import re

import numpy as np
from flax import nnx
from safetensors.numpy import save_file
from tunix.models.qwen3 import model as qwen3

from tunix_ppo_ext._src.tunix import compat


def save_qwen3_safetensors(model: qwen3.Qwen3, directory: str | pathlib.Path) -> pathlib.Path:
  """Writes `model.safetensors` in `directory` with Hugging Face Qwen3 tensor names.

  Each tunix tensor goes through the inverse of tunix's loader mapping: projections are
  flattened to 2-D and transposed back to `[out, in]`; embeddings and norms are copied.
  """
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  inverse = _inverse_key_mapping(model.config)
  tensors = {}
  for path, value in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    name = ".".join(str(p) for p in path)
    hf_name, transpose = inverse(name)
    array = np.asarray(value[...])
    if transpose:
      array = _to_2d(name, array).T
    tensors[hf_name] = np.ascontiguousarray(array)
  file = directory / "model.safetensors"
  save_file(tensors, str(file))
  return file


def _to_2d(name: str, array: np.ndarray) -> np.ndarray:
  """tunix's `[D, H, K]` q/k/v and `[H, K, D]` o projections as the 2-D `[in, out]` matrix."""
  if array.ndim == 2:
    return array
  if name.endswith("o_proj.w"):
    return array.reshape(-1, array.shape[-1])
  return array.reshape(array.shape[0], -1)


def _inverse_key_mapping(config: qwen3.ModelConfig):
  """Maps a tunix parameter path to `(hf_name, needs_transpose)` via tunix's own table."""
  rules = []
  for hf_pattern, (tunix_template, transform) in compat.qwen3_key_mapping(config).items():
    # Turn `layers.\1.attn.q_proj.w` into a regex and `model\.layers\.([0-9]+)...` into a
    # template, so the same table serves both directions.
    tunix_regex = (
      "^"
      + re.escape(tunix_template)
      .replace(r"\\1", "([0-9]+)")
      .replace(r"\\2", "([0-9]+)")
      .replace(r"\\3", "(gate|up|down)")
      + "$"
    )
    hf_template = hf_pattern.replace(r"\.", ".")
    for group in ("([0-9]+)", "([0-9]+)", "(gate|up|down)"):
      hf_template = hf_template.replace(group, "{}", 1)
    rules.append((re.compile(tunix_regex), hf_template, transform is not None))

  def inverse(name: str) -> tuple[str, bool]:
    for regex, template, transpose in rules:
      match = regex.match(name)
      if match:
        return template.format(*match.groups()), transpose
    raise ValueError(f"no Hugging Face name for tunix parameter {name!r}")

  return inverse
