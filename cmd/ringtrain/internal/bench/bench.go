package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/cli"
	"github.com/ringtrain/ringtrain/internal/ringbench"
	"github.com/ringtrain/ringtrain/p2p"
	"github.com/ringtrain/ringtrain/ring"
)

// Allreduce is `ringtrain bench allreduce`.
func Allreduce(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench allreduce", flag.ContinueOnError)
	fs.SetOutput(stderr)
	transport := fs.String("transport", "tcp", "ring links, comma-separated: mem, tcp (plain, loopback), libp2p (TLS streams), libp2p-tcp (token-gated TCP data plane), libp2p-tls (the TLS data plane: one direct TLS connection per link), libp2p-relay (TLS streams, every link through a circuit relay, as between peers behind NATs that hole punching cannot cross)")
	peers := fs.Int("peers", 4, "ranks in the ring, all in this process (each its own with --procs)")
	sizes := fs.String("sizes", "1MiB,16MiB,64MiB", "comma-separated buffer sizes (B, KiB, MiB, GiB)")
	iters := fs.Int("iters", 5, "timed calls per size; the median is reported")
	chunk := fs.String("chunk", "", "pipelining chunk size (default: the ring's)")
	asJSON := fs.Bool("json", false, "one JSON object per line instead of a table")
	loop := fs.Bool("loop", false, "with --procs: time the --iters calls back to back after one barrier, as nccl-tests does (rows end -loop), instead of each after a barrier of its own")
	procs := fs.Bool("procs", false, "run every rank in its own process, as gloo's and MPI's benchmarks do (no ceiling): --transport tcp is plain TCP on loopback (row tcp-procs); tls, libp2p and libp2p-tcp are the data planes, each peer its own libp2p host forming the ring as join does (rows tls-procs, libp2p-procs, libp2p-tcp-procs)")
	netns := fs.String("netns", "", "with --procs and a data plane: run rank i in the network namespace PREFIXi (testdata/bench-planes.sh makes them), at --subnet.(i+1)")
	subnet := fs.String("subnet", "", "with --netns: the first three octets of the namespaces' /24 (testdata/bench-planes.sh gives its own)")
	orderName := fs.String("ring-order", "id", "with --procs and a data plane: how the peers rank themselves — id, or measured (by the links they measure at formation; rows end -measured); with --netns, the peer in namespace i is i-th by peer ID")
	if err := cli.ParseFlags(fs, args); err != nil {
		return fmt.Errorf("bench allreduce: %w: %w", cli.ErrUsage, err)
	}
	cfg := ringbench.Config{Transport: *transport, Peers: *peers, Iters: *iters, Loop: *loop}
	var err error
	if cfg.Sizes, err = parseSizes(*sizes); err != nil {
		return fmt.Errorf("bench allreduce: --sizes: %w: %w", err, cli.ErrUsage)
	}
	if *chunk != "" {
		n, err := cli.ParseBytes(*chunk)
		if err != nil {
			return fmt.Errorf("bench allreduce: --chunk: %w: %w", err, cli.ErrUsage)
		}
		cfg.ChunkBytes = n
	}

	// Fixed widths rather than tabwriter: rows print as they are measured.
	const row = "%10s %5s %7s %10s %12s %12s %14s %8s %10s\n"
	if !*asJSON {
		fmt.Fprintf(stdout, row, "transport", "peers", "size", "time_ms", "algbw_GB/s", "busbw_GB/s", "ceiling_GB/s", "ratio", "cpu_s/GB")
	}
	enc := json.NewEncoder(stdout)
	var encErr error
	emit := func(r ringbench.Result) {
		if *asJSON {
			if err := enc.Encode(r); err != nil && encErr == nil {
				encErr = err
			}
			return
		}
		fmt.Fprintf(stdout, row, r.Transport, strconv.Itoa(r.Peers), cli.FormatBytes(r.Bytes),
			fmt.Sprintf("%.2f", r.Seconds*1e3), fmt.Sprintf("%.3f", r.Algbw), fmt.Sprintf("%.3f", r.Busbw),
			fmt.Sprintf("%.3f", r.CeilingBusbw), fmt.Sprintf("%.2f", r.Ratio), fmt.Sprintf("%.2f", r.CPUPerGB))
	}
	if (*netns == "") != (*subnet == "") {
		return fmt.Errorf("bench allreduce: --netns and --subnet go together: %w", cli.ErrUsage)
	}
	order, err := p2p.ParseRingOrder(*orderName)
	if err != nil {
		return fmt.Errorf("bench allreduce: %w: %w", err, cli.ErrUsage)
	}
	if *procs {
		if err := allreduceEachProcs(ctx, cfg, *transport, *sizes, order, *netns, *subnet, emit); err != nil {
			return err
		}
		return encErr
	}
	if *netns != "" || *loop {
		return fmt.Errorf("bench allreduce: --netns and --loop go with --procs: %w", cli.ErrUsage)
	}
	// Several transports run one after another in this process, so their
	// figures come from the same run.
	for _, tr := range strings.Split(*transport, ",") {
		c := cfg
		c.Transport = strings.TrimSpace(tr)
		if err := ringbench.Run(ctx, inProcess(), c, emit); err != nil {
			return fmt.Errorf("bench allreduce: %w", err)
		}
	}
	return encErr
}

