package train

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ringtrain/ringtrain/train/sparse"
)

// TestFragmentsCoverEveryParameterOnce: in every cycle of Every steps each
// fragment's exchange begins exactly once, and the fragments' ranges cover
// every parameter exactly once.
func TestFragmentsCoverEveryParameterOnce(t *testing.T) {
	for _, tc := range []struct{ n, f, every int }{
		{10, 4, 8}, {7, 3, 3}, {1000, 5, 50}, {3, 3, 7}, {5, 1, 4}, {100, 2, 9},
	} {
		o := &LocalSGD{Every: tc.every, Fragments: tc.f}
		covered := make([]int, tc.n)
		for k := range o.fragments() {
			lo, hi := o.fragment(k, tc.n)
			for i := lo; i < hi; i++ {
				covered[i]++
			}
		}
		if slices.ContainsFunc(covered, func(c int) bool { return c != 1 }) {
			t.Errorf("%+v: parameters covered %v times; want each once", tc, covered)
		}
		for cycle := range 3 {
			seen := make([]int, o.fragments())
			for s := 1; s <= tc.every; s++ {
				if k, ok := o.due(cycle*tc.every + s); ok {
					seen[k]++
				}
			}
			if slices.ContainsFunc(seen, func(c int) bool { return c != 1 }) {
				t.Errorf("%+v: cycle %d began fragments %v times; want each once", tc, cycle, seen)
			}
		}
		if _, ok := o.due(0); ok {
			t.Errorf("%+v: an exchange before any inner step", tc)
		}
	}
}

// TestStreamingLocalSGDSettings: settings a streaming round cannot keep
// are refused.
func TestStreamingLocalSGDSettings(t *testing.T) {
	for _, o := range []*LocalSGD{
		{Every: 4, Fragments: 5},
		{Every: 8, Fragments: 4, Overlap: 2},
		{Every: 8, Fragments: -1},
		{Every: 8, Overlap: -1},
		{Every: 1, Overlap: 1},
	} {
		o.Inner, o.LR = &SGD{LR: 0.1}, 1
		if err := o.validate(); err == nil {
			t.Errorf("%d fragments, overlap %d, every %d: accepted", o.Fragments, o.Overlap, o.Every)
		}
	}
	ok := &LocalSGD{Inner: &SGD{LR: 0.1}, LR: 1, Every: 8, Fragments: 4, Overlap: 1}
	if err := ok.validate(); err != nil {
		t.Errorf("4 fragments every 8 steps overlapping 1: %v", err)
	}
}

