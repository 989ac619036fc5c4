"""The `tunix-ppo-ext` command: config loading, overrides and errors (runs: test_metrics)."""

import pathlib
import re
import string
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers.tokenizers import save_hf_tokenizer
from tunix_ppo_ext._src.data.trajectory import TrajectoryBatch
from tunix_ppo_ext._src.run import cli
from tunix_ppo_ext._src.run.run_config import load_run_config
from tunix_ppo_ext.rollout import ObservationsInLoss

pytestmark = pytest.mark.tunix

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def test_dotted_overrides_reach_every_section():
  run = load_run_config(
    None, ["train.steps=7", "ppo.entropy_coef=0.02", "env.kwargs.num_symbols=2", "seed=3"]
  )
  assert run.train.steps == 7 and run.seed == 3
  assert run.ppo["entropy_coef"] == 0.02
  assert run.env.kwargs["num_symbols"] == 2


@pytest.mark.parametrize(
  "override, message",
  [
    ("train.stepz=3", r"unknown config key 'train.stepz'; did you mean 'steps'"),
    ("trian.steps=3", r"unknown config key 'trian'; did you mean 'train'"),
    ("train.steps=abc", r"'train.steps' must be int, got 'abc'"),
    ("train.steps=0", r"'train.steps'=0 is invalid: must be an integer >= 1"),
    ("train.lr=fast", r"'train.lr' must be float"),
    (
      "ppo.entropy_coeff=0.1",
      r"unknown config key 'ppo.entropy_coeff'; did you mean 'entropy_coef'",
    ),
    ("ppo.epsilon_c=0.5", r"config key 'ppo.epsilon_c'=0.5 is invalid"),
    ("wandb=maybe", r"'wandb'='maybe' unknown"),
    ("ppo.num_generations=5", r"batch_size'=32 must be a multiple of ppo.num_generations=5"),
    ("env.name=mmeory", r"'env.name'/'env.kwargs'.*unknown environment 'mmeory'"),
    ("env.kwargs.num_symbol=4", r"'env.kwargs'.*num_symbol"),
    ("env.kwargs.num_turns=1", r"'env.kwargs'.*num_turns=1 is invalid: must be an integer >= 2"),
    ("steps", r"must look like section.key=value"),
  ],
)
def test_bad_input_exits_2_with_a_clear_message(override, message, capsys):
  assert cli.main(["train", override]) == 2
  err = capsys.readouterr().err
  assert err.startswith("tunix-ppo-ext: error:")
  assert re.search(message, err), err


