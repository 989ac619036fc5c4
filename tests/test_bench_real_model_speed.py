"""`bench/real_model_speed.py`'s arithmetic: per-phase medians, compilations, floors."""

from __future__ import annotations

import pytest

from tests.helpers.bench import load_bench

pytestmark = pytest.mark.tunix

SHAPE = {"batch": 2, "prompt": 3, "completion": 5, "decode_steps": 4, "head": 10, "params": 110}


def test_floors_are_the_flops_at_the_matmul_rate_and_the_weight_reads_at_the_memory_rate():
  bench = load_bench("real_model_speed")
  m, rates = {"completion_tokens": 4.0}, {"float32": 1.0, "bfloat16": 2.0, "read": 1.0}
  lora = bench.floors({"shape": {**SHAPE, "lora": True}}, m, rates)
  # forward FLOPs: 2 x (body 100 x tokens + head 10 x logit positions), at 1 GFLOP/s
  fed = 2 * (100 * 2 * (3 + 4) + 10 * 2 * 4) / 1e9  # the prompt and the real completion
  read = 4 * 110 * 4 / 1e9  # 4 decode steps, each reading 110 float32 parameters
  assert lora["rollout"] == pytest.approx(max(fed, read))
  one_pass = 2 * (100 * 2 * (3 + 5) + 10 * 2 * 5) / 1e9  # padded widths, logits on T
  assert lora["old_logp"] == lora["ref_logp"] == lora["values"] == pytest.approx(one_pass)
  assert lora["update_actor"] == pytest.approx(2 * one_pass)  # no frozen-weight gradients
  full = bench.floors({"shape": {**SHAPE, "lora": False}}, m, rates)
  assert full["update_actor"] == pytest.approx(3 * one_pass)
  slow_memory = bench.floors({"shape": {**SHAPE, "lora": True}}, m, {**rates, "read": 1e-3})
  assert slow_memory["rollout"] == pytest.approx(read * 1e3)  # bound by the weight reads


def test_floors_of_bfloat16_weights_use_its_rate_and_its_bytes():
  bench = load_bench("real_model_speed")
  m, rates = {"completion_tokens": 4.0}, {"float32": 1.0, "bfloat16": 2.0, "read": 1e-3}
  shape = {**SHAPE, "lora": True, "dtype": "bfloat16", "weight_bytes": 2 * 110}
  half = bench.floors({"shape": shape}, m, rates)
  one_pass = 2 * (100 * 2 * (3 + 5) + 10 * 2 * 5) / 1e9
  assert half["old_logp"] == pytest.approx(one_pass / 2)  # at bfloat16's 2 GFLOP/s
  assert half["rollout"] == pytest.approx(4 * 2 * 110 / 1e9 * 1e3)  # 2 bytes a weight


def test_medians_skip_the_warm_up_and_count_its_later_compilations():
  bench = load_bench("real_model_speed")
  steps = {
    0: {"eval/timing_s/rollout": 9.0},
    1: {"timing_s/step": 60.0, "timing_s/rollout": 50.0},
    **{
      k: {
        "timing_s/step": 10.0 + k,
        "timing_s/rollout": 3.0 + k,
        "timing_s/update_actor": 6.0,
        "generation/completions/mean_length": 80.0 + k,
        "train/response_length/mean": 20.0,
      }
      for k in (2, 3, 4)
    },  # fmt: skip
  }
  stamps = [0.0, 60.0, 72.0, 85.0, 99.0]  # batch k + 1 drawn at stamps[k]
  result = {"steps": steps, "stamps": stamps, "compiles": [1.0, 30.0, 73.0, 90.0]}
  m = bench.medians(result, warmup=1)
  assert m["step"] == 13.0 and m["rollout"] == 6.0 and m["update_actor"] == 6.0
  assert m["old_logp"] == 0.0  # a phase that did not run
  assert m["first_step"] == 60.0
  assert m["completion_tokens"] == 83.0 and m["agent_tokens"] == 20.0
  assert m["compiles_after_warmup"] == 2  # those after batch 2 was drawn (step 2 on)


def test_top_ops_sum_each_program_and_op_kind_and_skip_annotations_and_loops(tmp_path):
  import gzip
  import json

  bench = load_bench("real_model_speed")

  def op(name, seconds, program, ph="X"):
    args = {"hlo_op": name, "hlo_module": program}
    return {"ph": ph, "name": name, "dur": seconds * 1e6, "args": args}

  events = [
    op("ynn_fusion.1", 3, "jit_train"),
    op("ynn_fusion.7", 1, "jit_train"),
    op("copy.2", 2, "jit_train"),
    op("ynn_fusion.1", 0.5, "jit_decode"),  # the same op name in another program
    op("while.3", 9, "jit_decode"),  # holds others
    {"ph": "X", "name": "train", "dur": 9e6, "args": {"step_num": "3"}},  # an annotation
    op("copy.9", 5, "jit_decode", ph="i"),  # not a span
  ]
  folder = tmp_path / "plugins" / "profile" / "run"
  folder.mkdir(parents=True)
  (folder / "perfetto_trace.json.gz").write_bytes(gzip.compress(json.dumps(events).encode()))
  assert bench.top_ops(tmp_path, count=4) == [
    ("jit_train/*", 6.0, 3),
    ("jit_train/ynn_fusion", 4.0, 2),
    ("jit_decode/*", 0.5, 1),
    ("jit_decode/ynn_fusion", 0.5, 1),
  ]
