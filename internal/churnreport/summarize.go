package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"time"
)

// Bounds a churned job must keep (make bench-churn, and the short run in
// make test).
const (
	maxAdmissionP99 = 3 * time.Second // restart (or first start) to its first step
	maxStallP99     = 2 * time.Second // the longest no survivor stepped, after an event
	// Wall time undisturbed ÷ churned, same samples; -min-throughput
	// sets another where the halves do not see the same machine.
	defaultMinThroughput = 0.8
	maxAccuracyLoss      = 0.01 // below the undisturbed run's test accuracy
	// A process's goroutines and open files may move by this much between
	// its first sample after its first step and its last: a peer of a ring
	// that grows holds a few more links. Leaks grow with every event.
	maxGoroutineGrowth = 25
	maxFDGrowth        = 25
	maxRSSGrowth       = 0.5 // of the first sample
	// standbyGrace: a peer started this close to the job's end may fairly
	// find it ended before it is admitted.
	standbyGrace = 10 * time.Second
)

// report is what a churned run showed against the undisturbed one.
type report struct {
	span                     time.Duration
	counts                   map[string]int
	admissions               []time.Duration
	standbysLeft, lateStarts []string
	stalls                   []time.Duration
	longestStall             time.Duration
	churnWall, baseWall      time.Duration
	accuracy, baseAccuracy   float64
	hashes                   map[int]map[string]bool // by stage (−1: the whole model)
	finished                 int
	killed                   int
	afterEnd                 int // processes started after the job's last step: they find no one, and exit 1
	badExits                 []string
	// Samples counted per epoch: of epochs × samples, those never counted
	// and those counted more than once (-1: no counts in the traces).
	epochs, samples, uncounted, twice int
	goroutineGrowth, fdGrowth         float64
	rssGrowth                         float64 // a share of the first sample
	growthOf                          string  // the process that grew most, in goroutines
	minThroughput                     float64 // the bound on throughput()
}

func summarize(churn, base *record, period time.Duration, samples int) *report {
	r := &report{counts: map[string]int{}, hashes: map[int]map[string]bool{}, samples: samples, minThroughput: defaultMinThroughput}
	steps := churn.allSteps()
	jobStart, jobEnd := bounds(steps)
	bs := base.allSteps()
	b0, b1 := bounds(bs)
	r.churnWall, r.baseWall = jobEnd.Sub(jobStart), b1.Sub(b0)
	if len(churn.events) > 0 {
		r.span = churn.events[len(churn.events)-1].at.Sub(churn.events[0].at)
	}
	killed := map[[2]int]bool{}
	for _, e := range churn.events {
		r.counts[e.kind]++
		switch e.kind {
		case "kill":
			killed[[2]int{e.peer, e.inc}] = true
		case "int", "leave", "new", "restart":
			r.stalls = append(r.stalls, longestGap(steps, e.at, minTime(e.at.Add(period), jobEnd)))
		}
	}
	started := map[[2]int]time.Time{}
	for _, e := range churn.events {
		switch {
		case e.kind == "start" || e.kind == "restart" || e.kind == "new":
			started[[2]int{e.peer, e.inc}] = e.at
		case e.kind != "exit":
		case killed[[2]int{e.peer, e.inc}]:
			r.killed++
		case e.rc != 0 && started[[2]int{e.peer, e.inc}].After(jobEnd):
			// Started after the job's last step: it finds no one, and
			// cannot know the job is over rather than unreachable.
			r.afterEnd++
		case e.rc != 0:
			r.badExits = append(r.badExits, fmt.Sprintf("p%d-%d exited %d", e.peer, e.inc, e.rc))
		}
	}
	r.longestStall = longestGap(steps, jobStart, jobEnd)
	for _, e := range churn.events {
		if e.kind != "start" && e.kind != "restart" && e.kind != "new" {
			continue
		}
		p := churn.procs[[2]int{e.peer, e.inc}]
		name := fmt.Sprintf("p%d-%d", e.peer, e.inc)
		first := firstAfter(p.steps, e.at)
		switch {
		case !first.IsZero():
			if e.kind != "start" { // the first ring's formation is not an admission
				r.admissions = append(r.admissions, first.Sub(e.at))
			}
		case killed[[2]int{e.peer, e.inc}] || churn.leftEarly(e.peer, e.inc):
			// Stopped by the harness before its first step.
		case jobEnd.Sub(e.at) > standbyGrace:
			r.standbysLeft = append(r.standbysLeft, name)
		default:
			r.lateStarts = append(r.lateStarts, name)
		}
		r.growth(name, p)
	}
	r.accuracy, r.finished = churn.finalAccuracy(r.hashes)
	r.countSamples(churn)
	r.baseAccuracy, _ = base.finalAccuracy(map[int]map[string]bool{})
	return r
}

