package train

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ringtrain/ringtrain/train/sparse"
)

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
		scores := centeredClip(got, xs, 2, 3)
		again := make([]float32, dim)
		centeredClip(again, xs, 2, 3)
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
	centeredClip(got, same, 2, 3)
	if !slices.Equal(got, same[0]) {
		t.Errorf("alike vectors aggregate to %v", got)
	}
}

func scaleBy(x []float32, f float32) {
	for j := range x {
		x[j] *= f
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
