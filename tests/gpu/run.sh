#!/bin/bash
# tests/gpu/run.sh - the whole GPU check of issue 8 in one device call
# (about 6-8 minutes on an H200; each stage has its own time limit):
#   1. builds the kernels, the CUDA backend plugin and the tools there
#      (binaries built elsewhere may not run on that image);
#   2. every kernel against the CPU backend on random inputs
#      (check_kernels), then again under compute-sanitizer memcheck;
#   3. whole models against the CPU backend (check_model: logits after a
#      prompt and after single steps, greedy tokens with teacher forcing) on
#      stories260K and llm-mkmodel models (F32/BF16/Q8_0/Q4_K);
#   4. memcheck over a short generation through llm-generate;
#   5. the timing table: device copy bandwidth and cuBLAS BF16 rate, then
#      prefill and decode tokens/s at batch 1/16/64/256 for the
#      llama-3.2-1b and llama-8b shapes in BF16 and Q8_0, batch-1 decode as
#      a fraction of the bandwidth roofline, prefill as a fraction of the
#      cuBLAS rate (tests/gpu/table.py prints it last).
# Results go to $OUT (the device tool brings them back) or /tmp/gpu-out.
#
# ../shared does not travel with a device call: before calling, copy the one
# file it needs into an ignored folder and carry it, e.g.
#   mkdir -p .gpudata && cp ../shared/models/stories260K.gguf .gpudata/
#   (.gpudata is in .gitignore; run with carry [".gpudata"])
set -u
cd "$(dirname "$0")/../.." || exit 1
out="${OUT:-/tmp/gpu-out}"
mkdir -p "$out"
models=/tmp/gpu-models
mkdir -p "$models"
fails=0
stage() { echo; echo "=== $*"; }
note_fail() { echo "FAILED: $*"; fails=$((fails + 1)); }

stage device
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/device.txt"
NPROC=$(nproc)

# the benchmark models take minutes to write: started right after the
# build, on the CPUs, while the GPU checks run
mk() { [ -s "$models/$1-$2.gguf" ] || ./build/bin/llm-mkmodel --shape "$1" --type "$2" -o "$models/$1-$2.gguf.tmp" \
    >/dev/null 2>&1 && mv "$models/$1-$2.gguf.tmp" "$models/$1-$2.gguf"; }

stage build
# WERROR=: that image's compilers may warn where ours do not; CI keeps -Werror
if ! timeout 300 make -j"$NPROC" OPT=-O2 WERROR= build/bin/llm-mkmodel build/bin/llm-generate build/bin/llm-bench gpu-check \
        > "$out/build.txt" 2>&1; then
    tail -30 "$out/build.txt"; echo "FAILED: build"; exit 1
