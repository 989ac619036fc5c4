#!/usr/bin/env bash
# The offload_to_cpu parity check of issue #12 on a GPU machine (tunix 0.1.7's own sampler
# fails with offload_to_cpu=True on CPU, so the CPU suite cannot run this variant).
# Runs tests/helpers/parity_run.py for `shared`, `offload` and `micro2` on one GPU and prints
# the largest loss difference of each against `shared`. Wheels for what the machine lacks
# are expected under .whl/ (tunix, this package); pass nothing to use what is installed.
set -uo pipefail
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
python3 -c "import jax, flax, tunix; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
out=${OUT:-/tmp/parity}; mkdir -p "$out"
for v in shared offload micro2; do
  PYTHONPATH="${PYTHONPATH:-}:$PWD" timeout 300 python3 tests/helpers/parity_run.py $v \
    >"$out/$v.log" 2>&1; echo "$v rc=$?"; grep '^PARITY' "$out/$v.log" || tail -20 "$out/$v.log"
done
python3 - "$out" <<'PY'
import json, pathlib, sys
runs = {}
for f in pathlib.Path(sys.argv[1]).glob("*.log"):
  line = [x for x in f.read_text().splitlines() if x.startswith("PARITY ")]
  if line:
    runs[f.stem] = json.loads(line[0].removeprefix("PARITY "))
base = runs.get("shared")
for name, r in sorted(runs.items()):
  if base and name != "shared":
    diff = max(abs(a - b) for k in base for a, b in zip(base[k], r[k], strict=True))
    print(f"{name}: max |loss - shared loss| = {diff:.3g}")
PY
# tunix's learner contract (tests/tunix/learner/test_tunix_contract.py) on the GPU as well.
PYTHONPATH="${PYTHONPATH:-}:$PWD" timeout 240 python3 -m pytest -q -x -p no:cacheprovider \
  tests/tunix/learner/test_tunix_contract.py 2>&1 | tail -15
