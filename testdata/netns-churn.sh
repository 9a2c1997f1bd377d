#!/usr/bin/env bash
# Churn: a job whose peers die, leave and come back every few seconds, on
# one machine: PEERS `ringtrain join`s in network namespaces on a bridge
# (1 Gbit/s links), min_world_size 3, the mlp on Fashion-MNIST. First the
# job undisturbed; then the same job while, every PERIOD seconds, a random
# peer is SIGKILLed or Ctrl-C'd (alternately) and started again 2 s later
# with the same identity on the same address, and every NEW_EVERY seconds
# a brand-new peer joins and one leaves for good. Every event and every
# step of every peer process is recorded (events.tsv, --trace, and the
# process's metrics every few seconds), and internal/churnreport prints the
# figures against the undisturbed run and, with BOUNDS=1, fails on any
# past its bound.
#
# usage: [MODE=everystep|deadline|pipeline] [PERIOD=15] [DURATION=600] [PEERS=6] [NEW_EVERY=180] [DATA=folder]
#        [SEC_PER_KIMAGE=s] [BOUNDS=1] [MIN_THROUGHPUT=0.8] [KEEP=folder] testdata/netns-churn.sh [path/to/ringtrain]
# MIN_THROUGHPUT bounds the undisturbed job's wall time ÷ the churned
# job's; it holds only where both halves have the machine to themselves.
# DURATION sets the job's epochs from SEC_PER_KIMAGE (the undisturbed
# job's seconds per 1,000 images of DATA; the defaults are a 2-core VM's,
# set it where the machine is slower or faster); the churn runs as long
# as the job does.
# make bench-churn runs it on the whole dataset, make test for two minutes
# on testdata's 2,000 images. Addresses are 10.236.0.x inside the
# namespaces only; everything made here is removed on exit.
set -euo pipefail

bin=$(realpath "${1:-bin/ringtrain}")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
if [ "$(id -u)" != 0 ]; then echo "netns-churn: SKIPPED, creating network namespaces needs root"; exit 0; fi
if ! command -v ip >/dev/null || ! command -v tc >/dev/null || ! command -v curl >/dev/null; then
	echo "netns-churn: SKIPPED, needs ip and tc (iproute2) and curl"
	exit 0
fi

MODE=${MODE:-everystep} PERIOD=${PERIOD:-15} DURATION=${DURATION:-600} PEERS=${PEERS:-6} NEW_EVERY=${NEW_EVERY:-180} BOUNDS=${BOUNDS:-1}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || DATA=$here/fashion-mnist
DATA=$(realpath "$DATA")
# The image count, from the IDX header (gzip stops early on a closed pipe).
images=$( (gzip -dc "$DATA/train-images-idx3-ubyte.gz" 2>/dev/null || true) | head -c 8 | od -An -tu1 | awk '{print $5*16777216 + $6*65536 + $7*256 + $8}')
# Seconds per epoch of the undisturbed job here, per 1,000 images (6 peers, batch 32 each, 2 cores).
case $MODE in
deadline) SEC_PER_KIMAGE=${SEC_PER_KIMAGE:-0.015} ;;
pipeline) SEC_PER_KIMAGE=${SEC_PER_KIMAGE:-0.055} ;;
*) SEC_PER_KIMAGE=${SEC_PER_KIMAGE:-0.072} ;;
esac
EPOCHS=${EPOCHS:-$(awk -v d="$DURATION" -v n="$images" -v s="$SEC_PER_KIMAGE" 'BEGIN { e = int(d / (n / 1000 * s) + 0.5); print (e < 1 ? 1 : e) }')}
spares=$(((DURATION + NEW_EVERY - 1) / NEW_EVERY + 1))
count=$((PEERS + spares))
if [ "$count" -gt 32 ]; then echo "netns-churn: $PEERS peers and $spares newcomers need $count namespaces; at most 32"; exit 1; fi

. "$here/netns-lib.sh"
p=rtc$$ # a prefix of our own for every name made here
tmp=$(mktemp -d)
pids=()
cleanup() {
	kill "${sampler:-0}" 2>/dev/null || true
	netns_cleanup "$p"
}
trap cleanup EXIT
netns_bridge "$p" 10.236.0 1gbit 256kb "$count"

