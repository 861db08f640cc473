#!/bin/sh
# tests/cudasim/check_models.sh BUILD - whole models through the CUDA
# backend on the CUDA-on-CPU emulator (make cudasim):
#   - tests/gpu/check_model: logits after a prompt (the cuBLAS path) and
#     after single steps (the GEMV path) against the CPU backend, and
#     greedy tokens, on stories260K (../shared), llm-mkmodel's tiny
#     model in every weight type the backend takes, and its tiny gemma3
#     (sliding window 8, Q/K norms, post-norms, GELU, scaled embeddings),
#     qwen3 and qwen3moe (8 experts, 2 per token) models;
#   - the engine's decode steps (device sampling, CUDA graphs captured and
#     replayed) through llm-bench: the same ids with graphs, without them
#     (LLM_CUDA_GRAPHS=0), with tensor parallelism over two emulated
#     devices (NCCL all-reduce) and on the CPU backend;
#   - LoRA adapters mixed in every step (llm-bench --loras): cuda = cpu;
#   - greedy text of stories260K through llm-generate: cuda = cpu.
# Exit status: the number of failed checks.
set -u
b=${1:-build}
lib=$b/cudasim/libllm_cuda.so
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0
fail() { echo "FAILED: $*"; fails=$((fails + 1)); }

models=""
story="${LLM_SHARED:-../shared}/models/stories260K.gguf"
if [ -s "$story" ]; then models="$story"; else echo "check_models: $story not present: stories260K skipped"; fi
for t in F32 BF16 F16 Q8_0 Q4_0 Q4_K; do
    if "$b/bin/llm-mkmodel" --shape tiny --type $t -o "$dir/tiny-$t.gguf" >/dev/null 2>&1; then
        models="$models $dir/tiny-$t.gguf"
    else
        fail "llm-mkmodel tiny $t"
    fi
done
for st in tiny-gemma3:Q5_0 tiny-gemma3:Q3_K tiny-qwen3:Q5_K tiny-qwen3:Q2_K tiny-gemma3:F32 tiny-qwen3moe:Q4_K \
          tiny-qwen3moe:F32; do
    s=${st%%:*} t=${st##*:}
    if "$b/bin/llm-mkmodel" --shape $s --type $t -o "$dir/$s-$t.gguf" >/dev/null 2>&1; then
        models="$models $dir/$s-$t.gguf"
    else
        fail "llm-mkmodel $s $t"
    fi
done

echo "== check_model on the emulator (CUDA backend vs CPU backend), two models at a time (each keeps a core busy)"
i=0
for m in $models; do
    i=$((i + 1))
    (LLM_CUDA_LIB=$lib "$b/tests/check_model" "$m" -n 32 > "$dir/check-$i.log" 2>&1; echo $? > "$dir/check-$i.rc") &
    [ $((i % 2)) -eq 0 ] && wait
done
wait
i=0
for m in $models; do
    i=$((i + 1))
    cat "$dir/check-$i.log"
    [ "$(cat "$dir/check-$i.rc")" = 0 ] || fail "check_model $m"
done

echo "== decode steps: CUDA graphs, eager steps and the CPU backend pick the same ids"
m="$dir/tiny-F32.gguf"
bench() { "$b/bin/llm-bench" -m "$m" --batch 1,4,16 -p 16 -n 8 --prefill 0 "$@" 2>&1 | grep -o "decode_batch=[0-9]* .*ids_hash=[0-9]*" | sed 's/ ctx.*ids_hash/ ids_hash/'; }
graphs=$(LLM_CUDA_LIB=$lib bench --backend cuda)
eager=$(LLM_CUDA_GRAPHS=0 LLM_CUDA_LIB=$lib bench --backend cuda)
tp2=$(LLM_CUDA_LIB=$lib bench --backend cuda --tp 2)
cpu=$(bench)
echo "graphs: $(echo $graphs)"
echo "eager:  $(echo $eager)"
echo "tp 2:   $(echo $tp2)"
echo "cpu:    $(echo $cpu)"
[ -n "$graphs" ] && [ "$graphs" = "$eager" ] || fail "graphs and eager steps picked different ids"
[ -n "$tp2" ] && [ "$graphs" = "$tp2" ] || fail "tensor parallelism 2 (NCCL) picked other ids"
[ -n "$cpu" ] && [ "$graphs" = "$cpu" ] || fail "the CUDA backend and the CPU backend picked different ids"

echo "== mixture-of-experts decode steps (routing read back each layer: never a graph): the same ids"
m="$dir/tiny-qwen3moe-F32.gguf"
graphs=$(LLM_CUDA_LIB=$lib bench --backend cuda)
tp2=$(LLM_CUDA_LIB=$lib bench --backend cuda --tp 2)
cpu=$(bench)
echo "cuda: $(echo $graphs)"
echo "tp 2: $(echo $tp2)"
echo "cpu:  $(echo $cpu)"
[ -n "$graphs" ] && [ "$graphs" = "$tp2" ] || fail "MoE: tensor parallelism 2 picked other ids"
[ -n "$cpu" ] && [ "$graphs" = "$cpu" ] || fail "MoE: the CUDA backend and the CPU backend picked different ids"

echo "== LoRA adapters (3 of them, sequence i under adapter i mod 3, every step mixing them; never a graph): the same ids"
for m in "$dir/tiny-F32.gguf" "$dir/tiny-qwen3moe-F32.gguf"; do
    cuda=$(LLM_CUDA_LIB=$lib bench --backend cuda --loras 3)
    cpu=$(bench --loras 3)
    plain=$(bench)
    echo "$(basename "$m") cuda: $(echo $cuda)"
    echo "$(basename "$m") cpu:  $(echo $cpu)"
    [ -n "$cuda" ] && [ "$cuda" = "$cpu" ] || fail "LoRA: the CUDA backend and the CPU backend picked different ids on $m"
    [ "$cpu" != "$plain" ] || fail "LoRA: the adapters changed no id on $m"
done

if [ -s "$story" ]; then
    echo "== greedy text of stories260K: cuda = cpu"
    gen() { "$b/bin/llm-generate" -m "$story" -p "Once upon a time" -n 32 --temp 0 --ids "$@" 2>/dev/null; }
    a=$(gen)
    c=$(LLM_CUDA_LIB=$lib gen --backend cuda)
    echo "cpu:  $a"
    echo "cuda: $c"
    [ -n "$a" ] && [ "$a" = "$c" ] || fail "greedy tokens differ"
fi
echo "check_models: $fails failure(s)"
exit $fails
