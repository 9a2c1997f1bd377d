#!/bin/bash
# The pipeline's figures: `ringtrain bench pipeline` RUNS times (bubble,
# peak activation memory, speedup of 2 and 4 stages over one peer), on the
# CPU and then paced (each stage waits as if on a device of its own, so
# that more stages than cores measure the schedule, not the contention),
# then
# testdata/pipeline-job.json on the full Fashion-MNIST — 2 stages × 2
# replicas, 4 processes, EPOCHS epochs — with float32 boundaries and with
# bf16 ones, alternately, RUNS runs each: the test accuracy bf16 costs.
# Usage: bench-pipeline.sh <ringtrain binary> [RUNS] [EPOCHS]
set -euo pipefail
bin=$(realpath "$1")
runs=${2:-3}
epochs=${3:-3}
here=$(cd "$(dirname "$0")" && pwd)
for i in $(seq "$runs"); do
  echo "bench-pipeline: run $i of $runs"
  "$bin" bench pipeline
done
for i in $(seq "$runs"); do
  echo "bench-pipeline: paced, run $i of $runs"
  "$bin" bench pipeline --width 64 --pace 1ms --stages 1,2,4,8
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq "$runs"); do
  for boundary in f32 bf16; do
    python3 - "$here" "$work/$boundary.json" "$boundary" "$epochs" <<'PY'
import json, sys
here, out, boundary, epochs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
job = json.load(open(here + "/pipeline-job.json"))
job["data"] = json.load(open(here + "/demo-job.json"))["data"]
job["epochs"] = epochs
job["pipeline"]["boundary"] = boundary
json.dump(job, open(out, "w"))
PY
    start=$(date +%s.%N)
    "$bin" local -n 4 --config "$work/$boundary.json" > "$work/$boundary.log" 2>&1
    end=$(date +%s.%N)
    acc=$(grep -o '"test_accuracy":[0-9.]*' "$work/$boundary.log" | tail -1 | cut -d: -f2)
    printf 'bench-pipeline: boundary %-4s run %d: test accuracy %s after %d epochs, %.1f s\n' "$boundary" "$i" "$acc" "$epochs" "$(awk "BEGIN{print $end - $start}")"
  done
done
