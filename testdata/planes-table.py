#!/usr/bin/env python3
"""Reads `make bench-planes` output (JSON lines) on stdin and prints, per
setting, peers and size: each plane's median busbw and CPU s/GB, and the
median over runs of its busbw / the clear plane's busbw in the same run."""
import json
import statistics
import sys
from collections import defaultdict

rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
# A run is the rows one `bench allreduce` printed: in one process (no
# "round"), a new run starts at each clear-TCP row of 1 MiB.
run, runs = -1, []
for r in rows:
    setting = r.get("rate", "loopback")
    clear = "libp2p-tcp-netns" if "rate" in r else "tcp"
    if "round" in r:
        key = (setting, r["round"], r["peers"])
    else:
        if r["transport"] == clear and r["bytes"] == 1 << 20:
            run += 1
        key = (setting, run, r["peers"])
    runs.append((key, setting, clear, r))

by_run = defaultdict(dict)
for key, setting, clear, r in runs:
    by_run[key][(r["transport"], r["bytes"])] = r
cells = defaultdict(lambda: defaultdict(list))
for key, got in by_run.items():
    setting, _, peers = key
    clear = "libp2p-tcp-netns" if setting != "loopback" else "tcp"
    for (tr, size), r in got.items():
        base = got.get((clear, size))
        c = cells[(setting, peers, size, tr)]
        c["busbw"].append(r["busbw_GBps"])
        c["cpu"].append(r["cpu_s_per_GB"])
        if base:
            c["ratio"].append(r["busbw_GBps"] / base["busbw_GBps"])

print("| setting | peers | size | plane | busbw GB/s | × clear TCP, per run | median × clear | CPU s/GB |")
print("|---|---|---|---|---|---|---|---|")
for (setting, peers, size, tr), c in sorted(cells.items(), key=lambda kv: (kv[0][0] != "loopback", kv[0][0], kv[0][1], kv[0][2], kv[0][3])):
    print(f"| {setting} | {peers} | {size >> 20} MiB | {tr} | {statistics.median(c['busbw']):.3f} | "
          f"{' / '.join(f'{x:.2f}' for x in c['ratio'])} | **{statistics.median(c['ratio']):.2f}** | {statistics.median(c['cpu']):.2f} |")
