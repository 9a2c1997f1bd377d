#!/usr/bin/env bash
# A real Prometheus scrapes a training peer's --metrics and loads
# cmd/ringtrain/prometheus/alerts.yml: the script fails unless Prometheus
# holds libp2p's series (connections, resource-manager limits) and
# ringtrain's own from the scrape, and every rule is loaded and healthy.
# Usage: testdata/prometheus-scrape.sh bin/ringtrain
set -euo pipefail
bin=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

# A ring of one that trains long enough to be scraped.
sed -e 's/"world_size": 3/"world_size": 1/' -e 's/"epochs": 1/"epochs": 400/' \
	-e "s#\"data\": \"data-config.json\"#\"data\": \"$here/data-config.json\"#" "$here/job.json" >"$tmp/job.json"
"$bin" join --config "$tmp/job.json" --listen /ip4/127.0.0.1/tcp/0 --metrics 0 --log-format json >"$tmp/peer.out" 2>"$tmp/peer.log" &
pids+=($!)
for _ in $(seq 100); do
	addr=$(sed -n 's#^metrics on http://\(.*\)/metrics$#\1#p' "$tmp/peer.out")
	[ -n "$addr" ] && break
	sleep 0.2
done
[ -n "${addr:-}" ] || { echo "prometheus-scrape: the peer never said where its metrics are"; tail -5 "$tmp/peer.log"; exit 1; }

cp "$here/../cmd/ringtrain/prometheus/alerts.yml" "$tmp/"
cat >"$tmp/prometheus.yml" <<CFG
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [alerts.yml]
scrape_configs:
  - job_name: ringtrain
    static_configs: [{targets: ['$addr']}]
CFG
port=$((20000 + RANDOM % 20000))
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" --web.listen-address="127.0.0.1:$port" \
	--log.level=warn >"$tmp/prom.log" 2>&1 &
pids+=($!)
query() { curl -sf "http://127.0.0.1:$port/api/v1/query" --data-urlencode "query=$1"; }
for _ in $(seq 120); do
	libp2p=$(query 'count({__name__=~"libp2p_.+",job="ringtrain"})' 2>/dev/null | sed -n 's/.*"value":\[[^,]*,"\([0-9]*\)"\].*/\1/p' || true)
	steps=$(query 'ringtrain_steps_total{job="ringtrain"}' 2>/dev/null | sed -n 's/.*"value":\[[^,]*,"\([0-9.e+]*\)"\].*/\1/p' || true)
	[ -n "$libp2p" ] && [ "$libp2p" -gt 0 ] && [ -n "$steps" ] && break
	sleep 0.5
done
if [ -z "${libp2p:-}" ] || [ "$libp2p" -eq 0 ] || [ -z "${steps:-}" ]; then
	echo "prometheus-scrape: Prometheus holds no libp2p series or no ringtrain_steps_total from the peer (libp2p: '${libp2p:-}', steps: '${steps:-}')"
	tail -5 "$tmp/prom.log"
	exit 1
fi
for name in libp2p_rcmgr_limit; do
	query "count($name{job=\"ringtrain\"})" | grep -q '"result":\[{' || { echo "prometheus-scrape: no $name"; exit 1; }
done
rules=$(curl -sf "http://127.0.0.1:$port/api/v1/rules" | grep -o '"health":"ok"' | wc -l)
[ "$rules" -eq 5 ] || { echo "prometheus-scrape: $rules of the 5 alerting rules loaded and healthy"; exit 1; }
echo "prometheus-scrape: ok, Prometheus scraped $libp2p libp2p series and ringtrain's ($steps steps) from the peer, and its 5 alerting rules are healthy"
