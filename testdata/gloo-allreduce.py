"""Allreduce of float32 buffers over PyTorch's gloo, one process per rank on
loopback: the baseline `ringtrain bench allreduce --procs` is held against
(make bench-procs). Prints one JSON line per size, its fields named as
ringbench's rows: each round lasts until its slowest rank is done; the row
is the median round.

usage: python3 testdata/gloo-allreduce.py PEERS ITERS SIZE_BYTES...
"""
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, n, port, iters, sizes, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    for size in sizes:
        buf = torch.ones(size // 4, dtype=torch.float32)
        times = []
        for i in range(iters + 1):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            t = time.perf_counter() - t0
            if i > 0:
                times.append(t)
        out.put((rank, size, times))
    dist.destroy_process_group()


def main():
    n, iters = int(sys.argv[1]), int(sys.argv[2])
    sizes = [int(s) for s in sys.argv[3:]]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, n, port, iters, sizes, out)) for r in range(n)]
    for p in procs:
        p.start()
    got = {}
    for _ in range(n * len(sizes)):
        rank, size, times = out.get()
        got.setdefault(size, {})[rank] = times
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"gloo rank exited {p.exitcode}")
    for size in sizes:
        slowest = sorted(max(got[size][r][i] for r in range(n)) for i in range(iters))
        t = slowest[len(slowest) // 2]
        algbw = size / t / 1e9
        print(json.dumps({"transport": "gloo-procs", "peers": n, "bytes": size, "seconds": t,
                          "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (n - 1) / n}))


if __name__ == "__main__":
    main()
