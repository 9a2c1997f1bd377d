#!/usr/bin/env bash
# The data planes between machines: four network namespaces on a bridge,
# every link capped at RATE each way with tbf (this kernel has no netem),
# a `ringtrain bench allreduce-peer` process in each of the first N, each
# its own libp2p host forming the ring as join does. For N = 2 and 4, each
# round measures the clear TCP plane (libp2p-tcp) and the TLS plane (tls)
# one after the other, ROUNDS times, alternating; every row is a JSON
# line (ringbench.Result; busbw is what the ring moved, cpu_s_per_GB the
# CPU of all ranks per GB that crossed the links).
# Addresses are 10.235.0.1–4, inside the namespaces only; everything made
# here is removed on exit.
#
# usage: testdata/bench-planes.sh BIN [RATE=1gbit] [ROUNDS=3] [SIZES=1MiB,16MiB,64MiB] [ITERS=5]
set -euo pipefail

bin=$(realpath "$1")
rate=${2:-1gbit}
rounds=${3:-3}
sizes=${4:-1MiB,16MiB,64MiB}
iters=${5:-5}
if [ "$(id -u)" != 0 ]; then echo "bench-planes: SKIPPED, creating network namespaces needs root"; exit 0; fi

. "$(dirname "$0")/netns-lib.sh"
p=rtq$$
tmp=$(mktemp -d)
pids=()
trap 'netns_cleanup "$p"' EXIT
# A burst of a millisecond at the rate, at least 64 kB: tbf needs one
# packet's worth, and more smooths the kernel's timer.
burst=$(python3 -c "import re,sys; r=sys.argv[1]; m=re.fullmatch(r'(\d+)(k|m|g)?bit',r); v=int(m[1])*{None:1,'k':1e3,'m':1e6,'g':1e9}[m[2]]; print(max(65536,int(v/8/1000)))" "$rate")
netns_bridge "$p" 10.235.0 "$rate" "$burst"
for round in $(seq "$rounds"); do
	for n in 2 4; do
		"$bin" bench allreduce --procs --netns "$p" --subnet 10.235.0 --transport libp2p-tcp,tls \
			--peers "$n" --sizes "$sizes" --iters "$iters" --json | sed "s/^{/{\"round\":$round,\"rate\":\"$rate\",/"
	done
done
