"""The built-in character tokenizer's checks of its alphabet: one line naming it."""

import pytest

from tunix_ppo_ext._src.data.char_tokenizer import CharTokenizer

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("alphabet", ["", None, ["a", "b"]])
def test_an_alphabet_with_no_characters_or_not_a_string_is_refused_in_one_line(alphabet):
  with pytest.raises(ValueError, match=r"^alphabet must be a non-empty string") as info:
    CharTokenizer(alphabet=alphabet)
  assert "\n" not in str(info.value)


def test_a_one_character_alphabet_round_trips():
  tokenizer = CharTokenizer(alphabet="a")
  assert tokenizer.vocab_size == 4
  assert tokenizer.decode(tokenizer.encode("aa", add_bos=True, add_eos=True)) == "aa"
  with pytest.raises(ValueError, match="repeated"):
    CharTokenizer(alphabet="aa")
