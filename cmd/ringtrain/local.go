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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/devices"
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
	f, err := parseLocalFlags(args, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	l := &localRun{f: f, stdout: stdout, stderr: stderr, ctx: ctx, cancel: cancel, logTo: io.Discard,
		errs: make([]error, f.n), firstGone: make(chan struct{})}
	err = l.prepare()
	if l.view != nil {
		defer l.view.close()
	}
	if l.file != nil {
		defer l.file.Close()
	}
	if err != nil {
		return err
	}
	addr := make(chan string, 1)
	if err := l.start(0, nil, addr); err != nil {
		return err
	}
	// The others need peer 0's address; if it ends first (a bad config,
	// a crash), they are never started and its error is what local says.
	select {
	case a := <-addr:
		l.startOthers(a)
	case <-l.firstGone:
		select {
		case a := <-addr: // printed just before it ended
			l.startOthers(a)
		default:
			cancel()
		}
	case <-ctx.Done():
	}
	l.wg.Wait()
	if f.traceFile != "" {
		l.mergeTrace()
	}
	if err := errors.Join(l.errs...); err != nil {
		return fmt.Errorf("local: %w", err)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("local: %w", ctx.Err())
	}
	return nil
}

// localFlags are local's command line.
type localFlags struct {
	n, threads                                  int
	config, plane, logFormat, logFile, logLevel string
	model, device, metrics, traceFile, logDir   string
	boots                                       stringList
	devOpt                                      *devices.Options
}

func parseLocalFlags(args []string, stderr io.Writer) (*localFlags, error) {
	f := &localFlags{}
	fs := flag.NewFlagSet("local", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&f.n, "n", 3, "peers to start")
	fs.StringVar(&f.config, "config", "", "job config (JSON)")
	fs.StringVar(&f.plane, "data-plane", "tls", "the peers' --data-plane: tls, libp2p or tcp")
	fs.StringVar(&f.logFormat, "log-format", "auto", "the peers' --log-format; auto: a live display on a terminal (the logs to --log-file), json lines otherwise")
	fs.StringVar(&f.logFile, "log-file", "", "with the live display, every peer's log lines (JSON, each with its peer number) and output go to this file")
	fs.StringVar(&f.logLevel, "log-level", "info", "the peers' --log-level")
	fs.StringVar(&f.model, "model", "", "the peers' --model (a built-in model instead of the config's)")
	fs.StringVar(&f.device, "device", "", "the peers' --device: cpu, cuda or host")
	f.devOpt = devices.AddFlags(fs)
	fs.StringVar(&f.metrics, "metrics", "", "the peers' --metrics; with port 0 each peer picks its own and prints it")
	fs.IntVar(&f.threads, "threads", 0, "each peer's --threads (default: the cores divided by -n, at least 1, so the peers do not fight over cores)")
	fs.Var(&f.boots, "bootstrap", "a peer every one of them also starts from (repeatable): a data node (ringtrain serve) for a job on served data, or a bootstrap peer")
	fs.StringVar(&f.traceFile, "trace", "", "write every peer's timeline, on one clock, to FILE as Chrome trace-event JSON (open it in Perfetto)")
	fs.StringVar(&f.logDir, "log-dir", "", "write peer i's log as JSON lines to DIR/peer-i.jsonl too (for ringtrain plot)")
	if err := parseFlags(fs, args); err != nil {
		return nil, fmt.Errorf("local: %w: %w", errUsage, err)
	}
	if f.config == "" || f.n < 1 {
		return nil, fmt.Errorf("local: --config and -n ≥ 1 are required: %w", errUsage)
	}
	return f, nil
}

// peerArgs are the join command line every peer gets.
func (f *localFlags) peerArgs() []string {
	a := []string{"join", "--config", f.config, "--listen", "/ip4/127.0.0.1/tcp/0",
		"--data-plane", f.plane, "--log-format", f.logFormat, "--log-level", f.logLevel}
	if f.model != "" {
		a = append(a, "--model", f.model)
	}
	if f.device != "" {
		a = append(a, "--device", f.device)
	}
	a = append(a, f.devOpt.Args()...)
	if f.metrics != "" {
		a = append(a, "--metrics", f.metrics)
	}
	a = append(a, "--threads", strconv.Itoa(peerThreads(f.threads, f.n, runtime.NumCPU())))
	for _, b := range f.boots {
		a = append(a, "--bootstrap", b)
	}
	return a
}

