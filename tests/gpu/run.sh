#!/bin/sh
# tests/gpu/run.sh - the GPU check in one device call (see issue 8): builds
# the CUDA kernels and checks each against the CPU backend on random inputs
# (tests/gpu/check_kernels.c), then runs the check again under
# compute-sanitizer memcheck. Results are also written under $OUT when the
# device tool provides it. Still to come here: full-model logits and greedy
# tokens against the CPU backend, and the decode/prefill timing table.
set -eu
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
make -j"$(nproc)" gpu-check
./build/tests/check_kernels | tee "$out/check_kernels.txt"
if command -v compute-sanitizer >/dev/null 2>&1; then
    compute-sanitizer --tool memcheck --error-exitcode 3 ./build/tests/check_kernels > "$out/memcheck.txt" 2>&1 &&
        echo "memcheck: clean" || { echo "memcheck: errors (see memcheck.txt)"; tail -20 "$out/memcheck.txt"; exit 3; }
fi
