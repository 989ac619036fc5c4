"""Chat template styles (ChatML/Qwen, Llama 3, Gemma) on character tokenizers saved here, and a
played chat episode.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
from tunix.generate.tokenizer_adapter import TokenizerAdapter
from tunix.rl.rollout import base_rollout

from tunix_ppo_ext._src.data.chat import ChatFormat
from tunix_ppo_ext._src.tunix.rollout import multi_turn as rollout_lib

ALPHABET = "abcdefghijklmnopqrstuvwxyz!?. \n"


MAX_TURN_TOKENS = 3


@dataclasses.dataclass(frozen=True)
class Style:
  """A chat template and, written independently in Python, the text it should produce."""

  specials: tuple[str, ...]
  eos: str
  bos: str | None
  template: str
  start: str  # before the first message
  sep: str  # after a message's end-of-turn token
  names: dict[str, str]

  def head(self, role: str) -> str:
    return {
      "<|im_end|>": f"<|im_start|>{self.names.get(role, role)}\n",
      "<|eot_id|>": f"<|start_header_id|>{role}<|end_header_id|>\n\n",
      "<end_of_turn>": f"<start_of_turn>{self.names.get(role, role)}\n",
    }[self.eos]


STYLES = {
  "chatml": Style(
    specials=("<|im_start|>", "<|im_end|>"),
    eos="<|im_end|>",
    bos=None,
    template=(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    start="",
    sep="\n",
    names={},
  ),
  "llama3": Style(
    specials=("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    eos="<|eot_id|>",
    bos="<|begin_of_text|>",
    template=(
      "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>"
      "\n\n{{ m.content | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
      "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    start="<|begin_of_text|>",
    sep="",
    names={},
  ),
  "gemma": Style(
    specials=("<bos>", "<start_of_turn>", "<end_of_turn>"),
    eos="<end_of_turn>",
    bos="<bos>",
    template=(
      "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m.role == 'assistant' "
      "else m.role %}<start_of_turn>{{ role }}\n{{ m.content | trim }}<end_of_turn>\n"
      "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
    start="<bos>",
    sep="\n",
    names={"assistant": "model"},
  ),
}


def save_chat_tokenizer(
  directory: pathlib.Path, style: Style, eos: str | None = None, alphabet: str = ALPHABET
):
  """A character-level `transformers` tokenizer with `style`'s special tokens and template."""
  from tokenizers import Tokenizer, decoders, pre_tokenizers
  from tokenizers import models as tok_models
  from transformers import PreTrainedTokenizerFast

  names = ["<pad>", *style.specials, *alphabet]
  tokenizer = Tokenizer(tok_models.WordLevel({n: i for i, n in enumerate(names)}, "<pad>"))
  tokenizer.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
  tokenizer.decoder = decoders.Fuse()
  tokenizer.add_special_tokens(["<pad>", *style.specials])
  specials = {"bos_token": style.bos} if style.bos else {}
  fast = PreTrainedTokenizerFast(
    tokenizer_object=tokenizer, eos_token=eos or style.eos, pad_token="<pad>", **specials
  )
  fast.chat_template = style.template
  fast.save_pretrained(directory)
  return fast


def play_chat(
  chat: ChatFormat, tokenizer, replies: list[list[int]], seed: int = 5, turns: int = 0, room=96
):
  """One memory episode of `turns` (default: one per reply) through `MultiTurnRollout`'s own
  turn logic, the agent's turns given, `room` completion tokens."""
  turns = turns or len(replies)
  rollout = rollout_lib.MultiTurnRollout(
    "memory",
    {"num_turns": turns},
    max_completion_len=room,
    max_turns=turns,
    max_turn_tokens=MAX_TURN_TOKENS,
    chat=chat,
  )
  adapter = TokenizerAdapter(tokenizer)
  ids = rollout_lib._Ids(adapter, adapter.pad_id(), adapter.eos_id(), adapter.bos_id())
  config = base_rollout.RolloutConfig(max_prompt_length=48)
  episode = rollout._start(seed, rollout.envs[0], ids, config)
  for turn, reply in enumerate(replies, start=1):
    output = base_rollout.RolloutOutput(
      text=[""], logits=[], tokens=[np.array(reply)], left_padded_prompt_tokens=None, logprobs=None
    )
    rollout._play_turn(episode, turn, output, 0, ids)
  return episode
