package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train/sparse"
)

// denseColumns is the columns of the dense updates xs at their support.
func denseColumns(xs [][]float32) *columns { return new(columns).gather(xs, refSupport(xs)) }

func dist(a, b []float32) float64 {
	var acc float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		acc += d * d
	}
	return math.Sqrt(acc)
}

// TestCenteredClip: with honest ranks spread about one direction (as
// non-IID shards are) and one that scales, flips or replaces its vector,
// the aggregate stays near the honest mean where the plain mean does not,
// and the attacker's score is the one over 1. Alike vectors aggregate to
// themselves exactly.
func TestCenteredClip(t *testing.T) {
	const n, dim = 5, 200
	rng := rand.New(rand.NewPCG(11, 12))
	base := make([]float32, dim)
	for j := range base {
		base[j] = float32(rng.NormFloat64())
	}
	honest := func() [][]float32 {
		xs := make([][]float32, n)
		for i := range xs {
			xs[i] = make([]float32, dim)
			for j := range xs[i] {
				xs[i][j] = base[j] + 0.3*float32(rng.NormFloat64())
			}
		}
		return xs
	}
	attacks := map[string]func(x []float32){
		"none":      func([]float32) {},
		"scale 100": func(x []float32) { scaleBy(x, 100) },
		"sign flip": func(x []float32) { scaleBy(x, -10) },
		"noise": func(x []float32) {
			for j := range x {
				x[j] = 50 * float32(rng.NormFloat64())
			}
		},
	}
	for name, attack := range attacks {
		xs := honest()
		mean := make([]float32, dim)
		for _, x := range xs[:n-1] {
			for j, v := range x {
				mean[j] += v / (n - 1)
			}
		}
		attack(xs[n-1])
		plain := make([]float32, dim)
		for _, x := range xs {
			for j, v := range x {
				plain[j] += v / n
			}
		}
		got := make([]float32, dim)
		scores := centeredClip(got, denseColumns(xs), 2, 3, nil)
		again := make([]float32, dim)
		centeredClip(again, denseColumns(xs), 2, 3, nil)
		if !slices.Equal(got, again) {
			t.Fatalf("%s: two runs on the same vectors differ", name)
		}
		spread := dist(xs[0], mean)
		if d := dist(got, mean); d > spread {
			t.Errorf("%s: the aggregate is %.2f from the honest mean (one honest rank is %.2f from it; the plain mean %.2f)", name, d, spread, dist(plain, mean))
		}
		if name != "none" {
			if dist(plain, mean) < 3*spread {
				t.Fatalf("%s: the attack does not move the plain mean (%.2f): the test shows nothing", name, dist(plain, mean))
			}
			if scores[n-1] <= 1 {
				t.Errorf("%s: the attacker scores %.2f; want over 1", name, scores[n-1])
			}
		}
		for i, s := range scores[:n-1] {
			if s > 1 {
				t.Errorf("%s: honest rank %d scores %.2f: clipped", name, i, s)
			}
		}
	}
	same := [][]float32{{1, 2, 3}, {1, 2, 3}, {1, 2, 3}}
	got := make([]float32, 3)
	centeredClip(got, denseColumns(same), 2, 3, nil)
	if !slices.Equal(got, same[0]) {
		t.Errorf("alike vectors aggregate to %v", got)
	}
}

