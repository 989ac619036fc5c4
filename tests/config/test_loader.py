"""The light configuration layer: a config file read and checked without JAX, tunix or
transformers (`tunix_ppo_ext._src.config.loader`), through Python and the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tunix_ppo_ext._src.checks import ConfigError
from tunix_ppo_ext._src.config import ppo_section
from tunix_ppo_ext._src.config.loader import read_run_config
from tunix_ppo_ext._src.config.run_sections import LoraSection, RunConfig

pytestmark = pytest.mark.fast

HEAVY = ("jax", "tunix", "transformers", "flax", "optax", "orbax", "qwix")
# runs in a fresh interpreter: `what` (Python) refuses a bad key; prints the message, the exit
# code (the command line's) and which heavy packages were imported
SCRIPT = """
import json, sys
from tunix_ppo_ext._src.checks import ConfigError
what, message, code = sys.argv[1], None, None
if what == "python":
  from tunix_ppo_ext._src.config.loader import read_run_config
  try:
    read_run_config(None, sys.argv[2:])
  except ConfigError as err:
    message = str(err)
else:
  from tunix_ppo_ext._src.run import cli
  code = cli.main(["train", *sys.argv[2:]])
heavy = sorted(m for m in {HEAVY} if m in sys.modules)
print(json.dumps({{"message": message, "code": code, "heavy": heavy}}))
"""


def _refused(what: str, *overrides: str) -> tuple[dict, str]:
  script = SCRIPT.format(HEAVY=HEAVY)
  done = subprocess.run(
    [sys.executable, "-c", script, what, *overrides], capture_output=True, text=True, check=True
  )
  return json.loads(done.stdout.splitlines()[-1]), done.stderr


@pytest.mark.parametrize(
  ("override", "message"),
  [
    ("ppo.entropy_coeff=0.01", "unknown config key 'ppo.entropy_coeff'; did you mean 'entropy_co"),
    ("train.stpes=3", "unknown config key 'train.stpes'; did you mean 'steps'?"),
    ("ppo.epsilon=2", "config key 'ppo.epsilon'=2 is invalid: must be a finite number in (0.0,"),
    ("model.lora.rnak=4", "unknown config key 'model.lora.rnak'; did you mean 'rank'?"),
    ("sampling.top_p=0", "config key 'sampling.top_p'=0"),
    ("ppo.kl_ctrl=adaptve", "config key 'ppo.kl_ctrl'='adaptve' is invalid: must be one of"),
  ],
)
def test_a_bad_key_or_value_is_refused_without_importing_jax_tunix_or_transformers(
  override, message
):
  got, _ = _refused("python", override)
  assert got["message"].startswith(message) and got["heavy"] == []


def test_the_command_line_refuses_a_bad_key_in_one_line_before_jax_loads():
  got, stderr = _refused("cli", "ppo.entropy_coeff=0.01")
  assert got["code"] == 2 and got["heavy"] == []
  line = "unknown config key 'ppo.entropy_coeff'; did you mean 'entropy_coef'?"
  assert stderr.strip() == f"tunix-ppo-ext: error: {line}"


def test_the_ppo_section_keeps_the_keys_given_with_the_numbers_as_floats():
  run = read_run_config(None, ["ppo.epsilon=0.3", "ppo.num_generations=2"])
  assert run.ppo["epsilon"] == 0.3 and isinstance(run.ppo["epsilon"], float)
  assert run.ppo["num_generations"] == 2
  with pytest.raises(ConfigError, match=r"config key 'ppo.fused_head': set model.fused_head"):
    read_run_config(None, ["ppo.fused_head=true"])
  with pytest.raises(ConfigError, match=r"config key 'ppo.kl_method'=5 is invalid: must be a name"):
    read_run_config(None, ["ppo.kl_method=5"])


def test_bounds_sit_beside_their_fields_and_are_checked_as_the_section_is_built():
  with pytest.raises(ConfigError, match=r"'train.steps'=0 is invalid: must be an integer >= 1"):
    read_run_config(None, ["train.steps=0"])
  with pytest.raises(ConfigError, match=r"config key 'seed'=2147483648 is invalid"):
    RunConfig(seed=2**31)
  with pytest.raises(ConfigError, match=r"config key 'model.lora.alpha'=0.0 is invalid"):
    LoraSection(alpha=0.0)
  # a section changed in code is checked again as the run is read or resolved (`check_run`)
  assert read_run_config(None, ["model.lora={rank: 2}"]).model.lora == LoraSection(rank=2)


def test_the_key_table_names_every_key_once():
  assert len(set(ppo_section.FIELDS)) == len(ppo_section.FIELDS)
  assert set(ppo_section.KEYS) == set(ppo_section.FIELDS) - set(ppo_section.SET_ELSEWHERE)
