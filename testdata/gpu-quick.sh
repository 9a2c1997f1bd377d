#!/bin/bash
# One short device call's checks and figures, for a GPU lent by the minute.
# Made for the folder `make gpu-pack` builds (bin/gpu): copy it to a GPU
# host (no Go needed there) and run
#   bash gpu-quick.sh OUTDIR [PART...]
# gptspeed (steady-state GPT tokens/s at both shapes, FP32 and TF32, beside
# torch_gpt.py, and the large GPT's layers timed), cnnalgos (cuDNN's
# algorithms for the cnn at batch 256, exact against any) and anytrain
# (the cnn trained 5 epochs with either) run only when named.
# PARTs (all the others when none is named), in this order so that a call cut short
# keeps the figures: tests, the engine's CUDA tests; overlap, `bench
# overlap` (two replicas on the GPU over a loopback ring: the step with
# its buckets reduced beside backward against compute alone and the ring
# alone) for the cnn and the large GPT, and two processes training the cnn for an epoch; gpt, the large GPT shape (6 × 384,
# context 256, batch 64) one epoch on fortunes beside torch_gpt.py for as
# many steps, FP32 on both sides, and each of its device calls timed;
# cnn, the cnn at batch 256 (cuDNN) beside torch_fmnist_gpu.py eager and
# captured, FP32 everywhere, and TF32 captured; sanitize, compute-
# sanitizer's memcheck and initcheck on the kernel, hand-over and staging
# tests, racecheck on the kernel test, with the convolutions on the
# engine's own kernels (RINGTRAIN_CUDNN=off: initcheck disturbs cuDNN's,
# see RESULTS). Every log
# goes to OUTDIR; summary.txt has the figures. About 6 minutes on an H100.
set -u
cd "$(dirname "$0")"
OUT=${1:-out}
shift
PARTS=" ${*:-tests overlap gpt cnn sanitize} "
has() { [[ $PARTS == *" $1 "* ]]; }
mkdir -p "$OUT"
for f in ringtrain-cuda engine-cuda.test gpteval; do [ -e $f.xz ] && xz -dkf $f.xz; chmod +x $f; done
log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
dnn=$(ls /usr/lib/x86_64-linux-gnu/libcudnn.so.9 /usr/local/cuda*/lib64/libcudnn.so.9 2>/dev/null | head -1)
[ -n "$dnn" ] || dnn=$(find /opt /usr/local /usr/lib -name 'libcudnn.so.9' 2>/dev/null | head -1)
[ -n "$dnn" ] && export LD_LIBRARY_PATH=$(dirname "$dnn")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log "cuDNN: ${dnn:-none}"
torch=0
python3 -c 'import torch' 2>/dev/null && torch=1

if has tests; then
  log "engine tests"
  timeout 200 ./engine-cuda.test -test.v -test.run CUDA > "$OUT/tests.txt" 2>&1
  echo "rc=$?" | tee -a "$OUT/summary.txt"
  grep -E '^\s*(--- |ok|FAIL|PASS)|panic' "$OUT/tests.txt" | cut -c1-300 | tee -a "$OUT/summary.txt"
fi
if has overlap; then
  ov() { # label, then bench overlap's flags
    local l=$1; shift
    log "bench overlap $l"
    timeout 120 ./ringtrain-cuda bench overlap --device cuda "$@" > "$OUT/overlap-${l// /_}.txt" 2>&1
    echo "rc=$?" | tee -a "$OUT/summary.txt"
    tail -1 "$OUT/overlap-${l// /_}.txt" | cut -c1-600 | tee -a "$OUT/summary.txt"
  }
  ov "cnn B=64 bucket 25" --model cnn --batch 64 --steps 100 --runs 3
  ov "cnn B=256 bucket 4" --model cnn --batch 256 --steps 50 --runs 3 --bucket-mb 4
  ov "gpt-large B=16 bucket 4" --model gpt-large --batch 16 --optimizer adamw --steps 20 --warmup 3 --runs 3 --bucket-mb 4
  ov "gpt-large B=32 bucket 4" --model gpt-large --batch 32 --optimizer adamw --steps 20 --warmup 3 --runs 3 --bucket-mb 4
  # As users run it: two processes on the GPU, the buckets beside backward
  # (the job's default bucket_mb), one epoch of the full training set.
  sed "s#/usr/share/datasets/fashion-mnist#$PWD/fmnist#g; s/\"epochs\": 5/\"epochs\": 1/" bench-cnn-2.json > cnn-2.json
  log "ringtrain-cuda local -n 2, cnn B=32 each, 1 epoch, tcp plane"
  timeout 120 ./ringtrain-cuda local -n 2 --config cnn-2.json --device cuda --data-plane tcp > "$OUT/two.txt" 2>&1
  echo "rc=$?" | tee -a "$OUT/summary.txt"
  grep '"summary"' "$OUT/two.txt" | grep -o '"test_accuracy":[0-9.]*\|"param_hash":"[0-9a-f]*\|"samples_per_sec":[0-9.]*' | sort | uniq -c | tee -a "$OUT/summary.txt"
  sed "s#/usr/share/games/fortunes#$PWD/fortunes#; s/\"epochs\": 2/\"epochs\": 1/; s/\"world_size\": 1/\"world_size\": 2/" gpt-quality-job.json > gpt-two.json
  log "ringtrain-cuda local -n 2, torch_gpt.py's GPT, batch 32 each, 1 epoch, tcp plane"
  timeout 120 ./ringtrain-cuda local -n 2 --config gpt-two.json --device cuda --data-plane tcp > "$OUT/gpt-two.txt" 2>&1
  echo "rc=$?" | tee -a "$OUT/summary.txt"
  grep '"summary"' "$OUT/gpt-two.txt" | grep -o '"param_hash":"[0-9a-f]*\|"samples_per_sec":[0-9.]*\|"test_loss":[0-9.]*' | sort | uniq -c | tee -a "$OUT/summary.txt"
