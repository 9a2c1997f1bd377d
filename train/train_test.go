package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ringtrain/ringtrain/ring"
)

const tinyIn, tinyClasses = 12, 5

var tiny = mlpCfg(tinyIn, []int{16, 8}, tinyClasses, 0, 3)

// mlpCfg is a test shorthand for an MLP's ModelConfig.
func mlpCfg(inputs int, hidden []int, classes, batch int, seed uint64) ModelConfig {
	return ModelConfig{Spec: MLPSpec(inputs, hidden, classes), Batch: batch, Seed: seed}
}

func newMLP(t *testing.T, cfg ModelConfig) Model {
	t.Helper()
	m, err := NewModel(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func randomBatch(rng *rand.Rand, n, features, classes int) ([]float32, []int) {
	x := make([]float32, n*features)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	y := make([]int, n)
	for i := range y {
		y[i] = rng.IntN(classes)
	}
	return x, y
}

func memRings(t *testing.T, n int) []*ring.Ring {
	t.Helper()
	ts := ring.MemRing(n)
	rs := make([]*ring.Ring, n)
	for i := range n {
		r, err := ring.New(ts[i], ring.Config{Rank: i, Size: n, Generation: 1})
		if err != nil {
			t.Fatal(err)
		}
		rs[i] = r
		t.Cleanup(func() { r.Close() })
	}
	return rs
}

func onAll(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// TestDistributedEqualsBigBatch is the test that proves the distribution
// right: 4 replicas with batch B each on an in-memory ring, against one
// replica with batch 4B over the same samples, several SGD steps.
func TestDistributedEqualsBigBatch(t *testing.T) {
	const world, b, steps = 4, 8, 5
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 7))
	type batch struct {
		x []float32
		y []int
	}
	global := make([]batch, steps)
	for s := range global {
		global[s].x, global[s].y = randomBatch(rng, world*b, tinyIn, tinyClasses)
	}
	opt := func() Optimizer { return &SGD{LR: 0.1, Momentum: 0.9, WeightDecay: 1e-4} }

	one, err := ring.New(nil, ring.Config{Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := tiny
	cfg.Batch = world * b
	big := NewReplica(newMLP(t, cfg), opt(), one)
	for _, g := range global {
		if _, err := big.Step(ctx, g.x, g.y, world*b); err != nil {
			t.Fatal(err)
		}
	}

	rings := memRings(t, world)
	cfg.Batch = b
	reps := make([]*Replica, world)
	for i := range reps {
		c := cfg
		c.Seed = tiny.Seed + uint64(100*i) // rank 0 as the big replica; the others differ until SyncParams
		reps[i] = NewReplica(newMLP(t, c), opt(), rings[i])
	}
	err = onAll(world, func(i int) error {
		r := reps[i]
		if err := r.SyncParams(ctx); err != nil {
			return err
		}
		for _, g := range global {
			f := tinyIn
			if _, err := r.Step(ctx, g.x[i*b*f:(i+1)*b*f], g.y[i*b:(i+1)*b], b); err != nil {
				return err
			}
		}
		return r.CheckInSync(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	want := big.Model.Params()
	for i := range world {
		got := reps[i].Model.Params()
		for ti := range want {
			for j := range want[ti] {
				if d := math.Abs(float64(got[ti][j] - want[ti][j])); d > 1e-4*math.Max(1, math.Abs(float64(want[ti][j]))) {
					t.Fatalf("rank %d %s[%d] = %v; one big batch gives %v", i, reps[i].Model.ParamNames()[ti], j, got[ti][j], want[ti][j])
				}
			}
		}
		if reps[i].ParamHash() != reps[0].ParamHash() {
			t.Fatalf("rank %d's parameters differ in bits from rank 0's", i)
		}
	}
}

// TestNonFiniteSkipsEverywhere: a NaN on one rank makes every rank skip the
// step, and no parameter moves.
func TestNonFiniteSkipsEverywhere(t *testing.T) {
	const world, b = 3, 4
	ctx := context.Background()
	rings := memRings(t, world)
	cfg := tiny
	cfg.Batch = b
	reps := make([]*Replica, world)
	for i := range reps {
		reps[i] = NewReplica(newMLP(t, cfg), &SGD{LR: 0.1}, rings[i])
	}
	before := reps[0].ParamHash()
	errs := make([]error, world)
	onAll(world, func(i int) error {
		x, y := randomBatch(rand.New(rand.NewPCG(uint64(i), 9)), b, tinyIn, tinyClasses)
		if i == 1 {
			x[5] = float32(math.NaN())
		}
		_, errs[i] = reps[i].Step(ctx, x, y, b)
		return nil
	})
	for i, err := range errs {
		if !errors.Is(err, ErrNonFinite) {
			t.Errorf("rank %d: Step = %v; want ErrNonFinite", i, err)
		}
	}
	if reps[0].ParamHash() != before {
		t.Error("parameters moved on a skipped step")
	}
}

// TestGradientsDoNotAccumulate: gorgonia adds backward results into the
// gradient tensors, so each run must start from zero; the same batch twice
// must give the same gradients.
func TestGradientsDoNotAccumulate(t *testing.T) {
	cfg := tiny
	cfg.Batch = 4
	m := newMLP(t, cfg)
	x, y := randomBatch(rand.New(rand.NewPCG(3, 4)), 4, tinyIn, tinyClasses)
	if _, err := m.ForwardBackward(x, y, 4); err != nil {
		t.Fatal(err)
	}
	first := append([]float32(nil), m.Grads()[0]...)
	if _, err := m.ForwardBackward(x, y, 4); err != nil {
		t.Fatal(err)
	}
	for j, g := range m.Grads()[0] {
		if g != first[j] {
			t.Fatalf("%s[%d]: second run gave %v, first %v; want the same", m.ParamNames()[0], j, g, first[j])
		}
	}
}

// TestGatherFinite: the one-pass copy finds a NaN or an Inf wherever it
// sits — in the unrolled body or the tail, in any tensor — copies every
// value, and passes the largest finite values.
func TestGatherFinite(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, tc := range []struct {
		name   string
		tensor int // where the bad value goes; -1: none
		at     int
		v      float32
		want   int
	}{
		{"all finite", -1, 0, 0, -1},
		{"NaN in the body", 1, 2, nan, 1},
		{"+Inf in the tail", 1, 9, inf, 1},
		{"-Inf first of all", 0, 0, -inf, 0},
		{"NaN in the last tensor's tail", 2, 2, nan, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := [][]float32{make([]float32, 7), make([]float32, 10), make([]float32, 3)}
			k := float32(1)
			for _, x := range ts {
				for j := range x {
					x[j] = k
					k = -k * 1.5
				}
			}
			ts[0][1] = math.MaxFloat32
			ts[1][0] = -math.MaxFloat32
			if tc.tensor >= 0 {
				ts[tc.tensor][tc.at] = tc.v
			}
			flat := make([]float32, 20)
			if got := gatherFinite(flat, ts); got != tc.want {
				t.Errorf("gatherFinite = %d; want %d", got, tc.want)
			}
			o := 0
			for _, x := range ts {
				for j, v := range x {
					if flat[o+j] != v && !(v != v && flat[o+j] != flat[o+j]) {
						t.Fatalf("flat[%d] = %v; want %v", o+j, flat[o+j], v)
					}
				}
				o += len(x)
			}
		})
	}
}

// TestReplicaStats: a replica counts its steps, the skipped one and the
// bytes it sent, splits their time into compute, waiting, ring and update,
// and the rank that keeps arriving first is the one that waits.
func TestReplicaStats(t *testing.T) {
	const world, steps, late = 2, 4, 20 * time.Millisecond
	rings := memRings(t, world)
	reps := make([]*Replica, world)
	cfg := mlpCfg(12, []int{8}, 3, 4, 1)
	onAll(world, func(i int) error {
		reps[i] = NewReplica(newMLP(t, cfg), &SGD{LR: 0.1}, rings[i])
		rng := rand.New(rand.NewPCG(1, uint64(i)))
		for s := range steps {
			x, y := randomBatch(rng, 4, 12, 3)
			if s == 2 && i == 0 {
				x[0] = float32(math.Inf(1)) // a skipped step, on all
			}
			if i == 1 {
				time.Sleep(late)
			}
			reps[i].Step(context.Background(), x, y, 4)
		}
		return nil
	})
	params := 12*8 + 8 + 8*3 + 3
	for i, r := range reps {
		st := r.Stats
		if st.Steps != steps || st.Skipped != 1 || st.Compute <= 0 || st.Ring <= 0 {
			t.Errorf("rank %d: %+v; want %d steps, 1 skipped, compute and ring time", i, st, steps)
		}
		// Measured: all the ring sent, which is every step's frames, headers
		// included — more than the payload, 2(n−1)/n of 4·flat bytes.
		payload := int64(steps * 4 * (params + stepTrailer(world, false)))
		if ringSent := rings[i].Stats().BytesSent; st.BytesSent != ringSent || st.BytesSent <= payload {
			t.Errorf("rank %d counted %d bytes sent; want the ring's count %d, above the payload's %d", i, st.BytesSent, ringSent, payload)
		}
	}
	if w := reps[0].Stats.Wait; w < steps*late/2 {
		t.Errorf("rank 0, first to every allreduce, waited %v in all; want at least %v", w, steps*late/2)
	}
}

// slowModel is a model whose forward and backward take extra time.
type slowModel struct {
	Model
	d time.Duration
}

func (m slowModel) ForwardBackward(x []float32, y []int, n int) (float32, error) {
	time.Sleep(m.d)
	return m.Model.ForwardBackward(x, y, n)
}

// TestStragglerIsNamed: the hash check shares each rank's compute time,
// and every rank names the one that computes far slower than the median.
func TestStragglerIsNamed(t *testing.T) {
	const world = 3
	rings := memRings(t, world)
	reps := make([]*Replica, world)
	cfg := mlpCfg(12, []int{8}, 3, 4, 1)
	err := onAll(world, func(i int) error {
		var m Model = newMLP(t, cfg)
		if i == 2 {
			m = slowModel{m, 20 * time.Millisecond}
		}
		reps[i] = NewReplica(m, &SGD{LR: 0.1}, rings[i])
		rng := rand.New(rand.NewPCG(2, uint64(i)))
		for range 3 {
			x, y := randomBatch(rng, 4, 12, 3)
			if _, err := reps[i].Step(context.Background(), x, y, 4); err != nil {
				return err
			}
		}
		return reps[i].CheckInSync(context.Background())
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range reps {
		if got := r.Stragglers(); len(got) != 1 || got[0] != 2 {
			t.Errorf("rank %d names %v as stragglers (compute %v); want [2]", i, got, r.RankCompute())
		}
	}
	if got := stragglers([]float64{1, 1.1, 0.9, 1}); got != nil {
		t.Errorf("stragglers among even ranks = %v; want none", got)
	}
}

// TestUnevenEpochEndEqualsBigBatch: an epoch whose samples do not divide
// into full steps ends with uneven batches — with batch 8 the last step
// has 3, 3 and 2 samples; with batch 222, 1, 1 and none — and every
// sample is trained once. Each rank weighs its gradients by its share of
// the step's samples, so the three replicas end where one replica with
// three times the batch over the same permutation does. Padding the last
// shares from the permutation's start (samples trained twice), or
// averaging the ranks' means alike whatever their size, ends elsewhere.
func TestUnevenEpochEndEqualsBigBatch(t *testing.T) {
	const world = 3
	for _, batch := range []int{8, 222} {
		big := NewReplica(newMLP(t, mlpCfg(784, []int{16}, 10, world*batch, 1)), &SGD{LR: 0.1}, solo(t))
		if _, err := Run(context.Background(), RunConfig{Replica: big, Train: loader(t, "train", world*batch, true), Epochs: 1, Classes: 10}); err != nil {
			t.Fatal(err)
		}
		rings := memRings(t, world)
		reps := make([]*Replica, world)
		seen := &seenCount{n: map[int]int{}}
		err := onAll(world, func(i int) error {
			reps[i] = NewReplica(newMLP(t, mlpCfg(784, []int{16}, 10, batch, uint64(1+i))), &SGD{LR: 0.1}, rings[i])
			_, err := Run(context.Background(), RunConfig{Replica: reps[i], Train: loader(t, "train", batch, true), Epochs: 1, Classes: 10,
				Trained: seen.add})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		for k := range 2000 {
			if seen.n[k] != 1 {
				t.Fatalf("batch %d: sample %d trained %d times", batch, k, seen.n[k])
			}
		}
		want := big.Model.Params()
		got := reps[0].Model.Params()
		for ti := range want {
			for j := range want[ti] {
				if d := math.Abs(float64(got[ti][j] - want[ti][j])); d > 1e-4*math.Max(1, math.Abs(float64(want[ti][j]))) {
					t.Fatalf("batch %d: %s[%d] = %v; one replica with the whole steps gives %v", batch, reps[0].Model.ParamNames()[ti], j, got[ti][j], want[ti][j])
				}
			}
		}
	}
}

// TestRingOfOneStepsOnTheModelsGradients: on a ring of one the gradients
// are applied where the model keeps them, not gathered first; the step is
// still, bit for bit, the optimizer's on those gradients, a NaN still
// skips it without moving a parameter, and a step with no samples still
// applies zeros (momentum carries on).
func TestRingOfOneStepsOnTheModelsGradients(t *testing.T) {
	ctx := context.Background()
	cfg := tiny
	cfg.Batch = 8
	one, err := ring.New(nil, ring.Config{Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	r := NewReplica(newMLP(t, cfg), &SGD{LR: 0.1, Momentum: 0.9}, one)
	ref, opt := newMLP(t, cfg), &SGD{LR: 0.1, Momentum: 0.9}
	rng := rand.New(rand.NewPCG(5, 6))
	same := func(when string) {
		t.Helper()
		got, want := r.Model.Params(), ref.Params()
		for ti := range want {
			for j := range want[ti] {
				if math.Float32bits(got[ti][j]) != math.Float32bits(want[ti][j]) {
					t.Fatalf("%s: %s[%d] = %v, the optimizer's own step gives %v", when, ref.ParamNames()[ti], j, got[ti][j], want[ti][j])
				}
			}
		}
	}
	for step := range 3 {
		x, y := randomBatch(rng, 8, tinyIn, tinyClasses)
		if _, err := r.Step(ctx, x, y, 8); err != nil {
			t.Fatal(err)
		}
		if _, err := ref.ForwardBackward(x, y, 8); err != nil {
			t.Fatal(err)
		}
		opt.Step(ref.Params(), ref.Grads())
		same(fmt.Sprintf("step %d", step))
	}
	x, y := randomBatch(rng, 8, tinyIn, tinyClasses)
	x[3] = float32(math.NaN())
	before := r.ParamHash()
	if _, err := r.Step(ctx, x, y, 8); !errors.Is(err, ErrNonFinite) {
		t.Fatalf("a NaN input: Step = %v, want ErrNonFinite", err)
	}
	if r.ParamHash() != before {
		t.Fatal("parameters moved on a skipped step")
	}
	if _, err := r.Step(ctx, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	zero := make([][]float32, len(ref.Grads()))
	for i, g := range ref.Grads() {
		zero[i] = make([]float32, len(g))
	}
	opt.Step(ref.Params(), zero)
	same("a step with no samples")
}

// seenCount counts the times each sample is reported trained (RunConfig.Trained),
// from any goroutine.
type seenCount struct {
	mu sync.Mutex
	n  map[int]int
}

func (t *seenCount) add(_ int, index []int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range index {
		t.n[k]++
	}
}
