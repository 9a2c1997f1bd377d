// Package trace writes a peer's training timeline as Chrome trace-event
// JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open: each
// phase of every step as a span — data, forward, backward, each
// allreduce bucket, the optimizer — on a compute lane and a ring lane,
// and the job's events (the ring formed, a peer lost, a checkpoint) as
// instants. Merge puts several peers' files on one clock.
//
// A file is the format's JSON array form, one event a line, written as
// the run goes; the viewers accept it unterminated, so a peer that is
// killed still leaves a trace that opens. Timestamps are microseconds
// since the file was created; its first event says when that was in Unix
// time, which is what Merge aligns the files by (so peers on several
// machines line up as well as their clocks agree).
package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

// The lanes (trace-event threads) of a peer's timeline.
const (
	LaneCompute = 1 // data, forward, backward, optimizer
	LaneRing    = 2 // allreduces and the waits in them
	LaneEvents  = 3 // the job's events
)

// Event is one trace event, as the format has it.
type Event struct {
	Name  string         `json:"name"`
	Phase string         `json:"ph"`
	TS    float64        `json:"ts"` // microseconds
	Dur   float64        `json:"dur,omitempty"`
	PID   int            `json:"pid"`
	TID   int            `json:"tid"`
	Scope string         `json:"s,omitempty"`
	Args  map[string]any `json:"args,omitempty"`
}

// startArg is the argument of a file's first event that says when its
// clock started, in Unix microseconds.
const startArg = "start_unix_us"

// File is one peer's trace, written as events come; safe for concurrent
// use.
type File struct {
	mu    sync.Mutex
	f     *os.File
	w     *bufio.Writer
	start time.Time
	err   error // the first write that failed
	// flushed is when the buffer was last written out: at most every
	// flushEvery, so that a peer killed loses under a second of its
	// timeline, not the buffer's last 64 KiB (a hundred steps).
	flushed time.Time
}

// flushEvery is how often a trace's buffer is written out as a run goes.
const flushEvery = time.Second

// Create starts a trace at path, named name (the peer's, until SetName).
func Create(path, name string) (*File, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	t := &File{f: f, w: bufio.NewWriterSize(f, 64<<10), start: time.Now()}
	t.flushed = t.start
	t.w.WriteString("[\n")
	t.SetName(name)
	for lane, name := range map[int]string{LaneCompute: "compute", LaneRing: "ring", LaneEvents: "events"} {
		t.write(Event{Name: "thread_name", Phase: "M", PID: 1, TID: lane, Args: map[string]any{"name": name}})
	}
	return t, t.err
}

// SetName names the peer's timeline (its rank, once it has one).
func (t *File) SetName(name string) {
	t.write(Event{Name: "process_name", Phase: "M", PID: 1, Args: map[string]any{"name": name, startArg: t.start.UnixMicro()}})
}

func (t *File) us(at time.Time) float64 {
	return float64(at.Sub(t.start).Nanoseconds()) / 1e3
}

// Span is a phase of a step, from start to end (train.Tracer): on the
// ring lane for an allreduce or a wait, on the compute lane otherwise.
func (t *File) Span(name string, start, end time.Time, step, bucket int) {
	lane := LaneCompute
	args := map[string]any{"step": step}
	if name == "allreduce" || name == "wait" {
		lane = LaneRing
	}
	if bucket >= 0 {
		args["bucket"] = bucket
		name += " bucket " + strconv.Itoa(bucket)
	}
	t.write(Event{Name: name, Phase: "X", TS: t.us(start), Dur: max(t.us(end)-t.us(start), 0), PID: 1, TID: lane, Args: args})
}

// Trained records a step's whole block once the step is applied
// (train.RunConfig.Blocks: its first position in the epoch's permutation
// and its dataset indices) as a "trained" instant with args epoch, from
// and index, and writes the buffer out at once: a count of every sample
// trained, over peers that may be SIGKILLed, must lose none of the steps
// they applied. (What the kernel has been given survives the process.)
func (t *File) Trained(epoch, from int, index []int) {
	now := time.Now()
	t.write(Event{Name: TrainedEvent, Phase: "i", Scope: "p", TS: t.us(now), PID: 1, TID: LaneEvents,
		Args: map[string]any{"epoch": epoch, "from": from, "index": index}})
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err == nil {
		t.flushed, t.err = now, t.w.Flush()
	}
}