fi
if has gpt; then
  sed "s#/usr/share/games/fortunes#$PWD/fortunes#; s/\"epochs\": 2/\"epochs\": 1/; s/\"batch_size\": 32/\"batch_size\": 64/;
    s#\"name\": \"gpt-quality\"#\"name\": \"gpt-large\", \"checkpoint_dir\": \"$OUT/ck\"#;
    s/\"layers\": 4, \"dim\": 128, \"heads\": 4, \"context\": 128/\"layers\": 6, \"dim\": 384, \"heads\": 6, \"context\": 256/" gpt-quality-job.json > gpt-large.json
  log "ringtrain GPT L6 d384 h6 T256 B64, one epoch on cuda"
  timeout 150 ./ringtrain-cuda local -n 1 --device cuda --config gpt-large.json > "$OUT/gpt-large.txt" 2>&1
  echo "rc=$?" | tee -a "$OUT/summary.txt"
  grep '"epoch done"' "$OUT/gpt-large.txt" | grep -o '"step":[0-9]*\|"samples_per_sec":[0-9.]*\|"elapsed_s":[0-9.]*' | tr '\n' ' ' | tee -a "$OUT/summary.txt"; echo | tee -a "$OUT/summary.txt"
  [ -x gpteval ] && ./gpteval "$OUT/ck/gpt-large.ckpt" fortunes 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
  if [ $torch = 1 ] && [ -e torch_gpt.py ]; then
    log "torch_gpt.py --device cuda L6 d384 h6 T256 B64, 140 steps"
    timeout 150 python3 torch_gpt.py --device cuda --data fortunes --layers 6 --dim 384 --heads 6 --ctx 256 --batch 64 --steps 140 --eval-every 140 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
  fi
  log "the large GPT's device calls (ns/op)"
  timeout 90 ./engine-cuda.test -test.run '^$' -test.bench 'GPTOps/L6' -test.benchtime 30x 2>&1 | grep 'ns/op' | awk '{print $1, $3}' | tee -a "$OUT/summary.txt"
fi
if has cnn; then
  log "ringtrain cnn B=256 cuDNN fp32"
  timeout 100 ./ringtrain-cuda bench device --device cuda --model cnn --batch 256 --runs 3 2>&1 | tail -1 | cut -c1-400 | tee -a "$OUT/summary.txt"
  log "ringtrain cnn B=256 cuDNN --tf32"
  timeout 100 ./ringtrain-cuda bench device --device cuda --model cnn --batch 256 --runs 3 --tf32 2>&1 | tail -1 | cut -c1-400 | tee -a "$OUT/summary.txt"
  if [ $torch = 1 ] && [ -e torch_fmnist_gpu.py ]; then
    for m in "eager fp32|NVIDIA_TF32_OVERRIDE=0|eager" "graph fp32|NVIDIA_TF32_OVERRIDE=0|graph" "graph tf32|TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1|graph"; do
      IFS='|' read -r l e mode <<<"$m"
      log "torch cnn B=256 $l"
      for r in 1 2 3; do
        env $e timeout 100 python3 torch_fmnist_gpu.py --data "$PWD/fmnist" --model cnn --batch 256 --mode $mode 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
      done
    done
  fi
