"""Chat-templated multi-turn episodes: the tokenizer's own chat template, token for token.

With `env.chat_template: true` an episode is the conversation

  user: first observation | assistant: turn 1 | user: observation 2 | assistant: turn 2 ...

formatted by the `transformers` tokenizer's `apply_chat_template`:

  prompt_ids      template(user 1) + generation prompt (the assistant header)
  completion_ids  agent turn 1 | EOT | template text up to the next assistant header | ...

The end-of-turn token (EOT: `<|im_end|>` for ChatML/Qwen, `<|eot_id|>` for Llama 3,
`<end_of_turn>` for Gemma) must be the tokenizer's EOS, so the sampler stops on it; the
loss mask covers the agent's tokens and the EOT that ended its turn, while the template's
text between turns (observations, role headers) is attended but not trained. A turn cut by
`max_turn_tokens` gets its EOT as template text (loss 0), as the template would write it.

Each segment is the template's own text between two end-of-turn points, rendered from the
whole conversation so far and tokenised alone; `mismatch` compares an episode's tokens
with `apply_chat_template` of the whole conversation (the metric
`rollout/chat_template_mismatch`), since tokenising pieces can differ from tokenising the
whole where a tokenizer merges across the boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Message = dict[str, str]


class ChatFormat:
  """Formats multi-turn episodes with `tokenizer`'s chat template (a `transformers` tokenizer).

  Raises ValueError when the tokenizer has no chat template, or when its template does not
  end an assistant turn with the tokenizer's EOS (the token that must stop the sampler).
  """

  def __init__(self, tokenizer: Any):
    if not getattr(tokenizer, "chat_template", None):
      raise ValueError(
        f"env.chat_template needs a tokenizer with a chat template; {type(tokenizer).__name__} "
        "has none (save one with the tokenizer, as instruct checkpoints do)"
      )
    self.tokenizer = tokenizer
    self.eot = int(tokenizer.eos_token_id)
    self.eot_text = str(tokenizer.convert_ids_to_tokens(self.eot))
    probe = self.render([user("x"), assistant("y")])
    after = probe[probe.rfind("y") + 1 :]
    if not after.startswith(self.eot_text):
      raise ValueError(
        f"env.chat_template: the chat template ends an assistant turn with {after[:24]!r}, not "
        f"with the tokenizer's EOS {self.eot_text!r}; set the tokenizer's eos_token to the "
        "template's end-of-turn token"
      )

  def render(self, messages: Sequence[Message], generation_prompt: bool = False) -> str:
    """The template's text of `messages` (plus the assistant header if `generation_prompt`)."""
    return self.tokenizer.apply_chat_template(
      list(messages), tokenize=False, add_generation_prompt=generation_prompt
    )

  def tokens(self, messages: Sequence[Message], generation_prompt: bool = False) -> list[int]:
    """`apply_chat_template(messages, tokenize=True)` as a list of ids."""
    ids = self.tokenizer.apply_chat_template(
      list(messages), tokenize=True, add_generation_prompt=generation_prompt, return_dict=False
    )
    return [int(i) for i in ids]

  def content(self, agent: Sequence[int]) -> str:
    """An agent turn's text as the assistant message: special tokens kept, spaces as sampled,
    so the template re-tokenises it to the same ids where the tokenizer round-trips."""
    return self.tokenizer.decode(
      [int(i) for i in agent], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )

  def prompt(self, observation: str) -> list[int]:
    """Ids of the first user message and the assistant header (the episode's prompt)."""
    return self.tokens([user(observation)], generation_prompt=True)

  def observation(self, history: Sequence[Message], observation: str, ended: bool) -> list[int]:
    """Ids following an agent turn: the template's text after that turn's EOT, up to and
    including the next assistant header; `[EOT] + ...` when the turn was cut (`ended` False).

    `history` ends with that agent turn as an assistant message.
    """
    before = self.render(history)
    cut = before.rfind(self.eot_text)
    if cut < 0:
      raise ValueError(f"the chat template wrote no {self.eot_text!r} after an assistant turn")
    cut += len(self.eot_text)
    after = self.render([*history, user(observation)], generation_prompt=True)
    if after[:cut] != before[:cut]:
      raise ValueError(
        "env.chat_template: the chat template rewrites earlier turns once a later message "
        "follows, so a multi-turn episode cannot be one growing token sequence"
      )
    segment = [int(i) for i in self.tokenizer.encode(after[cut:], add_special_tokens=False)]
    return segment if ended else [self.eot, *segment]

  def mismatch(self, messages: Sequence[Message], episode: Sequence[int]) -> bool:
    """Whether `episode` (prompt + completion ids, ending with an agent turn) differs from
    `apply_chat_template(messages)` up to the last end-of-turn token.

    The template's text after the last EOT (e.g. ChatML's newline) is not part of an
    episode; neither is the last EOT when the last agent turn was cut (no EOT sampled). An
    episode that ran out of room after an observation ends with it (`messages` end with the
    user message) and the assistant header: the whole `apply_chat_template(messages,
    add_generation_prompt=True)`.
    """
    if messages and messages[-1]["role"] == "user":
      return [int(t) for t in episode] != self.tokens(messages, generation_prompt=True)
    reference = self.tokens(messages)
    ends = [i for i, t in enumerate(reference) if t == self.eot]
    stop = ends[-1] + 1 if ends else len(reference)
    if episode and int(episode[-1]) != self.eot:
      stop -= 1
    return [int(t) for t in episode] != reference[:stop]


def user(content: str) -> Message:
  """A user message (an environment observation)."""
  return {"role": "user", "content": content}


def assistant(content: str) -> Message:
  """An assistant message (an agent turn's text)."""
  return {"role": "assistant", "content": content}
