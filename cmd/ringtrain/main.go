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
//	ringtrain bench device --device cuda|host|cpu [--model cnn] [--batch 64] [--tf32] [--no-graph] [--conv-algos exact|any]
//	ringtrain bench cpu|served|pipeline [flags]
//	ringtrain bench flood [--kinds hello,statements,links,jobconfig,data,data-bad,dht,random,dht-messages,relay,metrics,formation-lie] [--flood 60s] [--runs 3]
//	ringtrain swarm-key [-o swarm.key]
//	ringtrain version (or any command's --version)
//	ringtrain completion bash|zsh
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

// ctxFree are the commands that never wait on the network or on peers, and
// take no context: SIGTERM and Ctrl-C end them as they end any program
// (caught, they were ignored: plot spinning on a bad log, predict reading a
// FIFO).
func ctxFree(command string) bool {
	switch command {
	case "predict", "export", "plot", "trace", "id", "swarm-key", "version", "completion", "__complete":
		return true
	}
	return false
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if len(os.Args) > 1 && ctxFree(os.Args[1]) {
		stop()
	}
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

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	err := dispatch(ctx, args, stdout, stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return nil // asked for: the flags' usage is printed, and that is not an error
	case errors.Is(err, errVersion):
		fmt.Fprintln(stdout, version())
		return nil
	}
	return err
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText(""))
		return fmt.Errorf("no command given: %w", errUsage)
	}
	switch args[0] {
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usageText(""))
		return nil
	case "--version", "-version":
		return errVersion
	case "__complete":
		return runComplete(ctx, args[1:], stdout)
	}
	if c, rest, ok := findCommand(args); ok {
		return c.run(ctx, rest, stdout, stderr)
	}
	if args[0] == "bench" || args[0] == "trace" {
		// A group: its commands, on -h as asked, else as a usage error.
		if len(args) > 1 && (args[1] == "-h" || args[1] == "--help" || args[1] == "-help") {
			fmt.Fprint(stdout, usageText(args[0]+" "))
			return nil
		}
		fmt.Fprint(stderr, usageText(args[0]+" "))
		if len(args) == 1 {
			return fmt.Errorf("%s: say which: %w", args[0], errUsage)
		}
		return fmt.Errorf("unknown command %q: %w", args[0]+" "+args[1], errUsage)
	}
	fmt.Fprint(stderr, usageText(""))
	return fmt.Errorf("unknown command %q: %w", args[0], errUsage)
}

// runJoinCommand is join, with the one hint its errors need.
func runJoinCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	err := runJoin(ctx, args, stdout, stderr)
	if errors.Is(err, p2p.ErrPlaneBehindNAT) {
		err = fmt.Errorf("%w (start every peer with --data-plane tls, which falls back to libp2p streams where it must)", err)
	}
	return err
}

// writeFilePrivate writes b to a new file at path that only its owner may
// read; an existing file is left alone, and an error.
func writeFilePrivate(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// runID creates the identity file if there is none and prints its peer ID.
func runID(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("id", flag.ContinueOnError)
	fs.SetOutput(stderr)
	home, _ := os.UserHomeDir()
	identity := fs.String("identity", filepath.Join(home, ".ringtrain", "identity.key"), "identity key file, created on first use")
	if err := parseFlags(fs, args); err != nil {
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