// TestStreamingLocalSGD: in fragments, with and without overlap, dense
// and sparse — every rank holds the same anchors (one hash) after every
// step, its own parameters mid-round, and, once the round closes, the
// same parameters; no exchange carries more than a fragment's share of
// the bytes, and the loss stays finite.
func TestStreamingLocalSGD(t *testing.T) {
	const n, h, f, cycles = 3, 8, 4, 4
	cfg := mlpCfg(12, []int{64}, 3, 4, 1)
	for _, tc := range []struct {
		name    string
		overlap int
		sparse  bool
	}{
		{"dense", 0, false}, {"dense overlapped", 1, false}, {"sparse overlapped", 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rings := memRings(t, n)
			hashes := make([][][32]byte, n)
			end := make([][]float32, n)
			mid := make([][]float32, n)
			var first, last float32
			var most int64
			err := onAll(n, func(i int) error {
				o := &LocalSGD{Inner: NewAdam(0.01), Every: h, LR: 1, Fragments: f, Overlap: tc.overlap}
				if tc.sparse {
					o.Sparse = &sparse.Config{Fraction: 0.1, Bits: 4}
				}
				rep := NewLocalReplica(newMLP(t, cfg), o, rings[i])
				rng := rand.New(rand.NewPCG(5, uint64(i)))
				steps := h * cycles
				for s := range steps {
					x, y := randomBatch(rng, 4, 12, 3)
					rep.part.closing = s == steps-1
					before := rep.Stats.BytesSent
					loss, err := rep.Step(context.Background(), x, y, 4)
					if err != nil {
						return err
					}
					if i == 0 && s < steps-1 {
						most = max(most, rep.Stats.BytesSent-before)
					}
					hashes[i] = append(hashes[i], rep.ParamHash())
					if s == steps/2 {
						mid[i] = slices.Concat(rep.Model.Params()...)
					}
					if i == 0 && s == 0 {
						first = loss
					}
					if i == 0 && s >= steps-h {
						last = max(last, loss)
					}
				}
				if rep.roundOpen() || o.open {
					t.Errorf("rank %d: the round is still open after the epoch's last step", i)
				}
				end[i] = slices.Concat(rep.Model.Params()...)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for i := 1; i < n; i++ {
				for s := range hashes[0] {
					if hashes[i][s] != hashes[0][s] {
						t.Fatalf("after step %d rank %d's anchors differ from rank 0's", s+1, i)
					}
				}
				if !slices.Equal(end[i], end[0]) {
					t.Errorf("rank %d ends the round with other parameters than rank 0", i)
				}
				if slices.Equal(mid[i], mid[0]) {
					t.Errorf("rank %d holds rank 0's parameters mid-round; want its own", i)
				}
			}
			// A fragment's exchange: under half of a whole round's bytes
			// (2(n−1)/n of the parameters, as float32) with four fragments.
			whole := int64(2 * (n - 1) * 4 * len(end[0]) / n)
			if most == 0 || most > whole/2 {
				t.Errorf("the most bytes one step sent: %d; a whole round's are %d; want a fragment's share", most, whole)
			}
			// Random labels: nothing to learn, but nothing to blow up.
			if math.IsNaN(float64(last)) || math.IsInf(float64(last), 0) || math.IsNaN(float64(first)) {
				t.Errorf("loss %v at the start, at most %v in the last cycle; want both finite", first, last)
			}
		})
	}
}

// gated is a Collective of two whose AllreduceMean waits until its gate
// opens, then leaves the buffer as this rank's own (as if the other rank
// sent the same): the exchange in flight, for as long as a test says.
type gated struct {
	Collective
	gate    chan struct{}
	started chan struct{}
}

func (g *gated) Size() int { return 2 }

func (g *gated) AllreduceMean(ctx context.Context, buf []float32) error {
	g.started <- struct{}{}
	select {
	case <-g.gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestExchangeOverlapsInnerSteps: a fragment's exchange goes out in the
// background and inner steps go on while it is in flight; the step at
// its Overlap's end waits for it and applies it, keeping what the inner
// steps in between did.
func TestExchangeOverlapsInnerSteps(t *testing.T) {
	const h, f, overlap = 8, 2, 2
	cfg := mlpCfg(12, []int{8}, 3, 4, 1)
	g := &gated{Collective: solo(t), gate: make(chan struct{}), started: make(chan struct{}, 1)}
	o := &LocalSGD{Inner: &SGD{LR: 0.1}, Every: h, LR: 1, Fragments: f, Overlap: overlap}
	rep := NewLocalReplica(newMLP(t, cfg), o, g)
	rng := rand.New(rand.NewPCG(5, 1))
	step := func() error {
		x, y := randomBatch(rng, 4, 12, 3)
		_, err := rep.Step(context.Background(), x, y, 4)
		return err
	}
	began := make(chan error, 1)
	go func() { // fragment 0's exchange begins after step h/f
		for s := 1; s <= h/f; s++ {
			if err := step(); err != nil {
				began <- err
				return
			}
		}
		began <- nil
	}()
	select {
	case err := <-began:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute): // not a timing: a guard against a hang
		close(g.gate)
		t.Fatal("the step that began the exchange waited for it")
	}
	<-g.started
	if rep.Sync.(*streamed).inflight == nil {
		t.Fatal("no exchange in flight after the step that began it")
	}
	before := slices.Concat(rep.Model.Params()...)
	for range overlap - 1 { // inner steps while the exchange waits at the gate
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if slices.Equal(before, slices.Concat(rep.Model.Params()...)) || rep.Sync.(*streamed).inflight == nil {
		t.Fatal("no inner step went on beside the exchange")
	}
	done := make(chan error, 1)
	go func() { done <- step() }() // the Overlap's last step: waits for the exchange
	select {
	case err := <-done:
		t.Fatalf("the step at the overlap's end returned (%v) with the exchange still in flight", err)
	default:
	}
	close(g.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if rep.Sync.(*streamed).inflight != nil || o.outer != 1 {
		t.Fatalf("after the overlap's end: in flight %v, %d outer steps; want none in flight and 1", rep.Sync.(*streamed).inflight != nil, o.outer)
	}
	// The average is this rank's own pseudo-gradient and the outer LR 1,
	// so fragment 0's anchor is where the parameters were when the
	// exchange began, and they are there plus what the overlap's steps did.
	lo, hi := o.fragment(0, rep.nparams)
	params := slices.Concat(rep.Model.Params()...)
	if slices.Equal(o.anchor[lo:hi], params[lo:hi]) {
		t.Error("fragment 0 was set to its anchor: the overlap's inner steps were dropped")
	}
	if slices.Equal(o.anchor[hi:], params[hi:]) {
		t.Error("fragment 1 is at its anchor though its exchange has not begun")
	}
}

// TestStreamingExchangeUndone: an exchange that fails takes back the
// steps since it began, and every fragment goes back to its anchor.
func TestStreamingExchangeUndone(t *testing.T) {
	cfg := mlpCfg(12, []int{8}, 3, 4, 1)
	o := &LocalSGD{Inner: &SGD{LR: 0.1}, Every: 6, LR: 1, Fragments: 2, Overlap: 1}
	rep := NewLocalReplica(newMLP(t, cfg), o, &failsAt{Ring: solo(t), n: 2})
	rep.Coll = sized{rep.Coll, 2}
	rng := rand.New(rand.NewPCG(5, 1))
	var err error
	var s int
	for s = 1; s <= 12 && err == nil; s++ {
		x, y := randomBatch(rng, 4, 12, 3)
		_, err = rep.Step(context.Background(), x, y, 4)
	}
	// Exchanges begin after steps 3 and 6; the second fails and is found
	// at step 7, which takes steps 6 and 7 back.
	if !errors.Is(err, ErrCollective) || s-1 != 7 {
		t.Fatalf("step %d: %v; want ErrCollective at step 7", s-1, err)
	}
	if rep.out.undone != 2 || rep.Steps != 5 || o.open || rep.Sync.(*streamed).inflight != nil {
		t.Errorf("undone %d, steps %d, round open %v; want 2, 5, closed", rep.out.undone, rep.Steps, o.open)
	}
	if !slices.Equal(slices.Concat(rep.Model.Params()...), o.anchor) {
		t.Error("after the failed exchange the parameters are not the anchors")
	}
}
