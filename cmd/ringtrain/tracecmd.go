package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ringtrain/ringtrain/train"
	"github.com/ringtrain/ringtrain/train/trace"
)

// traceEvents puts the job's events, read from the peer's JSON log
// records, into its timeline as instants, and names the timeline by the
// peer's rank once the ring forms.
type traceEvents struct{ f *trace.File }

func (w traceEvents) Write(b []byte) (int, error) {
	now := time.Now()
	for _, line := range strings.Split(string(b), "\n") {
		r, ok := parseStatus([]byte(line))
		if !ok || !isEvent(r) {
			continue
		}
		args := map[string]any{}
		if r.Rank != nil {
			args["rank"] = *r.Rank
			if strings.Contains(r.Message, "formed") {
				w.f.SetName(fmt.Sprintf("rank %d", *r.Rank))
			}
		}
		if r.Generation > 0 {
			args["generation"] = r.Generation
		}
		if r.Error != "" {
			args["error"] = r.Error
		}
		w.f.Instant(r.Message, now, args)
	}
	return len(b), nil
}

// tracerOf is f as a train.Tracer: nil if f is (an interface holding a
// nil pointer would not be).
func tracerOf(f *trace.File) train.Tracer {
	if f == nil {
		return nil
	}
	return f
}

// joinWriters writes to both that are not nil.
func joinWriters(a, b io.Writer) io.Writer {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return io.MultiWriter(a, b)
}

// runTrace is `ringtrain trace merge -o all.json PEER.json...`: the peers'
// timelines on one clock, each a process of its own.
func runTraceMerge(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("trace merge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "trace.json", "the merged trace to write")
	files, err := parseWithFiles(fs, args)
	if err != nil {
		return fmt.Errorf("trace merge: %w: %w", errUsage, err)
	}
	if len(files) == 0 {
		return fmt.Errorf("trace merge: name the peers' trace files (join --trace): %w", errUsage)
	}
	if err := mergeTraces(*out, files); err != nil {
		return fmt.Errorf("trace merge: %w", err)
	}
	fmt.Fprintf(stdout, "%d traces merged into %s\n", len(files), *out)
	return nil
}

// mergeTraces merges the trace files into out.
func mergeTraces(out string, files []string) error {
	var peers [][]trace.Event
	for _, p := range files {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		evs, err := trace.Read(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		peers = append(peers, evs)
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	return errors.Join(trace.Merge(f, peers...), f.Close())
}
