package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// runLocal is `ringtrain local -n N --config job.json`: N real processes of
// this binary on 127.0.0.1, the first with no bootstrap and the rest pointed
// at it. On a terminal it shows a live display (a line per peer, the job's
// events above), the peers' logs going to --log-file; otherwise every
// output line is passed on, prefixed with the peer's rank once the ring has
// formed and with its start number before. Each peer tells local its rank
// and progress in JSON records on a pipe of its own (statusFDEnv). If a
// peer fails, the others are stopped; on Ctrl-C all are, and local waits
// for them.
func runLocal(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("local", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 3, "peers to start")
	config := fs.String("config", "", "job config (JSON)")
	plane := fs.String("data-plane", "tls", "the peers' --data-plane: tls, libp2p or tcp")
	logFormat := fs.String("log-format", "auto", "the peers' --log-format; auto: a live display on a terminal (the logs to --log-file), json lines otherwise")
	logFile := fs.String("log-file", "", "with the live display, every peer's log lines (JSON, each with its peer number) and output go to this file")
	logLevel := fs.String("log-level", "info", "the peers' --log-level")
	model := fs.String("model", "", "the peers' --model (a built-in model instead of the config's)")
	device := fs.String("device", "", "the peers' --device: cpu, cuda or host")
	devOpt := addDeviceFlags(fs)
	metrics := fs.String("metrics", "", "the peers' --metrics; with port 0 each peer picks its own and prints it")
	threads := fs.Int("threads", 0, "each peer's --threads (default: the cores divided by -n, at least 1, so the peers do not fight over cores)")
	var boots stringList
	fs.Var(&boots, "bootstrap", "a peer every one of them also starts from (repeatable): a data node (ringtrain serve) for a job on served data, or a bootstrap peer")
	traceFile := fs.String("trace", "", "write every peer's timeline, on one clock, to FILE as Chrome trace-event JSON (open it in Perfetto)")
	logDir := fs.String("log-dir", "", "write peer i's log as JSON lines to DIR/peer-i.jsonl too (for ringtrain plot)")
	if err := parseFlags(fs, args); err != nil {
		return fmt.Errorf("local: %w: %w", errUsage, err)
	}
	if *logDir != "" {
		if err := os.MkdirAll(*logDir, 0o755); err != nil {
			return fmt.Errorf("local: --log-dir: %w", err)
		}
	}
	if *config == "" || *n < 1 {
		return fmt.Errorf("local: --config and -n ≥ 1 are required: %w", errUsage)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// A lost peer stops the others unless the job lets fewer carry on
	// (min_world_size); a config that does not load is the peers' to report.
	minWorld := *n
	if jc, err := loadJobConfig(*config); err == nil {
		minWorld = jc.MinWorldSize
		if *n < jc.WorldSize {
			return fmt.Errorf("local: -n %d starts fewer peers than the config's world_size %d, so the ring would never form; start at least %d: %w",
				*n, jc.WorldSize, jc.WorldSize, errUsage)
		}
	}
	var view *display
	if *logFormat == "auto" {
		if isTerminal(stdout) {
			view = newDisplay(stdout)
			defer view.close()
		}
		*logFormat = "json"
	}
	var logTo io.Writer = io.Discard
	if *logFile != "" {
		file, err := os.OpenFile(*logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("local: --log-file: %w", err)
		}
		defer file.Close()
		logTo = file
	}
	var failed atomic.Int32
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var out sync.Mutex // one line at a time
	common := []string{"join", "--config", *config, "--listen", "/ip4/127.0.0.1/tcp/0",
		"--data-plane", *plane, "--log-format", *logFormat, "--log-level", *logLevel}
	if *model != "" {
		common = append(common, "--model", *model)
	}
	if *device != "" {
		common = append(common, "--device", *device)
	}
	common = append(common, devOpt.args()...)
	if *metrics != "" {
		common = append(common, "--metrics", *metrics)
	}
	common = append(common, "--threads", strconv.Itoa(peerThreads(*threads, *n, runtime.NumCPU())))
	for _, b := range boots {
		common = append(common, "--bootstrap", b)
	}
	errs := make([]error, *n)
	var wg sync.WaitGroup
	firstGone := make(chan struct{}) // peer 0's output has ended
	start := func(i int, extra []string, firstAddr chan<- string) error {
		args := append(append([]string(nil), common...), extra...)
		if *logDir != "" {
			args = append(args, "--log-file", filepath.Join(*logDir, fmt.Sprintf("peer-%d.jsonl", i)))
		}
		if *traceFile != "" {
			args = append(args, "--trace", peerTrace(*traceFile, i))
		}
		cmd := exec.CommandContext(ctx, self, args...)
		// Stop a peer the way Ctrl-C would, so it can leave cleanly; kill
		// it if it has not gone ten seconds later.
		cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
		cmd.WaitDelay = 10 * time.Second
		po, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		pe, err := cmd.StderrPipe()
		if err != nil {
			return err
		}
		statusR, statusW, err := os.Pipe()
		if err != nil {
			return err
		}
		cmd.ExtraFiles = []*os.File{statusW} // the peer's fd 3
		cmd.Env = append(os.Environ(), statusFDEnv+"=3")
		err = cmd.Start()
		statusW.Close() // the peer holds its own copy
		if err != nil {
			statusR.Close()
			return err
		}
		p := &peerOut{peer: i, prefix: fmt.Sprintf("[peer %d] ", i), mu: &out, view: view, log: logTo}
		p.println(stdout, fmt.Sprintf("started, pid %d", cmd.Process.Pid))
		var copies sync.WaitGroup
		copies.Go(func() {
			p.copy(po, stdout, firstAddr)
			if firstAddr != nil {
				close(firstGone)
			}
		})
		copies.Go(func() { p.copy(pe, stderr, nil) })
		copies.Go(func() { p.status(statusR) })
		wg.Go(func() {
			copies.Wait()
			if err := cmd.Wait(); err != nil {
				errs[i] = fmt.Errorf("peer %d: %w", i, err)
				if view != nil {
					view.failed(i, err)
				}
				if *n-int(failed.Add(1)) < minWorld {
					cancel() // too few left: the ring cannot finish
				}
			}
		})
		return nil
	}
	addr := make(chan string, 1)
	if err := start(0, nil, addr); err != nil {
		return err
	}
	// The others need peer 0's address; if it ends first (a bad config,
	// a crash), they are never started and its error is what local says.
	startOthers := func(a string) {
		for i := 1; i < *n; i++ {
			if err := start(i, []string{"--bootstrap", a}, nil); err != nil {
				cancel()
				errs[i] = err
				break
			}
		}
	}
	select {
	case a := <-addr:
		startOthers(a)
	case <-firstGone:
		select {
		case a := <-addr: // printed just before it ended
			startOthers(a)
		default:
			cancel()
		}
	case <-ctx.Done():
	}
	wg.Wait()
	if *traceFile != "" {
		// What the peers left, a failed run's included, on one clock.
		var parts []string
		for i := range *n {
			if _, err := os.Stat(peerTrace(*traceFile, i)); err == nil {
				parts = append(parts, peerTrace(*traceFile, i))
			}
		}
		if err := mergeTraces(*traceFile, parts); err != nil {
			errs = append(errs, fmt.Errorf("--trace: %w", err))
		} else {
			for _, p := range parts {
				os.Remove(p)
			}
			line := fmt.Sprintf("timeline of %d peers: %s (open it in Perfetto)", len(parts), *traceFile)
			if view != nil {
				view.println(line) // not across the bars being drawn
			} else {
				fmt.Fprintln(stdout, line)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("local: %w", err)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("local: %w", ctx.Err())
	}
	return nil
}

// peerOut passes one peer's output on: prefixed with "[peer i] " until
// its status records say which rank it got, "[rank r] " after; or, with a
// live display, to the log file, and to the display what is not a log
// record (a crash's output, say).
type peerOut struct {
	peer   int
	mu     *sync.Mutex // shared by all peers: one line at a time
	prefix string      // guarded by mu
	view   *display    // nil without the live display
	log    io.Writer   // with the display, where output goes; guarded by mu
}

func (p *peerOut) println(w io.Writer, line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.view == nil {
		fmt.Fprintf(w, "%s%s\n", p.prefix, line)
		return
	}
	if r, ok := parseStatus([]byte(line)); ok {
		fmt.Fprintf(p.log, `{"peer":%d,%s`+"\n", p.peer, strings.TrimPrefix(line, "{"))
		if r.Level != "panic" {
			return
		}
	} else {
		fmt.Fprintf(p.log, "%s%s\n", p.prefix, line)
	}
	if w != io.Discard && !strings.HasPrefix(line, "listening on ") && !strings.HasPrefix(line, "started, pid") {
		if !duplicatesEvent(line) && !strings.HasPrefix(line, "job ") {
			p.view.println(p.prefix + line)
		}
	}
}

// status reads the peer's status records: its rank, for the prefix, and
// with the display, everything the display shows.
func (p *peerOut) status(r io.ReadCloser) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		rec, ok := parseStatus(sc.Bytes())
		if !ok {
			continue
		}
		if rec.Rank != nil && strings.Contains(rec.Message, "formed") {
			p.mu.Lock()
			p.prefix = fmt.Sprintf("[rank %d] ", *rec.Rank)
			p.mu.Unlock()
		}
		if p.view != nil {
			p.view.record(p.peer, rec)
		}
	}
	io.Copy(io.Discard, r)
}

// copy copies r to w line by line. The first "listening on" address of a
// loopback peer goes to addr, if not nil.
func (p *peerOut) copy(r io.Reader, w io.Writer, addr chan<- string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if a, ok := strings.CutPrefix(line, "listening on "); ok && addr != nil && strings.Contains(a, "/127.0.0.1/") {
			addr <- a
			addr = nil
		}
		p.println(w, line)
	}
	io.Copy(io.Discard, r)
}

// peerTrace is where peer i of local writes its timeline.
func peerTrace(file string, i int) string { return fmt.Sprintf("%s.peer-%d", file, i) }

// peerThreads is each of n local peers' thread budget: what was asked, or
// the cpus shared out, at least one each.
func peerThreads(asked, n, cpus int) int {
	if asked > 0 {
		return asked
	}
	return max(1, cpus/max(1, n))
}