// TestRobustRounds: four ranks in sparse DiLoCo rounds, one of which
// steps a thousand times too far: with the robust aggregate every rank
// ends on the same bits near where four honest ranks go; with the mean,
// the attacker drags the model far off (the test's control).
func TestRobustRounds(t *testing.T) {
	const n, h, rounds = 4, 4, 6
	cfg := mlpCfg(12, []int{32}, 3, 4, 1)
	run := func(robust *Robust, attacker bool) []float32 {
		rings := memRings(t, n)
		end := make([][]float32, n)
		if err := onAll(n, func(i int) error {
			lr := float32(0.01)
			if attacker && i == n-1 {
				lr = 10
			}
			o := &LocalSGD{Inner: NewAdam(lr), Every: h, LR: 1, Sparse: &sparse.Config{Fraction: 0.2, Bits: 4}, Robust: robust}
			rep := NewLocalReplica(newMLP(t, cfg), o, rings[i])
			rng := rand.New(rand.NewPCG(7, uint64(i)))
			for range h * rounds {
				x, y := randomBatch(rng, 4, 12, 3)
				if _, err := rep.Step(context.Background(), x, y, 4); err != nil {
					return err
				}
			}
			end[i] = slices.Concat(rep.Model.Params()...)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for i := 1; i < n; i++ {
			if !slices.Equal(end[i], end[0]) {
				t.Fatalf("robust %v, attacker %v: rank %d ends on other bits than rank 0", robust != nil, attacker, i)
			}
		}
		return end[0]
	}
	rb := &Robust{Clip: 2, Iters: 3}
	clean := run(rb, false)
	robust := run(rb, true)
	mean := run(nil, true)
	dr, dm := dist(robust, clean), dist(mean, clean)
	t.Logf("from the clean run: robust %.4f, mean %.4f; the clean run moved %.4f", dr, dm, dist(clean, slices.Concat(newMLP(t, cfg).Params()...)))
	if dm < 10*dr {
		t.Errorf("the attacker moved the robust model %.3f from the clean run's and the averaged one %.3f; want the robust one far closer", dr, dm)
	}
	start := slices.Concat(newMLP(t, cfg).Params()...)
	if dr > 2*dist(clean, start) {
		t.Errorf("the robust model is %.3f from the clean run's, more than twice what the clean run moved (%.3f)", dr, dist(clean, start))
	}
}

func TestRobustConfig(t *testing.T) {
	for _, o := range []*LocalSGD{
		{Inner: NewAdam(0.01), Every: 4, LR: 1, Robust: &Robust{Clip: 2, Iters: 3}},
		{Inner: NewAdam(0.01), Every: 4, LR: 1, Sparse: &sparse.Config{Fraction: 0.1, Bits: 2}, Robust: &Robust{Clip: 0, Iters: 3}},
		{Inner: NewAdam(0.01), Every: 4, LR: 1, Sparse: &sparse.Config{Fraction: 0.1, Bits: 2}, Robust: &Robust{Clip: 2, Iters: 0}},
	} {
		if err := o.validate(); err == nil {
			t.Errorf("%+v: no error", o.Robust)
		}
	}
}

// teacherBatch draws n samples whose labels a fixed linear teacher gives,
// around a mean of the rank's own: shards that differ (non-IID) but teach
// the same thing, as honest members' do.
func teacherBatch(rng *rand.Rand, rank, n, features, classes int) ([]float32, []int) {
	tr := rand.New(rand.NewPCG(99, 99))
	w := make([]float64, classes*features)
	for i := range w {
		w[i] = tr.NormFloat64()
	}
	x := make([]float32, n*features)
	y := make([]int, n)
	for s := range n {
		row := x[s*features : (s+1)*features]
		for f := range row {
			row[f] = float32(rng.NormFloat64())
		}
		row[rank%features] += 1.5
		best := math.Inf(-1)
		for c := range classes {
			v := 0.0
			for f, xf := range row {
				v += w[c*features+f] * float64(xf)
			}
			if v > best {
				best, y[s] = v, c
			}
		}
	}
	return x, y
}

// TestRobustNamesOutliers: four ranks in sparse DiLoCo rounds on non-IID
// shards of one teacher. A rank that sends its pseudo-gradient scaled,
// flipped or replaced by noise is named by every rank after the same applied round, the
// third (NameAfter 3), with its distance and payload hash; with every
// rank honest nobody is named in 20 rounds, for several seeds; with
// naming off nobody is either.
func TestRobustNamesOutliers(t *testing.T) {
	const n, h, features, classes = 4, 4, 12, 3
	cfg := mlpCfg(features, []int{16}, classes, 32, 1)
	rb := &Robust{Clip: 2, Iters: 3, NameAfter: 3}
	type named struct {
		step int
		lie  *LiarError
	}
	run := func(rb *Robust, kind string, seed uint64, rounds int) [n]named {
		rings := memRings(t, n)
		var got [n]named
		if err := onAll(n, func(i int) error {
			o := &LocalSGD{Inner: NewAdam(0.01), Every: h, LR: 1, Sparse: &sparse.Config{Fraction: 0.2, Bits: 4}, Robust: rb}
			if kind != "" && i == n-1 {
				var err error
				if o.tamper, err = attack(kind, seed); err != nil {
					return err
				}
			}
			rep := NewLocalReplica(newMLP(t, cfg), o, rings[i])
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			for s := range h * rounds {
				x, y := teacherBatch(rng, i, 32, features, classes)
				if _, err := rep.Step(context.Background(), x, y, 32); err != nil {
					return err
				}
				if rep.out.named != nil && got[i].lie == nil {
					got[i] = named{s + 1, rep.out.named}
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	for _, tc := range []struct{ name string }{{"scale"}, {"flip"}, {"noise"}} {
		got := run(rb, tc.name, 7, 6)
		for i := range n {
			if got[i].lie == nil || !slices.Equal(got[i].lie.Ranks, []int{n - 1}) || got[i].step != 3*h {
				t.Fatalf("%s: rank %d named %+v at step %d; want rank %d named at step %d on every rank", tc.name, i, got[i].lie, got[i].step, n-1, 3*h)
			}
			if got[i].lie.Why != got[0].lie.Why {
				t.Errorf("%s: rank %d says %q, rank 0 %q; want one verdict", tc.name, i, got[i].lie.Why, got[0].lie.Why)
			}
		}
		if !strings.Contains(got[0].lie.Why, "payload sha256") || !errors.Is(got[0].lie, ErrLiar) {
			t.Errorf("%s: %v; want the evidence and an ErrLiar", tc.name, got[0].lie)
		}
		t.Logf("%s: %v", tc.name, got[0].lie)
	}
	// A replay of its first pseudo-gradient through the coder: the error
	// feedback makes every round's payload another, but the sketch of the
	// pseudo-gradient sent with it is the same bits again — named once it
	// has sent it NameAfter+1 times (a payload sent again byte for byte:
	// TestRobustNamesRepeatedPayloads).
	got := run(rb, "replay", 7, 8)
	for i := range n {
		if got[i].lie == nil || !slices.Equal(got[i].lie.Ranks, []int{n - 1}) || got[i].step != 4*h || !strings.Contains(got[i].lie.Why, "a replay") {
			t.Errorf("replay: rank %d named %+v at step %d; want rank %d named for a replay at step %d", i, got[i].lie, got[i].step, n-1, 4*h)
		}
	}
	for seed := range uint64(5) {
		for i, g := range run(rb, "", seed, 20) {
			if g.lie != nil {
				t.Errorf("honest, seed %d: rank %d named %v at step %d", seed, i, g.lie, g.step)
			}
		}
	}
	if got := run(&Robust{Clip: 2, Iters: 3}, "scale", 7, 6); got[0].lie != nil {
		t.Errorf("naming off: %v", got[0].lie)
	}
}

// A round of three updates judges no one — of three, two alike make the
// third far and the other two's mean is what its cosine is against —
// where one of four standing apart three rounds in a row is named.
func TestRoundsOfThreeNameNoOne(t *testing.T) {
	for _, tc := range []struct {
		dist, cos []float64
		named     []int
	}{
		{[]float64{0.5, 0.5, 5}, []float64{1, 1, -0.1}, nil},
		{[]float64{0.5, 0.5, 0.5, 5}, []float64{1, 1, 1, -0.1}, []int{3}},
		{[]float64{0.5, 0.5, 0.5, 0.5}, []float64{1, 1, 1, -0.1}, []int{3}},
	} {
		ring := memRings(t, len(tc.dist))[0]
		ranks := make([]int, len(tc.dist))
		for i := range ranks {
			ranks[i] = i
		}
		var o outliers
		var got []int
		for range 3 {
			for _, j := range o.count(ring, len(ranks), ranks, tc.dist, tc.cos, 3, true, 3) {
				got = append(got, j.rank)
			}
		}
		if !slices.Equal(got, tc.named) {
			t.Errorf("distances %v, cosines %v, three rounds: named %v; want %v", tc.dist, tc.cos, got, tc.named)
		}
	}
}

// TestRobustNamesRepeatedPayloads: a rank whose payload comes back byte for
// byte round after round (a replay of what it sent) is named once it has
// sent it NameAfter+1 times in a row, on every rank alike; an empty
// payload (a rank not in the round) ends no one's count but its own.
func TestRobustNamesRepeatedPayloads(t *testing.T) {
	rb := &Robust{NameAfter: 3}
	ring := memRings(t, 4)[0]
	var o outliers
	for round := range 5 {
		payloads := [][]byte{{byte(round), 1}, {byte(round), 2}, nil, {9, 9}}
		lie := rb.score(nil, &o, ring, payloads, []float64{0, 0, 0}, []float64{1, 1, 1}, round)
		switch {
		case round < 3 && lie != nil:
			t.Fatalf("round %d: %v", round, lie)
		case round == 3 && (lie == nil || !slices.Equal(lie.Ranks, []int{3}) || !strings.Contains(lie.Why, "a replay")):
			t.Fatalf("round %d: %v; want rank 3 named for a replay", round, lie)
		}
	}
}

// TestOthersCosines: each cosine against the coordinate-wise median of
// the others, as the median of all but that one gives it, for odd and
// even counts and with ties.
func TestOthersCosines(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for _, n := range []int{3, 4, 5, 8} {
		xs := make([][]float32, n)
		for i := range xs {
			xs[i] = make([]float32, 50)
			for j := range xs[i] {
				if j%5 != 0 { // every fifth coordinate 0 on every rank
					xs[i][j] = float32(rng.IntN(7) - 3) // ties
				}
			}
		}
		got := denseColumns(xs).othersCosines()
		for i, x := range xs {
			others := append(append([][]float32{}, xs[:i]...), xs[i+1:]...)
			ref := make([]float32, len(x))
			refMedian(ref, others)
			var xa, xx, aa float64
			for j, v := range x {
				xa += float64(v) * float64(ref[j])
				xx += float64(v) * float64(v)
				aa += float64(ref[j]) * float64(ref[j])
			}
			want := 0.0
			if xx > 0 && aa > 0 {
				want = xa / math.Sqrt(xx*aa)
			}
			if math.Abs(got[i]-want) > 1e-12 {
				t.Errorf("%d ranks, rank %d: %v; want %v", n, i, got[i], want)
			}
		}
	}
}

// BenchmarkRobustRound: one round's robust aggregate and scores of
// sparse payloads (top 5% of 235k values in 4 bits), as every rank
// computes it: of 4 and 8 ranks, their vectors independent (the top
// coordinates of each its own, most of the support one rank's alone) or
// sharing most of their size (most coordinates of the support in every
// payload).
func BenchmarkRobustRound(b *testing.B) {
	const size = 235_146
	for _, n := range []int{4, 8} {
		for _, shared := range []float64{0, 3} {
			b.Run(fmt.Sprintf("ranks=%d/shared=%v", n, shared), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(2, 2))
				common := make([]float32, size)
				for i := range common {
					common[i] = float32(shared * rng.NormFloat64())
				}
				cfg := sparse.Config{Fraction: 0.05, Bits: 4}
				all := make([][]byte, n)
				for k := range all {
					d := make([]float32, size)
					for i := range d {
						d[i] = common[i] + float32(rng.NormFloat64())
					}
					c, err := sparse.NewCoder(cfg, size)
					if err != nil {
						b.Fatal(err)
					}
					p, err := c.Encode(d)
					if err != nil {
						b.Fatal(err)
					}
					all[k] = sparse.AppendPart(nil, p)
				}
				o := &LocalSGD{Robust: &Robust{Clip: 2, Iters: 3, NameAfter: 3}}
				avg := make([]float32, size)
				ring := memRings(&testing.T{}, n)[0]
				for b.Loop() {
					if _, err := o.robust(ring, avg, [][]float32{avg}, all, nil, 0); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// garbledPayload is a rank that sends a payload that does not decode.
type garbledPayload struct{ *ring.Ring }

func (g garbledPayload) Allgather(ctx context.Context, buf []float32, counts []int) error {
	off := 0
	for _, c := range counts[:g.Rank()] {
		off += c
	}
	for i := range counts[g.Rank()] {
		buf[off+i] = float32(math.NaN())
	}
	return g.Ring.Allgather(ctx, buf, counts)
}

// TestUndecodablePayloadIsALie: a rank whose payload does not decode is
// named by every rank, in the round's failed collective (so the round
// is taken back and runs again without it), with or without Robust —
// before, it ended the job on every rank.
func TestUndecodablePayloadIsALie(t *testing.T) {
	const n, h = 4, 4
	cfg := mlpCfg(12, []int{16}, 3, 8, 1)
	for _, rb := range []*Robust{nil, {Clip: 2, Iters: 3, NameAfter: 3}} {
		rings := memRings(t, n)
		errs := make([]error, n)
		onAll(n, func(i int) error {
			var c Collective = rings[i]
			if i == n-1 {
				c = garbledPayload{rings[i]}
			}
			o := &LocalSGD{Inner: NewAdam(0.01), Every: h, LR: 1, Sparse: &sparse.Config{Fraction: 0.2, Bits: 4}, Robust: rb}
			rep := NewLocalReplica(newMLP(t, cfg), o, c)
			rng := rand.New(rand.NewPCG(3, uint64(i)))
			for range h {
				x, y := teacherBatch(rng, i, 8, 12, 3)
				if _, errs[i] = rep.Step(context.Background(), x, y, 8); errs[i] != nil {
					return nil
				}
			}
			return nil
		})
		for i, err := range errs {
			var lie *LiarError
			if !errors.As(err, &lie) || !slices.Equal(lie.Ranks, []int{n - 1}) || !errors.Is(err, ErrCollective) {
				t.Errorf("robust %v: rank %d: %v; want rank %d named in a failed collective", rb != nil, i, err, n-1)
			}
		}
	}
}
