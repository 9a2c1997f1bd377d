// Command ringtrain trains neural networks data-parallel across peers that
// average their gradients with ring-allreduce.
//
// Usage:
//
//	ringtrain join --config job.json [--bootstrap MULTIADDR]... [--listen MULTIADDR]... [--identity FILE] [--swarm-key FILE] [--relay=false] [--reachability auto|public|private] [--serve data.json] [--cache-dir DIR]
//	ringtrain join --job NAME@HASH --bootstrap MULTIADDR [--data data.json] [--cache-dir DIR]
//	ringtrain serve --data data.json [--listen MULTIADDR]... [--identity FILE] [--bootstrap MULTIADDR]...
//	ringtrain bootstrap [--listen MULTIADDR]... [--identity FILE] [--swarm-key FILE] [--reachability public|auto]
//	ringtrain local -n 3 --config job.json
//	ringtrain bench allreduce [--transport mem|tcp|libp2p|libp2p-tcp|libp2p-relay] [--procs] [--peers N] [--sizes 1MiB,16MiB] [--json]
//	ringtrain data --config data.json
//	ringtrain bench form [--peers 4,8] [--runs 5]
//	ringtrain bench engines --device cuda|host [--model cnn] [--steps 20]
//	ringtrain bench device --device cuda|host|cpu [--model cnn] [--batch 64] [--tf32] [--no-graph]
//	ringtrain bench flood [--kinds hello,statements,links,jobconfig,data,data-bad,dht,random] [--flood 60s] [--runs 3]
//	ringtrain swarm-key > swarm.key
//	ringtrain id [--identity FILE]
//	ringtrain predict --checkpoint FILE --image FILE.png|jpg
//	ringtrain export --checkpoint FILE --onnx OUT.onnx
//	ringtrain plot [--by rank|file] [LABEL=]LOG.jsonl... -o curves.png
//	ringtrain trace merge -o trace.json PEER.json...
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"syscall"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ringtrain/ringtrain/p2p"
	"github.com/ringtrain/ringtrain/train"
)

// startProfile writes a CPU profile of this process to PREFIX-PID.pprof
// when RINGTRAIN_CPUPROFILE=PREFIX is set (it reaches every peer of
// `ringtrain local` through the environment); the returned func ends it.
func startProfile(prefix string) func() {
	if prefix == "" {
		return func() {}
	}
	f, err := os.Create(fmt.Sprintf("%s-%d.pprof", prefix, os.Getpid()))
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ringtrain: RINGTRAIN_CPUPROFILE:", err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

// errUsage marks errors that are the caller's words being off; main then
// exits 2, as flag does.
var errUsage = errors.New("usage")

// ctxFree are the commands that never wait on the network or on peers, and
// take no context: SIGTERM and Ctrl-C end them as they end any program
// (caught, they were ignored: plot spinning on a bad log, predict reading a
// FIFO).
func ctxFree(command string) bool {
	switch command {
	case "predict", "export", "plot", "trace", "id", "swarm-key":
		return true
	}
	return false
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if len(os.Args) > 1 && ctxFree(os.Args[1]) {
		stop()
	}
	// A second signal ends any command at once, one that is leaving
	// gracefully too.
	context.AfterFunc(ctx, stop)
	stopProfile := startProfile(os.Getenv("RINGTRAIN_CPUPROFILE"))
	train.InstallBLAS()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stopProfile()
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "ringtrain:", err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

const usage = `usage: ringtrain <command> [flags]

commands:
  join              find the job's peers, form the ring, train, evaluate
  bootstrap         a peer that trains nothing: the DHT to meet in, AutoNAT, a relay for peers behind NAT
  serve             a bootstrap peer that also serves a dataset (--data) to the peers that train on it
  local             run -n peers of a job as processes on this machine
  bench allreduce   measure ring-allreduce against the pattern ceiling
  bench form        time ring formation through the DHT on loopback
  bench engines     hold a device's losses against gorgonia's, step by step
  bench device      one device's training samples/s for a model and batch, as JSON
  bench flood       a job's throughput, memory and goroutines while a hostile peer floods it
  data              load a data config's datasets and say what they hold
  predict           class and top probabilities of a PNG/JPEG from a checkpoint
  export            write a checkpoint's model as an ONNX file (opset 13)
  plot              draw loss, test accuracy and samples/s per rank (or per log file) from JSON logs
  trace merge       put several peers' --trace timelines on one clock, for Perfetto
  swarm-key         print a new private-swarm key (give the file to every peer)
  id                create or show this machine's peer ID (--identity FILE)
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	err := dispatch(ctx, args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil // asked for: the flags' usage is printed, and that is not an error
	}
	return err
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("no command given: %w", errUsage)
	}
	switch args[0] {
	case "bench":
		return runBench(ctx, args[1:], stdout, stderr)
	case "data":
		return runData(ctx, args[1:], stdout, stderr)
	case "join":
		err := runJoin(ctx, args[1:], stdout, stderr)
		if errors.Is(err, p2p.ErrPlaneBehindNAT) {
			err = fmt.Errorf("%w (start every peer with --data-plane tls, which falls back to libp2p streams where it must)", err)
		}
		return err
	case "bootstrap":
		return runBootstrap(ctx, args[1:], stdout, stderr)
	case "serve":
		return runServe(ctx, args[1:], stdout, stderr)
	case "local":
		return runLocal(ctx, args[1:], stdout, stderr)
	case "predict":
		return runPredict(args[1:], stdout, stderr)
	case "export":
		return runExport(args[1:], stdout, stderr)
	case "trace":
		return runTrace(args[1:], stdout, stderr)
	case "plot":
		return runPlot(args[1:], stdout, stderr)
	case "id":
		return runID(args[1:], stdout, stderr)
	case "swarm-key":
		return p2p.WriteSwarmKey(stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q: %w", args[0], errUsage)
}

// runID creates the identity file if there is none and prints its peer ID.
func runID(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("id", flag.ContinueOnError)
	fs.SetOutput(stderr)
	home, _ := os.UserHomeDir()
	identity := fs.String("identity", filepath.Join(home, ".ringtrain", "identity.key"), "identity key file, created on first use")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("id: %w: %w", errUsage, err)
	}
	k, err := p2p.LoadOrCreateIdentity(*identity)
	if err != nil {
		return err
	}
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, id)
	return nil
}
