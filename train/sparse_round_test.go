package train

import (
	"bytes"
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ringtrain/ringtrain/train/sparse"
)

// TestAllgatherBytes: every rank gets every rank's bytes, in rank order
// and bit for bit — also bytes that, read as float32, are NaN, −0 or
// denormal, which an allreduce would not keep — and lengths that are not
// multiples of 4, and nothing.
// Both ways: the ring's allgather, and broadcasts from each rank where a
// Collective has no allgather.
func TestAllgatherBytes(t *testing.T) {
	const n = 3
	for _, broadcasts := range []bool{false, true} {
		rings := memRings(t, n)
		colls := make([]Collective, n)
		for i, r := range rings {
			colls[i] = r
			if broadcasts {
				colls[i] = broadcastsOnly{r}
			}
		}
		mine := [][]byte{{0, 0, 0, 0x80, 0xff, 0xff, 0xff, 0xff, 1}, nil, {1, 0, 0, 0, 7}}
		got := make([][][]byte, n)
		if err := onAll(n, func(i int) error {
			var err error
			got[i], err = allgatherBytes(context.Background(), colls[i], mine[i], 64)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			for k := range n {
				if !slices.Equal(got[i][k], mine[k]) {
					t.Errorf("broadcasts %v: rank %d got rank %d's bytes as %x, want %x", broadcasts, i, k, got[i][k], mine[k])
				}
			}
		}
	}
}

// broadcastsOnly is a Collective without the ring's allgather.
type broadcastsOnly struct{ Collective }

// TestAllgatherRefusesAnOversizedLength: a rank that announces more bytes
// than the bound is refused by every rank before anything is broadcast,
// and one that has more to send than the bound refuses at once.
func TestAllgatherRefusesAnOversizedLength(t *testing.T) {
	const n = 2
	rings := memRings(t, n)
	errs := make([]error, n)
	onAll(n, func(i int) error {
		lim := 64
		if i == 1 {
			lim = 1000 // a rank that does not keep the job's bound
		}
		_, errs[i] = allgatherBytes(context.Background(), rings[i], make([]byte, 100*i), lim)
		// As a failed step would: the ring goes down, and the other
		// rank's call with it.
		rings[i].Close()
		return nil
	})
	if errs[0] == nil {
		t.Error("rank 0 took 100 bytes from rank 1 with a bound of 64")
	}
	if _, err := allgatherBytes(context.Background(), solo(t), make([]byte, 65), 64); err == nil {
		t.Error("gathering 65 bytes with a bound of 64: no error")
	}
}

// TestLocalSGDSparse: DiLoCo with sparse 2-bit pseudo-gradients — every
// rank ends each round with the same bits, keeps error feedback of its
// own, and sends a fraction of dense DiLoCo's bytes. (Whether it learns as
// well is for make bench-slow, on the real dataset.)
func TestLocalSGDSparse(t *testing.T) {
	const n, h, rounds = 3, 4, 6
	cfg := mlpCfg(12, []int{64}, 3, 4, 1)
	sent := map[bool]int64{}
	for _, sp := range []bool{false, true} {
		rings := memRings(t, n)
		end := make([][]float32, n)
		residual := make([][]float32, n)
		var first, last float32
		err := onAll(n, func(i int) error {
			o := &LocalSGD{Inner: NewAdam(0.01), Every: h, LR: 0.7, Momentum: 0.9, Nesterov: true}
			if sp {
				o.Sparse = &sparse.Config{Fraction: 0.05, Bits: 2}
			}
			rep := NewLocalReplica(newMLP(t, cfg), o, rings[i])
			rng := rand.New(rand.NewPCG(5, uint64(i)))
			for s := range h * rounds {
				x, y := randomBatch(rng, 4, 12, 3)
				loss, err := rep.Step(context.Background(), x, y, 4)
				if err != nil {
					return err
				}
				if i == 0 && s == 0 {
					first = loss
				}
				if i == 0 {
					last = loss
				}
			}
			end[i] = slices.Concat(rep.Model.Params()...)
			if o.coders != nil {
				residual[i] = slices.Clone(o.coders[0].Residual())
			}
			if i == 0 {
				sent[sp] = rep.Stats.BytesSent
			}
			return nil
		})
		if err != nil {
			t.Fatalf("sparse %v: %v", sp, err)
		}
		for i := 1; i < n; i++ {
			if !slices.Equal(end[i], end[0]) {
				t.Errorf("sparse %v: rank %d ends with other parameters than rank 0", sp, i)
			}
		}
		if sp {
			if residual[0] == nil || slices.Equal(residual[0], residual[1]) || !slices.ContainsFunc(residual[0], func(x float32) bool { return x != 0 }) {
				t.Error("sparse: want error feedback on every rank, each its own")
			}
			if math.IsNaN(float64(last)) || math.IsNaN(float64(first)) || !slices.ContainsFunc(end[0], func(x float32) bool { return x != 0 }) {
				t.Errorf("sparse: loss %v after %d rounds, %v at the start", last, rounds, first)
			}
		}
	}
	if r := float64(sent[true]) / float64(sent[false]); r > 0.25 {
		t.Errorf("sparse sent %d bytes, dense %d (%.2f); want under a quarter", sent[true], sent[false], r)
	}
}

// TestBroadcastEachChecksLengths: lengths that come in another
// collective's sum are checked before anything is read — a share that is
// no whole number of bytes, one below 0 or over the limit, or one that is
// not what this rank sends is an error.
func TestBroadcastEachChecksLengths(t *testing.T) {
	mine := []byte{1, 2, 3}
	for _, tc := range []struct {
		sum   float32
		f     float64
		valid bool
	}{
		{3, 1, true},
		{0.75, 4, true}, // a mean of 4 ranks
		{2.5, 1, false},
		{-3, 1, false},
		{float32(math.NaN()), 1, false},
		{65, 1, false},
		{4, 1, false},
	} {
		got, err := broadcastEach(context.Background(), solo(t), mine, []float32{tc.sum}, tc.f, 64)
		if tc.valid != (err == nil) {
			t.Errorf("a length of %v × %v: %v; want valid %v", tc.sum, tc.f, err, tc.valid)
		}
		if err == nil && !bytes.Equal(got[0], mine) {
			t.Errorf("a length of %v × %v: got %v; want %v", tc.sum, tc.f, got[0], mine)
		}
	}
}

// TestSparseFeedbackResumes: each rank's error feedback goes into its
// checkpoint, so ranks restored from theirs after R rounds end 2R rounds
// on the same bits as ranks that never stopped — and without it they do
// not (what a restored rank lost before). A re-formation's Level (the
// optimizer state set from another rank) leaves it as it is.
func TestSparseFeedbackResumes(t *testing.T) {
	const n, h, rounds = 3, 4, 3
	cfg := mlpCfg(12, []int{64}, 3, 4, 1)
	newRep := func(ring Collective) *Replica {
		o := &LocalSGD{Inner: NewAdam(0.01), Every: h, LR: 0.7, Momentum: 0.9, Nesterov: true, Sparse: &sparse.Config{Fraction: 0.05, Bits: 2}}
		return NewLocalReplica(newMLP(t, cfg), o, ring)
	}
	train := func(reps []*Replica, rngs []*rand.Rand, steps int) {
		t.Helper()
		rings := memRings(t, n)
		if err := onAll(n, func(i int) error {
			reps[i].Coll = rings[i]
			for range steps {
				x, y := randomBatch(rngs[i], 4, 12, 3)
				if _, err := reps[i].Step(context.Background(), x, y, 4); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	rngsFor := func() []*rand.Rand {
		out := make([]*rand.Rand, n)
		for i := range out {
			out[i] = rand.New(rand.NewPCG(5, uint64(i)))
		}
		return out
	}
	whole := make([]*Replica, n)
	for i := range whole {
		whole[i] = newRep(nil)
	}
	train(whole, rngsFor(), 2*h*rounds)
	want := slices.Concat(whole[0].Model.Params()...)

	for _, keep := range []bool{true, false} {
		reps, rngs := make([]*Replica, n), rngsFor()
		for i := range reps {
			reps[i] = newRep(nil)
		}
		train(reps, rngs, h*rounds)
		for i := range reps {
			path := filepath.Join(t.TempDir(), "ckpt")
			if err := reps[i].Snapshot(Checkpoint{Model: cfg}).Save(path); err != nil {
				t.Fatal(err)
			}
			c, err := LoadCheckpoint(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Feedback) != 1 || !slices.ContainsFunc(c.Feedback[0], func(x float32) bool { return x != 0 }) {
				t.Fatalf("rank %d's checkpoint holds error feedback %d tensors long, or all zero", i, len(c.Feedback))
			}
			if !keep {
				c.Feedback = nil
			}
			reps[i] = newRep(nil)
			if err := reps[i].Restore(c); err != nil {
				t.Fatal(err)
			}
		}
		if keep {
			// A Level's optimizer state from another rank leaves the feedback.
			before := slices.Clone(reps[1].local().coders[0].Residual())
			_, step, state := reps[0].OptimizerState()
			if err := reps[1].setOptimizerState(step, state); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(reps[1].local().coders[0].Residual(), before) {
				t.Error("setting the optimizer state, as Level does, changed the error feedback")
			}
		}
		train(reps, rngs, h*rounds)
		got := slices.Concat(reps[0].Model.Params()...)
		if slices.Equal(got, want) != keep {
			t.Errorf("feedback restored %v: the resumed ranks end on the whole run's bits: %v", keep, slices.Equal(got, want))
		}
	}
}
