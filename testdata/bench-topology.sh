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
# usage: testdata/bench-topology.sh BIN [ROUNDS=3] [SIZES=16MiB] [ITERS=3] [SLOW=100mbit]
set -euo pipefail

bin=$(realpath "$1")
rounds=${2:-3}
sizes=${3:-16MiB}
iters=${4:-3}
slow=${5:-100mbit}
if [ "$(id -u)" != 0 ]; then echo "bench-topology: SKIPPED, creating network namespaces needs root"; exit 0; fi

p=rto$$
tmp=$(mktemp -d)
cleanup() {
	local i
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
	ns=$p$i
	site=a
	if ((i % 2)); then site=b; fi
	ip netns add "$ns"
	ip link add "${p}v$i" type veth peer name eth0 netns "$ns"
	ip link set "${p}v$i" master "${p}b$site" up
	ip -n "$ns" link set lo up
	ip -n "$ns" addr add "10.237.0.$((i + 1))/24" dev eth0
	ip -n "$ns" link set eth0 up
	tc qdisc add dev "${p}v$i" root tbf rate 1gbit burst 125000 latency 50ms
	ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate 1gbit burst 125000 latency 50ms
done
ip link add "${p}xa" type veth peer name "${p}xb"
ip link set "${p}xa" master "${p}ba" up
ip link set "${p}xb" master "${p}bb" up
for x in xa xb; do tc qdisc add dev "$p$x" root tbf rate "$slow" burst 65536 latency 50ms; done

for round in $(seq "$rounds"); do
	for order in id measured; do
		"$bin" bench allreduce --procs --netns "$p" --subnet 10.237.0 --transport tls --peers 6 \
			--sizes "$sizes" --iters "$iters" --ring-order "$order" --json | sed "s/^{/{\"round\":$round,\"slow\":\"$slow\",/"
	done
done | tee "$tmp/rows.jsonl"
python3 - "$tmp/rows.jsonl" <<'PY'
import json, os, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
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
