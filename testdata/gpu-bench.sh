#!/bin/bash
# The GPU figures of train/engine/RESULTS.md, ringtrain and PyTorch side by
# side on one machine. Made for the folder `make gpu-pack` builds (bin/gpu):
# copy it to a GPU host (no Go needed there) and run
#   bash gpu-bench.sh OUTDIR
# Each figure is a median of 3 runs; PyTorch's side is skipped if
# torch_fmnist_gpu.py or python3 with torch is missing. About 5 minutes.
set -u
cd "$(dirname "$0")"
OUT=${1:-out}
mkdir -p "$OUT"
for f in ringtrain-cuda engine-cuda.test; do [ -e $f.xz ] && xz -dkf $f.xz; chmod +x $f; done
data=$PWD/fmnist
sed "s#/usr/share/datasets/fashion-mnist#$data#g" bench-cnn-1.json > cnn-1.json
sed "s#/usr/share/datasets/fashion-mnist#$data#g; s/\"epochs\": 5/\"epochs\": 1/" bench-cnn-2.json > cnn-2.json
torch=0
[ -e torch_fmnist_gpu.py ] && python3 -c 'import torch' 2>/dev/null && torch=1
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
pt() { [ $torch = 1 ] && timeout 120 python3 torch_fmnist_gpu.py --data "$data" "$@" 2>&1 | tail -1 | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt" 2>&1
log "engine tests"; timeout 240 ./engine-cuda.test -test.v > "$OUT/tests.txt" 2>&1; echo "rc=$?" | tee -a "$OUT/summary.txt"
log "engines against gorgonia"; timeout 120 ./ringtrain-cuda bench engines --device cuda --model cnn --steps 20 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
log "engines against gorgonia, --tf32"; timeout 120 ./ringtrain-cuda bench engines --device cuda --model cnn --steps 20 --tf32 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
for cfg in "cnn 64" "cnn 256" "mlp 64" "mlp 256"; do set -- $cfg
  log "ringtrain $1 B=$2"; timeout 120 ./ringtrain-cuda bench device --device cuda --model $1 --batch $2 --runs 3 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
  log "torch eager $1 B=$2"; for r in 1 2 3; do pt --model $1 --batch $2 --mode eager; done
done
log "ringtrain cnn B=64 --tf32"; timeout 120 ./ringtrain-cuda bench device --device cuda --model cnn --batch 64 --tf32 --runs 3 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
log "torch graph cnn B=64"; pt --model cnn --batch 64 --mode graph
for r in 1 2 3; do
  log "ringtrain 2 peers on one GPU, tcp plane, B=32 each, 1 epoch, run $r"
  timeout 120 ./ringtrain-cuda local -n 2 --config cnn-2.json --device cuda --data-plane tcp > "$OUT/two-$r.txt" 2>&1
  grep '"summary"' "$OUT/two-$r.txt" | grep -o '"samples_per_sec":[0-9.]*' | tr '\n' ' ' | tee -a "$OUT/summary.txt"; echo | tee -a "$OUT/summary.txt"
  log "torch DDP (gloo) 2 processes B=32, run $r"; pt --model cnn --batch 32 --mode ddp --procs 2
done
log "ringtrain cnn 5 epochs B=64, one peer"; timeout 300 ./ringtrain-cuda local -n 1 --config cnn-1.json --device cuda > "$OUT/one-5ep.txt" 2>&1
grep '"epoch done"\|"summary"' "$OUT/one-5ep.txt" | cut -c1-300 | tee -a "$OUT/summary.txt"
log "ringtrain cnn 5 epochs B=64, one peer, --tf32"; timeout 300 ./ringtrain-cuda local -n 1 --config cnn-1.json --device cuda --tf32 > "$OUT/one-5ep-tf32.txt" 2>&1
grep '"summary"' "$OUT/one-5ep-tf32.txt" | cut -c1-300 | tee -a "$OUT/summary.txt"
log done
