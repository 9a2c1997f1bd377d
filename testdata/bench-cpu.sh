#!/usr/bin/env bash
# The CPU engine against PyTorch on this machine's CPU, run alternately,
# back to back: RUNS runs of each, then medians and ratios.
#   bash testdata/bench-cpu.sh RINGTRAIN TORCH_SCRIPT [RUNS]
# Both sides train the same built-in model with SGD (lr 0.01, momentum
# 0.9) at the same batch size and thread count. ringtrain: `bench device
# --device cpu` (whole steps through train.Replica on batches in memory,
# after warm-up; GOMAXPROCS = threads); PyTorch: torch_fmnist_cpu.py
# (the whole dataset as one tensor; --threads). Two peers: `ringtrain
# local -n 2 --data-plane tcp` (one thread each, global samples/s = the
# sum of both ranks', loading and the ring included) against DDP over
# gloo with 2 processes × 1 thread, B=32 each.
set -euo pipefail
rt=$1 torch=$2 runs=${3:-3}
py=/usr/bin/python3
here=$(cd "$(dirname "$0")" && pwd)
results=$(mktemp)
trap 'rm -f "$results"' EXIT
num() { grep -oE "\"$1\": ?[0-9.]+" | head -1 | grep -oE '[0-9.]+$'; }
"$rt" bench cpu # the kernels this CPU gets, and why
for run in $(seq "$runs"); do
  for threads in 1 2; do
    v=$(GOMAXPROCS=$threads "$rt" bench device --device cpu --model mlp --optimizer sgd --steps 900 --warmup 50 --runs 1 2>/dev/null | num samples_per_s)
    echo "mlp-${threads}t ringtrain $v" | tee -a "$results"
    v=$("$py" "$torch" --model mlp --threads "$threads" 2>/dev/null | num global_samples_per_s)
    echo "mlp-${threads}t torch $v" | tee -a "$results"
    v=$(GOMAXPROCS=$threads "$rt" bench device --device cpu --model cnn --optimizer sgd --steps 100 --warmup 5 --runs 1 2>/dev/null | num samples_per_s)
    echo "cnn-${threads}t ringtrain $v" | tee -a "$results"
    v=$("$py" "$torch" --model cnn --threads "$threads" --max-steps 150 2>/dev/null | num global_samples_per_s)
    echo "cnn-${threads}t torch $v" | tee -a "$results"
  done
  v=$("$rt" local -n 2 --threads 1 --data-plane tcp --config "$here/bench-cpu-mlp-2.json" 2>&1 | grep '"summary"' | grep -oE '"samples_per_sec":[0-9.]+' | grep -oE '[0-9.]+$' | awk '{s+=$1} END {printf "%.0f", s}')
  echo "mlp-2peers ringtrain $v" | tee -a "$results"
  v=$("$py" "$torch" --model mlp --procs 2 --batch 32 --threads 1 2>/dev/null | num global_samples_per_s)
  echo "mlp-2peers torch $v" | tee -a "$results"
done
echo "# medians of $runs runs (samples/s) and ringtrain / PyTorch"
for cfg in mlp-1t mlp-2t cnn-1t cnn-2t mlp-2peers; do
  med() { awk -v c="$cfg" -v w="$1" '$1==c && $2==w {print $3}' "$results" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
  r=$(med ringtrain) t=$(med torch)
  awk -v c="$cfg" -v r="$r" -v t="$t" 'BEGIN {printf "%-11s ringtrain %9.0f  torch %9.0f  ratio %.2f\n", c, r, t, r/t}'
done
