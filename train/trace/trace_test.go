package trace

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A trace written as a run goes reads back whole, terminated or not.
func TestFileReadsBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "peer.json")
	f, err := Create(path, "peer 0")
	if err != nil {
		t.Fatal(err)
	}
	t0 := f.start.Add(time.Millisecond)
	f.Span("forward", t0, t0.Add(2*time.Millisecond), 1, -1)
	f.Span("allreduce", t0.Add(3*time.Millisecond), t0.Add(5*time.Millisecond), 1, 2)
	f.SetName("rank 1")
	f.Instant("ring formed", t0, map[string]any{"generation": 1})
	f.mu.Lock()
	f.w.Flush() // what a killed peer leaves
	f.mu.Unlock()
	cut, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(whole) {
		t.Fatalf("a closed trace is not JSON:\n%s", whole)
	}
	// A kill may cut the last line just after a comma inside it.
	last := bytes.LastIndexByte(bytes.TrimRight(cut, ",\n"), '\n')
	afterComma := cut[:last+1+bytes.IndexByte(cut[last+1:], ',')+1]
	for name, b := range map[string][]byte{"closed": whole, "unterminated": cut, "cut mid-line": cut[:len(cut)-7], "cut mid-line after a comma": afterComma} {
		evs, err := Read(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := map[string]Event{}
		for _, e := range evs {
			got[e.Name] = e
		}
		if e := got["forward"]; e.Phase != "X" || e.TS != 1000 || e.Dur != 2000 || e.TID != LaneCompute {
			t.Errorf("%s: forward %+v", name, e)
		}
		if e := got["allreduce bucket 2"]; e.TID != LaneRing || e.Args["bucket"] != 2.0 {
			t.Errorf("%s: allreduce %+v", name, e)
		}
		if s, ok := Start(evs); !ok || s != f.start.UnixMicro() {
			t.Errorf("%s: start %d, %v", name, s, ok)
		}
		if !strings.HasPrefix(name, "cut mid-line") && got["ring formed"].Phase != "i" {
			t.Errorf("%s: ring formed %+v", name, got["ring formed"])
		}
	}
}

// Merged traces share one clock: a peer that started 1.5 ms after the
// other has its events 1500 µs later.
func TestMergeAlignsClocks(t *testing.T) {
	peer := func(start int64, ts float64) []Event {
		return []Event{
			{Name: "process_name", Phase: "M", PID: 1, Args: map[string]any{"name": "x", startArg: float64(start)}},
			{Name: "forward", Phase: "X", TS: ts, Dur: 10, PID: 1, TID: LaneCompute},
		}
	}
	var out bytes.Buffer
	if err := Merge(&out, peer(1_000_000_001_500, 100), peer(1_000_000_000_000, 100)); err != nil {
		t.Fatal(err)
	}
	evs, err := Read(&out)
	if err != nil {
		t.Fatal(err)
	}
	ts := map[int]float64{}
	for _, e := range evs {
		if e.Name == "forward" {
			ts[e.PID] = e.TS
		}
	}
	if ts[1] != 1600 || ts[2] != 100 {
		t.Errorf("forward at %v; want pid 1 at 1600 µs, pid 2 at 100", ts)
	}
	if err := Merge(&out, []Event{{Name: "forward", Phase: "X"}}); err == nil || !strings.Contains(err.Error(), "not a ringtrain trace") {
		t.Errorf("a file without its start: %v", err)
	}
}

func FuzzRead(f *testing.F) {
	f.Add([]byte(`[` + "\n" + `{"name":"process_name","ph":"M","pid":1,"tid":0,"ts":0,"args":{"name":"a","start_unix_us":5}},` + "\n"))
	f.Add([]byte(`{"traceEvents":[{"name":"x","ph":"X","ts":1,"pid":1,"tid":1}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		evs, err := Read(bytes.NewReader(b))
		if err != nil {
			return
		}
		var out bytes.Buffer
		if Merge(&out, evs) == nil && !json.Valid(out.Bytes()) {
			t.Fatalf("merged %q into invalid JSON", b)
		}
	})
}

// A peer killed loses at most the last flushEvery of its timeline: what was
// written before that is on disk without Close.
func TestFileFlushesAsItGoes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "peer.json")
	f, err := Create(path, "peer 0")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Span("forward", f.start, f.start.Add(time.Millisecond), 1, -1)
	f.mu.Lock()
	f.flushed = f.flushed.Add(-flushEvery) // a second passes
	f.mu.Unlock()
	f.Span("optimizer", f.start, f.start.Add(time.Millisecond), 1, -1)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := Read(bytes.NewReader(b))
	if err != nil || len(evs) == 0 || evs[len(evs)-1].Name != "optimizer" {
		t.Fatalf("on disk before Close: %v, %s; want the events up to the optimizer span", err, b)
	}
}

// Trained writes the indices through at once: a peer killed right after a
// step loses none of what it trained.
func TestTrainedIsWrittenThrough(t *testing.T) {
	path := filepath.Join(t.TempDir(), "peer.json")
	f, err := Create(path, "peer 0")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Trained(3, 64, []int{5, 9, 2})
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := Read(bytes.NewReader(b))
	if err != nil || len(evs) == 0 {
		t.Fatalf("on disk before Close: %v, %s", err, b)
	}
	last := evs[len(evs)-1]
	ix, _ := last.Args["index"].([]any)
	if last.Name != TrainedEvent || last.Args["epoch"] != float64(3) || last.Args["from"] != float64(64) || len(ix) != 3 || ix[1] != float64(9) {
		t.Fatalf("the last event on disk: %+v; want epoch 3's block from 64, indices 5, 9, 2", last)
	}
}
