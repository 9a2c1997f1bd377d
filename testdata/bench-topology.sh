#!/usr/bin/env bash
# The ring order against the network: six network namespaces on two
# bridges (two sites), 1 Gbit/s each way on every peer's link and one
# link of SLOW (100mbit) each way between the bridges — tbf, as this
# kernel has no netem. Peer i runs in namespace i and is i-th by peer ID
# (bench allreduce --netns gives each its key), and the sites take the
# even and the odd namespaces: peer IDs interleave the sites, so the ring
# by ID crosses the slow link six times, three times each way. Each
# round measures a `bench allreduce --procs` of 6 TLS-plane peers ranked
# by ID, then one ranked by the links they measure (ring_order
# measured), ROUNDS times, alternating; every row is a JSON line
# (ringbench.Result; busbw is what the ring moved). The last line is the
# summary: the medians and their ratio; with MIN_RATIO set, a ratio
# below it fails the run.
# Addresses are 10.237.0.1–6, inside the namespaces only; everything made
# here is removed on exit.
#
# With JOB_EPOCHS set, each round then trains the mlp on the full
# Fashion-MNIST for that many epochs with six `ringtrain join`s on the same
# sites (batch 64 a peer, one thread each), ring_order id, then measured;
# a JSON line each (samples/s, test accuracy, the parameter hashes the six
# ended with), and a summary of the medians.
#
# usage: testdata/bench-topology.sh BIN [ROUNDS=3] [SIZES=16MiB] [ITERS=3] [SLOW=100mbit]
set -euo pipefail

bin=$(realpath "$1")
rounds=${2:-3}
sizes=${3:-16MiB}
iters=${4:-3}
slow=${5:-100mbit}
if [ "$(id -u)" != 0 ]; then echo "bench-topology: SKIPPED, creating network namespaces needs root"; exit 0; fi