// growth notes how much p's goroutines, files and memory grew from its
// first sample after its first step to its last.
func (r *report) growth(name string, p *proc) {
	if len(p.steps) == 0 {
		return
	}
	var s []sample
	for _, x := range p.samples {
		if x.at.After(p.steps[0]) {
			s = append(s, x)
		}
	}
	if len(s) < 2 {
		return
	}
	first, last := s[0], s[len(s)-1]
	if g := last.goroutines - first.goroutines; g > r.goroutineGrowth {
		r.goroutineGrowth, r.growthOf = g, name
	}
	r.fdGrowth = max(r.fdGrowth, last.fds-first.fds)
	if first.residentBytes > 0 {
		r.rssGrowth = max(r.rssGrowth, last.residentBytes/first.residentBytes-1)
	}
}

// countSamples counts, over every process, in how many different blocks
// (by first position) each sample of each epoch was trained: every rank of
// a step records its whole block, so one block is one training. The epochs
// are those the finishers trained.
func (r *report) countSamples(rec *record) {
	r.uncounted, r.twice = -1, -1
	for _, p := range rec.procs {
		if p.summary != nil {
			r.epochs = max(r.epochs, p.summary.Epochs)
		}
	}
	if r.samples <= 0 || r.epochs == 0 {
		return
	}
	from := make([][]int32, r.epochs) // the block each sample was trained in, −1: none yet
	for e := range from {
		from[e] = make([]int32, r.samples)
		for k := range from[e] {
			from[e][k] = -1
		}
	}
	counted := false
	r.uncounted, r.twice = 0, 0
	for _, p := range rec.procs {
		for _, b := range p.trained {
			counted = true
			for _, k := range b.index {
				switch {
				case b.epoch < 0 || b.epoch >= r.epochs || k < 0 || k >= r.samples:
					r.twice++ // nothing outside the job's epochs and dataset may be trained
				case from[b.epoch][k] < 0:
					from[b.epoch][k] = int32(b.from)
				case from[b.epoch][k] != int32(b.from):
					r.twice++
				}
			}
		}
	}
	if !counted {
		r.uncounted, r.twice = -1, -1
		return
	}
	for _, f := range from {
		for _, b := range f {
			if b < 0 {
				r.uncounted++
			}
		}
	}
}

// allSteps is when every step of every process ended, in order.
func (rec *record) allSteps() []time.Time {
	var out []time.Time
	for _, p := range rec.procs {
		out = append(out, p.steps...)
	}
	slices.SortFunc(out, time.Time.Compare)
	return out
}

// leftEarly says whether the harness stopped incarnation inc of peer with
// Ctrl-C (an int or a leave event).
func (rec *record) leftEarly(peer, inc int) bool {
	for _, e := range rec.events {
		if e.peer == peer && e.inc == inc && (e.kind == "int" || e.kind == "leave") {
			return true
		}
	}
	return false
}

// finalAccuracy is the test accuracy the processes that finished the job
// report (their mean; they agree when their hashes do), and how many
// finished; hashes gets each one's parameter hash, by its stage (−1 for
// the whole model).
func (rec *record) finalAccuracy(hashes map[int]map[string]bool) (float64, int) {
	var sum float64
	n := 0
	for _, p := range rec.procs {
		if p.summary != nil && p.summary.ParamHash != "" {
			sum += p.summary.TestAccuracy
			stage := -1
			if p.summary.Stage != nil {
				stage = *p.summary.Stage
			}
			if hashes[stage] == nil {
				hashes[stage] = map[string]bool{}
			}
			hashes[stage][p.summary.ParamHash] = true
			n++
		}
	}
	if n == 0 {
		return math.NaN(), 0
	}
	return sum / float64(n), n
}

func bounds(ts []time.Time) (time.Time, time.Time) {
	if len(ts) == 0 {
		return time.Time{}, time.Time{}
	}
	return ts[0], ts[len(ts)-1]
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// firstAfter is the first of the sorted ts after t; zero if none.
func firstAfter(ts []time.Time, t time.Time) time.Time {
	if i := sort.Search(len(ts), func(i int) bool { return ts[i].After(t) }); i < len(ts) {
		return ts[i]
	}
	return time.Time{}
}

// longestGap is the longest time in [from, to] with no step ending in it,
// counting from the last step at or before from; steps are sorted.
func longestGap(steps []time.Time, from, to time.Time) time.Duration {
	if !to.After(from) {
		return 0
	}
	prev := from
	i := sort.Search(len(steps), func(i int) bool { return steps[i].After(from) })
	if i > 0 {
		prev = steps[i-1]
	}
	var longest time.Duration
	for ; i < len(steps) && !steps[i].After(to); i++ {
		longest = max(longest, steps[i].Sub(prev))
		prev = steps[i]
	}
	return max(longest, to.Sub(prev))
}

// percentile is the nearest-rank q-th percentile of ds (0 for none).
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	k := int(math.Ceil(q/100*float64(len(s)))) - 1
	return s[min(max(k, 0), len(s)-1)]
}

func (r *report) throughput() float64 {
	if r.churnWall <= 0 {
		return 0
	}
	return r.baseWall.Seconds() / r.churnWall.Seconds()
}

