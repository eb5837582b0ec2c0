#!/usr/bin/env bash
# The device path on a machine with a CUDA GPU, in one command: the `gpu`-marked tests, then
# bench/gpu.py against issue 20's targets (XOR + change detection >= 1000 GB/s of input,
# Adler-32 >= 500 GB/s), with an Adler-32 sweep over row and block sizes.
#
#   bash scripts/gpu-check.sh                # results and bench JSON under ${OUT:-bench/out/gpu-check}/
#
# Python: $PYTHON, else .venv-3.12/bin/python, else python3. It needs torch with CUDA, numpy,
# zstandard, pytest and hypothesis; cwtrain-core is taken from this checkout (PYTHONPATH), so
# nothing is installed. Exit 0 only if the tests pass and both targets are met.
set -uo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x .venv-3.12/bin/python ]; then py=.venv-3.12/bin/python; else py=python3; fi
fi
out="${OUT:-bench/out/gpu-check}"
mkdir -p "$out"
export PYTHONPATH="$PWD/packages/cwtrain-core/src${PYTHONPATH:+:$PYTHONPATH}"

"$py" - <<'EOF' || exit 2
import importlib.util, sys
missing = [m for m in ("torch", "numpy", "zstandard", "pytest", "hypothesis") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu-check: missing Python modules: {', '.join(missing)}")
import torch
if not torch.cuda.is_available():
    sys.exit("gpu-check: torch sees no CUDA device")
print(f"gpu-check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF

status=0
echo "== gpu tests" >&2
"$py" -m pytest -m gpu -q -p no:cacheprovider tests/core/codec/test_torch_codec.py 2>&1 | tee "$out/gpu-tests.txt" || status=1
echo "== bench/gpu.py" >&2
if "$py" bench/gpu.py --json --sweep > "$out/gpu.json"; then
  "$py" - "$out/gpu.json" <<'EOF' || status=1
import json, sys
result = json.load(open(sys.argv[1]))
for name, rate in result["gb_per_s"].items():
    print(f"{name:<30}{rate:>10.1f} GB/s")
for row in result.get("adler32_sweep", []):
    print(f"adler32 row {row['row']:>5} block {row['block'] >> 20:>4} MiB {row['gb_per_s']:>10.1f} GB/s")
verdicts = result["targets_pass"] or {}
for name, ok in verdicts.items():
    print(f"target {name} >= {result['targets_gb_per_s'][name]:.0f} GB/s: {'pass' if ok else 'FAIL'}")
sys.exit(0 if verdicts and all(verdicts.values()) else 1)
EOF
else
  status=1
fi
exit $status