. "$(dirname "$0")/netns-lib.sh"
p=rto$$
tmp=$(mktemp -d)
pids=()
cleanup() {
	local i
	for i in "${pids[@]}"; do kill -9 "$i" 2>/dev/null || true; done
	for ((i = 0; i < 6; i++)); do ip netns del "$p$i" 2>/dev/null || true; done
	ip link del "${p}ba" 2>/dev/null || true
	ip link del "${p}bb" 2>/dev/null || true
	ip link del "${p}xa" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

# Two sites: bridges a and b, joined by the veth pair xa–xb, each end's
# egress capped at the slow rate (xa carries a→b, xb carries b→a).
for s in a b; do
	ip link add "${p}b$s" type bridge
	ip link set "${p}b$s" up
done
for ((i = 0; i < 6; i++)); do
	site=a
	if ((i % 2)); then site=b; fi
	netns_on_bridge "$p" "$i" "${p}b$site" 10.237.0 1gbit 125000
done
ip link add "${p}xa" type veth peer name "${p}xb"
ip link set "${p}xa" master "${p}ba" up
ip link set "${p}xb" master "${p}bb" up
for x in xa xb; do tc qdisc add dev "$p$x" root tbf rate "$slow" burst 65536 latency 50ms; done

data=/usr/share/datasets/fashion-mnist
# The joins' keys, sorted by peer ID: namespace i gets the i-th, so that
# the sites interleave by ID as in the allreduce runs.
keys=()
for ((i = 0; i < 6; i++)); do echo "$("$bin" id --identity "$tmp/k$i.key") $tmp/k$i.key"; done | sort >"$tmp/keys"
while read -r _ k; do keys+=("$k"); done <"$tmp/keys"
job() { # job <order> <round>: one mlp run of six joins, a JSON line
	local name=topo-$1-$2-$$ i boot
	cat >"$tmp/job.json" <<JSON
{"name": "$name", "world_size": 6, "epochs": $JOB_EPOCHS, "batch_size": 64, "seed": 1, "model": "mlp", "ring_order": "$1",
 "optimizer": {"name": "adam", "lr": 0.001}, "data": {"transforms": [{"name": "ToTensor", "args": []}, {"name": "Normalize", "args": [[0.5], [0.5]]}],
 "dataset_path": {"train": "$data", "test": "$data"}}}
JSON
	ip netns exec "${p}0" "$bin" join --config "$tmp/job.json" --listen /ip4/10.237.0.1/tcp/4001 --identity "${keys[0]}" --threads 1 --log-format json >"$tmp/0.log" 2>&1 &
	pids=($!)
	for ((i = 0; i < 300; i++)); do grep -q '^listening on /ip4/10.237.0.1/' "$tmp/0.log" && break; sleep 0.1; done
	boot=$(grep -m1 '^listening on /ip4/10.237.0.1/' "$tmp/0.log" | cut -d' ' -f3)
	for ((i = 1; i < 6; i++)); do
		ip netns exec "$p$i" "$bin" join --config "$tmp/job.json" --listen "/ip4/10.237.0.$((i + 1))/tcp/4001" --bootstrap "$boot" \
			--identity "${keys[$i]}" --threads 1 --log-format json >"$tmp/$i.log" 2>&1 &
		pids+=($!)
	done
	for ((i = 0; i < 6; i++)); do
		if ! wait "${pids[$i]}"; then
			echo "bench-topology: FAIL, peer $i of the $1 job exited non-zero:"
			tail -5 "$tmp/$i.log"
			exit 1
		fi
	done
	local sum sps acc hashes
	if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP/$1-$2" && cp "$tmp"/[0-5].log "$KEEP/$1-$2/"; fi
	sum=$(grep '"message":"summary"' "$tmp/0.log")
	sps=$(grep -o '"samples_per_sec":[0-9.]*' <<<"$sum" | cut -d: -f2)
	acc=$(grep -o '"test_accuracy":[0-9.]*' <<<"$sum" | head -1 | cut -d: -f2)
	hashes=$(grep -ho '"param_hash":"[0-9a-f]*"' "$tmp"/[0-5].log | sort -u | wc -l)
	field() { grep -o "\"$1\":[0-9.e+-]*" <<<"$sum" | head -1 | cut -d: -f2; }
	echo "{\"round\":$2,\"job\":\"mlp\",\"ring_order\":\"$1\",\"samples_per_sec\":$sps,\"test_accuracy\":$acc,\"param_hashes\":$hashes,\"compute_s\":$(field compute_s),\"ring_s\":$(field ring_s),\"wait_s\":$(field wait_s)}"
}
if [ -n "${JOB_EPOCHS:-}" ] && [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then echo "bench-topology: no $data (make fashion-mnist): no mlp runs"; JOB_EPOCHS=""; fi

for round in $(seq "$rounds"); do
	if [ -n "${JOB_EPOCHS:-}" ]; then
		for order in id measured; do job "$order" "$round"; done
	fi
	for order in id measured; do
		"$bin" bench allreduce --procs --netns "$p" --subnet 10.237.0 --transport tls --peers 6 \
			--sizes "$sizes" --iters "$iters" --ring-order "$order" --json | sed "s/^{/{\"round\":$round,\"slow\":\"$slow\",/"
	done
done | tee "$tmp/rows.jsonl"
python3 - "$tmp/rows.jsonl" <<'PY'
import json, os, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
jobs = {}
for r in rows:
    if "job" in r:
        jobs.setdefault(r["ring_order"], []).append(r["samples_per_sec"])
if jobs:
    i, m = statistics.median(jobs["id"]), statistics.median(jobs["measured"])
    print(json.dumps({"summary": "two sites, mlp job", "runs": len(jobs["id"]), "samples_per_sec_id": i,
                      "samples_per_sec_measured": m, "ratio": round(m / i, 2)}))
by = {}
for r in rows:
    if "busbw_GBps" in r:
        by.setdefault((r["bytes"], r["transport"]), []).append(r["busbw_GBps"])
for size in sorted({b for b, _ in by}):
    ident = statistics.median(by[(size, "tls-netns")])
    meas = statistics.median(by[(size, "tls-netns-measured")])
    print(json.dumps({"summary": "two sites", "bytes": size, "runs": len(by[(size, "tls-netns")]),
                      "busbw_id_GBps": round(ident, 4), "busbw_measured_GBps": round(meas, 4),
                      "ratio": round(meas / ident, 2)}))
    if os.environ.get("MIN_RATIO") and meas / ident < float(os.environ["MIN_RATIO"]):
        print(f"bench-topology: FAIL, the measured order moved {meas / ident:.2f}× the ID order's busbw, under {os.environ['MIN_RATIO']}×")
        sys.exit(1)
PY
