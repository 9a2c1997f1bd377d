#!/usr/bin/env bash
# Training over slow links: four network namespaces on
# a bridge, every link capped with tbf (this kernel has no netem, so no
# added latency), a `ringtrain join` in each (or in the first SLOW_PEERS); the mlp trains on the full
# Fashion-MNIST with each variant in turn, RUNS times, alternating. A
# variant is a compression (none, bf16, fp16, int8), optionally with
# "+b<MB>", the gradient bucket size (bucket_mb; the default 25 else), and
# "+h<H>", DiLoCo with H inner steps a round (outer Nesterov, lr 0.7,
# momentum 0.9, or the JSON object SLOW_OUTER), and with it "+k<P>", its
# pseudo-gradients sparse: the top P percent of entries, in 2 bits (or
# "+q<B>" bits), and "+f<F>" "+o<S>", the outer sync streamed in F
# fragments, each exchange beside S inner steps, or "+d<MS>", rounds that
# close by a deadline of MS milliseconds without a peer slow to compute
# (sync.deadline, with min_world_size 3 of 4).
# Prints a JSON line per run: variant, sent_bytes and samples/s of rank 0,
# the most bytes peer 0 sent in any 1 s of training (peak_1s_bytes),
# the epoch time they imply, the wall time, the final test accuracy (the
# same on every rank), how many parameter hashes the 4 ended with, rank
# 0's steps and seconds of compute, wait, ring and optimizer, and its test
# accuracy and training seconds after each epoch.
#
# SLOW_MODEL=gpt trains the byte-level GPT of ../shared/bench/torch_gpt.py
# on Debian's fortunes instead (AdamW 1e-3, constant, as that script), the
# figures its validation loss: test_loss, and with SLOW_EVAL_EVERY (steps)
# val_curve, peer 0's [step, validation loss, bytes sent] at each score.
# The environment picks the rest: SLOW_MODEL (mlp) and SLOW_DEVICE (cpu;
# host is the own engine), SLOW_TRAIN (all; else the first that many
# training samples, and a tenth as many test samples, written to a
# temporary copy of the dataset), SLOW_BATCH (64), SLOW_PEERS (4; 2 to 4)
# SLOW_THREADS (1, each peer's --threads), SLOW_ARGS (more join flags) and
# SLOW_LOGS (a folder to keep peer 0's JSON log of each run in, as
# <variant>-<run>.jsonl, for ringtrain plot --by file) and SLOW_LAST_RATE
# (the last peer's link at this rate instead, each way: a slow peer; the
# figures are peer 0's, one of the others) and SLOW_LAST_CPU (the last
# peer's processes held to this percent of one CPU, by a cgroup's CPU
# quota: a peer slow to compute).
# Addresses are 10.232.0.1–4, inside the namespaces only; everything made
# here is removed on exit.
#
# usage: testdata/netns-slow.sh BIN [VARIANTS=none,bf16] [RUNS=1] [RATE=100mbit] [EPOCHS=5]
set -euo pipefail

bin=$(realpath "$1")
compressions=${2:-none,bf16}
runs=${3:-1}
rate=${4:-100mbit}
epochs=${5:-5}
data=/usr/share/datasets/fashion-mnist
model=${SLOW_MODEL:-mlp}
device=${SLOW_DEVICE:-cpu}
batch=${SLOW_BATCH:-64}
peers=${SLOW_PEERS:-4} # 2 to 4
threads=${SLOW_THREADS:-1}
read -r -a extra <<<"${SLOW_ARGS:-}" # more join flags, as --data-plane tcp
if [ "$(id -u)" != 0 ]; then echo "netns-slow: SKIPPED, creating network namespaces needs root"; exit 0; fi
modeljson="\"$model\""
optimizer='{"name": "adam", "lr": 0.001, "schedule": "cosine"}'
datajson=''
if [ "$model" = gpt ]; then
	if [ ! -d /usr/share/games/fortunes ]; then echo "netns-slow: SKIPPED, no /usr/share/games/fortunes (make fortunes)"; exit 0; fi
	modeljson='{"gpt": {"layers": 4, "dim": 128, "heads": 4, "context": 128}}'
	optimizer='{"name": "adamw", "lr": 0.001, "weight_decay": 0.1}'
	datajson='{"text": {"folder": "/usr/share/games/fortunes"}}'
