#!/bin/bash
# The GPT on the CUDA engine, checked and timed on a GPU host beside
# torch_gpt.py --device cuda. Made for the folder `make gpu-pack` builds
# (bin/gpu): copy it to a GPU host (no Go needed there) and run
#   bash gpu-gpt.sh OUTDIR
# The engine's CUDA tests (every kernel against its Go twin, the GPT's
# training against Host), compute-sanitizer's memcheck, racecheck and
# initcheck on them where the host has it, then one epoch of torch_gpt.py's
# settings on fortunes (batch 32, context 128) and 300 of PyTorch's steps.
# About 4 minutes.
set -u
cd "$(dirname "$0")"
OUT=${1:-out}
mkdir -p "$OUT"
for f in ringtrain-cuda engine-cuda.test; do [ -e $f.xz ] && xz -dkf $f.xz; chmod +x $f; done
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt" 2>&1
log "engine tests"
timeout 240 ./engine-cuda.test -test.v -test.run CUDA > "$OUT/tests.txt" 2>&1
echo "rc=$?" | tee -a "$OUT/summary.txt"
grep -E '^(--- |ok|FAIL|PASS)|losses' "$OUT/tests.txt" | tee -a "$OUT/summary.txt"
log "the GPT's device calls at torch_gpt.py's shape"
RINGTRAIN_OP_TIMES=1 timeout 60 ./engine-cuda.test -test.v -test.run GPTOpTimes 2>&1 | grep 'µs' | tee -a "$OUT/summary.txt"
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$san" ]; then
  for tool in memcheck racecheck initcheck; do
    log "compute-sanitizer --tool $tool"
    timeout 150 "$san" --tool $tool --error-exitcode 9 ./engine-cuda.test -test.run 'CUDAKernels|CUDAGPT' > "$OUT/sanitizer-$tool.txt" 2>&1
    echo "rc=$?" | tee -a "$OUT/summary.txt"; tail -2 "$OUT/sanitizer-$tool.txt" | tee -a "$OUT/summary.txt"
  done
else
  log "no compute-sanitizer on this host"
fi
sed "s#/usr/share/games/fortunes#$PWD/fortunes#; s/\"epochs\": 2/\"epochs\": 1/" gpt-quality-job.json > gpt.json
log "ringtrain GPT L4 d128 h4 T128 B32 on cuda, one peer, one epoch"
timeout 300 ./ringtrain-cuda local -n 1 --device cuda --config gpt.json > "$OUT/gpt.txt" 2>&1
echo "rc=$?" | tee -a "$OUT/summary.txt"
grep -E '"epoch done"|"summary"' "$OUT/gpt.txt" | cut -c1-400 | tee -a "$OUT/summary.txt"
if [ -e torch_gpt.py ] && python3 -c 'import torch' 2>/dev/null; then
  log "torch_gpt.py --device cuda, 300 steps"
  timeout 200 python3 torch_gpt.py --device cuda --data fortunes --steps 300 > "$OUT/torch-gpt.txt" 2>&1
  tail -2 "$OUT/torch-gpt.txt" | tee -a "$OUT/summary.txt"
fi
log done
