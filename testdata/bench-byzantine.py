#!/usr/bin/env python3
"""Members that lie with their updates, as processes on this machine.

Runs `ringtrain join` processes on loopback, built with the ringtrain_attack
tag (`make bench-byzantine` builds it), some of them attackers
(RINGTRAIN_ATTACK=scale|flip|noise|replay), in two kinds of job: sparse
DiLoCo rounds with "robust" (rounds) and a ring that syncs every step with
"update_checks" (audit_every 64) and grad_norm_guard 5 (everystep). Prints
a JSON line per run and then a table per mode: final test accuracy against the clean run,
whether every attacker was named and dropped and at which step, honest
peers dropped. Then CLEAN runs of each mode on non-IID shards (labels dealt
by peer, "non_iid_shards") of the small DATA_SMALL, counting honest peers
dropped; and the clean job with the checks on and off in turn (samples/s).

With MODEL=gpt the model is testdata/gpt-demo-job.json's GPT (batch 16,
AdamW with warm-up and clipping) on DATA, a folder of text (fortunes),
and the figure is the validation loss.

usage: [MODES=rounds,everystep] [KINDS=clean,scale,flip,noise,replay] [GUARD=5] [CHECKS='{"audit_every": 64}'] [MODEL=mlp|gpt]
       [SIZES=4:1,8:2 (peers:attackers)] [RUNS=3 (job seeds 1 … RUNS; the table holds medians)]
       bench-byzantine.py BIN DATA DATA_SMALL [EPOCHS=2] [CLEAN=20] [PAIRS=3]
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

BIN, DATA, SMALL = sys.argv[1], sys.argv[2], sys.argv[3]
EPOCHS = int(sys.argv[4]) if len(sys.argv) > 4 else 2
CLEAN = int(sys.argv[5]) if len(sys.argv) > 5 else 20
PAIRS = int(sys.argv[6]) if len(sys.argv) > 6 else 3
RUNS = int(os.environ.get("RUNS", "3"))  # seeds 1 … RUNS of each configuration, medians

MODES = {
    "rounds": {"sync": {"every": 8, "sparse": {"fraction": 0.05, "bits": 4}, "robust": {}}},
    "everystep": {"update_checks": json.loads(os.environ.get("CHECKS", '{"audit_every": 64}')), "grad_norm_guard": float(os.environ.get("GUARD", "5"))},
}
MODES = {m: MODES[m] for m in os.environ.get("MODES", ",".join(MODES)).split(",")}
KINDS = os.environ.get("KINDS", "clean,scale,flip,noise,replay").split(",")
SIZES = [tuple(int(v) for v in s.split(":")) for s in os.environ.get("SIZES", "4:1,8:2").split(",")]
OFF = {"rounds": {"sync": {"every": 8, "sparse": {"fraction": 0.05, "bits": 4}}}, "everystep": {}}


GPT = os.environ.get("MODEL", "mlp") == "gpt"


def job(dirname, name, peers, attackers, data, extra, seed=1):
    cfg = {"name": name, "world_size": peers, "min_world_size": peers - attackers, "epochs": EPOCHS,
           "batch_size": 32, "seed": seed, "model": "mlp", "optimizer": {"name": "adam", "lr": 0.001},
           "join_timeout": "60s",
           "data": {"transforms": [{"name": "ToTensor", "args": []}],
                    "dataset_path": {"train": data, "test": data}}}
    if GPT:
        cfg.update({"batch_size": 16, "model": {"gpt": {"layers": 4, "dim": 128, "heads": 4, "context": 128}},
                    "optimizer": {"name": "adamw", "lr": 2e-3, "weight_decay": 0.1, "warmup_steps": 20, "clip_grad_norm": 1},
                    "data": {"text": {"folder": data}}})
    cfg.update(extra)
    path = os.path.join(dirname, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def run(peers, attackers, kind, data, extra, seed=1):
    """One job: returns what each peer printed and its exit status."""
    with tempfile.TemporaryDirectory() as d:
        cfg = job(d, "byz%d" % int(time.time() * 1000 % 1e9), peers, attackers, data, extra, seed)
        ids = []
        for i in range(peers):
            key = os.path.join(d, "id-%d" % i)
            ids.append(subprocess.run([BIN, "id", "--identity", key], capture_output=True, text=True, check=True).stdout.strip())
        procs, outs = [], []
        boot = None
        for i in range(peers):
            args = [BIN, "join", "--config", cfg, "--identity", os.path.join(d, "id-%d" % i),
                    "--listen", "/ip4/127.0.0.1/tcp/0", "--log-format", "json", "--threads", "1"]
            if boot:
                args += ["--bootstrap", boot]
            env = dict(os.environ)
            env.pop("RINGTRAIN_ATTACK", None)
            if kind != "clean" and i >= peers - attackers:
                env["RINGTRAIN_ATTACK"] = kind
            out = open(os.path.join(d, "p%d.log" % i), "w+")
            procs.append(subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env))
            outs.append(out)
            if boot is None:
                for _ in range(200):
                    out.flush()
                    m = re.search(r"listening on (/ip4/127\.0\.0\.1/tcp/\d+/p2p/\S+)", open(out.name).read())
                    if m:
                        boot = m.group(1)
                        break
                    time.sleep(0.05)
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=1800))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(-9)
        texts = [open(o.name).read() for o in outs]
        return ids, codes, texts


def judge(mode, peers, attackers, kind, ids, codes, texts):
    honest = range(peers - attackers)
    liars = set(ids[peers - attackers:]) if kind != "clean" else set()
    dropped, steps, acc, hashes, sps, audits = set(), [], [], set(), [], []
    for i in honest:
        for line in texts[i].splitlines():
            if '"dropped":' in line:
                e = json.loads(line)
                dropped.update(e["dropped"])
                steps.append(e.get("steps_done", 0))
            elif '"param_hash"' in line and ('"test_accuracy"' in line or '"test_loss"' in line):
                e = json.loads(line)
                acc.append(e["test_loss"] if GPT else e["test_accuracy"])
                hashes.add(e["param_hash"])
                sps.append(e["samples_per_sec"])
                audits.append(e.get("audits", 0))
    return {"mode": mode, "peers": peers, "attackers": attackers if kind != "clean" else 0, "attack": kind,
            "honest_exits": [codes[i] for i in honest], "accuracy": statistics.median(acc) if acc else None,
            "one_hash": len(hashes) == 1 and len(acc) == len(honest),
            "attackers_dropped": len(liars & dropped), "honest_dropped": len(dropped - liars),
            "dropped_at_steps": sorted(set(steps)), "samples_per_sec": statistics.median(sps) if sps else None,
            "audits": statistics.median(audits) if audits else None}


def median_of(runs):
    """One row from RUNS runs of a configuration (seeds 1, 2, …): the
    median accuracy and drop step; attackers counted dropped only where
    every run dropped them, honest peers where any run did."""
    r = dict(runs[0])
    accs = [x["accuracy"] for x in runs if x["accuracy"] is not None]
    r["accuracy"] = round(statistics.median(accs), 4) if accs else None
    r["runs"] = len(runs)
    r["accuracies"] = [x["accuracy"] for x in runs]
    r["one_hash"] = all(x["one_hash"] for x in runs)
    r["attackers_dropped"] = min(x["attackers_dropped"] for x in runs)
    r["runs_all_dropped"] = sum(x["attackers_dropped"] == x["attackers"] for x in runs)
    r["honest_dropped"] = max(x["honest_dropped"] for x in runs)
    firsts = [x["dropped_at_steps"][0] for x in runs if x["dropped_at_steps"]]
    r["dropped_at_steps"] = [statistics.median(firsts)] if firsts else []
    r["dropped_at_each_run"] = [x["dropped_at_steps"] for x in runs]
    r["audits_each_run"] = [x["audits"] for x in runs]
    return r


def main():
    rows = []
    for mode, extra in MODES.items():
        for peers, attackers in SIZES:
            for kind in KINDS:
                runs = []
                for seed in range(1, RUNS + 1):
                    runs.append(judge(mode, peers, attackers, kind, *run(peers, attackers, kind, DATA, extra, seed=seed)))
                    print(json.dumps(runs[-1]), flush=True)
                r = median_of(runs)
                if RUNS > 1:
                    print(json.dumps(r), flush=True)
                rows.append(r)
    for mode in MODES:
        print("\n%s: accuracy against the clean run; attackers named and dropped (at step)" % mode)
        for peers, _ in SIZES:
            clean = next((r for r in rows if r["mode"] == mode and r["peers"] == peers and r["attack"] == "clean"), {"accuracy": None})
            for r in (r for r in rows if r["mode"] == mode and r["peers"] == peers):
                d = None if r["accuracy"] is None or clean["accuracy"] is None else round(100 * (r["accuracy"] - clean["accuracy"]), 2)
                if GPT and d is not None:
                    d = round(d / clean["accuracy"], 2)  # the validation loss, in % of the clean run's
                print("  %d peers, %-6s %s %s (%+s %s)  dropped %d/%d at %s (in %d of %d runs), honest dropped %d, one hash %s" % (
                    peers, r["attack"], "loss" if GPT else "acc", r["accuracy"], d, "%" if GPT else "points",
                    r["attackers_dropped"], r["attackers"], r["dropped_at_steps"], r["runs_all_dropped"], r["runs"],
                    r["honest_dropped"], r["one_hash"]))
    for mode, extra in MODES.items():
        bad, failed, audits = 0, 0, []
        for seed in range(CLEAN):
            x = dict(extra, non_iid_shards=4)
            r = judge(mode, 4, 0, "clean", *run(4, 0, "clean", SMALL, x, seed=seed + 1))
            bad += r["honest_dropped"] > 0
            # A run that ended in an error (an honest peer named where
            # dropping it leaves too few, skips in a row) dropped no one
            # and finished nothing: it counts against the checks too.
            failed += any(c != 0 for c in r["honest_exits"]) or not r["one_hash"]
            audits.append(r["audits"])
        print(json.dumps({"summary": "clean non-IID runs", "mode": mode, "runs": CLEAN, "runs_with_an_honest_peer_dropped": bad,
                          "runs_failed": failed, "audits_each_run": audits}), flush=True)
    for mode in MODES if PAIRS > 0 else []:
        on, off, audits = [], [], []
        for _ in range(PAIRS):
            off.append(judge(mode, 4, 0, "clean", *run(4, 0, "clean", DATA, OFF[mode]))["samples_per_sec"])
            r = judge(mode, 4, 0, "clean", *run(4, 0, "clean", DATA, MODES[mode]))
            on.append(r["samples_per_sec"])
            audits.append(r["audits"])
        print(json.dumps({"summary": "checks on against off", "mode": mode, "off": off, "on": on, "audits": audits,
                          "ratio": round(statistics.median(on) / statistics.median(off), 3)}), flush=True)


main()