// TrainedEvent names the instants Trained writes.
const TrainedEvent = "trained"

// Instant is an event of the job at a moment: the ring formed, a peer
// lost, a checkpoint written.
func (t *File) Instant(name string, at time.Time, args map[string]any) {
	t.write(Event{Name: name, Phase: "i", Scope: "p", TS: t.us(at), PID: 1, TID: LaneEvents, Args: args})
}

func (t *File) write(e Event) {
	b, err := json.Marshal(e)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return
	}
	if err == nil {
		b = append(b, ",\n"...)
		_, err = t.w.Write(b)
	}
	if now := time.Now(); err == nil && now.Sub(t.flushed) >= flushEvery {
		t.flushed, err = now, t.w.Flush()
	}
	t.err = err
}

// Close ends the array and the file; it returns the first error met
// writing the trace.
func (t *File) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	// A last metadata event, so that the array needs no trailing comma.
	if t.err == nil {
		b, _ := json.Marshal(Event{Name: "trace_end", Phase: "M", PID: 1, TS: t.us(time.Now())})
		t.w.Write(append(b, "\n]\n"...))
		t.err = t.w.Flush()
	}
	return errors.Join(t.err, t.f.Close())
}

// Read parses a trace file: the JSON array form, terminated or not (a
// peer killed before Close), or the object form with traceEvents.
func Read(r io.Reader) ([]Event, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '{' {
		var obj struct {
			TraceEvents []Event `json:"traceEvents"`
		}
		if err := json.Unmarshal(b, &obj); err != nil {
			return nil, fmt.Errorf("trace: %w", err)
		}
		return obj.TraceEvents, nil
	}
	if len(b) == 0 || b[0] != '[' {
		return nil, errors.New("trace: not a trace-event JSON array or object")
	}
	if b[len(b)-1] != ']' {
		// Unterminated: a line a kill cut short goes — one that is no
		// JSON value without its comma, wherever the cut fell (after a
		// comma inside it too) — then the comma.
		if i := bytes.LastIndexByte(b, '\n'); i > 0 && !json.Valid(bytes.TrimRight(b[i+1:], ", ")) {
			b = b[:i]
		}
		b = append(bytes.TrimRight(b, ",\n "), ']')
	}
	var evs []Event
	if err := json.Unmarshal(b, &evs); err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	return evs, nil
}

// Start is when a file's clock started, from its process_name event.
func Start(evs []Event) (int64, bool) {
	for _, e := range evs {
		if e.Phase == "M" && e.Name == "process_name" {
			if v, ok := e.Args[startArg].(float64); ok {
				return int64(v), true
			}
		}
	}
	return 0, false
}

// Merge puts the peers' traces on one clock — the earliest start is time
// zero — each as a process of its own (pid i+1 for the i-th), and writes
// them as one trace in the object form.
func Merge(w io.Writer, peers ...[]Event) error {
	starts := make([]int64, len(peers))
	for i, evs := range peers {
		s, ok := Start(evs)
		if !ok {
			return fmt.Errorf("trace %d of %d: no process_name event with %s: not a ringtrain trace", i+1, len(peers), startArg)
		}
		starts[i] = s
	}
	if len(peers) == 0 {
		return errors.New("trace: nothing to merge")
	}
	zero := slices.Min(starts)
	var all []Event
	for i, evs := range peers {
		shift := float64(starts[i] - zero)
		last := -1
		for j, e := range evs {
			if e.Phase == "M" && e.Name == "process_name" {
				last = j
			}
		}
		for j, e := range evs {
			if e.Phase == "M" && e.Name == "process_name" && j != last {
				continue // named again later (its rank): the last name holds
			}
			e.PID = i + 1
			if e.Phase != "M" {
				e.TS += shift
			}
			all = append(all, e)
		}
	}
	return json.NewEncoder(w).Encode(struct {
		TraceEvents     []Event `json:"traceEvents"`
		DisplayTimeUnit string  `json:"displayTimeUnit"`
	}{all, "ms"})
}
