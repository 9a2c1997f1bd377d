#!/usr/bin/env bash
# Served data across hosts, on one machine: four network namespaces on a
# bridge (1 Gbit/s links, tbf), and the data in one of them. In ns0 a data
# node (ringtrain serve) and a peer that trains on the files there and
# serves them too (join --serve); in ns1–3 peers started with nothing but
# --job name@hash and the data node's address, from an empty folder. The
# data node is SIGKILLed after the first epoch: the workers go on with the
# other server. All four must end with the parameter hash of the same job
# trained on local files (ringtrain local, outside the namespaces).
# Addresses are 10.232.0.1–4, inside the namespaces only; everything made
# here is removed on exit, also on failure.
#
# usage: testdata/netns-served.sh [path/to/ringtrain]   (make test-netns)
set -euo pipefail

bin=$(realpath "${1:-bin/ringtrain}")
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" != 0 ]; then echo "netns-served: SKIPPED, creating network namespaces needs root"; exit 0; fi
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then echo "netns-served: SKIPPED, needs ip and tc (iproute2)"; exit 0; fi

. "$here/netns-lib.sh"
p=rts$$
tmp=$(mktemp -d)
mkdir "$tmp/empty"
pids=()
trap 'netns_cleanup "$p"; rm -rf "$tmp"' EXIT
wait_for() { netns_wait_for netns-served "$@"; }

job='"world_size": 4, "epochs": 3, "batch_size": 8, "seed": 5, "model": "mlp", "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}'
echo "{\"name\": \"netns-local\", $job, \"data\": \"$here/data-config.json\"}" >"$tmp/local.json"
"$bin" local -n 4 --config "$tmp/local.json" >"$tmp/local.log" 2>&1 || { echo "netns-served: FAIL, the local-files run failed:"; cat "$tmp/local.log"; exit 1; }
want=$(grep -o '"param_hash":"[0-9a-f]*"' "$tmp/local.log" | sort -u | grep -o '[0-9a-f]\{64\}')
[ "$(echo "$want" | wc -l)" = 1 ] || { echo "netns-served: FAIL, the local-files run ended with hashes $want"; exit 1; }

netns_bridge "$p" 10.232.0 1gbit 256kb

ip netns exec "${p}0" "$bin" serve --data "$here/data-config.json" --listen /ip4/10.232.0.1/tcp/4001 --log-format json >"$tmp/serve.log" 2>&1 &
pids+=($!); server=$!
wait_for "$tmp/serve.log" '^serving dataset ' 60
id=$(awk '/^serving dataset/ {print $3}' "$tmp/serve.log")
addr=$(awk '/^listening on/ {print $3; exit}' "$tmp/serve.log")
echo "{\"name\": \"netns-served\", $job, \"data\": {\"served\": \"$id\"}, \"request_size\": 64}" >"$tmp/served.json"

ip netns exec "${p}0" "$bin" join --config "$tmp/served.json" --serve "$here/data-config.json" --bootstrap "$addr" \
	--listen /ip4/10.232.0.1/tcp/4002 --log-format json >"$tmp/0.log" 2>&1 &
pids[0]=$!
wait_for "$tmp/0.log" 'join --job ' 60
ref=$(grep -o 'join --job [^ ]*' "$tmp/0.log" | awk '{print $3}')
for i in 1 2 3; do
	(cd "$tmp/empty" && exec ip netns exec "$p$i" "$bin" join --job "$ref" --bootstrap "$addr" \
		--listen "/ip4/10.232.0.$((i + 1))/tcp/4001" --log-format json) >"$tmp/$i.log" 2>&1 &
	pids[$i]=$!
done
for i in 0 1 2 3; do wait_for "$tmp/$i.log" '"epoch":1,.*"epoch done"|"message":"epoch done".*"epoch":1,' 120; done
kill -9 "$server"
wait "$server" 2>/dev/null || true
echo "netns-served: SIGKILLed the data node after the first epoch; the peer in ${p}0 still serves"
for i in 0 1 2 3; do
	if ! wait "${pids[$i]}"; then echo "netns-served: FAIL, peer $i exited non-zero:"; cat "$tmp/$i.log"; exit 1; fi
done
got=$(cat "$tmp"/[0123].log | grep '"message":"summary"' | grep -o '"param_hash":"[0-9a-f]*"' | grep -o '[0-9a-f]\{64\}' | sort -u)
fetched=$(grep -h '"message":"served data"' "$tmp"/[123].log | grep '(train)' | grep -o '"fetched":[0-9]*' | cut -d: -f2 | tr '\n' ' ')
if [ "$got" != "$want" ] || [ "$(cat "$tmp"/[0123].log | grep -c '"message":"summary"')" != 4 ] || ! grep -q '"fetched the job config"' "$tmp/1.log"; then
	echo "netns-served: FAIL, want 4 summaries with the local-files hash ${want:0:16}; got:"; echo "$got"
	cat "$tmp"/[0123].log
	exit 1
fi
switched=$(grep -l 'asking another' "$tmp"/[123].log | wc -l)
netns_no_refusals "netns-served"
echo "netns-served: ok, 3 peers with no config and no data fetched the job and $fetched train samples ($switched of them had a request fail over to the other server); all 4 ended with the local-files hash ${want:0:16}"
