#!/usr/bin/env bash
# Peers behind NAT, on one machine. A "public" bridge holds a
# `ringtrain bootstrap` peer and two routers; behind each router, which
# masquerades its LAN and drops connections from outside that its LAN did
# not open (a home router's NAT and stateful firewall, iptables), sit two
# training peers. Nobody on the bridge can dial them; each knows it at
# once (its own addresses are private, the bootstrap peer's public),
# reserves a slot on the bootstrap peer's relay, and is reached through it
# — then directly, once DCUtR hole punching gets through, or, behind the
# same router, at its private address.
# The 4-peer ring must form and train; one NATed peer is SIGKILLed mid-epoch;
# the 3 survivors must re-form, and a replacement started behind the same
# NAT must be admitted; all 4 must end with one parameter hash. Then a
# 2-peer job asking for the TCP data plane across the NATs must stop on
# both sides with an error that says so.
#
# With --flat the same five peers sit on the bridge with no NAT: the
# formation time to compare with (make bench-nat prints both).
#
# Addresses: the bridge is 11.0.0.0/24 and the LANs 10.1.0.0/24 and
# 10.2.0.0/24. The bridge needs addresses libp2p counts as public
# (AutoNAT, AutoRelay and hole punching ignore private ones, and RFC 5737's
# documentation ranges count as unroutable). Every name made here lives in
# network namespaces of our own — the bridge too, in a namespace with no
# link to the host's network — so nothing sent to these addresses can leave
# them. Everything is removed on exit, also on failure.
#
# usage: [JOIN_FLAGS=...] testdata/netns-nat.sh [--flat] [path/to/ringtrain]
# (make test-netns; make bench-nat). JOIN_FLAGS go to every training peer's join.
set -euo pipefail

flat=
if [ "${1:-}" = --flat ]; then flat=1; shift; fi
bin=$(realpath "${1:-bin/ringtrain}")
here=$(cd "$(dirname "$0")" && pwd)
name=netns-nat${flat:+-flat}
if [ "$(id -u)" != 0 ]; then echo "$name: SKIPPED, creating network namespaces needs root"; exit 0; fi
if ! command -v ip >/dev/null; then echo "$name: SKIPPED, needs ip (iproute2)"; exit 0; fi
if [ -z "$flat" ] && ! command -v iptables >/dev/null; then echo "$name: SKIPPED, needs iptables (make test-netns installs it)"; exit 0; fi

