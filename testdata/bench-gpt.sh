#!/usr/bin/env bash
# ringtrain's byte-level GPT against ../shared/bench/torch_gpt.py on this
# machine's CPU, run alternately, back to back: RUNS runs of each, then
# medians and ratios.
#   bash testdata/bench-gpt.sh RINGTRAIN TORCH_GPT [RUNS]
# Both sides train torch_gpt.py's model (4 layers, width 128, 4 heads,
# context 128) with AdamW at lr 1e-3. One process, batch 32, at 1 and 2
# threads: ringtrain `bench device --model gpt` (whole steps through
# train.Replica on batches in memory, after warm-up; GOMAXPROCS =
# threads) against torch_gpt.py --threads (tokens/s after its first 5
# steps). Two processes, batch 16 each, one thread each: `ringtrain local
# -n 2 --data-plane tcp` on a part of Debian's fortunes (global tokens/s,
# loading and the ring included, from the two ranks' summaries) against
# DDP over gloo (torch_gpt.py --procs 2).
set -euo pipefail
rt=$1 torch=$2 runs=${3:-3}
py=/usr/bin/python3
here=$(cd "$(dirname "$0")" && pwd)
results=$(mktemp)
trap 'rm -f "$results"' EXIT
num() { grep -oE "\"$1\": ?[0-9.]+" | tail -1 | grep -oE '[0-9.]+$'; }
for run in $(seq "$runs"); do
  for threads in 1 2; do
    v=$(GOMAXPROCS=$threads "$rt" bench device --device cpu --model gpt --optimizer adamw --batch 32 --steps 30 --warmup 3 --runs 1 2>/dev/null | num tokens_per_s)
    echo "gpt-${threads}t ringtrain $v" | tee -a "$results"
    v=$("$py" "$torch" --threads "$threads" --steps 40 --eval-every 0 2>/dev/null | num tokens_per_s)
    echo "gpt-${threads}t torch $v" | tee -a "$results"
  done
  v=$("$rt" local -n 2 --threads 1 --data-plane tcp --config "$here/bench-gpt-2.json" 2>&1 | grep '"summary"' | grep -oE '"samples_per_sec":[0-9.]+' | grep -oE '[0-9.]+$' | awk '{s+=$1} END {printf "%.0f", s*128}')
  echo "gpt-2procs ringtrain $v" | tee -a "$results"
  v=$("$py" "$torch" --procs 2 --batch 16 --threads 1 --steps 40 --eval-every 0 2>/dev/null | num tokens_per_s)
  echo "gpt-2procs torch $v" | tee -a "$results"
done
echo "# medians of $runs runs (tokens/s) and ringtrain / PyTorch"
for cfg in gpt-1t gpt-2t gpt-2procs; do
  med() { awk -v c="$cfg" -v w="$1" '$1==c && $2==w {print $3}' "$results" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
  r=$(med ringtrain) t=$(med torch)
  awk -v c="$cfg" -v r="$r" -v t="$t" 'BEGIN {printf "%-11s ringtrain %9.0f  torch %9.0f  ratio %.2f\n", c, r, t, r/t}'
done