fi
if has gptspeed; then
  # Steady state on both sides: ringtrain's `bench device` after 5 untimed
  # steps, torch_gpt.py after its first 5; FP32, then TF32 on both.
  for prec in fp32 tf32; do
    flag=; env=NVIDIA_TF32_OVERRIDE=0
    [ $prec = tf32 ] && flag=--tf32 && env=TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1
    for shape in "gpt 32 4 128 4 128" "gpt-large 64 6 384 6 256"; do
      read -r model batch L D H T <<<"$shape"
      log "ringtrain bench device $model B=$batch $prec"
      timeout 60 ./ringtrain-cuda bench device --device cuda --model $model --batch $batch --optimizer adamw --warmup 5 --steps 40 --runs 3 $flag 2>&1 | tail -1 | cut -c1-400 | tee -a "$OUT/summary.txt"
      if [ $torch = 1 ] && [ -e torch_gpt.py ]; then
        log "torch_gpt.py --device cuda L$L d$D h$H T$T B$batch $prec, 60 steps, twice"
        for r in 1 2; do
          env $env timeout 60 python3 torch_gpt.py --device cuda --data fortunes --layers $L --dim $D --heads $H --ctx $T --batch $batch --steps 60 --eval-every 0 2>&1 | tail -1 | grep -o '"tokens_per_s": [0-9]*' | tee -a "$OUT/summary.txt"
        done
      fi
    done
  done
  log "the large GPT's layers, a call each and the step (ns/op)"
  timeout 90 ./engine-cuda.test -test.run '^$' -test.bench 'GPTLayers' -test.benchtime 20x 2>&1 | grep 'ns/op' | awk '{print $1, $3}' | tee -a "$OUT/summary.txt"
fi
if has anytrain; then
  # The cnn trained 5 epochs on the full Fashion-MNIST (bench-cnn-1.json,
  # batch 64) with cuDNN free to take any algorithm, and with the exact ones.
  sed "s#/usr/share/datasets/fashion-mnist#$PWD/fmnist#g" bench-cnn-1.json > cnn-1.json
  for algos in any exact; do
    log "ringtrain-cuda local -n 1, cnn 5 epochs, --conv-algos $algos"
    timeout 90 ./ringtrain-cuda local -n 1 --config cnn-1.json --device cuda --conv-algos $algos > "$OUT/train-$algos.txt" 2>&1
    echo "rc=$?" | tee -a "$OUT/summary.txt"
    grep -o '"test_accuracy":[0-9.]*\|"param_hash":"[0-9a-f]\{16\}\|"samples_per_sec":[0-9.]*' "$OUT/train-$algos.txt" | tr '\n' ' ' | tee -a "$OUT/summary.txt"; echo | tee -a "$OUT/summary.txt"
  done
fi
if has cnnalgos; then
  # Every algorithm cuDNN timed for the cnn's convolutions at batch 256,
  # and the step with cuDNN free to take any (PyTorch's defaults) or only
  # the exact, deterministic ones, beside PyTorch eager and captured, FP32.
  for algos in any exact; do
    log "ringtrain cnn B=256 fp32 --conv-algos $algos"
    timeout 60 ./ringtrain-cuda bench device --device cuda --model cnn --batch 256 --runs 3 --conv-algos $algos > "$OUT/cnn-$algos.txt" 2>&1
    grep -v '^{' "$OUT/cnn-$algos.txt" | tee -a "$OUT/summary.txt"; tail -1 "$OUT/cnn-$algos.txt" | cut -c1-400 | tee -a "$OUT/summary.txt"
  done
  if [ $torch = 1 ] && [ -e torch_fmnist_gpu.py ]; then
    for mode in eager graph; do
      log "torch cnn B=256 fp32 $mode, twice"
      for r in 1 2; do
        NVIDIA_TF32_OVERRIDE=0 timeout 60 python3 torch_fmnist_gpu.py --data "$PWD/fmnist" --model cnn --batch 256 --mode $mode 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
      done
    done
  fi
fi
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if has sanitize && [ -n "$san" ]; then
  for tool in memcheck racecheck initcheck; do
    # racecheck looks for shared-memory hazards, which only the kernels
    # test's kernels can have; under it the hand-over tests ran past 90 s.
    tests='CUDAKernels|CUDALayers|CUDAStage'
    [ $tool = racecheck ] && tests=CUDAKernels
    log "compute-sanitizer --tool $tool on $tests (RINGTRAIN_CUDNN=off)"
    RINGTRAIN_CUDNN=off timeout 100 "$san" --tool $tool --error-exitcode 9 ./engine-cuda.test -test.run "$tests" > "$OUT/sanitizer-$tool.txt" 2>&1
    echo "rc=$?" | tee -a "$OUT/summary.txt"; tail -2 "$OUT/sanitizer-$tool.txt" | tee -a "$OUT/summary.txt"
    # The tool's count of errors says nothing of the tests run under it.
    grep -E '^\s*--- FAIL|^FAIL$' "$OUT/sanitizer-$tool.txt" | sed "s/^/under $tool: /" | tee -a "$OUT/summary.txt"
  done
elif has sanitize; then
  log "no compute-sanitizer on this host"
fi
log done
