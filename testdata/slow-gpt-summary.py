#!/usr/bin/env python3
"""Reads netns-slow.sh's JSON lines for SLOW_MODEL=gpt (a synchronous
variant first, then others) and prints, for each variant, the bytes peer 0
sent until its validation loss first reached the synchronous run's final
one, and the ratio of the synchronous run's bytes to those."""
import json
import sys

runs = [json.loads(l) for l in sys.stdin if l.startswith("{")]
if not runs:
    sys.exit("slow-gpt-summary: no runs on stdin")
sync = runs[0]
target = sync["test_loss"]
sync_bytes = sync["val_curve"][-1][3]  # at its last score, the end of training
print(f"target: {sync['variant']}'s final validation loss {target:.4f} nats "
      f"({target / 0.6931471805599453:.4f} bits per byte), {sync_bytes:,} bytes")
print(f"{'variant (outer step)':44} {'final loss':>10} {'bytes to target':>16} {'fewer bytes':>12}")
# A variant's curve: [epoch, step, validation loss, bytes sent so far].
for r in runs:
    name = r["variant"] + (f" ({r['outer']})" if "h" in r["variant"] and r.get("outer") else "")
    reached = next(((ep, st, b) for ep, st, l, b in r["val_curve"] if l <= target * 1.0000001), None)
    if reached is None:
        print(f"{name:44} {r['test_loss']:10.4f} {'not reached':>16} {'-':>12}")
        continue
    ep, st, b = reached
    ratio = f"{sync_bytes / b:,.0f}x" if b else "-"
    print(f"{name:44} {r['test_loss']:10.4f} {b:16,} {ratio:>12}  (epoch {ep}, step {st})")