// inProcess are the transports a ring in one process can run on:
// ringbench's own, and p2p's data planes between local hosts.
func inProcess() ringbench.Transports {
	trs := ringbench.Builtin()
	trs["libp2p"] = func(ctx context.Context, n int) ([]ring.Transport, func(), error) {
		return p2p.LocalRing(ctx, n, p2p.PlaneLibp2p)
	}
	trs["libp2p-relay"] = p2p.LocalRingBehindNAT
	trs["libp2p-tcp"] = func(ctx context.Context, n int) ([]ring.Transport, func(), error) {
		return p2p.LocalRing(ctx, n, p2p.PlaneTCP)
	}
	trs["libp2p-tls"] = func(ctx context.Context, n int) ([]ring.Transport, func(), error) {
		return p2p.LocalRing(ctx, n, p2p.PlaneTLS)
	}
	return trs
}

// allreduceEachProcs runs --procs for each transport: plain TCP between
// processes, or a data plane between peers, in network namespaces where
// netns is set.
func allreduceEachProcs(ctx context.Context, cfg ringbench.Config, transports, sizes string, order p2p.RingOrder, netns, subnet string, emit func(ringbench.Result)) error {
	for _, tr := range strings.Split(transports, ",") {
		tr = strings.TrimSpace(tr)
		if tr == "tcp" && netns == "" {
			if err := allreduceProcs(ctx, cfg, sizes, emit); err != nil {
				return fmt.Errorf("bench allreduce --procs: %w", err)
			}
			continue
		}
		plane, err := p2p.ParsePlane(strings.TrimPrefix(tr, "libp2p-"))
		if tr == "tcp" || err != nil {
			return fmt.Errorf("bench allreduce --procs: --transport %s; want tcp (not with --netns), tls, libp2p or libp2p-tcp: %w", tr, cli.ErrUsage)
		}
		if err := allreducePeers(ctx, cfg, sizes, tr, plane, order, netns, subnet, emit); err != nil {
			return fmt.Errorf("bench allreduce --procs --transport %s: %w", tr, err)
		}
	}
	return nil
}

// parseSizes reads a comma-separated list of sizes (parseBytes).
func parseSizes(list string) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		n, err := cli.ParseBytes(s)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// Form times ring formation on loopback: hosts start, find each
// other through the DHT from one bootstrap address, and agree.
func Form(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench form", flag.ContinueOnError)
	fs.SetOutput(stderr)
	peers := fs.String("peers", "4,8", "comma-separated peer counts")
	runs := fs.Int("runs", 5, "formations per count; the median is reported")
	if err := cli.ParseFlags(fs, args); err != nil {
		return fmt.Errorf("bench form: %w: %w", cli.ErrUsage, err)
	}
	for _, p := range strings.Split(*peers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 || *runs < 1 {
			return fmt.Errorf("bench form: --peers %q, --runs %d: %w", p, *runs, cli.ErrUsage)
		}
		var ds []time.Duration
		for range *runs {
			d, err := p2p.TimeFormation(ctx, n)
			if err != nil {
				return fmt.Errorf("bench form: %d peers: %w", n, err)
			}
			ds = append(ds, d)
		}
		fmt.Fprintf(stdout, "%d peers: formed in %v (median of %d: %v)\n", n, median(ds).Round(time.Millisecond), *runs, roundAll(ds))
	}
	return nil
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// median is the middle of v (the upper one of an even count); v is not
// reordered.
func median[T cmp.Ordered](v []T) T {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