// broken lists the figures past their bounds.
func (r *report) broken() []string {
	var bad []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			bad = append(bad, fmt.Sprintf(format, args...))
		}
	}
	check(percentile(r.admissions, 99) <= maxAdmissionP99, "admission p99 %v > %v", percentile(r.admissions, 99), maxAdmissionP99)
	check(len(r.standbysLeft) == 0, "left standbys while the job ran: %v", r.standbysLeft)
	check(percentile(r.stalls, 99) <= maxStallP99, "stall p99 %v > %v", percentile(r.stalls, 99), maxStallP99)
	check(r.throughput() >= r.minThroughput, "throughput %.2f× < %.2f×", r.throughput(), r.minThroughput)
	check(r.finished > 0 && r.accuracy >= r.baseAccuracy-maxAccuracyLoss, "test accuracy %.4f, undisturbed %.4f", r.accuracy, r.baseAccuracy)
	check(r.hashCount() == 1, "%d parameter hashes at the end (the most in one stage)", r.hashCount())
	// With no samples to count (-samples 0: rounds by a deadline skip a
	// late peer's samples by design) there is nothing to hold them to.
	check(r.samples <= 0 || r.uncounted == 0 && r.twice == 0, "samples never trained %d, trained twice %d (of %d epochs × %d)", r.uncounted, r.twice, r.epochs, r.samples)
	check(len(r.badExits) == 0, "exits: %v", r.badExits)
	check(r.goroutineGrowth <= maxGoroutineGrowth, "goroutines grew by %.0f in %s", r.goroutineGrowth, r.growthOf)
	check(r.fdGrowth <= maxFDGrowth, "open files grew by %.0f", r.fdGrowth)
	check(r.rssGrowth <= maxRSSGrowth, "resident memory grew by %.0f%%", 100*r.rssGrowth)
	return bad
}

func (r *report) print(w io.Writer) {
	sec := func(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }
	fmt.Fprintf(w, "churn: %d events in %.0f s: %d SIGKILL, %d Ctrl-C and back, %d new peers, %d left for good\n",
		r.counts["kill"]+r.counts["int"]+r.counts["new"]+r.counts["leave"], r.span.Seconds(), r.counts["kill"], r.counts["int"], r.counts["new"], r.counts["leave"])
	fmt.Fprintf(w, "| figure | value | bound |\n|---|---|---|\n")
	fmt.Fprintf(w, "| admissions, start to first step (%d) | p50 %s, p99 %s | p99 ≤ %s |\n", len(r.admissions), sec(percentile(r.admissions, 50)), sec(percentile(r.admissions, 99)), sec(maxAdmissionP99))
	fmt.Fprintf(w, "| left a standby while the job ran | %d (%d started within %s of the end) | 0 |\n", len(r.standbysLeft), len(r.lateStarts), standbyGrace)
	fmt.Fprintf(w, "| longest stall after an event (%d) | p50 %s, p99 %s; longest in the run %s | p99 ≤ %s |\n", len(r.stalls), sec(percentile(r.stalls, 50)), sec(percentile(r.stalls, 99)), sec(r.longestStall), sec(maxStallP99))
	fmt.Fprintf(w, "| throughput, undisturbed wall ÷ churned (%s ÷ %s) | %.2f× | ≥ %.2f× |\n", sec(r.baseWall), sec(r.churnWall), r.throughput(), r.minThroughput)
	fmt.Fprintf(w, "| test accuracy, churned vs undisturbed | %.2f%% vs %.2f%% | within %.0f point |\n", 100*r.accuracy, 100*r.baseAccuracy, 100*maxAccuracyLoss)
	if r.hashes[-1] == nil && len(r.hashes) > 0 { // a pipeline's: hashes by stage
		fmt.Fprintf(w, "| parameter hashes of the %d that finished, the most in one of %d stages | %d | 1 |\n", r.finished, len(r.hashes), r.hashCount())
	} else {
		fmt.Fprintf(w, "| parameter hashes of the %d that finished | %d | 1 |\n", r.finished, r.hashCount())
	}
	if r.samples > 0 {
		fmt.Fprintf(w, "| samples of %d epochs × %d never trained, trained twice | %d, %d | 0, 0 |\n", r.epochs, r.samples, r.uncounted, r.twice)
	} else {
		fmt.Fprintf(w, "| samples trained once in every epoch | not counted in this mode | — |\n")
	}
	fmt.Fprintf(w, "| exits other than 0 (besides %d SIGKILLed, %d started after the job's end) | %d | 0 |\n", r.killed, r.afterEnd, len(r.badExits))
	fmt.Fprintf(w, "| growth in one process: goroutines, open files, memory | +%.0f, +%.0f, +%.0f%% | ≤ +%d, +%d, +%.0f%% |\n", r.goroutineGrowth, r.fdGrowth, 100*r.rssGrowth, maxGoroutineGrowth, maxFDGrowth, 100*maxRSSGrowth)
}

// hashCount is the most parameter hashes the finishers of one stage (or of
// the whole model) hold: 1 when every stage's replicas agree; 0 when
// none finished.
func (r *report) hashCount() int {
	most := 0
	for _, hs := range r.hashes {
		most = max(most, len(hs))
	}
	return most
}
