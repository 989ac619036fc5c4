"""A tiny built-in character tokenizer for tests and toy runs (nothing to download).

`CharTokenizer` provides what tunix's `TokenizerAdapter` requires of a custom
tokenizer (`encode`, `decode`, `bos_id`, `eos_id`, `pad_id`): one id per character
of a fixed alphabet, plus pad/bos/eos special ids. pad and eos may share an id.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

DEFAULT_ALPHABET = (
  string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation + " \n"
)


class CharTokenizer:
  """Deterministic character-level tokenizer over a fixed alphabet.

  Special ids come first (by default pad=0, bos=1, eos=2); the alphabet's
  characters take the remaining ids 0..vocab_size-1 in order. `eos_id == pad_id`
  is allowed. `bos_id` must be non-zero: tunix's sampler only prepends BOS when
  `bos_id()` is truthy.
  """

  def __init__(
    self,
    alphabet: str = DEFAULT_ALPHABET,
    *,
    pad_id: int = 0,
    bos_id: int = 1,
    eos_id: int = 2,
  ):
    if not isinstance(alphabet, str) or not alphabet:
      raise ValueError(f"alphabet must be a non-empty string of characters, got {alphabet!r}")
    if len(set(alphabet)) != len(alphabet):
      raise ValueError("alphabet has repeated characters")
    if bos_id in (pad_id, eos_id) or bos_id == 0:
      raise ValueError(f"bos_id must be non-zero and distinct from pad/eos, got {bos_id}")
    self._pad_id, self._bos_id, self._eos_id = pad_id, bos_id, eos_id
    self._special_ids = frozenset((pad_id, bos_id, eos_id))
    self._vocab_size = len(self._special_ids) + len(alphabet)
    if max(self._special_ids) >= self._vocab_size or min(self._special_ids) < 0:
      raise ValueError(f"special ids must lie in [0, {self._vocab_size})")
    free_ids = [i for i in range(self._vocab_size) if i not in self._special_ids]
    self._char_to_id = dict(zip(alphabet, free_ids, strict=True))
    self._id_to_char = {i: c for c, i in self._char_to_id.items()}

  @property
  def vocab_size(self) -> int:
    """Number of ids (specials + alphabet); use it as the model's `vocab_size`."""
    return self._vocab_size

  def __len__(self) -> int:
    return self._vocab_size

  def pad_id(self) -> int:
    return self._pad_id

  def bos_id(self) -> int:
    return self._bos_id

  def eos_id(self) -> int:
    return self._eos_id

  def encode(self, text: str, add_bos: bool = False, add_eos: bool = False, **_) -> list[int]:
    """Ids of `text`'s characters (no specials unless asked); unknown characters raise."""
    unknown = sorted(set(text) - self._char_to_id.keys())
    if unknown:
      raise ValueError(
        f"characters not in the alphabet: {unknown!r} (in {text[:40]!r}); add them to the "
        "built-in tokenizer's alphabet (model.alphabet) or use a tokenizer that has them"
      )
    ids = [self._char_to_id[c] for c in text]
    return [self._bos_id] * add_bos + ids + [self._eos_id] * add_eos

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True, **_) -> str:
    """Text of `ids`; special ids are dropped (or rendered `<pad>` etc.), unknown ids dropped."""
    pieces = []
    for i in (int(x) for x in ids):
      if i in self._id_to_char:
        pieces.append(self._id_to_char[i])
      elif i in self._special_ids and not skip_special_tokens:
        pieces.append(self._special_name(i))
    return "".join(pieces)

  def _special_name(self, i: int) -> str:
    """`<bos>`, `<eos>`, `<pad>` (or `<eos/pad>` when they share an id)."""
    named = (("bos", self._bos_id), ("eos", self._eos_id), ("pad", self._pad_id))
    names = [name for name, special_id in named if special_id == i]
    return f"<{'/'.join(names)}>"