config() { # config <name> <dir>: the job's config, for MODE
	local model='"mlp"' extra='' sizes=", \"min_world_size\": 3, \"max_world_size\": $((PEERS + 2))"
	case $MODE in
	everystep) ;;
	deadline) extra=', "sync": {"every": 8, "outer": {"name": "nesterov", "lr": 0.7, "momentum": 0.9}, "sparse": {"fraction": 0.05, "bits": 4}, "deadline": "50ms"}' ;;
	pipeline)
		model='{"layers": [{"type": "linear", "out": 128}, {"type": "relu"}, {"type": "linear", "out": 128}, {"type": "relu"}, {"type": "linear", "out": 10}]}'
		extra=', "pipeline": {"stages": 2, "micro_batches": 4, "schedule": "1f1b", "split": [2]}'
		sizes='' # a pipeline waits for a peer to take a stage left empty, and grows no larger
		;;
	*) echo "netns-churn: MODE $MODE; want everystep, deadline or pipeline" >&2; exit 1 ;;
	esac
	cat >"$2/job.json" <<EOF
{"name": "$1", "world_size": $PEERS$sizes, "epochs": $EPOCHS, "batch_size": 32, "seed": 3, "model": $model,
 "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}$extra,
 "data": {"transforms": [{"name": "ToTensor", "args": []}],
          "dataset_path": {"train": "$DATA", "test": "$DATA"}}}
EOF
}

now_ms() { date +%s%3N; }
record() { echo "$(now_ms) $*" >>"$dir/events.tsv"; } # record <kind> <peer> <incarnation> [status]

inc=() # each peer's incarnation
addr() { echo "/ip4/10.236.0.$(($1 + 1))/tcp/4001"; }
boots=() # every peer's multiaddr
for ((i = 0; i < count; i++)); do
	id=$("$bin" id --identity "$tmp/id-$i")
	boots+=("$(addr "$i")/p2p/$id")
done
# Each peer's bootstrap peers, fixed at its first start and given again
# at every restart, as a user runs the same command again: the first
# peers name each other, a newcomer the peers running when it came. Over
# an hour every peer so named may have left for good; a restarted peer
# then finds the job through the peers it remembers (join keeps them
# beside its identity).
pboot=()

start() { # start <peer> <kind>: ringtrain join in namespace <peer>, a new incarnation
	local i=$1 kind=$2 k args b
	k=$((${inc[$i]:--1} + 1))
	inc[$i]=$k
	if [ -z "${pboot[$i]:-}" ]; then
		if [ "$i" -lt "$PEERS" ]; then pboot[$i]=$(seq 0 $((PEERS - 1))); else pboot[$i]=$(running); fi
	fi
	args=(join --config "$dir/job.json" --identity "$tmp/id-$i" --listen "$(addr "$i")" --log-format json --threads 1
		--trace "$dir/p$i-$k.trace.json" --metrics 127.0.0.1:9100)
	for b in ${pboot[$i]}; do [ "$b" = "$i" ] || args+=(--bootstrap "${boots[$b]}"); done
	record "$kind" "$i" "$k"
	echo "$k" >"$dir/inc-$i" # for the sampler, a process of its own
	ip netns exec "$p$i" "$bin" "${args[@]}" >"$dir/p$i-$k.log" 2>&1 &
	pids[$i]=$!
}

reap() { # reap <peer>: wait for its process, record its exit status
	local i=$1 rc=0
	wait "${pids[$i]}" || rc=$?
	record exit "$i" "${inc[$i]}" "$rc"
	pids[$i]=
}

sample() { # every 3 s: each running peer's goroutines, open files and memory
	local i k
	while :; do
		for ((i = 0; i < count; i++)); do
			k=$(cat "$dir/inc-$i" 2>/dev/null) || continue
			ip netns exec "$p$i" curl -s -m 1 http://127.0.0.1:9100/metrics 2>/dev/null |
				awk -v t="$(now_ms)" '/^go_goroutines /{g=$2} /^process_open_fds /{f=$2} /^process_resident_memory_bytes /{r=$2}
					END {if (g != "") printf "%s %s %s %s\n", t, g, f, r}' >>"$dir/p$i-$k.metrics" || true
		done
		sleep 3
	done
}

