package pipeline

import "testing"

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
