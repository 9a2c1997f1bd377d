package ringbench

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/ringtrain/ringtrain/ring"
)

func TestRunEmitsARowPerSize(t *testing.T) {
	for _, tr := range []string{"mem", "tcp"} {
		var rows []Result
		err := Run(context.Background(), Builtin(), Config{Transport: tr, Peers: 3, Sizes: []int{4096, 1 << 16}, Iters: 1},
			func(r Result) { rows = append(rows, r) })
		if err != nil {
			t.Fatalf("Run(%s): %v", tr, err)
		}
		if len(rows) != 2 {
			t.Fatalf("Run(%s) gave %d rows; want 2", tr, len(rows))
		}
		for _, r := range rows {
			if r.Seconds <= 0 || r.Busbw <= 0 || r.CeilingBusbw <= 0 || math.Abs(r.Busbw-r.Algbw*4/3) > 1e-9*r.Busbw {
				t.Errorf("Run(%s) row %+v: want positive figures and busbw = algbw·2(n−1)/n", tr, r)
			}
		}
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{Transport: "carrier-pigeon", Peers: 2, Sizes: []int{4}}, "unknown transport"},
		{Config{Transport: "mem", Peers: 1, Sizes: []int{4}}, "at least 2"},
		{Config{Transport: "mem", Peers: 2, Sizes: []int{6}}, "multiple of 4"},
	}
	for _, tt := range tests {
		err := Run(context.Background(), Builtin(), tt.cfg, func(Result) {})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Run(%+v) = %v; want an error saying %q", tt.cfg, err, tt.want)
		}
	}
}

// TestRunRankAndCombine: ranks run apart (here goroutines over an
// in-memory ring) and Combine makes their row — each round as long as its
// slowest rank — and refuses results that do not belong together.
func TestRunRankAndCombine(t *testing.T) {
	const n = 3
	cfg := Config{Peers: n, Sizes: []int{4096, 1 << 16}, Iters: 3}
	ts := ring.MemRing(n)
	got := make([][]RankResult, n)
	err := onAll(n, func(i int) error {
		return RunRank(context.Background(), ts[i], i, cfg, func(r RankResult) { got[i] = append(got[i], r) })
	})
	if err != nil {
		t.Fatal(err)
	}
	for s, size := range cfg.Sizes {
		rs := []RankResult{got[0][s], got[1][s], got[2][s]}
		row, err := Combine("mem", rs)
		if err != nil {
			t.Fatal(err)
		}
		slowest := 0.0
		for _, r := range rs {
			if r.Bytes != size || len(r.Seconds) != cfg.Iters {
				t.Fatalf("rank %d: %d rounds of %d bytes; want %d of %d", r.Rank, len(r.Seconds), r.Bytes, cfg.Iters, size)
			}
			slowest = max(slowest, slices.Max(r.Seconds))
		}
		if row.Peers != n || row.Bytes != size || row.Seconds <= 0 || row.Seconds > slowest || math.Abs(row.Busbw-row.Algbw*4/3) > 1e-9*row.Busbw {
			t.Errorf("row %+v", row)
		}
	}
	// Two ranks, three rounds: the slowest rank's times 2, 4 and 3 s, the
	// ranks' means 1.5, 3 and 2 s; medians 3 and 2 s. (Two ranks: busbw is
	// algbw.)
	row, err := Combine("mem", []RankResult{{Rank: 0, Bytes: 3 << 30, Seconds: []float64{1, 2, 3}}, {Rank: 1, Bytes: 3 << 30, Seconds: []float64{2, 4, 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if want := float64(3<<30) / 3 / 1e9; math.Abs(row.Busbw-want) > 1e-9 {
		t.Errorf("busbw %v; want %v (the slowest rank's median round)", row.Busbw, want)
	}
	if want := float64(3<<30) / 2 / 1e9; math.Abs(row.RankAvgBusbw-want) > 1e-9 {
		t.Errorf("rank-average busbw %v; want %v", row.RankAvgBusbw, want)
	}
	bad := [][]RankResult{
		{got[0][0]},                       // one rank
		{got[0][0], got[0][0], got[2][0]}, // rank 0 twice
		{got[0][0], got[1][1], got[2][0]}, // another size
		{got[0][0], {Rank: 7}, got[2][0]}, // out of the ring
	}
	for i, rs := range bad {
		if _, err := Combine("mem", rs); err == nil {
			t.Errorf("case %d: combined results that do not belong together", i)
		}
	}
}
