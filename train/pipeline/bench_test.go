package pipeline

import (
	"testing"
	"time"
)

// The benchmark runs and its figures hang together (speed is measured by
// make bench-pipeline, not asserted here).
func TestBenchRuns(t *testing.T) {
	var rows []BenchResult
	err := Bench(BenchConfig{Width: 32, Blocks: 4, Batch: 16, MicroBatches: 4, Reps: 1, Stages: []int{1, 2}, Schedules: []Kind{OneFOneB, GPipe}},
		func(r BenchResult) { rows = append(rows, r) })
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows; want 4", len(rows))
	}
	for _, r := range rows {
		if r.Step <= 0 || r.Bottleneck <= 0 || r.Speedup <= 0 || len(r.PeakInFlight) != r.Stages {
			t.Errorf("%+v", r)
		}
	}
	if rows[1].PeakInFlight[0] != 2 || rows[3].PeakInFlight[0] != 4 {
		t.Errorf("1f1b peak %v, gpipe peak %v; want 2 and 4 on stage 0", rows[1].PeakInFlight, rows[3].PeakInFlight)
	}
}

// With a pace, every stage waits as a device would: each stage's busy
// time holds at least its share of the waits (a lower bound; sleeps are
// never shorter), so all stages cost the same.
func TestBenchPaced(t *testing.T) {
	const pace = 2 * time.Millisecond
	var rows []BenchResult
	err := Bench(BenchConfig{Width: 8, Blocks: 4, Batch: 8, MicroBatches: 4, Reps: 1, Stages: []int{1, 2}, Schedules: []Kind{OneFOneB}, Pace: pace},
		func(r BenchResult) { rows = append(rows, r) })
	if err != nil {
		t.Fatal(err)
	}
	// One stage: 4 micro-batches × 4 blocks × 3 paces (forward in the
	// backward call); two: each stage 4 × 2 blocks × 4 paces.
	for i, least := range []time.Duration{48 * pace, 32 * pace} {
		if rows[i].Busy < least || rows[i].Bottleneck < least {
			t.Errorf("S=%d: busy %v, alone %v; want at least %v", rows[i].Stages, rows[i].Busy, rows[i].Bottleneck, least)
		}
	}
}