elif [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then echo "netns-slow: SKIPPED, no $data (make fashion-mnist)"; exit 0; fi

. "$(dirname "$0")/netns-lib.sh"
p=rts$$
tmp=$(mktemp -d)
pids=()
cg=""
trap 'netns_cleanup "$p"; if [ -n "$cg" ]; then rmdir "$cg" 2>/dev/null || true; fi' EXIT
netns_bridge "$p" 10.232.0 "$rate" 64kb
if [ -n "${SLOW_LAST_RATE:-}" ]; then
	last=$((peers - 1))
	tc qdisc change dev "${p}v$last" root tbf rate "$SLOW_LAST_RATE" burst 64kb latency 50ms
	ip netns exec "$p$last" tc qdisc change dev eth0 root handle 1: tbf rate "$SLOW_LAST_RATE" burst 64kb latency 50ms
fi
if [ -n "${SLOW_LAST_CPU:-}" ]; then
	cg=/sys/fs/cgroup/cpu/$p
	if ! mkdir "$cg" 2>/dev/null; then echo "netns-slow: SKIPPED, no cgroup v1 cpu controller at /sys/fs/cgroup/cpu for SLOW_LAST_CPU"; cg=""; exit 0; fi
	# A 10 ms period: the peer runs slower throughout, not in bursts with
	# long stops between them (the default period is 100 ms).
	echo 10000 >"$cg/cpu.cfs_period_us"
	echo $((SLOW_LAST_CPU * 100)) >"$cg/cpu.cfs_quota_us"
fi
if [ -n "${SLOW_TRAIN:-}" ] && [ "$model" != gpt ]; then # a subset: the first SLOW_TRAIN samples
	python3 - "$data" "$tmp/data" "$SLOW_TRAIN" <<'PY'
import gzip, os, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(dst)
for split, count in (("train", n), ("t10k", max(n // 10, 1))):
    for kind, head in (("images-idx3", 16), ("labels-idx1", 8)):
        name = f"{split}-{kind}-ubyte.gz"
        b = gzip.open(os.path.join(src, name)).read()
        per = 784 if kind.startswith("images") else 1
        out = b[:4] + struct.pack(">I", count) + b[8:head] + b[head:head + count * per]
        with gzip.open(os.path.join(dst, name), "wb") as f:
            f.write(out)
PY
	data=$tmp/data
fi

wait_for() { netns_wait_for netns-slow "$@"; } # wait_for <file> <regexp> <seconds>
one() { # one <variant> <run>
	local c=${1%%+*} bucket=25 sync="" every="" sparse="" bits=2 fragments=0 overlap=0 deadline="" minw=$peers name=slow-${1//+/-}-$2-$$ part
	local rest=""
	if [[ $1 == *+* ]]; then rest=${1#*+}; fi # what follows the compression: "bf16" is no bucket size
	for part in ${rest//+/ }; do
		case $part in
		b*) bucket=${part#b} ;;
		h*) every=${part#h} ;;
		k*) sparse=$(awk -v p="${part#k}" 'BEGIN{print p / 100}') ;;
		q*) bits=${part#q} ;;
		f*) fragments=${part#f} ;;
		o*) overlap=${part#o} ;;
		d*) deadline=${part#d} minw=$((peers > 3 ? peers - 1 : peers)) ;;
		esac
	done
	if [ -n "$every" ]; then
		sync=", \"sync\": {\"every\": $every, \"outer\": ${SLOW_OUTER:-{\"name\": \"nesterov\", \"lr\": 0.7, \"momentum\": 0.9\}}"
		if [ -n "$sparse" ]; then sync="$sync, \"sparse\": {\"fraction\": $sparse, \"bits\": $bits}"; fi
		sync="$sync, \"fragments\": $fragments, \"overlap\": $overlap"
		if [ -n "$deadline" ]; then sync="$sync, \"deadline\": \"${deadline}ms\""; fi
		sync="$sync}"
	fi
	local dj=${datajson:-"{\"transforms\": [{\"name\": \"ToTensor\", \"args\": []}, {\"name\": \"Normalize\", \"args\": [[0.5], [0.5]]}], \"dataset_path\": {\"train\": \"$data\", \"test\": \"$data\"}}"}
	cat >"$tmp/job.json" <<JSON
{"name": "$name", "world_size": $peers, "min_world_size": $minw, "epochs": $epochs, "batch_size": $batch, "seed": 1, "model": $modeljson, "compression": "$c", "bucket_mb": $bucket$sync,
 "eval_every": ${SLOW_EVAL_EVERY:-0}, "optimizer": $optimizer, "data": $dj}
JSON
	local began=$EPOCHREALTIME
	ip netns exec "${p}0" "$bin" join --config "$tmp/job.json" --listen /ip4/10.232.0.1/tcp/4001 --threads "$threads" --device "$device" "${extra[@]}" --log-format json >"$tmp/0.log" 2>&1 &
	pids[0]=$!
	wait_for "$tmp/0.log" '^listening on /ip4/10.232.0.1/' 30
	local boot
	boot=$(grep -m1 '^listening on /ip4/10.232.0.1/' "$tmp/0.log" | cut -d' ' -f3)
	for ((i = 1; i < peers; i++)); do
		ip netns exec "$p$i" "$bin" join --config "$tmp/job.json" --listen "/ip4/10.232.0.$((i + 1))/tcp/4001" --bootstrap "$boot" \
			--threads "$threads" --device "$device" "${extra[@]}" --log-format json >"$tmp/$i.log" 2>&1 &
		pids[$i]=$!
		if [ -n "$cg" ] && [ "$i" = $((peers - 1)) ]; then echo "${pids[$i]}" >"$cg/cgroup.procs"; fi
	done
	# What peer 0 sends, sampled every 100 ms at the bridge's end of its
	# link from its first progress line on — after rank 0's broadcast of
	# the parameters at the start, the same for every variant, which the
	# line that says training begins comes before: the most in any 1 s.
	wait_for "$tmp/0.log" '"step":[0-9]*,.*"message":"training"' 120
	(while :; do echo "$EPOCHREALTIME $(cat "/sys/class/net/${p}v0/statistics/rx_bytes")"; sleep 0.1; done) >"$tmp/tx.txt" 2>/dev/null &
	local sampler=$!
	for ((i = 0; i < peers; i++)); do
		if ! wait "${pids[$i]}"; then
			echo "netns-slow: FAIL, peer $i exited non-zero; the peers' last lines:"
			for ((j = 0; j < peers; j++)); do echo "--- peer $j"; tail -8 "$tmp/$j.log"; done
			exit 1
		fi
	done
	if [ -n "${SLOW_LOGS:-}" ]; then mkdir -p "$SLOW_LOGS" && grep "^{" "$tmp/0.log" >"$SLOW_LOGS/$1-$2.jsonl"; fi # the JSON lines: plot reads no others
	kill "$sampler" 2>/dev/null || true
	wait "$sampler" 2>/dev/null || true
	local peak
	peak=$(awk '{t[NR] = $1; b[NR] = $2} END {m = 0; j = 1; for (i = 1; i <= NR; i++) {while (t[i] - t[j] > 1.0) j++; if (b[i] - b[j] > m) m = b[i] - b[j]}; print m}' "$tmp/tx.txt")
	local wall hashes sum
	wall=$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $began}")
	hashes=$(grep -ho '"param_hash":"[0-9a-f]*"' "$tmp"/[0-9].log | sort -u | wc -l)
	sum=$(grep '"message":"summary"' "$tmp/0.log")
	local sent sps acc train=${SLOW_TRAIN:-60000}
	if [ "$model" = gpt ]; then # windows an epoch: its steps of every peer's batch
		train=$(($(grep -m1 -o '"steps":[0-9]*' "$tmp/0.log" | cut -d: -f2) * batch * peers))
	fi
	sent=$(grep -o '"sent_bytes":[0-9]*' <<<"$sum" | cut -d: -f2)
	sps=$(grep -o '"samples_per_sec":[0-9.]*' <<<"$sum" | cut -d: -f2)
	acc=$(grep -o '"test_accuracy":[0-9.]*' <<<"$sum" | head -1 | cut -d: -f2)
	field() { grep -o "\"$1\":[0-9.e+-]*" <<<"$sum" | head -1 | cut -d: -f2; }
	local curve
	curve=$(grep -E '"message":"(validation|epoch done)"' "$tmp/0.log" | awk '{
		match($0, /"step":[0-9]+/); st = substr($0, RSTART + 7, RLENGTH - 7)
		match($0, /"epoch":[0-9]+/); ep = substr($0, RSTART + 8, RLENGTH - 8)
		if (!match($0, /"test_loss":[0-9.e+-]+/)) next; l = substr($0, RSTART + 12, RLENGTH - 12)
		if (!match($0, /"sent_bytes":[0-9]+/)) next; b = substr($0, RSTART + 13, RLENGTH - 13)
		printf "%s[%d,%d,%s,%s]", (n++ ? "," : ""), ep, st, l, b}')
	local eacc es
	eacc=$(grep '"message":"epoch done"' "$tmp/0.log" | grep -o '"test_accuracy":[0-9.]*' | cut -d: -f2 | paste -sd,)
	es=$(grep '"message":"epoch done"' "$tmp/0.log" | grep -o '"elapsed_s":[0-9.]*' | cut -d: -f2 | paste -sd,)
	awk -v c="$1" -v r="$2" -v s="$sent" -v sps="$sps" -v w="$wall" -v a="$acc" -v h="$hashes" -v e="$epochs" -v rate="$rate" -v n="$train" -v p="$peers" \
		-v pk="$peak" -v st="$(field steps)" -v cs="$(field compute_s)" -v ws="$(field wait_s)" -v rs="$(field ring_s)" -v os="$(field optimizer_s)" -v ea="$eacc" -v es="$es" \
		-v last="${SLOW_LAST_RATE:-}" -v lastcpu="${SLOW_LAST_CPU:-}" -v tl="$(field test_loss)" -v curve="$curve" -v outer="$(tr -d '"{}' <<<"${SLOW_OUTER:-nesterov lr 0.7 momentum 0.9}")" \
		'BEGIN{printf "{\"variant\":\"%s\",\"run\":%d,\"rate\":\"%s\",\"last_rate\":\"%s\",\"last_cpu\":\"%s\",\"outer\":\"%s\",\"sent_bytes\":%.0f,\"sent_bytes_per_epoch\":%.0f,\"peak_1s_bytes\":%.0f,\"samples_per_sec\":%.1f,\"epoch_s\":%.2f,\"wall_s\":%s,\"test_accuracy\":%s,\"param_hashes\":%d,\"steps\":%d,\"compute_s\":%.3f,\"wait_s\":%.3f,\"ring_s\":%.3f,\"optimizer_s\":%.3f,\"epoch_accuracy\":[%s],\"epoch_train_s\":[%s],\"test_loss\":%s,\"val_curve\":[%s]}\n", c, r, rate, last, lastcpu, outer, s, s/e, pk, sps, n/p/sps, w, a, h, st, cs, ws, rs, os, ea, es, tl, curve}'
}
for r in $(seq "$runs"); do
	for c in ${compressions//,/ }; do one "$c" "$r"; done
done