. "$here/netns-lib.sh"
p=rtt$$ # a prefix of our own for every name made here
wan=${p}w
tmp=$(mktemp -d)
pids=()
nss=("$wan" "${p}boot" "${p}ra" "${p}rb" "${p}a1" "${p}a2" "${p}b1" "${p}b2")
cleanup() {
	for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
	for ns in "${nss[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT
for ns in "${nss[@]}"; do ip netns add "$ns"; ip -n "$ns" link set lo up; done

if ! ip -n "$wan" link add br0 type bridge 2>/dev/null; then echo "$name: SKIPPED, cannot make a bridge in a namespace"; exit 0; fi
ip -n "$wan" link set br0 up
# plug <ns> <dev> <addr/len> [<bridge-ns> <bridge>]: a veth from ns (named dev) into a bridge
plug() {
	local ns=$1 dev=$2 addr=$3 bns=${4:-$wan} br=${5:-br0}
	local port=${p}$((++ports))
	ip link add "$port" netns "$bns" type veth peer name "$dev" netns "$ns"
	ip -n "$bns" link set "$port" master "$br" up
	ip -n "$ns" addr add "$addr" dev "$dev"
	ip -n "$ns" link set "$dev" up
}
ports=0
plug "${p}boot" eth0 11.0.0.1/24
peer_ns=("${p}a1" "${p}a2" "${p}b1" "${p}b2")
if [ -n "$flat" ]; then
	for i in 0 1 2 3; do plug "${peer_ns[$i]}" eth0 "11.0.0.$((i + 11))/24"; done
else
	for side in a b; do
		r=${p}r$side
		lan=$([ $side = a ] && echo 1 || echo 2)
		plug "$r" wan0 "11.0.0.$((lan + 1))/24"
		ip -n "$r" link add lan type bridge
		ip -n "$r" addr add "10.$lan.0.1/24" dev lan
		ip -n "$r" link set lan up
		for j in 1 2; do
			plug "${p}$side$j" eth0 "10.$lan.0.$((j + 1))/24" "$r" lan
			ip -n "${p}$side$j" route add default via "10.$lan.0.1"
		done
		ip netns exec "$r" sysctl -qw net.ipv4.ip_forward=1
		ip netns exec "$r" iptables -t nat -A POSTROUTING -o wan0 -j MASQUERADE
		ip netns exec "$r" iptables -A FORWARD -i wan0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
		ip netns exec "$r" iptables -A FORWARD -i wan0 -j DROP
		# Silently, like a home router: a refusal (RST) to the first SYN of
		# a hole punch would end the punch before the other side's SYN
		# has opened the way.
		ip netns exec "$r" iptables -A INPUT -i wan0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
		ip netns exec "$r" iptables -A INPUT -i wan0 -j DROP
	done
	# Nobody on the bridge has a route to a LAN.
	if ip -n "${p}boot" route get 10.1.0.2 >/dev/null 2>&1; then echo "$name: FAIL, the bridge can route to a LAN"; exit 1; fi
fi

# 16 epochs of the 2000-image subset: the survivors run an epoch in about
# half a second, and a replacement behind NAT takes up to 4 s to be heard
# and admitted; with 8 the job could end before it was.
cat >"$tmp/job.json" <<EOF
{"name": "$name", "world_size": 4, "min_world_size": 3, "epochs": 16, "batch_size": 8, "seed": 3, "model": "mlp",
 "data": {"transforms": [{"name": "ToTensor", "args": []}],
          "dataset_path": {"train": "$here/fashion-mnist", "test": "$here/fashion-mnist"}}}
EOF

ip netns exec "${p}boot" "$bin" bootstrap --relay-unlimited --listen /ip4/11.0.0.1/tcp/4001 --log-format json >"$tmp/boot.log" 2>&1 &
pids[4]=$!
disown "${pids[4]}" # killed at exit, with no "Killed" report from bash
NETNS_LOGS="$tmp/*.log" # a failed wait shows every peer's last lines
wait_for() { netns_wait_for "$name" "$@"; } # wait_for <file> <regexp> <seconds>
wait_for "$tmp/boot.log" '^listening on /ip4/11.0.0.1/' 30
boot=$(grep -m1 '^listening on /ip4/11.0.0.1/' "$tmp/boot.log" | cut -d' ' -f3)
if [ -z "$flat" ]; then
	# The NAT must be real before anything relies on it: a LAN reaches the
	# bridge, and its packets leave with the router's address.
	if ! ip netns exec "${p}a1" timeout 5 bash -c 'exec 3<>/dev/tcp/11.0.0.1/4001' 2>/dev/null ||
		[ "$(ip netns exec "${p}ra" iptables -t nat -L POSTROUTING -v -n -x | awk '/MASQUERADE/{print $1}')" = 0 ]; then
		echo "$name: SKIPPED, the NAT routers do not forward and masquerade here"; exit 0
	fi
fi
# Each peer listens where join does by default, on a port the OS picks.
# Two peers behind one router on one fixed port would collide in the
# router's mappings: it gives the second another port for each
# destination, so no punch can aim at it, and its links stay relayed.
start() { # start <i> [port]: ringtrain join in peer namespace i, output in $tmp/<i>.log
	ip netns exec "${peer_ns[$1]}" "$bin" join --config "$tmp/job.json" --listen "/ip4/0.0.0.0/tcp/${2:-0}" --bootstrap "$boot" \
		--log-format json ${JOIN_FLAGS:-} >"$tmp/$1.log" 2>&1 &
	pids[$1]=$!
}
began=$EPOCHREALTIME
for i in 0 1 2 3; do start "$i"; done
for i in 0 1 2 3; do wait_for "$tmp/$i.log" '"message":"ring formed"' 120; done
formed=$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $began}")
for i in 0 1 2 3; do wait_for "$tmp/$i.log" '"message":"training"' 60; done
links=$(cat "$tmp"/[0123].log | grep '"message":"ring link to the successor"' | grep -o '"link":"[a-z]*"' | sort | uniq -c | tr -s ' \n' ' ')
echo "$name: the 4-peer ring formed in $formed s; its links: $links"
wait_for "$tmp/0.log" '"epoch":2,"step":50,' 180 # the middle of epoch 2
kill -9 "${pids[3]}"
wait "${pids[3]}" 2>/dev/null || true # reaped here, so bash does not report "Killed" as if it were a failure
echo "$name: SIGKILLed the peer in ${peer_ns[3]} in the middle of epoch 2"
for i in 0 1 2; do wait_for "$tmp/$i.log" 'ring re-formed without the lost peers' 60; done
echo "$name: the 3 survivors re-formed; starting a replacement in ${peer_ns[3]}"
mv "$tmp/3.log" "$tmp/3-killed.log"
start 3
for i in 0 1 2 3; do
	if ! wait "${pids[$i]}"; then
		echo "$name: FAIL, peer $i exited non-zero:"; cat "$tmp/$i.log"
		echo "$name: the other peers' last lines:"; tail -n 15 "$tmp"/*.log # where the cause mostly lies
		exit 1
	fi
done
hashes=$(for i in 0 1 2 3; do grep -o '"world_size":4,"epochs":16,[^}]*"param_hash":"[0-9a-f]*"' "$tmp/$i.log" | grep -o '[0-9a-f]\{64\}'; done | sort -u)
summaries=$(cat "$tmp"/[0123].log | grep -c '"message":"summary"' || true)
if [ "$(echo "$hashes" | wc -l)" != 1 ] || [ -z "$hashes" ] || [ "$summaries" != 4 ] || ! grep -q 'admitted to the ring' "$tmp/3.log"; then
	echo "$name: FAIL, want the replacement admitted and 4 summaries of a world of 4 with one hash; got $summaries and:"; echo "$hashes"
	tail -n 30 "$tmp"/*.log
	exit 1
fi
all=$(cat "$tmp"/*.log)
if [ -z "$flat" ]; then
	# The token-gated TCP data plane cannot cross the NATs: two peers on
	# either side must both stop with an error that says so, not hang.
	sed 's/"world_size": 4, "min_world_size": 3/"world_size": 2/; s/"name": "'"$name"'"/"name": "tcp-across-nat"/' "$tmp/job.json" >"$tmp/tcp.json"
	for i in 0 2; do
		ip netns exec "${peer_ns[$i]}" timeout 120 "$bin" join --config "$tmp/tcp.json" --listen /ip4/0.0.0.0/tcp/4002 --bootstrap "$boot" \
			--data-plane tcp --reachability private --log-format json >"$tmp/tcp$i.log" 2>&1 &
		pids[$i]=$!
	done
	for i in 0 2; do
		if wait "${pids[$i]}"; then echo "$name: FAIL, a TCP-plane job across the NATs ran:"; cat "$tmp/tcp$i.log"; exit 1; fi
		if ! grep -qE 'the TCP data plane cannot cross a NAT.*through (relay|a NAT)' "$tmp/tcp$i.log"; then
			echo "$name: FAIL, a TCP-plane job across the NATs ended without saying why:"; cat "$tmp/tcp$i.log"; exit 1
		fi
	done
	echo "$name: a TCP-plane job across the NATs stopped on both sides: $(grep -oE 'through (relay|a NAT) [^ ]*' "$tmp/tcp0.log" | head -1 | cut -c1-40)…"
fi
echo "$name: AutoNAT verdicts: $(grep '"message":"AutoNAT' <<<"$all" | grep -o '"reachability":"[A-Za-z]*"' | sort | uniq -c | tr -s ' \n' ' ')"
echo "$name: hole punches: $(grep -o '"message":"hole punch[^"]*"' <<<"$all" | sort | uniq -c | tr -s ' \n' ' ')"
echo "$name: why hole punches failed: $(grep '"message":"hole punch failed' <<<"$all" | grep -o '"error":"[^"]*"' | sort | uniq -c | tr -s ' \n' ' ')"
job=$(cat "$tmp"/[0123].log "$tmp"/3-killed.log | grep '"message":"ring link to the successor"')
echo "$name: every link of every generation: $(grep -o '"link":"[a-z]*"' <<<"$job" | sort | uniq -c | tr -s ' \n' ' ')"
echo "$name: what carried them: $(grep -o '"plane":"[a-z0-9]*"' <<<"$job" | sort | uniq -c | tr -s ' \n' ' ')"
netns_no_refusals "$name"
echo "$name: ok, the replacement was admitted and all 4 ended with parameter hash ${hashes:0:16}"
