#!/bin/sh
# tests/bench/lora_speed.sh - decode throughput with LoRA adapters, llm-server against llama.cpp's
# llama-server in the same run: 16 concurrent greedy requests of NTOK (64) tokens, with 0, 1, 4 and 16
# distinct rank-16 adapters of type TYPE (F16; F32, BF16, Q8_0: llm-mkmodel --lora-of, seeded), 2 threads
# each, through each server's HTTP API (llama.cpp: all 16 adapters loaded with --lora-init-without-apply,
# per-request "lora" scales).
#   LLAMA_CPP_DIR=... [MODEL=file.gguf] [NTOK=64] [TYPE=F16] sh tests/bench/lora_speed.sh  (from the repository)
set -u
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
for i in $(seq 0 15); do build/bin/llm-mkmodel --lora-of "${MODEL:-build/models/gemma-3-270m-q4_k_m.gguf}" --rank 16 \
    --alpha 32 --type "${TYPE:-F16}" --seed $((200 + i)) -o "$D/a$i.gguf" >/dev/null 2>&1 || { echo "llm-mkmodel failed"; exit 1; }; done
G=${MODEL:-build/models/gemma-3-270m-q4_k_m.gguf}
L=${LLAMA_CPP_DIR:?set LLAMA_CPP_DIR to a llama.cpp checkout built with -DLLAMA_BUILD_SERVER=ON}/build/bin
NSEQ=16; NTOK=${NTOK:-64}
loras=""; llargs=""
for i in $(seq 0 15); do loras="$loras${loras:+,}a$i=$D/a$i.gguf"; llargs="$llargs --lora $D/a$i.gguf"; done
wait_up() { for k in $(seq 1 600); do curl -sf localhost:$1/health >/dev/null 2>&1 && return 0; sleep 0.2; done; return 1; }
# ours
build/bin/llm-server -m $G --port 18080 --threads 2 --model_name test --max_seqs 16 --max_loras 16 --lora "$loras" >$D/ours.log 2>&1 &
P=$!; wait_up 18080; for i in $(seq 1 600); do curl -sf localhost:18080/readyz >/dev/null && break; sleep 0.2; done
for a in 0 1 4 16; do python3 tests/bench/lora_speed.py ours 18080 $a $NSEQ $NTOK; done
kill $P; wait $P 2>/dev/null
# llama.cpp: plain, then with the 16 adapters
$L/llama-server -m $G --port 18081 -t 2 -np 16 -c $((16*256)) >$D/llama0.log 2>&1 &
P=$!; wait_up 18081; python3 tests/bench/lora_speed.py llama 18081 0 $NSEQ $NTOK; kill $P; wait $P 2>/dev/null
$L/llama-server -m $G --port 18082 -t 2 -np 16 -c $((16*256)) $llargs --lora-init-without-apply >$D/llama16.log 2>&1 &
P=$!; wait_up 18082; for a in 1 4 16; do python3 tests/bench/lora_speed.py llama 18082 $a $NSEQ $NTOK; done; kill $P; wait $P 2>/dev/null
