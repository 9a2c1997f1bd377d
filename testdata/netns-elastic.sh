#!/usr/bin/env bash
# Multi-host test of the elastic ring, on one machine: four network
# namespaces, each with one veth into a bridge, every link capped at 1 Gbit/s
# with tbf (and 1 ms of netem delay where the kernel has netem; this one does
# not). A `ringtrain join` runs in each; one is SIGKILLed mid-epoch; the
# three others must re-form the ring; a new peer started in the dead one's
# namespace must be admitted at a step boundary. Then another is Ctrl-C'd:
# it must leave (exit 0, logged as left by the others, never as lost), and,
# started again with the same identity on the same address, be admitted
# again; and all four must finish with identical parameter hashes. Addresses are 10.231.0.1–4, inside the namespaces only; everything
# made here is removed on exit, also on failure.
#
# usage: testdata/netns-elastic.sh [path/to/ringtrain]   (make test-netns)
set -euo pipefail

bin=$(realpath "${1:-bin/ringtrain}")
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" != 0 ]; then echo "netns-elastic: SKIPPED, creating network namespaces needs root"; exit 0; fi
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then echo "netns-elastic: SKIPPED, needs ip and tc (iproute2)"; exit 0; fi

. "$here/netns-lib.sh"
p=rtn$$ # a prefix of our own for every name made here
tmp=$(mktemp -d)
pids=()
trap 'netns_cleanup "$p"' EXIT

# 1 Gbit/s each way on every link.
netns_bridge "$p" 10.231.0 1gbit 256kb
for i in 0 1 2 3; do
	# A little delay where netem exists (a child of tbf); skipped where not.
	ip netns exec "$p$i" tc qdisc add dev eth0 parent 1:1 handle 10: netem delay 1ms 2>/dev/null || true
done

cat >"$tmp/job.json" <<EOF
{"name": "netns-elastic", "world_size": 4, "min_world_size": 3, "epochs": 12, "batch_size": 8, "seed": 3, "model": "mlp",
 "data": {"transforms": [{"name": "ToTensor", "args": []}],
          "dataset_path": {"train": "$here/fashion-mnist", "test": "$here/fashion-mnist"}}}
EOF

start() { # start <i> [bootstrap]: ringtrain join in namespace i, output in $tmp/<i>.log
	local i=$1 boot=${2:-}
	local args=(join --config "$tmp/job.json" --identity "$tmp/id-$i" --listen "/ip4/10.231.0.$((i + 1))/tcp/4001" --log-format json)
	[ -n "$boot" ] && args+=(--bootstrap "$boot")
	ip netns exec "$p$i" "$bin" "${args[@]}" >"$tmp/$i.log" 2>&1 &
	pids[$i]=$!
}
NETNS_LOGS="$tmp/*.log" # every peer's tail on a failure: the others say why one was not admitted
wait_for() { netns_wait_for netns-elastic "$@"; } # wait_for <file> <regexp> <seconds>

start 0
wait_for "$tmp/0.log" '^listening on /ip4/10.231.0.1/' 30
boot=$(grep -m1 '^listening on /ip4/10.231.0.1/' "$tmp/0.log" | cut -d' ' -f3)
for i in 1 2 3; do start "$i" "$boot"; done
for i in 0 1 2 3; do wait_for "$tmp/$i.log" '"message":"training"' 60; done
wait_for "$tmp/0.log" '"epoch":2,"step":50,' 120 # the middle of epoch 2
kill -9 "${pids[3]}"
wait "${pids[3]}" 2>/dev/null || true # reaped here, so bash does not report "Killed" as if it were a failure
echo "netns-elastic: SIGKILLed the peer in ${p}3 in the middle of epoch 2"
for i in 0 1 2; do wait_for "$tmp/$i.log" 'ring re-formed without the lost peers' 30; done
echo "netns-elastic: the 3 survivors re-formed; starting a replacement in ${p}3"
mv "$tmp/3.log" "$tmp/3-killed.log"
start 3 "$boot"
wait_for "$tmp/3.log" 'admitted to the ring' 60
echo "netns-elastic: the replacement was admitted; Ctrl-C on the peer in ${p}2"
lost_before=$(grep -c 'ring re-formed without the lost peers' "$tmp/0.log")
kill -INT "${pids[2]}"
if ! wait "${pids[2]}"; then echo "netns-elastic: FAIL, the peer Ctrl-C'd did not exit 0:"; cat "$tmp/2.log"; exit 1; fi
grep -q 'left the job' "$tmp/2.log" || { echo "netns-elastic: FAIL, the peer Ctrl-C'd did not say it left:"; cat "$tmp/2.log"; exit 1; }
for i in 0 1 3; do wait_for "$tmp/$i.log" 'ring re-formed without the peers that left' 30; done
if [ "$(grep -c 'ring re-formed without the lost peers' "$tmp/0.log")" != "$lost_before" ]; then
	echo "netns-elastic: FAIL, the leave was taken for a loss:"; cat "$tmp/0.log"; exit 1
fi
echo "netns-elastic: the peer left and the others carry on; starting it again with the same identity and address"
mv "$tmp/2.log" "$tmp/2-left.log"
start 2 "$boot"
for i in 0 1 2 3; do
	if ! wait "${pids[$i]}"; then echo "netns-elastic: FAIL, peer $i exited non-zero:"; cat "$tmp/$i.log"; for j in 0 1 3; do echo "--- peer $j, its last lines"; tail -5 "$tmp/$j.log"; done; exit 1; fi
done
hashes=$(for i in 0 1 2 3; do grep -o '"world_size":4,"epochs":12,[^}]*"param_hash":"[0-9a-f]*"' "$tmp/$i.log" | grep -o '[0-9a-f]\{64\}'; done | sort -u)
summaries=$(cat "$tmp"/[0123].log | grep -c '"message":"summary"' || true)
if [ "$(echo "$hashes" | wc -l)" != 1 ] || [ -z "$hashes" ] || [ "$summaries" != 4 ] || ! grep -q 'admitted to the ring' "$tmp/3.log" || ! grep -q 'admitted to the ring' "$tmp/2.log"; then
	echo "netns-elastic: FAIL, want the replacement and the returning peer admitted and 4 summaries of a world of 4 with one hash; got $summaries and:"; echo "$hashes"
	cat "$tmp"/[0123].log
	exit 1
fi
netns_no_refusals "netns-elastic"
echo "netns-elastic: ok, the replacement and the returning peer were admitted and all 4 ended with parameter hash ${hashes:0:16}"
