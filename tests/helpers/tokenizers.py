"""Hugging Face tokenizers built offline: a character-level one and a byte-level BPE one."""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
  pass


def save_hf_tokenizer(directory: pathlib.Path, alphabet: str) -> None:
  """A character-level Hugging Face tokenizer built offline (`tokenizers` + `transformers`)."""
  from tokenizers import Tokenizer, decoders, pre_tokenizers
  from tokenizers import models as tok_models
  from transformers import PreTrainedTokenizerFast

  vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(alphabet)}}
  tokenizer = Tokenizer(tok_models.WordLevel(vocab=vocab, unk_token="<pad>"))
  tokenizer.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
  tokenizer.decoder = decoders.Fuse()
  PreTrainedTokenizerFast(
    tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
  ).save_pretrained(directory)


def save_byte_level_tokenizer(directory: pathlib.Path, vocab_size: int = 270) -> None:
  """A byte-level BPE tokenizer (as Qwen2's and Llama 3's are) trained offline on a few
  environment texts: every byte is a token, so any text round-trips, also when
  transformers loads it as the `Qwen2Tokenizer` a `qwen2` config.json picks."""
  from tokenizers import ByteLevelBPETokenizer
  from transformers import PreTrainedTokenizerFast

  bpe = ByteLevelBPETokenizer()
  corpus = ["see c! take? cash? ok k", "use 1 2 3 to make 4", "##.. g.bp pfff"] * 10
  special = ["<pad>", "<s>", "</s>"]
  bpe.train_from_iterator(corpus, vocab_size=vocab_size, special_tokens=special)
  PreTrainedTokenizerFast(
    tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
  ).save_pretrained(directory)
