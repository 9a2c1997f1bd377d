#!/usr/bin/env bash
# Multi-host test of a pipeline job, on one machine: four network
# namespaces, each with one veth into a bridge, every link capped at 1
# Gbit/s with tbf. testdata/pipeline-job.json (2 stages × 2 replicas, a
# residual crossing the boundary) runs as a `ringtrain join` in each; one
# is SIGKILLed mid-training. The three others must re-form: every stage
# trains on with one replica (the other stage's second peer waits as a
# spare), back from the latest snapshot they all hold. The killed peer is
# started again with its identity on its address: it must be admitted at
# a step boundary into the stage that lost it, and all four end the job as
# 2 × 2, one hash per stage, with the whole model gathered into one file
# that predict takes.
# Addresses are 10.232.0.1–4, inside the namespaces only; everything made
# here is removed on exit, also on failure.
#
# usage: testdata/netns-pipeline.sh [path/to/ringtrain]   (make test-netns)
set -euo pipefail

bin=$(realpath "${1:-bin/ringtrain}")
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" != 0 ]; then echo "netns-pipeline: SKIPPED, creating network namespaces needs root"; exit 0; fi
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then echo "netns-pipeline: SKIPPED, needs ip and tc (iproute2)"; exit 0; fi

. "$here/netns-lib.sh"
p=rtp$$ # a prefix of our own for every name made here
tmp=$(mktemp -d)
pids=()
trap 'netns_cleanup "$p"' EXIT

netns_bridge "$p" 10.232.0 1gbit 256kb

python3 - "$here" "$tmp" <<'PY'
import json, sys
here, tmp = sys.argv[1], sys.argv[2]
job = json.load(open(here + "/pipeline-job.json"))
job["data"] = {"transforms": [{"name": "ToTensor", "args": []}],
               "dataset_path": {"train": here + "/fashion-mnist", "test": here + "/fashion-mnist"}}
job["epochs"] = 60
job["checkpoint_dir"] = tmp + "/ckpt-NS"
json.dump(job, open(tmp + "/job.json", "w"))
PY

start() { # start <i> [bootstrap]: ringtrain join in namespace i, output in $tmp/<i>.log
	local i=$1 boot=${2:-}
	sed "s|ckpt-NS|ckpt-$i|" "$tmp/job.json" >"$tmp/job-$i.json"
	local args=(join --config "$tmp/job-$i.json" --identity "$tmp/id-$i" --listen "/ip4/10.232.0.$((i + 1))/tcp/4001" --log-format json)
	[ -n "$boot" ] && args+=(--bootstrap "$boot")
	ip netns exec "$p$i" "$bin" "${args[@]}" >"$tmp/$i.log" 2>&1 &
	pids[$i]=$!
}
wait_for() { netns_wait_for netns-pipeline "$@"; } # wait_for <file> <regexp> <seconds>

start 0
wait_for "$tmp/0.log" '^listening on /ip4/10.232.0.1/' 30
boot=$(grep -m1 '^listening on /ip4/10.232.0.1/' "$tmp/0.log" | cut -d' ' -f3)
for i in 1 2 3; do start "$i" "$boot"; done
for i in 0 1 2 3; do wait_for "$tmp/$i.log" '"message":"epoch done"' 60; done
wait_for "$tmp/0.log" '"epoch":5,' 120
kill -9 "${pids[3]}"
wait "${pids[3]}" 2>/dev/null || true # reaped here, so bash does not report "Killed" as if it were a failure
killed=$(grep -o '"stage":[01],"stages":2,"replica":[01]' "$tmp/3.log" | head -1)
echo "netns-pipeline: SIGKILLed the peer in ${p}3 ($killed) in epoch 5"
for i in 0 1 2; do wait_for "$tmp/$i.log" 'pipeline re-formed' 60; done
echo "netns-pipeline: the 3 survivors re-formed"
mv "$tmp/3.log" "$tmp/3-killed.log"
start 3 "$boot"
for i in 0 1 2; do wait_for "$tmp/$i.log" 'standbys admitted to the pipeline' 60; done
echo "netns-pipeline: the killed peer, started again, was admitted"
for i in 0 1 2 3; do
	if ! wait "${pids[$i]}"; then echo "netns-pipeline: FAIL, peer $i exited non-zero:"; cat "$tmp/$i.log"; exit 1; fi
done
spares=$(grep -l 'a spare of its stage' "$tmp"/[012].log | wc -l)
back=$(grep -l 'back to the latest snapshot every peer holds' "$tmp"/[012].log | wc -l)
done=$(grep -c '"epochs":60,"test_accuracy"' "$tmp"/[0123].log | awk -F: '{s += $2} END {print s}')
# One hash per stage among the four that finish.
hashes=$(grep -h -o 'stage [01] of 2, replica [01] of 2: .*stage param hash [0-9a-f]*' "$tmp"/[0123].log | sed 's/, replica.*hash / /' | sort -u | wc -l)
model=$(ls "$tmp"/ckpt-*/pipeline-demo.ckpt 2>/dev/null | head -1)
if [ "$spares" != 1 ] || [ "$back" -lt 2 ] || [ "$done" != 4 ] || [ "$hashes" != 2 ] || [ -z "$model" ]; then
	echo "netns-pipeline: FAIL, want one spare, the survivors back at a snapshot, four peers of 2 × 2 that finish 60 epochs with one hash per stage, and a gathered model; got $spares, $back, $done, $hashes, '$model'"
	cat "$tmp"/[0123].log
	exit 1
fi
img=$(ls "$here"/fashion-folder/test/*/* | head -1)
"$bin" predict --checkpoint "$model" --image "$img" >/dev/null
acc=$(grep -h -o '"epochs":60,"test_accuracy":[0-9.]*' "$tmp"/[0123].log | head -1 | cut -d: -f3)
netns_no_refusals "netns-pipeline"
echo "netns-pipeline: ok, one stage lost a replica, the others trained on as 2 stages × 1, the replica started again was admitted, and all four ended as 2 × 2 (test accuracy $acc); the gathered model predicts"
