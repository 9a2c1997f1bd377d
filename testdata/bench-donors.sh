#!/usr/bin/env bash
# A newcomer's admission against the bytes it takes: DONORS members (each
# run: 1, 2 and 4) train a 9.8M-parameter mlp (784-4096-1600-10, Adam:
# 117 MB of parameters and optimizer state) in network namespaces on one
# bridge, 1 Gbit/s each way on every link (tbf); once they train, a
# newcomer joins, and its log says how long catching up took (`took` of
# "admitted to the ring", from the ring that admits it to the state and
# position taken) and how many bytes (`state_bytes`). Each row is a JSON
# line: took, the time those bytes take on one link at 1 Gbit/s, and their
# ratio; the summary is the median ratio per donor count. Every member at
# the newcomer's step sends it an equal part (train.Replica.Level's
# takeState); with one member, that member sends all of it.
# Addresses are 10.238.0.1–5, inside the namespaces only; everything made
# here is removed on exit.
#
# usage: testdata/bench-donors.sh BIN [RUNS=3] [DONORS="1 2 4"] [MAX_RATIO]
# (PLANE=tcp: the peers' clear TCP data plane instead of TLS)
set -euo pipefail

bin=$(realpath "$1")
runs=${2:-3}
donors=${3:-1 2 4}
maxratio=${4:-}
if [ "$(id -u)" != 0 ]; then echo "bench-donors: SKIPPED, creating network namespaces needs root"; exit 0; fi
data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then echo "bench-donors: SKIPPED, no $data (make fashion-mnist)"; exit 0; fi

. "$(dirname "$0")/netns-lib.sh"
p=rdn$$
tmp=$(mktemp -d)
pids=()
trap 'netns_cleanup "$p"' EXIT

one() { # one <donors> <run>: a JSON line
	local d=$1 run=$2 i boot="" line took bytes
	netns_bridge "$p" 10.238.0 1gbit 125000 $((d + 1))
	cat >"$tmp/job.json" <<JSON
{"name": "donors-$d-$run-$$", "world_size": $d, "min_world_size": $d, "max_world_size": $((d + 1)), "epochs": 1,
 "batch_size": 64, "seed": 1, "optimizer": {"name": "adam", "lr": 0.001},
 "model": {"input": [1, 28, 28], "layers": [{"type": "flatten"}, {"type": "linear", "out": 4096}, {"type": "relu"},
   {"type": "linear", "out": 1600}, {"type": "relu"}, {"type": "linear", "out": 10}]},
 "data": {"transforms": [{"name": "ToTensor", "args": []}, {"name": "Normalize", "args": [[0.5], [0.5]]}],
 "dataset_path": {"train": "$data", "test": "$data"}}}
JSON
	pids=()
	start() { # start <i> <log>: a join in namespace i
		local args=(--bootstrap "$boot")
		if (($1 == 0)); then args=(); fi
		ip netns exec "$p$1" "$bin" join --config "$tmp/job.json" --listen "/ip4/10.238.0.$(($1 + 1))/tcp/4001" "${args[@]}" \
			--threads 1 --data-plane "${PLANE:-tls}" --log-format json >"$tmp/$2" 2>&1 &
		pids+=($!)
	}
	: >"$tmp/0.log"
	start 0 0.log
	netns_wait_for bench-donors "$tmp/0.log" '^listening on /ip4/10.238.0.1/' 30
	boot=$(grep -m1 '^listening on /ip4/10.238.0.1/' "$tmp/0.log" | cut -d' ' -f3)
	for ((i = 1; i < d; i++)); do start "$i" "$i.log"; done
	netns_wait_for bench-donors "$tmp/0.log" '"message":"training"' 120
	sleep 3
	: >"$tmp/new.log"
	start "$d" new.log
	NETNS_LOGS="$tmp/*.log" netns_wait_for bench-donors "$tmp/new.log" 'admitted to the ring; caught up' 180
	line=$(grep -m1 'admitted to the ring; caught up' "$tmp/new.log")
	took=$(grep -o '"took":[0-9.]*' <<<"$line" | cut -d: -f2)
	bytes=$(grep -o '"state_bytes":[0-9]*' <<<"$line" | cut -d: -f2)
	for i in "${pids[@]}"; do kill -9 "$i" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP/$d-$run" && cp "$tmp"/*.log "$KEEP/$d-$run/"; fi
	netns_bridge_remove "$p"
	python3 -c "
import json; took, b = $took / 1000, $bytes; link = b * 8 / 1e9
print(json.dumps({'run': $run, 'donors': $d, 'state_bytes': b, 'took_s': round(took, 3), 'link_s': round(link, 3), 'ratio': round(took / link, 3)}))"
}

for run in $(seq "$runs"); do
	for d in $donors; do one "$d" "$run"; done
done | tee "$tmp/rows.jsonl"
python3 - "$tmp/rows.jsonl" "$maxratio" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
fail = False
for d in sorted({r["donors"] for r in rows}):
    rs = [r["ratio"] for r in rows if r["donors"] == d]
    m = statistics.median(rs)
    print(json.dumps({"summary": "admission against one link's time", "donors": d, "runs": len(rs), "ratio_median": m,
                      "took_s_median": statistics.median(r["took_s"] for r in rows if r["donors"] == d)}))
    fail |= bool(sys.argv[2]) and m > float(sys.argv[2])
if fail:
    print(f"bench-donors: FAIL, an admission took more than {sys.argv[2]}× its bytes' time on one link")
    sys.exit(1)
PY
