"""Chat-templated multi-turn episodes (`tunix_ppo_ext._src.data.chat`): ChatML/Qwen, Llama 3 and
Gemma style templates on tokenizers built here, episodes equal to `apply_chat_template` of the
whole conversation, the masks token by token, the refusals and a short training run."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import yaml

from tests.helpers.chat import MAX_TURN_TOKENS, STYLES, Style, play_chat, save_chat_tokenizer
from tests.helpers.runs import SMOKE
from tunix_ppo_ext._src.data.chat import ChatFormat
from tunix_ppo_ext._src.envs.base import make_env
from tunix_ppo_ext._src.run import job
from tunix_ppo_ext._src.run.run_config import load_run_config
from tunix_ppo_ext._src.tunix.rollout import multi_turn as rollout_lib

pytestmark = pytest.mark.tunix


@pytest.fixture(scope="module", params=sorted(STYLES))
def styled(request, tmp_path_factory):
  """`(style, tokenizer)` of each template style."""
  style = STYLES[request.param]
  return style, save_chat_tokenizer(tmp_path_factory.mktemp(request.param), style)


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
    episode = play_chat(chat, tokenizer, replies)
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
  episode = play_chat(chat, tokenizer, [[k], [k]])
  sequence = episode.prompt + episode.tokens
  assert not chat.mismatch(episode.messages, sequence)
  sequence[len(episode.prompt) + 2] = tokenizer.convert_tokens_to_ids("z")  # an observation id
  assert chat.mismatch(episode.messages, sequence)


def test_an_episode_out_of_room_after_an_observation_is_no_mismatch(styled):
  """It ends with the observation and the assistant header, with no agent turn after."""
  _, tokenizer = styled
  chat = ChatFormat(tokenizer)
  k = tokenizer.convert_tokens_to_ids("k")
  episode = play_chat(chat, tokenizer, [[k]], turns=2, room=2)
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
