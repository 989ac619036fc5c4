"""`tests/helpers/compile_settings.py`: the suite's compile settings over a caller's environment."""

import pytest

from tests.helpers import compile_settings

pytestmark = pytest.mark.fast


def test_missing_flags_are_added_and_the_caller_s_own_values_win():
  mine = {
    "XLA_FLAGS": "--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=2",
    "JAX_COMPILATION_CACHE_DIR": "/elsewhere",
  }
  got = compile_settings.settings(mine)
  assert got["XLA_FLAGS"].split() == [
    "--xla_force_host_platform_device_count=4",
    "--xla_backend_optimization_level=2",
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_parallel_codegen_split_count=1",
  ]
  assert got["JAX_COMPILATION_CACHE_DIR"] == "/elsewhere"
  assert got["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
  assert compile_settings.settings({})["XLA_FLAGS"].split() == [
    "--xla_backend_optimization_level=0",
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_parallel_codegen_split_count=1",
  ]


def test_a_real_size_model_s_subprocess_compiles_with_the_fusion_emitters():
  suite = compile_settings.settings({"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
  got = compile_settings.large_program_env({**suite, "HOME": "/home/me"})
  assert got["XLA_FLAGS"].split() == [
    "--xla_force_host_platform_device_count=2",
    "--xla_backend_optimization_level=0",
    "--xla_cpu_parallel_codegen_split_count=1",
    "--xla_cpu_use_fusion_emitters=true",
  ]
  assert got["HOME"] == "/home/me"
  assert got["JAX_COMPILATION_CACHE_DIR"] == suite["JAX_COMPILATION_CACHE_DIR"]