running() { # the peers whose process runs, one a line
	local i
	for ((i = 0; i < count; i++)); do [ -n "${pids[$i]:-}" ] && kill -0 "${pids[$i]}" 2>/dev/null && echo "$i"; done
	return 0
}

# The job undisturbed.
dir=$tmp/undisturbed
mkdir -p "$dir"
config netns-churn-undisturbed "$dir"
echo "netns-churn: $MODE, $PEERS peers, $EPOCHS epochs of $images images ($DATA), undisturbed"
for ((i = 0; i < PEERS; i++)); do start "$i" start; done
for ((i = 0; i < PEERS; i++)); do reap "$i"; done

# The same job, churned.
dir=$tmp/churn
mkdir -p "$dir"
rm -f "$tmp"/id-*.peers # the undisturbed job's members
config netns-churn "$dir"
inc=()
echo "netns-churn: the same job while a peer is SIGKILLed or Ctrl-C'd every ${PERIOD}s and started again 2 s later; a new peer joins and one leaves for good every ${NEW_EVERY}s"
for ((i = 0; i < PEERS; i++)); do start "$i" start; done
sample &
sampler=$!
next_spare=$PEERS
kill9=1
last_new=$SECONDS
netns_wait_for netns-churn "$dir/p0-0.log" '"message":"(training|pipeline formed)"' 120
while [ -n "$(running)" ]; do
	sleep "$PERIOD"
	mapfile -t up < <(running)
	[ "${#up[@]}" -gt 3 ] || continue # min_world_size: never take the ring below it
	i=${up[$((RANDOM % ${#up[@]}))]}
	if [ $((SECONDS - last_new)) -ge "$NEW_EVERY" ] && [ "$next_spare" -lt "$count" ]; then
		last_new=$SECONDS
		start "$next_spare" new
		next_spare=$((next_spare + 1))
		record leave "$i" "${inc[$i]}"
		kill -INT "${pids[$i]}"
		reap "$i"
		continue
	fi
	if [ "$kill9" = 1 ]; then
		record kill "$i" "${inc[$i]}"
		kill -9 "${pids[$i]}"
	else
		record int "$i" "${inc[$i]}"
		kill -INT "${pids[$i]}"
	fi
	kill9=$((1 - kill9))
	reap "$i"
	sleep 2
	# The job may have ended meanwhile: the restarted peer is told so, and exits 0.
	start "$i" restart
done
kill "$sampler" 2>/dev/null || true
for ((i = 0; i < count; i++)); do [ -z "${pids[$i]:-}" ] || reap "$i"; done
[ -z "${KEEP:-}" ] || { mkdir -p "$KEEP" && cp -r "$tmp/undisturbed" "$tmp/churn" "$KEEP/"; }

flags=(-period "${PERIOD}s" -min-throughput "${MIN_THROUGHPUT:-0.8}")
# Every sample once an epoch, counted from the traces: in DiLoCo's
# deadline rounds a rank behind when an epoch's last round closes leaves
# the rest of its share for the epoch by design, and a pipeline's stages
# count their micro-batches otherwise.
[ "$MODE" = everystep ] && flags+=(-samples "$images")
[ "$BOUNDS" = 1 ] && flags+=(-bounds)
if ! (cd "$root" && go run ./internal/churnreport "${flags[@]}" "$tmp/churn" "$tmp/undisturbed"); then
	echo "netns-churn: FAIL; the events:"
	cat "$tmp/churn/events.tsv"
	# What each peer said of its admissions and re-formations: a slow
	# admission or a stall is read from these, when nothing was kept.
	echo "netns-churn: the peers' admissions and re-formations:"
	for f in "$tmp"/churn/p*.log; do
		grep -hE '"message":"(a standby being admitted|admitted|the ring has formed without|no bootstrap peer|could not admit)' "$f" |
			sed -E 's/.*"time":"([^"]*)".*"message":"([^"]*)".*/\1 \2/' | sed "s|^|$(basename "$f" .log) |"
	done | sort -k2,2 | cut -c1-200
	exit 1
fi
echo "netns-churn: ok"
