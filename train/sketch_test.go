package train

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ringtrain/ringtrain/ring"
)

// TestSketchIsLinear: the sketch of a sum is the sum of the sketches, a
// vector sketched in pieces of any bounds gives the whole's sketch, and
// another seed another sketch.
func TestSketchIsLinear(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	const n, k = 10_000, 32
	randn := func() []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	a, b, ab := randn(), randn(), make([]float32, n)
	for i := range ab {
		ab[i] = a[i] + b[i]
	}
	sk := func(v []float32, seed uint64) []float64 {
		s := make([]float64, k)
		sketchAdd(s, v, 0, seed, nil)
		return s
	}
	near := func(x, y []float64) bool {
		var d, m float64
		for i := range x {
			d = max(d, math.Abs(x[i]-y[i]))
			m = max(m, math.Abs(x[i]))
		}
		return d <= 1e-6*m
	}
	sa, sb, sab := sk(a, 1), sk(b, 1), sk(ab, 1)
	sum := make([]float64, k)
	for i := range sum {
		sum[i] = sa[i] + sb[i]
	}
	if !near(sum, sab) {
		t.Errorf("sketch(a)+sketch(b) = %v; sketch(a+b) = %v", sum, sab)
	}
	pieces := make([]float64, k)
	for lo := 0; lo < n; {
		hi := min(n, lo+1+rng.IntN(300))
		sketchAdd(pieces, a[lo:hi], lo, 1, nil)
		lo = hi
	}
	if !near(pieces, sa) {
		t.Errorf("in pieces %v; whole %v", pieces, sa)
	}
	if near(sk(a, 2), sa) {
		t.Error("two seeds, one sketch")
	}
	// A window's table of the blocks' hashes gives the same bits, whole
	// and in pieces, where it covers them and past its end; one of
	// another seed is redone.
	var tab sketchTable
	for _, seed := range []uint64{1, 2, 1} {
		tab.cover(seed, k, (n/2+63)/64)
		whole, cut := make([]float64, k), make([]float64, k)
		sketchAdd(whole, a, 0, seed, &tab)
		sketchAdd(cut, a[:777], 0, seed, &tab)
		sketchAdd(cut, a[777:], 777, seed, &tab)
		plain, plainCut := make([]float64, k), make([]float64, k)
		sketchAdd(plain, a, 0, seed, nil)
		sketchAdd(plainCut, a[:777], 0, seed, nil)
		sketchAdd(plainCut, a[777:], 777, seed, nil)
		if !slices.Equal(whole, plain) || !slices.Equal(cut, plainCut) {
			t.Errorf("seed %d: with the table %v / %v; without %v / %v", seed, whole, cut, plain, plainCut)
		}
	}
}

// scaledGrads is a member whose gradients are f times its own.
type scaledGrads struct {
	Model
	f float32
}

func (m scaledGrads) ForwardBackward(x []float32, y []int, n int) (float32, error) {
	loss, err := m.Model.ForwardBackward(x, y, n)
	for _, g := range m.Model.Grads() {
		scaleBy(g, m.f)
	}
	return loss, err
}

// replayedGrads sends the gradients of its first step again at every
// step (the attacker build's replay).
type replayedGrads struct {
	Model
	first *[][]float32
}

func (m replayedGrads) ForwardBackward(x []float32, y []int, n int) (float32, error) {
	loss, err := m.Model.ForwardBackward(x, y, n)
	if *m.first == nil {
		for _, g := range m.Model.Grads() {
			*m.first = append(*m.first, slices.Clone(g))
		}
	}
	for i, g := range m.Model.Grads() {
		copy(g, (*m.first)[i])
	}
	return loss, err
}

// alteredSums is a ring in which some forwarder altered a value of the
// gradients' sum, as every rank receives it — or, with nan, put a NaN in
// the last rank's sketch, which would blind the checks.
type alteredSums struct {
	Collective
	nparams int
	nan     bool
}

func (a alteredSums) AllreduceMean(ctx context.Context, buf []float32) error {
	if err := a.Collective.AllreduceMean(ctx, buf); err != nil {
		return err
	}
	switch {
	case len(buf) > a.nparams && a.nan:
		buf[len(buf)-1] = float32(math.NaN())
	case len(buf) > a.nparams:
		buf[7] += 0.5
	}
	return nil
}

