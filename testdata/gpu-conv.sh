#!/bin/bash
# The cnn's convolutions by cuDNN against im2col and cuBLAS, and against
# PyTorch at the same precision, on a GPU host. Made for the folder `make
# gpu-pack` builds (bin/gpu): copy it there (no Go needed) and run
#   bash gpu-conv.sh OUTDIR [PART...]
# PARTs (all five when none is named): tests, the engine's CUDA tests;
# sanitize, compute-sanitizer's memcheck, racecheck and initcheck on the
# kernel and convolution tests; layers, each of the cnn's calls timed at
# batch 256 with cuDNN and without; speed256 and speed64, samples/s of `bench
# device` (median of 3 runs of 400 steps) with RINGTRAIN_CUDNN=off, with
# cuDNN, and with --tf32, at batch 256 or 64, beside torch_fmnist_gpu.py
# eager and captured (3 runs each) with TF32 off everywhere
# (NVIDIA_TF32_OVERRIDE=0) and on everywhere (its default TF32
# convolutions plus TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 for the linear
# layers), and eager at PyTorch's defaults. cuDNN is the system's, else the
# one PyTorch's wheels carry.
set -u
cd "$(dirname "$0")"
OUT=${1:-out}
shift
PARTS=" ${*:-tests sanitize layers speed256 speed64} "
mkdir -p "$OUT"
for f in ringtrain-cuda engine-cuda.test; do [ -e $f.xz ] && xz -dkf $f.xz; chmod +x $f; done
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/summary.txt" 2>&1
dnn=$(ls /usr/lib/x86_64-linux-gnu/libcudnn.so.9 /usr/local/cuda*/lib64/libcudnn.so.9 2>/dev/null | head -1)
[ -n "$dnn" ] || dnn=$(find /opt /usr/local /usr/lib -name 'libcudnn.so.9' 2>/dev/null | head -1)
if [ -n "$dnn" ]; then
  export LD_LIBRARY_PATH=$(dirname "$dnn")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  log "cuDNN: $dnn"
else
  log "no libcudnn.so.9 on this host: the convolutions stay im2col"
fi
data=$PWD/fmnist
torch=0
[ -e torch_fmnist_gpu.py ] && python3 -c 'import torch' 2>/dev/null && torch=1

if [[ $PARTS == *" tests "* ]]; then
  log "engine tests"
  timeout 200 ./engine-cuda.test -test.v -test.run CUDA > "$OUT/tests.txt" 2>&1
  echo "rc=$?" | tee -a "$OUT/summary.txt"
  grep -E '^\s*(--- |ok|FAIL|PASS)|losses|cuDNN|convolutions|panic' "$OUT/tests.txt" | cut -c1-300 | tee -a "$OUT/summary.txt"
fi
if [[ $PARTS == *" sanitize "* ]]; then
  san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -n "$san" ]; then
    for tool in memcheck racecheck initcheck; do
      log "compute-sanitizer --tool $tool"
      timeout 90 "$san" --tool $tool --error-exitcode 9 ./engine-cuda.test -test.run 'CUDAKernels|CUDAConvolves' > "$OUT/sanitizer-$tool.txt" 2>&1
      echo "rc=$?" | tee -a "$OUT/summary.txt"; tail -2 "$OUT/sanitizer-$tool.txt" | tee -a "$OUT/summary.txt"
      # The tool's count of errors says nothing of the tests run under it.
      grep -E '^\s*--- FAIL|^FAIL$' "$OUT/sanitizer-$tool.txt" | sed "s/^/under $tool: /" | tee -a "$OUT/summary.txt"
    done
  else
    log "no compute-sanitizer on this host"
  fi
fi

if [[ $PARTS == *" layers "* ]]; then
  for dnn in on off; do
    log "the cnn's calls at batch 256, cuDNN $dnn (ns/op)"
    RINGTRAIN_CUDNN=${dnn/on/} timeout 120 ./engine-cuda.test -test.run '^$' -test.bench CNNLayers -test.benchtime 200x 2>&1 |
      grep 'ns/op' | awk '{print $1, $3}' | tee -a "$OUT/summary.txt"
  done
fi

rt() { # label, then bench device's flags
  local l=$1; shift
  log "ringtrain $l"
  local o
  o=$(timeout 120 ./ringtrain-cuda bench device --device cuda --model cnn --runs 3 "$@" 2>&1)
  if ! grep -q '"median":true' <<<"$o"; then # say why, then try call by call
    echo "$o" | tail -3 | cut -c1-600 | tee -a "$OUT/summary.txt"
    log "ringtrain $l --no-graph"
    o=$(timeout 120 ./ringtrain-cuda bench device --device cuda --model cnn --runs 3 --no-graph "$@" 2>&1)
  fi
  echo "$o" | tail -1 | cut -c1-400 | tee -a "$OUT/summary.txt"
}
pt() { # label, env, then torch_fmnist_gpu.py's flags
  local l=$1 e=$2; shift 2
  [ $torch = 1 ] || return 0
  log "torch $l"
  for r in 1 2 3; do
    env $e timeout 120 python3 torch_fmnist_gpu.py --data "$data" --model cnn "$@" 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
  done
}
for b in 256 64; do
  [[ $PARTS == *" speed$b "* ]] || continue
  RINGTRAIN_CUDNN=off rt "B=$b im2col+cuBLAS fp32" --batch $b
  rt "B=$b cuDNN fp32" --batch $b
  rt "B=$b cuDNN --tf32" --batch $b --tf32
  pt "B=$b eager fp32" NVIDIA_TF32_OVERRIDE=0 --batch $b --mode eager
  pt "B=$b graph fp32" NVIDIA_TF32_OVERRIDE=0 --batch $b --mode graph
  pt "B=$b eager tf32" TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 --batch $b --mode eager
  pt "B=$b graph tf32" TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 --batch $b --mode graph
  pt "B=$b eager default (tf32 convolutions, fp32 linear)" "" --batch $b --mode eager
done
log done
