package main

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Unix(1_000_000, 0)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

func ats(ss ...float64) []time.Time {
	var out []time.Time
	for _, s := range ss {
		out = append(out, at(s))
	}
	return out
}

func TestLongestGap(t *testing.T) {
	steps := ats(1, 2, 3, 7, 8, 9)
	for _, tc := range []struct {
		name     string
		from, to float64
		want     time.Duration
	}{
		{"the gap the window holds", 3.5, 9, 4 * time.Second},
		{"counted from the last step before the window", 2.5, 7.5, 4 * time.Second},
		{"a window past the last step runs to its end", 9, 12, 3 * time.Second},
		{"steady steps", 7, 9, time.Second},
		{"an empty window", 5, 5, 0},
	} {
		if got := longestGap(steps, at(tc.from), at(tc.to)); got != tc.want {
			t.Errorf("%s: %v; want %v", tc.name, got, tc.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if p50, p99 := percentile(ds, 50), percentile(ds, 99); p50 != 50*time.Millisecond || p99 != 99*time.Millisecond {
		t.Errorf("p50, p99 of 1..100 ms = %v, %v; want 50ms, 99ms", p50, p99)
	}
	if got := percentile([]time.Duration{3 * time.Second}, 99); got != 3*time.Second {
		t.Errorf("p99 of one = %v", got)
	}
	if got := percentile(nil, 99); got != 0 {
		t.Errorf("p99 of none = %v", got)
	}
}

// A churned run of three peers: peer 1 SIGKILLed and back, peer 2
// Ctrl-C'd and back but never admitted while the job ran on for a minute,
// peer 0 exits 1 at the end. Each must show in the figures and the bounds.
func TestSummarize(t *testing.T) {
	fin := &summary{Epochs: 2, TestAccuracy: 0.80, ParamHash: "aa"}
	churn := &record{
		events: []event{
			{at: at(0), kind: "start", peer: 0}, {at: at(0), kind: "start", peer: 1}, {at: at(0), kind: "start", peer: 2},
			{at: at(10), kind: "kill", peer: 1}, {at: at(10.1), kind: "exit", peer: 1, rc: 137},
			{at: at(12), kind: "restart", peer: 1, inc: 1},
			{at: at(20), kind: "int", peer: 2}, {at: at(20.5), kind: "exit", peer: 2},
			{at: at(22.5), kind: "restart", peer: 2, inc: 1},
			{at: at(90), kind: "exit", peer: 0, rc: 1}, {at: at(90), kind: "exit", peer: 1, inc: 1}, {at: at(90), kind: "exit", peer: 2, inc: 1},
		},
		procs: map[[2]int]*proc{
			{0, 0}: {steps: ats(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 14, 20, 21, 25, 89), summary: fin,
				samples: []sample{{at: at(5), goroutines: 50, fds: 20, residentBytes: 100}, {at: at(80), goroutines: 90, fds: 21, residentBytes: 120}}},
			{1, 0}: {steps: ats(1, 2, 3)},
			{1, 1}: {steps: ats(13.5, 89), summary: fin},
			{2, 0}: {steps: ats(1, 2, 3)},
			{2, 1}: {ended: true},
		},
	}
	base := &record{procs: map[[2]int]*proc{{0, 0}: {steps: ats(0, 60), summary: &summary{TestAccuracy: 0.82, ParamHash: "bb"}}}}
	// Epoch 1: blocks from 0 and 2, the first recorded by two ranks (one
	// training); epoch 2: sample 1 in two blocks, sample 2 in none.
	churn.procs[[2]int{0, 0}].trained = []trainedBatch{{0, 0, []int{0, 1}}, {1, 0, []int{0, 1}}, {1, 2, []int{1}}}
	churn.procs[[2]int{1, 1}].trained = []trainedBatch{{0, 0, []int{0, 1}}, {0, 2, []int{2}}}
	r := summarize(churn, base, 15*time.Second, 3)
	if r.epochs != 2 || r.uncounted != 1 || r.twice != 1 {
		t.Errorf("samples: %d epochs, %d never trained, %d twice; want 2, 1 (epoch 2's sample 2), 1 (its sample 1)", r.epochs, r.uncounted, r.twice)
	}
	if len(r.admissions) != 1 || r.admissions[0] != 1500*time.Millisecond {
		t.Errorf("admissions %v; want the restarted peer 1's 1.5 s", r.admissions)
	}
	if len(r.standbysLeft) != 1 || r.standbysLeft[0] != "p2-1" {
		t.Errorf("standbys left %v; want p2-1", r.standbysLeft)
	}
	if len(r.badExits) != 1 || !strings.Contains(r.badExits[0], "p0-0 exited 1") {
		t.Errorf("bad exits %v; want p0-0's", r.badExits)
	}
	if r.longestStall != 64*time.Second || r.goroutineGrowth != 40 {
		t.Errorf("longest stall %v, goroutine growth %v; want 64s, 40", r.longestStall, r.goroutineGrowth)
	}
	bad := strings.Join(r.broken(), "; ")
	for _, want := range []string{"left standbys", "stall p99", "throughput", "test accuracy", "exits", "goroutines grew", "samples never trained 1, trained twice 1"} {
		if !strings.Contains(bad, want) {
			t.Errorf("bounds broken: %s; want %q among them", bad, want)
		}
	}
	// Its throughput (60 s ÷ 89 s) is within a lower bound, as make test
	// sets beside other tests.
	r.minThroughput = 0.5
	if bad := strings.Join(r.broken(), "; "); strings.Contains(bad, "throughput") {
		t.Errorf("bounds broken at a 0.5× throughput bound: %s", bad)
	}
	// Without samples to count (a mode that does not count them), none is
	// held to the bound.
	uncounted := summarize(churn, base, 15*time.Second, 0)
	if bad := strings.Join(uncounted.broken(), "; "); strings.Contains(bad, "samples never trained") {
		t.Errorf("bounds broken without samples to count: %s", bad)
	}
	// A pipeline's stages each hold one hash; a stage whose replicas
	// differ breaks the bound.
	zero, one := 0, 1
	staged := func(stage *int, hash string) *summary {
		return &summary{TestAccuracy: 0.82, ParamHash: hash, Stage: stage}
	}
	for _, tt := range []struct {
		hashes []string
		want   int
	}{{[]string{"s0", "s1", "s0", "s1"}, 1}, {[]string{"s0", "s1", "s0", "xx"}, 2}} {
		pipe := &record{procs: map[[2]int]*proc{}}
		for i, h := range tt.hashes {
			stage := &zero
			if i%2 == 1 {
				stage = &one
			}
			pipe.procs[[2]int{i, 0}] = &proc{steps: ats(0, 60), summary: staged(stage, h)}
		}
		pr := summarize(pipe, base, 15*time.Second, 0)
		if pr.hashCount() != tt.want || strings.Contains(strings.Join(pr.broken(), ";"), "parameter hashes") != (tt.want != 1) {
			t.Errorf("stage hashes %v: %d a stage, bounds broken %v; want %d", tt.hashes, pr.hashCount(), pr.broken(), tt.want)
		}
	}
	var out strings.Builder
	r.print(&out)
	if !strings.Contains(out.String(), "| admissions, start to first step (1) | p50 1.50 s, p99 1.50 s |") {
		t.Errorf("the table:\n%s", out.String())
	}
}