// TestSketchesInTheRing: four ranks that sync every step on non-IID
// shards, with sketches in the trailer. Honest, over float32, bf16 and
// int8 wires and with buckets beside backward: nothing is skipped or
// named and every rank holds the same bits. A forwarder that alters the
// sum: every rank skips every step (ErrTampered). A rank whose gradients
// are scaled, or flipped and scaled: with the norm guard on, named by
// every rank after the guard has kept its gradients out 3 steps in a row;
// without, after the sketches' third window.
func TestSketchesInTheRing(t *testing.T) {
	const n, features, classes, batch, window = 4, 12, 3, 32, 16
	cfg := mlpCfg(features, []int{16}, classes, batch, 1)
	sk := &Sketch{Dims: 32, Window: window, NameAfter: 3}
	type outcome struct {
		skipped  int
		tampered bool
		namedAt  int
		named    *LiarError
		params   []float32
	}
	run := func(wire ring.Encoding, bucket int, guard float64, liar func(Model) Model, altered, nan bool, steps int) [n]outcome {
		rings := memRings(t, n)
		var out [n]outcome
		if err := onAll(n, func(i int) error {
			m := newMLP(t, cfg)
			if liar != nil && i == n-1 {
				m = liar(m)
			}
			var c Collective = rings[i]
			if altered {
				c = alteredSums{rings[i], len(slices.Concat(m.Params()...)), nan}
			}
			rep := NewReplica(m, NewAdam(0.01), c)
			rep.Sketch, rep.Wire, rep.BucketBytes = sk, wire, bucket
			rep.NormGuard = guard
			rng := rand.New(rand.NewPCG(5, uint64(i)))
			for s := range steps {
				x, y := teacherBatch(rng, i, batch, features, classes)
				_, err := rep.Step(context.Background(), x, y, batch)
				if errors.Is(err, ErrTampered) {
					out[i].tampered = true
				} else if err != nil && !Skipped(err) {
					return err
				}
				if rep.out.named != nil && out[i].named == nil {
					out[i].named, out[i].namedAt = rep.out.named, s+1
				}
			}
			out[i].skipped, out[i].params = rep.Stats.Skipped, slices.Concat(rep.Model.Params()...)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, tc := range []struct {
		wire   ring.Encoding
		bucket int
	}{{ring.F32, 0}, {ring.BF16, 0}, {ring.I8, 0}, {ring.F32, 256}} {
		out := run(tc.wire, tc.bucket, 5, nil, false, false, 40)
		for i, o := range out {
			if o.skipped != 0 || o.named != nil || !slices.Equal(o.params, out[0].params) {
				t.Errorf("honest, %v, buckets of %d: rank %d skipped %d, named %v, same bits %v", tc.wire, tc.bucket, i, o.skipped, o.named, slices.Equal(o.params, out[0].params))
			}
		}
	}
	for _, nan := range []bool{false, true} {
		for i, o := range run(ring.F32, 0, 0, nil, true, nan, 6) {
			if o.skipped != 6 || !o.tampered {
				t.Errorf("altered sums (a NaN sketch %v): rank %d skipped %d of 6 steps (tampered seen %v); want all", nan, i, o.skipped, o.tampered)
			}
		}
	}
	// With the norm guard on, it keeps a far rank's gradients out and
	// names it after 3 of its steps in a row; without, the sketches name
	// it after 3 windows.
	for _, tc := range []struct {
		f     float32
		guard float64
		at    int
		says  string
	}{{100, 5, 3, "norm of their gradients"}, {-30, 5, 3, "norm of their gradients"}, {100, 0, 3 * window, "sketches of their gradients"}} {
		out := run(ring.F32, 0, tc.guard, func(m Model) Model { return scaledGrads{m, tc.f} }, false, false, 3*window)
		for i, o := range out {
			if o.named == nil || !slices.Equal(o.named.Ranks, []int{n - 1}) || o.namedAt != tc.at || o.named.Why != out[0].named.Why ||
				!strings.Contains(o.named.Why, tc.says) {
				t.Errorf("gradients ×%v, guard %v: rank %d named %v at step %d; want rank %d at step %d, one verdict: %s", tc.f, tc.guard, i, o.named, o.namedAt, n-1, tc.at, tc.says)
			}
		}
		if out[0].named != nil {
			t.Logf("×%v, guard %v: %v", tc.f, tc.guard, out[0].named)
		}
	}
	// A rank that sends the same gradients step after step is named
	// after its third repeat (its fourth step), guard or not; a repeat
	// across a window's end (another projection) does not count.
	for _, guard := range []float64{0, 5} {
		out := run(ring.F32, 0, guard, func(m Model) Model { return replayedGrads{m, new([][]float32)} }, false, false, window)
		for i, o := range out {
			if o.named == nil || !slices.Equal(o.named.Ranks, []int{n - 1}) || o.namedAt != 4 || !strings.Contains(o.named.Why, "a replay") {
				t.Errorf("replay, guard %v: rank %d named %v at step %d; want rank %d at step 4 for a replay", guard, i, o.named, o.namedAt, n-1)
			}
		}
	}
}

// TestRepeats: the same update again counts only while it is bit for bit
// the one before (a sketch of the next window is another projection), and
// never while there is none (no samples); half the ranks or more are
// never named.
func TestRepeats(t *testing.T) {
	ring := memRings(t, 4)[0]
	var o outliers
	for step, tc := range []struct {
		keys  []string
		same  []int
		named []int
	}{
		{[]string{"a", "", "x1", "y1"}, []int{0, 0, 0, 0}, nil},
		{[]string{"a", "", "x2", "y2"}, []int{1, 0, 0, 0}, nil},
		{[]string{"a", "", "x3", "y3"}, []int{2, 0, 0, 0}, []int{0}},
		{[]string{"b", "", "x4", "y4"}, []int{0, 0, 0, 0}, nil}, // a window's end: another projection
		{[]string{"b", "", "x4", "y4"}, []int{1, 0, 1, 1}, nil},
		{[]string{"b", "", "x4", "y4"}, []int{2, 0, 2, 2}, nil}, // three of four: the round tells nothing
	} {
		named := o.repeated(ring, tc.keys, 2)
		if !slices.Equal(o.same, tc.same) || !slices.Equal(named, tc.named) {
			t.Errorf("step %d: runs %v, named %v; want %v, %v", step, o.same, named, tc.same, tc.named)
		}
	}
}

// TestGatherScansOnce: gathering a rank's gradients with the checks on
// sketches them and sums their squares in the same pass, and finds the
// same first tensor that is not finite, the same norm and the same
// sketch as the passes it replaces — for values whose squares overflow
// float32 or underflow it too; and so does the pass over the average.
func TestGatherScansOnce(t *testing.T) {
	cfg := mlpCfg(12, []int{40}, 3, 8, 1)
	for _, tc := range []struct {
		name string
		set  func(g [][]float32)
	}{
		{"normal", func([][]float32) {}},
		{"NaN in the third", func(g [][]float32) { g[2][1] = float32(math.NaN()) }},
		{"Inf in the first", func(g [][]float32) { g[0][len(g[0])-1] = float32(math.Inf(-1)) }},
		{"squares past float32", func(g [][]float32) { g[1][3] = 3e19 }},
		{"squares under it", func(g [][]float32) {
			for _, v := range g {
				for i := range v {
					v[i] = 1e-25
				}
			}
		}},
	} {
		m := newMLP(t, cfg)
		x, y := randomBatch(rand.New(rand.NewPCG(1, 1)), 8, 12, 3)
		if _, err := m.ForwardBackward(x, y, 8); err != nil {
			t.Fatal(err)
		}
		tc.set(m.Grads())
		r := NewReplica(m, NewAdam(0.01), memRings(t, 2)[0])
		r.Sketch = &Sketch{}
		flat, err := r.buffer()
		if err != nil {
			t.Fatal(err)
		}
		r.openStep()
		bad := r.gatherGrads(flat)
		g := flat[:r.nparams]
		if want := nonFinite(m.Grads()); bad != want || !r.out.own.done {
			t.Errorf("%s: first tensor not finite %d (scanned %v); want %d", tc.name, bad, r.out.own.done, want)
		}
		if !slices.EqualFunc(g, slices.Concat(m.Grads()...), func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
			t.Errorf("%s: the gradients were not copied as they are", tc.name)
		}
		// The same pass over the average, for the guard and apply.
		r.scanAverage(g)
		if r.avgFinite(g) != (bad < 0) {
			t.Errorf("%s: the average found finite %v", tc.name, r.avgFinite(g))
		}
		if bad >= 0 {
			continue
		}
		for _, got := range []float64{scannedNorm(r.out.own.squares, g), r.avgNorm(g)} {
			if want := norm2Wide(g); math.Abs(got-want) > 1e-6*want {
				t.Errorf("%s: norm %v; want %v", tc.name, got, want)
			}
		}
		want := make([]float64, len(r.sk.own))
		sketchAdd(want, g, 0, r.sk.seed(r.Sketch), nil)
		for j := range want {
			if math.Abs(r.sk.own[j]-want[j]) > 1e-6*math.Abs(want[j])+1e-30 {
				t.Fatalf("%s: sketch %v; want %v", tc.name, r.sk.own, want)
			}
		}
	}
}
