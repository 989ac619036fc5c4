"""Tiny GGUF files written offline, as llama.cpp's `convert_hf_to_gguf.py` writes a Llama:
a random `transformers` Llama's tensors under llama.cpp's names, the query and key rows
permuted for llama.cpp's RoPE, matrices quantized by PyPI's `gguf`, a byte-level BPE
tokenizer of a few tokens with a ChatML template."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from tests.helpers.hf_fixtures import hf_config

# 20 single characters, two merges ("a b" -> "ab", "b c" -> "bc") and ChatML's specials
CHARS = list("abcdefghijklmnopqrs") + ["Ġ"]
TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *CHARS, "ab", "bc"]
CHATML = (
  "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NAMES = {  # Hugging Face Llama parameter (after `model.layers.N.`) -> llama.cpp's
  "input_layernorm": "attn_norm",
  "post_attention_layernorm": "ffn_norm",
  "self_attn.q_proj": "attn_q",
  "self_attn.k_proj": "attn_k",
  "self_attn.v_proj": "attn_v",
  "self_attn.o_proj": "attn_output",
  "mlp.gate_proj": "ffn_gate",
  "mlp.up_proj": "ffn_up",
  "mlp.down_proj": "ffn_down",
}


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py), written as it is there."""
  return (
    weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
    .swapaxes(1, 2)
    .reshape(weight.shape)
  )


def gguf_name(name: str) -> str:
  if name == "model.embed_tokens.weight":
    return "token_embd.weight"
  if name == "model.norm.weight":
    return "output_norm.weight"
  if name == "lm_head.weight":
    return "output.weight"
  _, _, layer, rest = name.split(".", 3)
  module, _, suffix = rest.rpartition(".")
  return f"blk.{layer}.{NAMES[module]}.{suffix}"


def write_gguf(path: pathlib.Path, model: Any, quant: str = "Q8_0", arch: str = "llama") -> None:
  """Writes a `transformers` Llama `model` as a GGUF file: matrices as `quant`, norms F32."""
  import gguf

  config = model.config
  writer = gguf.GGUFWriter(str(path), arch)
  writer.add_block_count(config.num_hidden_layers)
  writer.add_context_length(config.max_position_embeddings)
  writer.add_embedding_length(config.hidden_size)
  writer.add_feed_forward_length(config.intermediate_size)
  writer.add_head_count(config.num_attention_heads)
  writer.add_head_count_kv(config.num_key_value_heads)
  writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
  writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
  writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
  writer.add_vocab_size(config.vocab_size)
  _add_tokenizer(writer, config.vocab_size)
  kind = gguf.GGMLQuantizationType[quant]
  for name, param in model.state_dict().items():
    if name == "lm_head.weight" and config.tie_word_embeddings:
      continue  # tied: llama.cpp writes no output.weight
    value = param.detach().float().numpy()
    if name.endswith("q_proj.weight"):
      value = llama_cpp_permute(value, config.num_attention_heads)
    elif name.endswith("k_proj.weight"):
      value = llama_cpp_permute(value, config.num_key_value_heads)
    if value.ndim == 2:
      writer.add_tensor(gguf_name(name), gguf.quants.quantize(value, kind), raw_dtype=kind)
    else:
      writer.add_tensor(gguf_name(name), value)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()


def _add_tokenizer(writer: Any, vocab_size: int) -> None:
  tokens = TOKENS + [f"<|pad{i}|>" for i in range(vocab_size - len(TOKENS))]
  writer.add_tokenizer_model("gpt2")
  writer.add_tokenizer_pre("default")
  writer.add_token_list(tokens)
  types = [3, 3, 3] + [1] * len(CHARS) + [1, 1] + [3] * (vocab_size - len(TOKENS))
  writer.add_token_types(types)
  writer.add_token_merges(["a b", "b c"])
  writer.add_bos_token_id(1)
  writer.add_eos_token_id(2)
  writer.add_pad_token_id(0)
  writer.add_chat_template(CHATML)
  writer.add_add_bos_token(False)


def tiny_llama(seed: int = 0, **overrides):
  """A random `transformers` Llama (width 64, theta 1e5, tied) with sharp attention."""
  import torch
  import transformers

  torch.manual_seed(seed)
  rope = {"rope_type": "default", "rope_theta": 100_000.0}
  settings = dict(hidden_size=64, intermediate_size=128, vocab_size=32, rope_parameters=rope)
  config = hf_config("llama", **{"tie_word_embeddings": True, **settings, **overrides})
  model = transformers.AutoModelForCausalLM.from_config(config)
  with torch.no_grad():
    for name, param in model.named_parameters():
      if "norm" in name:
        param.add_(0.1 * torch.randn_like(param))
      if name.endswith(("q_proj.weight", "k_proj.weight")):
        param.mul_(8.0)
  return model