fi
grep -E "skipping|NCCL|error" "$out/build.txt" || true
# BENCH_SHAPES / BENCH_TYPES override what is timed (a dry run elsewhere:
# BENCH_SHAPES=tiny); the largest shape gets a writer per type
shapes=${BENCH_SHAPES:-"llama-3.2-1b llama-8b"}
types=${BENCH_TYPES:-"BF16 Q8_0"}
big=${shapes##* }
writers=()
for t in $types; do ( mk "$big" "$t" ) & writers+=($!); done
( for sh in $shapes; do [ "$sh" = "$big" ] || for t in $types; do mk "$sh" "$t"; done; done ) & writers+=($!)

stage "kernels against the CPU backend"
timeout 120 ./build/tests/check_kernels 2>&1 | tee "$out/check_kernels.txt"
[ "${PIPESTATUS[0]}" = 0 ] || note_fail check_kernels
if command -v compute-sanitizer >/dev/null 2>&1; then
    if CHECK_QUICK=1 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 ./build/tests/check_kernels \
            > "$out/memcheck_kernels.txt" 2>&1; then
        echo "memcheck (kernels): clean"
    else
        note_fail "memcheck (kernels)"; tail -20 "$out/memcheck_kernels.txt"
    fi
fi

stage "whole models against the CPU backend"
story=""
for f in "${LLM_SHARED:-../shared}/models/stories260K.gguf" .gpudata/stories260K.gguf; do [ -s "$f" ] && story="$f" && break; done
small="$story"
for t in F32 BF16 Q8_0 Q4_K; do
    ./build/bin/llm-mkmodel --shape tiny --type $t -o "$models/tiny-$t.gguf" >/dev/null 2>&1 && small="$small $models/tiny-$t.gguf"
done
[ -n "$story" ] || echo "stories260K not found (carry .gpudata): skipped"
for m in $small; do
    timeout 120 ./build/tests/check_model "$m" -n 64 2>&1 | tee -a "$out/check_model.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || note_fail "check_model $m"
done
if [ -n "$story" ]; then
    # greedy text on the GPU equals the CPU's (and llama.cpp's reference)
    a=$(./build/bin/llm-generate -m "$story" -p "Once upon a time" -n 64 --temp 0 --ids 2>/dev/null)
    b=$(./build/bin/llm-generate -m "$story" -p "Once upon a time" -n 64 --temp 0 --ids --backend cuda 2>/dev/null)
    if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "greedy 64 tokens: cuda = cpu"; else note_fail "greedy tokens differ"; echo "cpu:  $a"; echo "cuda: $b"; fi
    stage "memcheck over a short generation"
    if command -v compute-sanitizer >/dev/null 2>&1; then
        if timeout 180 compute-sanitizer --tool memcheck --error-exitcode 3 ./build/bin/llm-generate -m "$story" \
                -p "Once upon a time" -n 8 --temp 0 --backend cuda > "$out/memcheck_generate.txt" 2>&1; then
            echo "memcheck (generation): clean"
        else
            note_fail "memcheck (generation)"; tail -20 "$out/memcheck_generate.txt"
        fi
    fi
fi

stage "device ceilings"
timeout 120 ./build/bin/llm-bench --backend cuda --bandwidth --gemm | tee "$out/bench.txt"

stage "waiting for the benchmark models"
wait "${writers[@]}"
for sh in $shapes; do for t in $types; do
    m="$sh-$t"
    [ -s "$models/$m.gguf" ] || { note_fail "no model $m"; continue; }
    stage "bench $m"
    timeout 150 ./build/bin/llm-bench -m "$models/$m.gguf" --backend cuda --batch 1,16,64,256 -p 128 -n 32 \
        --prefill 512 2>&1 | tee -a "$out/bench.txt"
done; done

stage "graphs replay the eager steps"
# the first shape again with CUDA graphs off: the same kernels launched
# one by one must pick the same ids, and the table shows what graphs save
first="${shapes%% *}-${types%% *}"
if [ -s "$models/$first.gguf" ]; then
    LLM_CUDA_GRAPHS=0 timeout 120 ./build/bin/llm-bench -m "$models/$first.gguf" --backend cuda --batch 1,16,64,256 \
        -p 128 -n 32 --prefill 0 2>&1 | tee "$out/bench_eager.txt"
    cat "$out/bench_eager.txt" >> "$out/bench.txt"
    with=$(grep -A4 "file=$first.gguf graphs=1" "$out/bench.txt" | grep -o "decode_batch=[0-9]* .*ids_hash=[0-9]*" | sed 's/ ctx.*ids_hash/ ids_hash/')
    without=$(grep -o "decode_batch=[0-9]* .*ids_hash=[0-9]*" "$out/bench_eager.txt" | sed 's/ ctx.*ids_hash/ ids_hash/')
    if [ -n "$with" ] && [ "$with" = "$without" ]; then echo "graphs: same ids as eager at every batch"
    else note_fail "graphs and eager steps picked different ids"; echo "graphs: $with"; echo "eager:  $without"; fi
fi

stage table
python3 tests/gpu/table.py "$out/bench.txt" | tee "$out/table.txt"
echo
echo "gpu run: $fails failure(s)"
exit $((fails > 0))
