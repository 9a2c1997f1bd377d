#!/usr/bin/env bash
# Long links: four network namespaces joined by cmd/netdelay, which holds
# every packet for DELAY each way (this kernel has no netem, fq or etf:
# the delay is a userspace switch of TUN devices), every namespace's link
# capped at RATE with tbf. Prints the round trip it gives (TCP connects
# timed from the first namespace to the second, the least of 5), then
# ROUNDS `bench allreduce --procs` rows of 4 TLS-plane peers (JSON lines,
# ringbench.Result) each way of timing — every call after a barrier of
# its own (rows tls-netns), and ITERS calls back to back after one barrier
# as nccl-tests times them (--loop, rows tls-netns-loop) — then a summary
# per way: the median busbw and its share of the link rate, each round's
# time its slowest rank's (of_link_rate) and, as nccl-tests' default, its
# ranks' mean (rank_avg_of_link_rate). CHUNK, if
# set, is the ring's chunk size (bench allreduce --chunk); TRANSPORT
# (tls) the data plane (libp2p-tcp: the clear TCP one).
# Addresses are 10.238.0.1–4, inside the namespaces only; everything made
# here is removed on exit.
#
# usage: testdata/bench-longlinks.sh BIN NETDELAY [ROUNDS=3] [SIZES=64MiB] [ITERS=3] [DELAY=50ms] [RATE=1gbit]
set -euo pipefail

bin=$(realpath "$1")
netdelay=$(realpath "$2")
rounds=${3:-3}
sizes=${4:-64MiB}
iters=${5:-3}
delay=${6:-50ms}
rate=${7:-1gbit}
if [ "$(id -u)" != 0 ]; then echo "bench-longlinks: SKIPPED, creating network namespaces needs root"; exit 0; fi

p=rtl$$
pids=()
cleanup() {
	local i
	for i in "${pids[@]}"; do kill "$i" 2>/dev/null || true; done
	for ((i = 0; i < 4; i++)); do ip netns del "$p$i" 2>/dev/null || true; done
}
trap cleanup EXIT
for ((i = 0; i < 4; i++)); do
	ip netns add "$p$i"
	ip -n "$p$i" link set lo up
done
"$netdelay" -ns "$p" -count 4 -subnet 10.238.0 -delay "$delay" >"/tmp/$p.netdelay" 2>&1 &
pids+=($!)
for ((i = 0; i < 50; i++)); do grep -q ready "/tmp/$p.netdelay" 2>/dev/null && break; sleep 0.1; done
rm -f "/tmp/$p.netdelay"
# A burst of 1 ms at the rate, and at least two of the TUN's 65000-byte
# packets; room in the queue for 200 ms.
burst=$(python3 -c "import re,sys; r=sys.argv[1]; m=re.fullmatch(r'(\d+)(k|m|g)?bit',r); v=int(m[1])*{None:1,'k':1e3,'m':1e6,'g':1e9}[m[2]]; print(max(131072,int(v/8/1000)))" "$rate")
for ((i = 0; i < 4; i++)); do ip netns exec "$p$i" tc qdisc add dev tun0 root tbf rate "$rate" burst "$burst" latency 200ms; done

ip netns exec "${p}1" python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.238.0.2", 9)); s.listen(16); s.settimeout(10)
for _ in range(5): s.accept()[0].close()' &
pids+=($!)
sleep 0.3
ip netns exec "${p}0" python3 -c '
import json, socket, time
rtts = []
for _ in range(5):
    s = socket.socket(); t = time.perf_counter(); s.connect(("10.238.0.2", 9)); rtts.append(time.perf_counter() - t); s.close()
print(json.dumps({"rtt_ms": round(min(rtts) * 1000, 1), "delay_each_way": "'"$delay"'", "rate": "'"$rate"'"}))'

for round in $(seq "$rounds"); do
	for loop in false true; do
		"$bin" bench allreduce --procs --netns "$p" --subnet 10.238.0 --transport "${TRANSPORT:-tls}" --peers 4 --loop="$loop" \
			--sizes "$sizes" --iters "$iters" ${CHUNK:+--chunk "$CHUNK"} --json | sed "s/^{/{\"round\":$round,\"delay\":\"$delay\",\"rate\":\"$rate\",/"
	done
done | tee "/tmp/$p.rows"
python3 - "/tmp/$p.rows" "$rate" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
m = re.fullmatch(r"(\d+)(k|m|g)?bit", sys.argv[2])
rate = int(m[1]) * {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[m[2]] / 8 / 1e9  # GB/s
for way, size in sorted({(r["transport"], r["bytes"]) for r in rows}):
    mine = [r for r in rows if r["bytes"] == size and r["transport"] == way]
    b = statistics.median(r["busbw_GBps"] for r in mine)
    a = statistics.median(r.get("busbw_rank_avg_GBps", 0) for r in mine)
    print(json.dumps({"summary": "long links", "timing": "loop" if way.endswith("-loop") else "barrier each call",
                      "bytes": size, "runs": len(mine), "busbw_GBps": round(b, 4), "of_link_rate": round(b / rate, 3),
                      "rank_avg_busbw_GBps": round(a, 4), "rank_avg_of_link_rate": round(a / rate, 3)}))
PY
rm -f "/tmp/$p.rows"
