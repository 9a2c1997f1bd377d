#!/bin/bash
# The GPT on the CUDA engine, checked and timed on a GPU host beside
# torch_gpt.py --device cuda. Made for the folder `make gpu-pack` builds
# (bin/gpu): copy it to a GPU host (no Go needed there) and run
#   bash gpu-gpt.sh OUTDIR [PART...]
# PARTs (all but large-tf32 when none is named): tests, the engine's CUDA
# tests (every kernel against its Go twin, the GPT's training against Host);
# ops, each of the GPT's device calls timed; sanitize, compute-sanitizer's
# memcheck, racecheck and initcheck on them where the host has it; epoch,
# one epoch of torch_gpt.py's settings on fortunes (batch 32, context 128)
# and 300 of PyTorch's steps; small and large, the two shapes below in FP32
# on both sides; large-tf32, the large one with TF32 tensor cores on both
# sides (--tf32; TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1). About 2 minutes on an
# H100 for the default parts.
set -u
cd "$(dirname "$0")"
OUT=${1:-out}
shift
PARTS=" ${*:-tests ops sanitize epoch small large} "
has() { [[ $PARTS == *" $1 "* ]]; }
mkdir -p "$OUT"
for f in ringtrain-cuda engine-cuda.test gpteval; do [ -e $f.xz ] && xz -dkf $f.xz; chmod +x $f; done
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt" 2>&1
if has tests; then
  log "engine tests"
  timeout 240 ./engine-cuda.test -test.v -test.run CUDA > "$OUT/tests.txt" 2>&1
  echo "rc=$?" | tee -a "$OUT/summary.txt"
  grep -E '^(--- |ok|FAIL|PASS)|losses' "$OUT/tests.txt" | tee -a "$OUT/summary.txt"
fi
if has ops; then
  log "the GPT's device calls at torch_gpt.py's shape"
  timeout 120 ./engine-cuda.test -test.run '^$' -test.bench GPTOps -test.benchtime 50x 2>&1 | grep 'ns/op' | tee -a "$OUT/summary.txt"
fi
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if ! has sanitize; then
  :
elif [ -n "$san" ]; then
  for tool in memcheck racecheck initcheck; do
    log "compute-sanitizer --tool $tool"
    timeout 150 "$san" --tool $tool --error-exitcode 9 ./engine-cuda.test -test.run 'CUDAKernels|CUDAGPT' > "$OUT/sanitizer-$tool.txt" 2>&1
    echo "rc=$?" | tee -a "$OUT/summary.txt"; tail -2 "$OUT/sanitizer-$tool.txt" | tee -a "$OUT/summary.txt"
    # The tool's count of errors says nothing of the tests run under it.
    grep -E '^\s*--- FAIL|^FAIL$' "$OUT/sanitizer-$tool.txt" | sed "s/^/under $tool: /" | tee -a "$OUT/summary.txt"
  done
else
  log "no compute-sanitizer on this host"
fi
torch=0
[ -e torch_gpt.py ] && python3 -c 'import torch' 2>/dev/null && torch=1
if has epoch; then
  sed "s#/usr/share/games/fortunes#$PWD/fortunes#; s/\"epochs\": 2/\"epochs\": 1/" gpt-quality-job.json > gpt.json
  log "ringtrain GPT L4 d128 h4 T128 B32 on cuda, one peer, one epoch"
  timeout 300 ./ringtrain-cuda local -n 1 --device cuda --config gpt.json > "$OUT/gpt.txt" 2>&1
  echo "rc=$?" | tee -a "$OUT/summary.txt"
  grep -E '"epoch done"|"summary"' "$OUT/gpt.txt" | cut -c1-400 | tee -a "$OUT/summary.txt"
  if [ $torch = 1 ]; then
    log "torch_gpt.py --device cuda, 300 steps"
    timeout 200 python3 torch_gpt.py --device cuda --data fortunes --steps 300 > "$OUT/torch-gpt.txt" 2>&1
    tail -2 "$OUT/torch-gpt.txt" | tee -a "$OUT/summary.txt"
  fi
fi
# Two shapes at equal steps, torch_gpt.py's and 6 layers × 384 at context
# 256: one epoch of ringtrain on the GPU (562 steps at batch 32, context
# 128; 140 at batch 64, context 256),
# its checkpoint scored by gpteval on torch_gpt.py's own 64 validation
# windows, and torch_gpt.py run for as many steps.
shape() { # name layers dim heads ctx batch steps [ringtrain flag] [torch env]
  sed "s#/usr/share/games/fortunes#$PWD/fortunes#; s/\"epochs\": 2/\"epochs\": 1/; s/\"batch_size\": 32/\"batch_size\": $6/;
    s#\"name\": \"gpt-quality\"#\"name\": \"$1\", \"checkpoint_dir\": \"$OUT/ck\"#;
    s/\"layers\": 4, \"dim\": 128, \"heads\": 4, \"context\": 128/\"layers\": $2, \"dim\": $3, \"heads\": $4, \"context\": $5/" gpt-quality-job.json > $1.json
  log "ringtrain $1 (L$2 d$3 h$4 T$5 B$6) ${8:-}, one epoch on cuda"
  timeout 300 ./ringtrain-cuda local -n 1 --device cuda ${8:-} --config $1.json > "$OUT/$1.txt" 2>&1
  echo "rc=$?" | tee -a "$OUT/summary.txt"
  grep '"epoch done"' "$OUT/$1.txt" | grep -o '"step":[0-9]*\|"samples_per_sec":[0-9.]*\|"elapsed_s":[0-9.]*' | tr '\n' ' ' | tee -a "$OUT/summary.txt"; echo | tee -a "$OUT/summary.txt"
  [ -x gpteval ] && ./gpteval "$OUT/ck/$1.ckpt" fortunes 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
  if [ $torch = 1 ]; then
    log "torch_gpt.py --device cuda $1, $7 steps ${9:-}"
    timeout 300 env ${9:-} python3 torch_gpt.py --device cuda --data fortunes --layers $2 --dim $3 --heads $4 --ctx $5 --batch $6 --steps $7 --eval-every $7 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
  fi
}
has small && shape gpt-small 4 128 4 128 32 562
has large && shape gpt-large 6 384 6 256 64 140
has large-tf32 && shape gpt-large-tf32 6 384 6 256 64 140 --tf32 TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1
log done
