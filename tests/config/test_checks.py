"""The shared validation helpers (`tunix_ppo_ext._src.checks`): one line naming the field,
the value and what is allowed, for every kind of nonsense."""

from __future__ import annotations

import math

import pytest

from tunix_ppo_ext._src.checks import (
  ConfigError,
  FieldKeys,
  check_choice,
  check_integer,
  check_number,
  did_you_mean,
  whole_share,
)

pytestmark = pytest.mark.fast


def test_did_you_mean_names_the_closest_choice_or_nothing():
  assert did_you_mean("grop", ("group", "batch", "state")) == "; did you mean 'group'?"
  assert did_you_mean("zzzz", ("group", "batch")) == ""
  assert did_you_mean(5, ("group",)) == ""


@pytest.mark.parametrize(
  "value", [True, "1", None, math.nan, math.inf, -0.5, 2.0, [1], complex(1, 1)]
)
def test_check_number_refuses_what_is_not_a_finite_number_in_the_interval(value):
  with pytest.raises(ConfigError) as error:
    check_number("config key 'x'", value, low=0.0, high=1.0, high_open=True)
  assert str(error.value) == (
    f"config key 'x'={value!r} is invalid: must be a finite number in [0.0, 1.0)."
  )
  assert "\n" not in str(error.value)


def test_check_number_keeps_the_bounds_it_is_given():
  assert check_number("x", 0, low=0.0) == 0.0 and isinstance(check_number("x", 1), float)
  with pytest.raises(ConfigError, match=r"in \(0.0, inf\)"):
    check_number("x", 0, low=0.0, low_open=True)
  with pytest.raises(ConfigError, match=r"in \(-inf, 0.0\]"):
    check_number("x", 0.1, high=0.0)


@pytest.mark.parametrize("value", [True, 2.0, "3", 0, -1])
def test_check_integer_refuses_bools_floats_strings_and_small_values(value):
  with pytest.raises(ConfigError, match=r"^n=.* is invalid: must be an integer >= 1\.$"):
    check_integer("n", value, low=1)
  assert check_integer("n", 4, low=1) == 4


def test_check_choice_names_the_value_a_hint_and_the_choices():
  check_choice("config key 'filter.by'", "std", ("std", "std_rev"))
  with pytest.raises(ConfigError) as error:
    check_choice("config key 'filter.by'", "sdt", ["std", "std_rev"])
  assert str(error.value) == (
    "config key 'filter.by'='sdt' unknown; did you mean 'std'? (valid: ('std', 'std_rev'))"
  )
  with pytest.raises(ConfigError, match=r"^x=\[1\] unknown \(valid: \('a',\)\)$"):
    check_choice("x", [1], ("a",))


@pytest.mark.parametrize(
  "ratio, total, share", [(0.28, 50, 14), (0.5, 8, 4), (0.3, 8, None), (1.0, 3, 3), (0.1, 3, None)]
)
def test_whole_share_allows_float_rounding_only(ratio, total, share):
  assert whole_share(ratio, total) == share


def test_field_keys_name_a_field_as_the_user_sets_it():
  run = FieldKeys(prefix="ppo.", elsewhere={"fused_head": "model.fused_head"})
  assert run.subject("epsilon") == "config key 'ppo.epsilon'"
  assert run.key("epsilon") == "ppo.epsilon"
  assert run.subject("fused_head") == "config key 'model.fused_head'"
  own = FieldKeys(owner="PpoExtConfig")
  assert own.subject("epsilon") == "PpoExtConfig.epsilon" and own.key("epsilon") == "epsilon"