def test_a_top_k_above_the_vocabulary_exits_2_naming_the_key(tmp_path, capsys):
  smoke = str(CONFIGS / "smoke.yaml")
  for key in ("top_k", "eval_top_k"):
    argv = ["train", "--config", smoke, f"output_dir={tmp_path / key}", "wandb=disabled"]
    assert cli.main([*argv, f"sampling.{key}=100000"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and f"'sampling.{key}'=100000 is larger than the model's" in err[0]
    assert not (tmp_path / key / "metrics.jsonl").exists()


def test_a_tokenizer_that_changes_the_text_is_refused_naming_its_directory(tmp_path, capsys):
  """transformers picks Qwen2Tokenizer for a generic tokenizer saved beside a qwen2
  config.json, and it drops spaces and newlines: the run stops before training."""
  directory = tmp_path / "tokenizer"
  save_hf_tokenizer(directory, "abcdefghijklmnopqrstuvwxyz!?:. \n")
  smoke = str(CONFIGS / "smoke.yaml")
  argv = ["train", "--config", smoke, "wandb=disabled", f"model.tokenizer={directory}"]
  assert cli.main([*argv, f"output_dir={tmp_path / 'plain'}", "train.steps=1"]) == 0
  capsys.readouterr()
  (directory / "config.json").write_text('{"model_type": "qwen2"}')
  assert cli.main([*argv, f"output_dir={tmp_path / 'qwen2'}"]) == 2
  err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
  assert len(err) == 1 and f"the tokenizer in {str(directory)!r} (Qwen2Tokenizer)" in err[0]
  assert "changes the text it encodes" in err[0]


def test_a_turn_too_short_for_a_guess_is_refused_with_a_hugging_face_tokenizer(tmp_path, capsys):
  """The built-in tokenizer's count is checked at load; a Hugging Face tokenizer's, once it
  is loaded, before the models are built: `guess` up to 1000 in 2-token turns."""
  directory = tmp_path / "tokenizer"
  save_hf_tokenizer(directory, string.ascii_letters + string.digits + "!?:. \n")
  argv = ["train", "--config", str(CONFIGS / "smoke.yaml"), "wandb=disabled"]
  argv += [f"model.tokenizer={directory}", f"output_dir={tmp_path / 'run'}", "env.name=guess"]
  argv += ["env.kwargs={high: 1000}", "train.max_prompt_length=128", "env.max_tokens_per_turn=2"]
  assert cli.main(argv) == 2
  err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
  assert len(err) == 1 and "'env.max_tokens_per_turn'=2 is below the 'guess'" in err[0], err
  assert f"'1000' (4 tokens with the tokenizer in {str(directory)!r})" in err[0]
  assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_dotted_key_inside_a_section_keeps_the_section_s_other_defaults():
  """`optim.actor`'s own default is a cosine decay to a tenth: setting one of its keys, in
  an override or a config file's partial section, keeps the rest of it."""
  for config in (None, str(CONFIGS / "smoke.yaml")):
    actor = load_run_config(config, ["optim.actor.clip_grad_norm=1.0"]).optim.actor
    assert (actor.clip_grad_norm, actor.schedule, actor.min_lr_ratio) == (1.0, "cosine", 0.1)
  critic = load_run_config(None, ["optim.critic.schedule=linear"]).optim.critic
  assert (critic.schedule, critic.min_lr_ratio) == ("linear", 0.0)  # the critic's default


def test_missing_config_file(tmp_path, capsys):
  assert cli.main(["train", "--config", str(tmp_path / "nope.yaml")]) == 2
  assert "no such file" in capsys.readouterr().err


def test_observation_loss_ablation_puts_every_real_token_under_the_loss():
  attention = np.array([[1, 1, 1, 1, 0]])
  batch = TrajectoryBatch(
    prompt_ids=np.ones((1, 2), int),
    completion_ids=np.ones((1, 5), int),
    attention_mask=attention,
    loss_mask=np.array([[1, 0, 0, 1, 0]]),
    token_rewards=np.zeros((1, 5), np.float32),
  )
  wrapped = ObservationsInLoss(lambda learner, training_input, mode: batch)
  np.testing.assert_array_equal(wrapped(None, {}, "train").loss_mask, attention)


class _FailedSave:
  """A thread whose `join` re-raises its error, as orbax's save futures do."""

  name = "orbax-save"

  def __init__(self, error: Exception):
    self.error = error

  def join(self, timeout: float | None = None) -> None:
    raise self.error


def test_a_failed_background_save_adds_no_traceback_after_the_error_line(capsys):
  refused = ValueError('OUT_OF_RANGE: writing "/run/ckpt/d/x": File too large [os_error_code=27]')
  cli._join_quietly(_FailedSave(refused), 1.0)  # the error line already names the write
  assert capsys.readouterr().err == ""
  cli._join_quietly(_FailedSave(RuntimeError("boom\nmore")), 1.0)
  assert capsys.readouterr().err == "tunix-ppo-ext: error: orbax-save also failed: boom\n"


def test_the_exit_s_wake_up_finds_the_thread_pool_names_it_reads():
  """`cli._wake_idle_workers` reads private names of `concurrent.futures.thread` (what the
  interpreter's exit does); without them it silently does nothing and a failed run waits
  out the 30 s grace again. Pinned on the Python the project runs on."""
  from concurrent.futures import thread as futures_thread

  for name in ("_global_shutdown_lock", "_threads_queues", "_shutdown"):
    assert hasattr(futures_thread, name), name


def test_the_console_script_freezes_the_imported_heap_and_a_python_caller_s_is_left_alone():
  """A job started by the console script runs over a frozen heap (`gc.freeze`: tunix's full
  collections skip the imported modules); `cli.main`, called from Python, freezes nothing."""
  program = (
    "import gc, sys\n"
    "from tunix_ppo_ext._src.run import cli\n"
    "load = cli._load_jax\n"
    "def loaded(own_process):\n"  # JAX and tunix loaded: the count, and the job stops there
    "  load(own_process)\n"
    "  print(gc.get_freeze_count())\n"
    "  raise cli.ConfigError('stopped after the load')\n"
    "cli._load_jax = loaded\n"
    "assert cli.main(['train']) == 2 and gc.get_freeze_count() == 0\n"
    "sys.argv = ['tunix-ppo-ext', 'train']\n"
    "cli.console_main()\n"
  )
  done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
  assert done.returncode == 2 and "stopped after the load" in done.stderr, done.stderr[-2000:]
  from_python, from_console = map(int, done.stdout.split())
  assert from_python == 0 and from_console > 100_000  # jax's and tunix's modules, at least
