// Command churnreport reads what testdata/netns-churn.sh recorded of a job
// that churned — the events it caused, and each peer process's log, trace
// and resource samples — beside the same job undisturbed, prints the
// table make bench-churn shows, and with -bounds exits 1 when a figure is
// past its bound.
//
// A run's folder holds events.tsv (one line an event: Unix ms, kind —
// start, kill, int, leave, new, restart, exit — peer, incarnation, and for
// exit the status) and, per incarnation p<peer>-<inc>, its .log (JSON
// lines), .trace.json (ringtrain join --trace) and .metrics (lines of
// Unix ms, goroutines, open fds, resident bytes).
//
// Usage: go run ./internal/churnreport [-bounds] [-period 15s] [-samples N] [-min-throughput 0.8] CHURN_DIR UNDISTURBED_DIR
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

func main() {
	bounds := flag.Bool("bounds", false, "exit 1 when a figure is past its bound")
	period := flag.Duration("period", 15*time.Second, "the churn's period: the window after an event its stall is looked for in")
	samples := flag.Int("samples", 0, "the training set's samples: each must be trained once in every epoch (0: not counted)")
	minThroughput := flag.Float64("min-throughput", defaultMinThroughput, "the least undisturbed wall ÷ churned wall")
	flag.Parse()
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: churnreport [-bounds] [-period 15s] [-samples N] [-min-throughput 0.8] CHURN_DIR UNDISTURBED_DIR")
		os.Exit(2)
	}
	if err := run(os.Stdout, flag.Arg(0), flag.Arg(1), *period, *samples, *minThroughput, *bounds); err != nil {
		fmt.Fprintln(os.Stderr, "churnreport:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, churnDir, baseDir string, period time.Duration, samples int, minThroughput float64, bounds bool) error {
	churn, err := readRun(churnDir)
	if err != nil {
		return err
	}
	base, err := readRun(baseDir)
	if err != nil {
		return err
	}
	r := summarize(churn, base, period, samples)
	r.minThroughput = minThroughput
	r.print(w)
	if bad := r.broken(); bounds && len(bad) > 0 {
		return fmt.Errorf("past the bounds: %v", bad)
	}
	return nil
}