// localRun is one run of local: the peers it started and what became of
// them.
type localRun struct {
	f              *localFlags
	stdout, stderr io.Writer
	ctx            context.Context
	cancel         context.CancelFunc
	self           string // this binary, which every peer runs
	minWorld       int    // the fewest peers the job carries on with
	view           *display
	file           *os.File  // --log-file, if any
	logTo          io.Writer // with the display, where the peers' output goes
	out            sync.Mutex
	common         []string
	errs           []error // each peer's end
	failed         atomic.Int32
	wg             sync.WaitGroup
	firstGone      chan struct{} // peer 0's output has ended
}

// prepare checks what the peers will need and opens where their output
// goes.
func (l *localRun) prepare() error {
	f := l.f
	if f.logDir != "" {
		if err := os.MkdirAll(f.logDir, 0o755); err != nil {
			return fmt.Errorf("local: --log-dir: %w", err)
		}
	}
	var err error
	if l.self, err = os.Executable(); err != nil {
		return err
	}
	// A lost peer stops the others unless the job lets fewer carry on
	// (min_world_size); a config that does not load is the peers' to report.
	l.minWorld = f.n
	if jc, err := loadJobConfig(f.config); err == nil {
		l.minWorld = jc.MinWorldSize
		if f.n < jc.WorldSize {
			return fmt.Errorf("local: -n %d starts fewer peers than the config's world_size %d, so the ring would never form; start at least %d: %w",
				f.n, jc.WorldSize, jc.WorldSize, errUsage)
		}
	}
	if f.logFormat == "auto" {
		if isTerminal(l.stdout) {
			l.view = newDisplay(l.stdout)
		}
		f.logFormat = "json"
	}
	if f.logFile != "" {
		if l.file, err = os.OpenFile(f.logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644); err != nil {
			return fmt.Errorf("local: --log-file: %w", err)
		}
		l.logTo = l.file
	}
	l.common = f.peerArgs()
	return nil
}

// start starts peer i with the common arguments and extra; the first
// address it listens on goes to firstAddr, if not nil. Stopped with the
// run, a peer is interrupted as Ctrl-C would, so it can leave cleanly,
// and killed if it has not gone ten seconds later.
func (l *localRun) start(i int, extra []string, firstAddr chan<- string) error {
	f := l.f
	args := append(slices.Clone(l.common), extra...)
	if f.logDir != "" {
		args = append(args, "--log-file", filepath.Join(f.logDir, fmt.Sprintf("peer-%d.jsonl", i)))
	}
	if f.traceFile != "" {
		args = append(args, "--trace", peerTrace(f.traceFile, i))
	}
	cmd := exec.CommandContext(l.ctx, l.self, args...)
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
	p := &peerOut{peer: i, prefix: fmt.Sprintf("[peer %d] ", i), mu: &l.out, view: l.view, log: l.logTo}
	p.println(l.stdout, fmt.Sprintf("started, pid %d", cmd.Process.Pid))
	var copies sync.WaitGroup
	copies.Go(func() {
		p.copy(po, l.stdout, firstAddr)
		if firstAddr != nil {
			close(l.firstGone)
		}
	})
	copies.Go(func() { p.copy(pe, l.stderr, nil) })
	copies.Go(func() { p.status(statusR) })
	l.wg.Go(func() {
		copies.Wait()
		l.ended(i, cmd.Wait())
	})
	return nil
}

// ended records how peer i ended; with too few left for the ring to
// finish, the others are stopped.
func (l *localRun) ended(i int, err error) {
	if err == nil {
		return
	}
	l.errs[i] = fmt.Errorf("peer %d: %w", i, err)
	if l.view != nil {
		l.view.failed(i, err)
	}
	if l.f.n-int(l.failed.Add(1)) < l.minWorld {
		l.cancel()
	}
}

// startOthers starts peers 1 to n−1, pointed at peer 0's address.
func (l *localRun) startOthers(addr string) {
	for i := 1; i < l.f.n; i++ {
		if err := l.start(i, []string{"--bootstrap", addr}, nil); err != nil {
			l.cancel()
			l.errs[i] = err
			return
		}
	}
}

// mergeTrace merges what the peers left of their timelines, a failed
// run's included, into --trace, on one clock.
func (l *localRun) mergeTrace() {
	file := l.f.traceFile
	var parts []string
	for i := range l.f.n {
		if _, err := os.Stat(peerTrace(file, i)); err == nil {
			parts = append(parts, peerTrace(file, i))
		}
	}
	if err := mergeTraces(file, parts); err != nil {
		l.errs = append(l.errs, fmt.Errorf("--trace: %w", err))
		return
	}
	for _, p := range parts {
		os.Remove(p)
	}
	line := fmt.Sprintf("timeline of %d peers: %s (open it in Perfetto)", len(parts), file)
	if l.view != nil {
		l.view.println(line) // not across the bars being drawn
	} else {
		fmt.Fprintln(l.stdout, line)
	}
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
		if setsRank(rec) {
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
