package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/cli"
	"github.com/ringtrain/ringtrain/internal/ringbench"
	"github.com/ringtrain/ringtrain/ring"
)

// allreduceProcs is `bench allreduce --procs`: every rank its own process
// (`ringtrain bench allreduce-rank`), linked by plain TCP on loopback, as
// gloo's and MPI's benchmarks run theirs; the parent opens each rank's
// listener and hands it down, so no rank waits on a port it must find.
func allreduceProcs(ctx context.Context, cfg ringbench.Config, sizes string, emit func(ringbench.Result)) error {
	n := cfg.Peers
	if n < 2 {
		return fmt.Errorf("%d peers; want at least 2: %w", n, cli.ErrUsage)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	lns := make([]*net.TCPListener, n)
	defer func() {
		for _, ln := range lns {
			if ln != nil {
				ln.Close()
			}
		}
	}()
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		lns[i] = ln.(*net.TCPListener)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make([][]ringbench.RankResult, n) // by rank, by size
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		f, err := lns[i].File()
		if err != nil {
			return err
		}
		args := []string{"bench", "allreduce-rank", "--rank", strconv.Itoa(i), "--peers", strconv.Itoa(n),
			"--next", lns[(i+1)%n].Addr().String(), "--sizes", sizes, "--iters", strconv.Itoa(cfg.Iters),
			"--chunk", strconv.Itoa(cfg.ChunkBytes), "--loop=" + strconv.FormatBool(cfg.Loop)}
		cmd := exec.CommandContext(ctx, exe, args...)
		cmd.ExtraFiles = []*os.File{f} // fd 3 in the child
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			f.Close()
			return err
		}
		if err := cmd.Start(); err != nil {
			f.Close()
			return err
		}
		f.Close()
		wg.Go(func() {
			if results[i], err = readRankResults(json.NewDecoder(bufio.NewReader(out))); err != nil {
				errs[i] = fmt.Errorf("rank %d's output: %w", i, err)
				cancel() // the others would wait for this rank for ever
			}
			if err := cmd.Wait(); err != nil && errs[i] == nil {
				errs[i] = fmt.Errorf("rank %d: %w: %s", i, err, strings.TrimSpace(stderr.String()))
				cancel()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return emitRows(loopName("tcp-procs", cfg.Loop), results, len(cfg.Sizes), emit)
}

// readRankResults reads a rank process's JSON lines to their end.
func readRankResults(dec *json.Decoder) ([]ringbench.RankResult, error) {
	var rs []ringbench.RankResult
	for {
		var r ringbench.RankResult
		if err := dec.Decode(&r); err == io.EOF {
			return rs, nil
		} else if err != nil {
			return rs, err
		}
		rs = append(rs, r)
	}
}

// emitRows combines, for each of sizes buffer sizes, every rank process's
// result (results[process][size]) into a row named name.
func emitRows(name string, results [][]ringbench.RankResult, sizes int, emit func(ringbench.Result)) error {
	for s := range sizes {
		rs := make([]ringbench.RankResult, len(results))
		for i := range results {
			if s >= len(results[i]) {
				return fmt.Errorf("process %d reported %d sizes of %d", i, len(results[i]), sizes)
			}
			rs[i] = results[i][s]
		}
		row, err := ringbench.Combine(name, rs)
		if err != nil {
			return err
		}
		emit(row)
	}
	return nil
}

// AllreduceRank is `ringtrain bench allreduce-rank`, one rank that
// allreduceProcs started: its listener is file descriptor 3; it dials
// --next and prints a JSON line per size.
func AllreduceRank(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench allreduce-rank", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rank := fs.Int("rank", 0, "this rank")
	peers := fs.Int("peers", 0, "ranks in the ring")
	next := fs.String("next", "", "the successor's listen address")
	sizes := fs.String("sizes", "", "comma-separated buffer sizes")
	iters := fs.Int("iters", 5, "timed calls per size")
	chunk := fs.Int("chunk", 0, "pipelining chunk size in bytes (0: the ring's)")
	loop := fs.Bool("loop", false, "time the calls back to back after one barrier")
	if err := cli.ParseFlags(fs, args); err != nil {
		return fmt.Errorf("bench allreduce-rank: %w: %w", cli.ErrUsage, err)
	}
	cfg := ringbench.Config{Peers: *peers, Iters: *iters, ChunkBytes: *chunk, Loop: *loop}
	var err error
	if cfg.Sizes, err = parseSizes(*sizes); err != nil {
		return fmt.Errorf("bench allreduce-rank: --sizes: %w: %w", err, cli.ErrUsage)
	}
	var ln net.Listener
	f := os.NewFile(3, "listener")
	if f == nil {
		return fmt.Errorf("bench allreduce-rank: no listener on file descriptor 3 (bench allreduce --procs starts this): %w", cli.ErrUsage)
	}
	ln, err = net.FileListener(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("bench allreduce-rank: the listener on file descriptor 3: %w", err)
	}
	defer ln.Close()
	t, err := ring.ConnectTCP(ctx, ln, *next, ring.Config{Rank: *rank, Size: *peers, Generation: 1})
	if err != nil {
		return fmt.Errorf("bench allreduce-rank %d: %w", *rank, err)
	}
	enc := json.NewEncoder(stdout)
	var encErr error
	err = ringbench.RunRank(ctx, t, *rank, cfg, func(r ringbench.RankResult) {
		if err := enc.Encode(r); err != nil && encErr == nil {
			encErr = err
		}
	})
	return errors.Join(err, encErr)
}
