#!/usr/bin/env bash
# Training over slow links (issue 15's figures): four network namespaces on
# a bridge, every link capped with tbf (this kernel has no netem, so no
# added latency), a `ringtrain join` in each; the mlp trains on the full
# Fashion-MNIST with each compression in turn, RUNS times, alternating.
# Prints a JSON line per run: compression, sent_bytes and samples/s of
# rank 0, the epoch time they imply, the wall time, the final test accuracy
# (the same on every rank) and how many parameter hashes the 4 ended with.
# Addresses are 10.232.0.1–4, inside the namespaces only; everything made
# here is removed on exit.
#
# usage: testdata/netns-slow.sh BIN [COMPRESSIONS=none,bf16] [RUNS=1] [RATE=100mbit] [EPOCHS=5]
set -euo pipefail

bin=$(realpath "$1")
compressions=${2:-none,bf16}
runs=${3:-1}
rate=${4:-100mbit}
epochs=${5:-5}
data=/usr/share/datasets/fashion-mnist
if [ "$(id -u)" != 0 ]; then echo "netns-slow: SKIPPED, creating network namespaces needs root"; exit 0; fi
if [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then echo "netns-slow: SKIPPED, no $data (make fashion-mnist)"; exit 0; fi

. "$(dirname "$0")/netns-lib.sh"
p=rts$$
tmp=$(mktemp -d)
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
	netns_bridge_remove "$p"
	rm -rf "$tmp"
}
trap cleanup EXIT
netns_bridge "$p" 10.232.0 "$rate" 64kb

wait_for() { netns_wait_for netns-slow "$@"; } # wait_for <file> <regexp> <seconds>
one() { # one <compression> <run>
	local c=$1 name=slow-$1-$2-$$
	cat >"$tmp/job.json" <<JSON
{"name": "$name", "world_size": 4, "epochs": $epochs, "batch_size": 64, "seed": 1, "model": "mlp", "compression": "$c",
 "optimizer": {"name": "adam", "lr": 0.001, "schedule": "cosine"},
 "data": {"transforms": [{"name": "ToTensor", "args": []}, {"name": "Normalize", "args": [[0.5], [0.5]]}],
          "dataset_path": {"train": "$data", "test": "$data"}}}
JSON
	local began=$EPOCHREALTIME
	ip netns exec "${p}0" "$bin" join --config "$tmp/job.json" --listen /ip4/10.232.0.1/tcp/4001 --threads 1 --log-format json >"$tmp/0.log" 2>&1 &
	pids[0]=$!
	wait_for "$tmp/0.log" '^listening on /ip4/10.232.0.1/' 30
	local boot
	boot=$(grep -m1 '^listening on /ip4/10.232.0.1/' "$tmp/0.log" | cut -d' ' -f3)
	for i in 1 2 3; do
		ip netns exec "$p$i" "$bin" join --config "$tmp/job.json" --listen "/ip4/10.232.0.$((i + 1))/tcp/4001" --bootstrap "$boot" \
			--threads 1 --log-format json >"$tmp/$i.log" 2>&1 &
		pids[$i]=$!
	done
	for i in 0 1 2 3; do
		if ! wait "${pids[$i]}"; then echo "netns-slow: FAIL, peer $i exited non-zero:"; tail -20 "$tmp/$i.log"; exit 1; fi
	done
	local wall hashes sum
	wall=$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $began}")
	hashes=$(grep -ho '"param_hash":"[0-9a-f]*"' "$tmp"/[0123].log | sort -u | wc -l)
	sum=$(grep '"message":"summary"' "$tmp/0.log")
	local sent sps acc
	sent=$(grep -o '"sent_bytes":[0-9]*' <<<"$sum" | cut -d: -f2)
	sps=$(grep -o '"samples_per_sec":[0-9.]*' <<<"$sum" | cut -d: -f2)
	acc=$(grep -o '"test_accuracy":[0-9.]*' <<<"$sum" | head -1 | cut -d: -f2)
	awk -v c="$c" -v r="$2" -v s="$sent" -v sps="$sps" -v w="$wall" -v a="$acc" -v h="$hashes" -v e="$epochs" -v rate="$rate" \
		'BEGIN{printf "{\"compression\":\"%s\",\"run\":%d,\"rate\":\"%s\",\"sent_bytes\":%d,\"sent_bytes_per_epoch\":%d,\"samples_per_sec\":%.1f,\"epoch_s\":%.2f,\"wall_s\":%s,\"test_accuracy\":%s,\"param_hashes\":%d}\n", c, r, rate, s, s/e, sps, 15000/sps, w, a, h}'
}
for r in $(seq "$runs"); do
	for c in ${compressions//,/ }; do one "$c" "$r"; done
done
