#!/usr/bin/env bash
# The drafter's device check, in one command, on a GPU machine with only torch, triton, numpy and msgpack (no vLLM,
# no Ray, no network): the `gpu` tests, then benchmarks.drafter device at Llama 4 Scout shapes (bf16, k = 3).
#
#     bash benchmarks/device_check.sh [OUT_DIR]      # ~5 minutes on an H200; figures: docs/BENCHMARKS.md
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-/tmp/device_check}}"
mkdir -p "$out"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee "$out/device.txt"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/actors/drafter/test_drafter_cuda.py 2>&1 | tee "$out/gpu_tests.txt"
tests=${PIPESTATUS[0]}
python3 -m benchmarks.drafter device --batch 1 8 32 128 --context 1024 8000 --steps 10 --recompute-max-tokens 0 --branches \
    --sweep 2>&1 | tee "$out/drafter_device.txt"
bench=${PIPESTATUS[0]}
echo "gpu tests exit $tests, benchmark exit $bench"
exit $(( tests || bench ))
