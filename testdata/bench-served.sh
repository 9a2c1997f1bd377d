#!/usr/bin/env bash
# The served epoch figure: two peers (--threads 1 each) train the mlp on
# the full Fashion-MNIST, from local files and from data served by a third
# process on this machine (ringtrain serve), alternating (and which goes first), RUNS times each.
# The served peers start with nothing: the first with a config that names
# the served dataset, the second with only --job name@hash. Prints each
# run's epoch times (rank 0's "epoch done" elapsed_s) and the medians.
#
#   bash testdata/bench-served.sh bin/ringtrain [RUNS] [EPOCHS]
#
# SERVED_PEERS=1 trains one peer instead (no ring; the data node then has
# the other core to itself).
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

peers=${SERVED_PEERS:-2}
common='"world_size": '$peers', "epochs": '$epochs', "batch_size": 32, "seed": 1, "model": "mlp", "optimizer": {"name": "adam", "lr": 0.001, "schedule": "cosine"}'
echo '{"name": "bench-local", '"$common"', "data": "'"$here"'/fashion-mnist-full.json"}' >"$work/local.json"
echo '{"name": "bench-served", '"$common"', "data": {"served": "'"$id"'"}}' >"$work/served.json"

# run KIND: two peers; prints rank 0's epoch times, space-separated.
# The local-files peers bootstrap from the data node too, so that both
# kinds meet the same peers; only the served ones fetch from it.
run() {
  local kind=$1 out=$work/$1
  "$bin" join --config "$work/$kind.json" --listen /ip4/127.0.0.1/tcp/0 --threads 1 --log-format json \
    --bootstrap "$addr" >"$out.0" 2>"$out.0.err" &
  local p0=$!
  for _ in $(seq 300); do grep -q "join --job" "$out.0" 2>/dev/null && break; sleep 0.1; done
  local ref
  ref=$(grep -o 'join --job [^ ]*' "$out.0" | awk '{print $3}')
  if [ "$peers" = 1 ]; then
    :
  elif [ "$kind" = served ]; then
    "$bin" join --job "$ref" --bootstrap "$addr" --listen /ip4/127.0.0.1/tcp/0 --threads 1 --log-format json >"$out.1" 2>"$out.1.err"
  else
    "$bin" join --config "$work/local.json" --bootstrap "$addr" --listen /ip4/127.0.0.1/tcp/0 --threads 1 --log-format json >"$out.1" 2>"$out.1.err"
  fi
  wait $p0
  local f=$out.0.err
  grep -q '"rank":0\|rank 0 of' "$out.0" || f=$out.1.err
  grep '"epoch done"' "$f" | grep -o '"elapsed_s":[0-9.]*' | cut -d: -f2 | tr '\n' ' '
  cat "$out".[01].err 2>/dev/null | grep '"summary"' | grep -o '"param_hash":"[0-9a-f]\{16\}' | cut -d'"' -f4 | tr '\n' ' ' >"$out.hash"
}

declare -A times
for r in $(seq "$runs"); do
  order="local served"
  [ $((r % 2)) = 0 ] && order="served local" # so that drift over the runs falls on both
  for kind in $order; do
    t=$(run $kind)
    echo "run $r $kind: epoch times ${t}s, param hashes $(cat "$work/$kind.hash")"
    times[$kind]+="$t;"
  done
done
python3 - "${times[local]}" "${times[served]}" <<'PY'
import statistics, sys
runs = lambda s: [list(map(float, r.split())) for r in s.strip(';').split(';')]
L, S = runs(sys.argv[1]), runs(sys.argv[2])
med = statistics.median
# Runs alternate back to back, so each pair's ratio cancels the machine's
# drift; its median is the figure.
for e in range(len(L[0])):
    pairs = [s[e] / l[e] for l, s in zip(L, S)]
    print(f"epoch {e+1}: local files {med(r[e] for r in L):.2f} s, served {med(r[e] for r in S):.2f} s (medians); "
          f"served/local per run {' '.join(f'{x:.3f}' for x in pairs)}, median {med(pairs):.3f}")
pairs = [sum(s) / sum(l) for l, s in zip(L, S)]
print(f"all epochs: served/local per run {' '.join(f'{x:.3f}' for x in pairs)}, median {med(pairs):.3f}")
PY
