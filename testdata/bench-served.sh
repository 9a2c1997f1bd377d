#!/usr/bin/env bash
# Issue 17's epoch figure: two peers (--threads 1 each) train the mlp on
# the full Fashion-MNIST, from local files and from data served by a third
# process on this machine (ringtrain serve), alternating, RUNS times each.
# The served peers start with nothing: the first with a config that names
# the served dataset, the second with only --job name@hash. Prints each
# run's epoch times (rank 0's "epoch done" elapsed_s) and the medians.
#
#   bash testdata/bench-served.sh bin/ringtrain [RUNS] [EPOCHS]
set -euo pipefail
bin=$(realpath "$1"); runs=${2:-3}; epochs=${3:-2}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

"$bin" serve --data "$here/fashion-mnist-full.json" --listen /ip4/127.0.0.1/tcp/0 --log-format json >"$work/serve.out" 2>"$work/serve.err" &
pids+=($!)
for _ in $(seq 300); do grep -q "serving dataset" "$work/serve.out" 2>/dev/null && break; sleep 0.1; done
id=$(awk '/serving dataset/ {print $3}' "$work/serve.out")
addr=$(awk '/listening on/ {print $3; exit}' "$work/serve.out")
[ -n "$id" ] || { echo "bench-served: the server did not start"; cat "$work/serve.err"; exit 1; }

common='"world_size": 2, "epochs": '$epochs', "batch_size": 32, "seed": 1, "model": "mlp", "optimizer": {"name": "adam", "lr": 0.001, "schedule": "cosine"}'
echo '{"name": "bench-local", '"$common"', "data": "'"$here"'/fashion-mnist-full.json"}' >"$work/local.json"
echo '{"name": "bench-served", '"$common"', "data": {"served": "'"$id"'"}}' >"$work/served.json"

# run KIND: two peers; prints rank 0's epoch times, space-separated.
run() {
  local kind=$1 out=$work/$1
  "$bin" join --config "$work/$kind.json" --listen /ip4/127.0.0.1/tcp/0 --threads 1 --log-format json \
    $([ "$kind" = served ] && echo --bootstrap "$addr") >"$out.0" 2>"$out.0.err" &
  local p0=$!
  for _ in $(seq 300); do grep -q "join --job" "$out.0" 2>/dev/null && break; sleep 0.1; done
  local first ref
  first=$(awk '/listening on/ {print $3; exit}' "$out.0")
  ref=$(grep -o 'join --job [^ ]*' "$out.0" | awk '{print $3}')
  if [ "$kind" = served ]; then
    "$bin" join --job "$ref" --bootstrap "$addr" --listen /ip4/127.0.0.1/tcp/0 --threads 1 --log-format json >"$out.1" 2>"$out.1.err"
  else
    "$bin" join --config "$work/local.json" --bootstrap "$first" --listen /ip4/127.0.0.1/tcp/0 --threads 1 --log-format json >"$out.1" 2>"$out.1.err"
  fi
  wait $p0
  local f=$out.0.err
  grep -q '"rank":0\|rank 0 of' "$out.0" || f=$out.1.err
  grep '"epoch done"' "$f" | grep -o '"elapsed_s":[0-9.]*' | cut -d: -f2 | tr '\n' ' '
  grep -h '"summary"' "$out.0.err" "$out.1.err" | grep -o '"param_hash":"[0-9a-f]\{16\}' | cut -d'"' -f4 | tr '\n' ' ' >"$out.hash"
}

declare -A times
for r in $(seq "$runs"); do
  for kind in local served; do
    t=$(run $kind)
    echo "run $r $kind: epoch times ${t}s, param hashes $(cat "$work/$kind.hash")"
    times[$kind]+="$t;"
  done
done
python3 - "${times[local]}" "${times[served]}" <<'PY'
import statistics, sys
def epochs(s):
    runs = [list(map(float, r.split())) for r in s.strip(';').split(';')]
    return [statistics.median(r[e] for r in runs) for e in range(len(runs[0]))], [sum(r) for r in runs]
(le, lt), (se, st) = epochs(sys.argv[1]), epochs(sys.argv[2])
for e, (a, b) in enumerate(zip(le, se)):
    print(f"epoch {e+1}: local files {a:.2f} s, served {b:.2f} s (median), served/local {b/a:.3f}")
print(f"all epochs: local files {statistics.median(lt):.2f} s, served {statistics.median(st):.2f} s (median), served/local {statistics.median(st)/statistics.median(lt):.3f}")
PY
