"""Chat-templated multi-turn episodes (`tunix_ppo_ext._src.data.chat`): ChatML/Qwen, Llama 3 and
Gemma style templates on tokenizers built here, episodes equal to `apply_chat_template` of the
whole conversation, the masks token by token, the refusals and a short training run."""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import pytest
import yaml
from tunix.generate.tokenizer_adapter import TokenizerAdapter
from tunix.rl.rollout import base_rollout

from tests.conftest import SMOKE
from tunix_ppo_ext._src.data.chat import ChatFormat
from tunix_ppo_ext._src.envs.base import make_env
from tunix_ppo_ext._src.run import job
from tunix_ppo_ext._src.run.run_config import load_run_config
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


@pytest.fixture(scope="module", params=sorted(STYLES))
def styled(request, tmp_path_factory):
  """`(style, tokenizer)` of each template style."""
  style = STYLES[request.param]
  return style, save_chat_tokenizer(tmp_path_factory.mktemp(request.param), style)


def _play(
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


def _expected(style: Style, tokenizer, replies: list[list[int]], seed: int = 5):
  """`(ids, loss)` of the episode written out by hand from the style's text layout."""
  encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
  env = make_env("memory", num_turns=len(replies))
  observation, _ = env.reset(seed=seed)
  pieces = [(style.start + style.head("user") + observation + style.eos, 0)]
  pieces.append((style.sep + style.head("assistant"), 0))
  eot = tokenizer.convert_tokens_to_ids(style.eos)
  ids, loss = [], []
  for text, flag in pieces:
    ids += encode(text)
    loss += [flag] * len(encode(text))
  for turn, reply in enumerate(replies, start=1):
    ended = len(reply) < MAX_TURN_TOKENS
    ids += [*reply, eot]
    loss += [1] * len(reply) + [int(ended)]
    observation, *_ = env.step(tokenizer.decode(reply, skip_special_tokens=True))
    if turn < len(replies):
      segment = encode(style.sep + style.head("user") + observation + style.eos)
      segment += encode(style.sep + style.head("assistant"))
      ids += segment
      loss += [0] * len(segment)
  if len(replies[-1]) == MAX_TURN_TOKENS:  # the last turn was cut: no EOT is in the episode
    ids, loss = ids[:-1], loss[:-1]
  return ids, loss


def test_episodes_equal_the_template_and_the_masks_cover_agent_turns(styled):
  style, tokenizer = styled
  chat = ChatFormat(tokenizer)
  char = lambda c: tokenizer.convert_tokens_to_ids(c)  # noqa: E731
  header = tokenizer.convert_tokens_to_ids(style.specials[0])
  scripts = [
    [[char("k")], [char("k"), char("k"), char("k")], [char("b")]],  # middle turn cut
    [[char("k")], [header, char("k")], [char("b"), char("!"), char("?")]],  # last turn cut
    [[char(" "), char("k")], [char("x")]],  # a leading space (trimmed by some templates)
  ]
  for replies in scripts:
    episode = _play(chat, tokenizer, replies)
    ids, loss = _expected(style, tokenizer, replies)
    prompt = len(episode.prompt)
    assert episode.prompt + episode.tokens == ids
    assert loss[:prompt] == [0] * prompt
    assert episode.loss == loss[prompt:]
    row = rollout_lib._row(episode, 96, tokenizer.pad_token_id)
    n = len(episode.tokens)
    np.testing.assert_array_equal(row["loss_mask"][:n], loss[prompt:])
    np.testing.assert_array_equal(row["attention_mask"], [1] * n + [0] * (96 - n))
    rewards = np.flatnonzero(row["token_rewards"])
    assert all(row["loss_mask"][r] for r in rewards)  # rewards sit on trained tokens
    trims = "trim" in style.template and replies[0][0] == char(" ")
    assert chat.mismatch(episode.messages, episode.prompt + episode.tokens) == trims


def test_a_changed_token_is_counted_as_a_mismatch(styled):
  style, tokenizer = styled
  chat = ChatFormat(tokenizer)
  k = tokenizer.convert_tokens_to_ids("k")
  episode = _play(chat, tokenizer, [[k], [k]])
  sequence = episode.prompt + episode.tokens
  assert not chat.mismatch(episode.messages, sequence)
  sequence[len(episode.prompt) + 2] = tokenizer.convert_tokens_to_ids("z")  # an observation id
  assert chat.mismatch(episode.messages, sequence)


def test_an_episode_out_of_room_after_an_observation_is_no_mismatch(styled):
  """It ends with the observation and the assistant header, with no agent turn after."""
  _, tokenizer = styled
  chat = ChatFormat(tokenizer)
  k = tokenizer.convert_tokens_to_ids("k")
  episode = _play(chat, tokenizer, [[k]], turns=2, room=2)
  assert episode.out_of_room and episode.messages[-1]["role"] == "user"
  sequence = episode.prompt + episode.tokens
  assert not chat.mismatch(episode.messages, sequence)
  assert chat.mismatch(episode.messages, sequence[:-1])


def test_a_template_whose_turns_do_not_end_with_eos_is_refused(tmp_path):
  tokenizer = save_chat_tokenizer(tmp_path, STYLES["chatml"], eos="<|im_start|>")
  with pytest.raises(ValueError, match=r"ends an assistant turn with '<\|im_end\|>\\n'"):
    ChatFormat(tokenizer)
  tokenizer.chat_template = None
  with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
    ChatFormat(tokenizer)


def _config(tmp_path: pathlib.Path, *overrides: str):
  data = yaml.safe_load(SMOKE.read_text())
  data.pop("model")
  file = tmp_path / "run.yaml"
  file.write_text(yaml.safe_dump(data))
  base = [f"output_dir={tmp_path / 'run'}", "train.steps=2", "train.batch_size=4"]
  fast = ["train.eval_batches=0", "train.checkpoint_every=10"]
  return load_run_config(str(file), [*base, *fast, *overrides])


def test_chat_template_config_is_checked_by_key(tmp_path):
  with pytest.raises(ValueError, match="'env.chat_template' must be bool, got 3"):
    _config(tmp_path, "env.chat_template=3")
  with pytest.raises(ValueError, match=r"'env.chat_template'=True needs a Hugging Face tokenizer"):
    _config(tmp_path, "env.chat_template=true")


def test_ppo_steps_train_a_chatml_checkpoint_with_zero_mismatches(tmp_path):
  pytest.importorskip("torch")
  from tests.helpers.hf_fixtures import write_checkpoint

  # a vocabulary of exactly the tokenizer's ids: an id the tokenizer cannot decode (a padded
  # vocabulary's) has no text, so its episode could never equal the template's
  # (in its own directory: next to a qwen2 config.json, transformers 5 loads it as a
  # Qwen2Tokenizer, which adds an <|endoftext|> id)
  tokenizer = save_chat_tokenizer(tmp_path / "tokenizer", STYLES["chatml"])
  directory = write_checkpoint(
    tmp_path / "ckpt", "qwen2", seed=1, vocab_size=len(tokenizer), max_position_embeddings=128
  )
  run = _config(
    tmp_path,
    f"model.checkpoint={directory}",
    f"model.tokenizer={tmp_path / 'tokenizer'}",
    "env.chat_template=true",
    "env.max_tokens_per_turn=3",
    "env.max_completion_len=48",
    "train.max_prompt_length=32",
  )
  learner, batches, eval_batches, _ = job.build_run(run, tmp_path / "run")
  source = learner.trajectory_source
  seen = []
  learner.trajectory_source = lambda *args: seen.append(source(*args)) or seen[-1]
  learner.train(batches, eval_ds=eval_batches)
  assert learner.rl_cluster.actor_trainer.train_steps == 2
  assert len(seen) == 2
  assert all(b.metrics["rollout/chat_template_mismatch"][0] == 0 for b in seen)
  header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
  eot = tokenizer.eos_token_id
  for batch in seen:
    for ids, loss, attention in zip(
      batch.completion_ids, batch.loss_mask, batch.attention_mask, strict=True
    ):
      n = int(attention.sum())
      assert loss[0] == 1 and not loss[n:].any()
      # trained: every agent token (from the start or after an assistant header) and the EOT
      # that ended a turn, not the one after a turn cut at max_tokens_per_turn
      expect, span = [], 0
      for i, token in enumerate(ids[:n].tolist()):
        if span is None and ids[max(0, i - len(header)) : i].tolist() == header:
          span = 0
        if span is None:
          expect.append(0)
        elif token == eot:
          expect.append(int(span < 3))
          span = None
        else:
          expect.append(1)
          span += 1
      np.testing.assert_array_equal(loss[:n], expect)
