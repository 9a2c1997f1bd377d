# Shared by the testdata/netns-*.sh scripts (sourced, not run).

# netns_bridge <prefix> <subnet> <rate> <burst> [count]: count (default
# four, at most 32) network namespaces <prefix>0…, each with an eth0 at
# <subnet>.1…/24 on a bridge <prefix>br, every link capped at <rate> each
# way with tbf (handle 1: on the namespace side, for a netem child where
# the kernel has netem).
netns_bridge() {
	local p=$1 subnet=$2 rate=$3 burst=$4 count=${5:-4} i
	ip link add "${p}br" type bridge
	ip link set "${p}br" up
	for ((i = 0; i < count; i++)); do
		netns_on_bridge "$p" "$i" "${p}br" "$subnet" "$rate" "$burst"
	done
}

# netns_on_bridge <prefix> <i> <bridge> <subnet> <rate> <burst>: namespace
# <prefix><i> with an eth0 at <subnet>.(i+1)/24 on <bridge>, its link
# capped at <rate> each way with tbf (handle 1: on the namespace side).
netns_on_bridge() {
	local p=$1 i=$2 br=$3 subnet=$4 rate=$5 burst=$6 ns=$1$2
	ip netns add "$ns"
	ip link add "${p}v$i" type veth peer name eth0 netns "$ns"
	ip link set "${p}v$i" master "$br" up
	ip -n "$ns" link set lo up
	ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
	ip -n "$ns" link set eth0 up
	tc qdisc add dev "${p}v$i" root tbf rate "$rate" burst "$burst" latency 50ms
	ip netns exec "$ns" tc qdisc add dev eth0 root handle 1: tbf rate "$rate" burst "$burst" latency 50ms
}

# netns_cleanup <prefix>: the EXIT trap of a script that keeps its
# processes' pids in the array pids and its files under $tmp: kills the
# processes, removes what netns_bridge made, and the files.
netns_cleanup() {
	local pid
	for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
	netns_bridge_remove "$1"
	rm -rf "$tmp"
}

# netns_bridge_remove <prefix>: what netns_bridge made, whatever of it exists.
netns_bridge_remove() {
	local i
	for ((i = 0; i < 32; i++)); do ip netns del "$1$i" 2>/dev/null || true; done
	ip link del "$1br" 2>/dev/null || true
}

# netns_wait_for <name> <file> <regexp> <seconds>: until the file holds a
# line matching; past the deadline, "<name>: FAIL", the file's tail (and
# those of the files NETNS_LOGS names, a glob), exit 1.
netns_wait_for() {
	local deadline=$((SECONDS + $4))
	until grep -qE "$3" "$2" 2>/dev/null; do
		if [ $SECONDS -ge $deadline ]; then
			echo "$1: FAIL, no '$3' in $2:"
			tail -n 40 "$2"
			[ -z "${NETNS_LOGS:-}" ] || tail -n 20 $NETNS_LOGS
			exit 1
		fi
		sleep 0.1
	done
}

# netns_no_refusals <name>: no peer's log in $tmp says its limits refused
# or cut off another peer: every peer here is a member of the job, and
# members are never limited (p2p.Guard.Trust).
netns_no_refusals() {
	local hit
	if hit=$(grep -lE "over this peer's limits|cut off a peer that broke" "$tmp"/*.log 2>/dev/null); then
		echo "$1: FAIL, members were refused by each other's limits in $hit:"
		grep -hE "over this peer's limits|cut off a peer that broke" $hit | head -5
		exit 1
	fi
}
