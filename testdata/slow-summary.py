#!/usr/bin/env python3
"""The figures of make bench-slow from netns-slow.sh's JSON lines.

usage: testdata/slow-summary.py [--target ACC] FILE...

For each variant, epochs and last_rate (a run with one slow peer), the
median over its runs of: bytes sent per epoch, peak bytes in any 1 s,
samples/s, final test accuracy, and the training seconds until the test
accuracy after an epoch first reached the target — the final accuracy of
the float32 synchronous variant ("none") among the files, or ACC. Then,
for every variant run both with and without a slow peer (a slow link,
last_rate, or a slow CPU, last_cpu), the other peers' throughput with it
against without.
"""
import json
import statistics
import sys
from collections import defaultdict


def slow_peer(d):
    """What makes the last peer slow in a run, or "" for none."""
    if d.get("last_rate"):
        return "link at " + d["last_rate"]
    if d.get("last_cpu"):
        return "CPU at %s%% of one core" % d["last_cpu"]
    return ""


def main(args):
    target = None
    if args[:1] == ["--target"]:
        target, args = float(args[1]), args[2:]
    paths = args
    runs = defaultdict(list)
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.startswith("{"):
                    d = json.loads(line)
                    runs[(d["variant"], len(d["epoch_accuracy"]), slow_peer(d))].append(d)
    if not runs:
        sys.exit("slow-summary: no runs in " + " ".join(paths))
    sync = [d for (v, _, last), ds in runs.items() if v == "none" and not last for d in ds]
    if target is None and sync:
        target = statistics.median(d["test_accuracy"] for d in sync)

    def reached(d):
        total = 0.0
        for acc, s in zip(d["epoch_accuracy"], d["epoch_train_s"]):
            total += s
            if target is not None and acc >= target:
                return total
        return None

    print("variant | epochs | slow peer | runs | sent per epoch | fewer bytes than float32 | peak 1 s | samples/s | final accuracy | reaches %s after" %
          ("%.4f" % target if target is not None else "float32's final"))
    base = statistics.median(d["sent_bytes_per_epoch"] for d in sync) if sync else None
    for (variant, epochs, last), ds in sorted(runs.items()):
        sent = statistics.median(d["sent_bytes_per_epoch"] for d in ds)
        times = [t for t in map(reached, ds) if t is not None]
        print("%s | %d | %s | %d | %.0f KB | %s | %.3f MB | %.0f | %.4f | %s" % (
            variant, epochs, last or "-", len(ds), sent / 1e3,
            "%.0fx" % (base / sent) if base else "-",
            statistics.median(d["peak_1s_bytes"] for d in ds) / 1e6,
            statistics.median(d["samples_per_sec"] for d in ds),
            statistics.median(d["test_accuracy"] for d in ds),
            "%.2f s (%d of %d runs)" % (statistics.median(times), len(times), len(ds)) if times else "not reached"))
    for (variant, epochs, last), ds in sorted(runs.items()):
        fast = runs.get((variant, epochs, ""))
        if not last or not fast:
            continue
        slow_sps = statistics.median(d["samples_per_sec"] for d in ds)
        fast_sps = statistics.median(d["samples_per_sec"] for d in fast)
        print("%s, %d epochs: one peer's %s: the others' samples/s %.0f against %.0f without (%.3fx, medians of %d and %d)" % (
            variant, epochs, last, slow_sps, fast_sps, slow_sps / fast_sps, len(ds), len(fast)))


if __name__ == "__main__":
    main(sys.argv[1:])
