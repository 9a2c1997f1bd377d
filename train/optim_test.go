package train

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// TestOptimizers: three steps of each optimizer against torch's update
// rules written out in float64, on two tensors (one of odd length).
func TestOptimizers(t *testing.T) {
	type ref func(p, g, s1, s2 []float64, step int)
	sgd := func(lr, mu, wd float64) ref {
		return func(p, g, v, _ []float64, _ int) {
			for j := range p {
				d := g[j] + wd*p[j]
				if mu != 0 {
					v[j] = mu*v[j] + d
					d = v[j]
				}
				p[j] -= lr * d
			}
		}
	}
	adam := func(lr, wd float64) ref {
		return func(p, g, m, v []float64, t int) {
			for j := range p {
				d := g[j] + wd*p[j]
				m[j] = 0.9*m[j] + 0.1*d
				v[j] = 0.999*v[j] + 0.001*d*d
				mh, vh := m[j]/(1-math.Pow(0.9, float64(t))), v[j]/(1-math.Pow(0.999, float64(t)))
				p[j] -= lr * mh / (math.Sqrt(vh) + 1e-8)
			}
		}
	}
	// AdamW: p ← p·(1 − lr·wd) on the decayed tensor (the first) only,
	// then Adam with betas (0.9, 0.95) and no decay in the gradient.
	adamw := func(lr, wd float64) func(decayed bool) ref {
		return func(decayed bool) ref {
			return func(p, g, m, v []float64, t int) {
				for j := range p {
					if decayed {
						p[j] *= 1 - lr*wd
					}
					m[j] = 0.9*m[j] + 0.1*g[j]
					v[j] = 0.95*v[j] + 0.05*g[j]*g[j]
					mh, vh := m[j]/(1-math.Pow(0.9, float64(t))), v[j]/(1-math.Pow(0.95, float64(t)))
					p[j] -= lr * mh / (math.Sqrt(vh) + 1e-8)
				}
			}
		}
	}
	withWD := NewAdam(0.01)
	withWD.WeightDecay = 0.1
	for _, tc := range []struct {
		name string
		opt  Optimizer
		ref  ref
	}{
		{"sgd", &SGD{LR: 0.1}, sgd(0.1, 0, 0)},
		{"sgd momentum", &SGD{LR: 0.1, Momentum: 0.9}, sgd(0.1, 0.9, 0)},
		{"sgd momentum weight decay", &SGD{LR: 0.1, Momentum: 0.9, WeightDecay: 0.01}, sgd(0.1, 0.9, 0.01)},
		{"sgd weight decay", &SGD{LR: 0.1, WeightDecay: 0.01}, sgd(0.1, 0, 0.01)},
		{"adam", NewAdam(0.01), adam(0.01, 0)},
		{"adam weight decay", withWD, adam(0.01, 0.1)},
		{"adamw", NewAdamW(0.01, 0.1, []bool{true, false}), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 1))
			params := [][]float32{make([]float32, 8), make([]float32, 5)}
			want := [][]float64{make([]float64, 8), make([]float64, 5)}
			s1 := [][]float64{make([]float64, 8), make([]float64, 5)}
			s2 := [][]float64{make([]float64, 8), make([]float64, 5)}
			for i := range params {
				for j := range params[i] {
					params[i][j] = float32(rng.NormFloat64())
					want[i][j] = float64(params[i][j])
				}
			}
			for step := 1; step <= 3; step++ {
				grads := [][]float32{make([]float32, 8), make([]float32, 5)}
				for i := range grads {
					g64 := make([]float64, len(grads[i]))
					for j := range grads[i] {
						grads[i][j] = float32(rng.NormFloat64())
						g64[j] = float64(grads[i][j])
					}
					if tc.ref == nil {
						adamw(0.01, 0.1)(i == 0)(want[i], g64, s1[i], s2[i], step)
					} else {
						tc.ref(want[i], g64, s1[i], s2[i], step)
					}
				}
				tc.opt.Step(params, grads)
			}
			for i := range params {
				for j, got := range params[i] {
					if w := want[i][j]; math.Abs(float64(got)-w) > 1e-5*(1+math.Abs(w)) {
						t.Errorf("param %d[%d] = %v after 3 steps; torch's rule gives %v", i, j, got, w)
					}
				}
			}
		})
	}
}

func TestDecayWeights(t *testing.T) {
	names := []string{"0.embedding.weight", "1.layernorm.weight", "1.layernorm.bias", "2.linear.weight", "2.linear.bias", "5.conv2d.weight"}
	want := []bool{true, false, false, true, false, true}
	if got := DecayWeights(names); !slices.Equal(got, want) {
		t.Errorf("DecayWeights(%v) = %v; want %v", names, got, want)
	}
}

// Clipping scales the gradients to the norm asked, as torch's
// clip_grad_norm_ does, and leaves gradients under it alone.
func TestClipNorm(t *testing.T) {
	ts := [][]float32{{3, 0}, {0, 4}} // norm 5
	clipNorm(ts, 1)
	if n := math.Hypot(float64(ts[0][0]), float64(ts[1][1])); math.Abs(n-1) > 1e-6 || ts[0][0] <= 0 {
		t.Errorf("clipped to norm %v (%v); want 1, the direction kept", n, ts)
	}
	small := [][]float32{{0.3, 0.4}}
	clipNorm(small, 1)
	if small[0][0] != 0.3 || small[0][1] != 0.4 {
		t.Errorf("a norm under the limit changed: %v", small)
	}
}

// AdamW's update is each value's own: the same bits with one thread and
// with several, on a tensor long enough to be split between them.
func TestAdamWSameBitsWhateverTheThreads(t *testing.T) {
	run := func(threads int) []float32 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(threads))
		rng := rand.New(rand.NewPCG(3, 3))
		p := make([]float32, 8*splitValues+7)
		for i := range p {
			p[i] = float32(rng.NormFloat64())
		}
		o := NewAdamW(1e-3, 0.1, []bool{true})
		for range 3 {
			g := make([]float32, len(p))
			for i := range g {
				g[i] = float32(rng.NormFloat64())
			}
			o.Step([][]float32{p}, [][]float32{g})
		}
		return p
	}
	if !slices.Equal(run(1), run(4)) {
		t.Error("AdamW's parameters differ between 1 and 4 threads")
	}
}

// Clipping in a ring step: every rank clips the same average, so every
// rank ends with the same bits, and no step moves a parameter further
// than the learning rate times the clip allows.
func TestClipNormInTheRing(t *testing.T) {
	const n, lr, clip = 3, 0.5, 1e-3
	cfg := mlpCfg(12, []int{16}, 3, 4, 1)
	rings := memRings(t, n)
	params := make([][]float32, n)
	err := onAll(n, func(i int) error {
		rep := NewReplica(newMLP(t, cfg), &SGD{LR: lr}, rings[i])
		rep.ClipNorm = clip
		rng := rand.New(rand.NewPCG(5, uint64(i)))
		for range 4 {
			before := slices.Concat(rep.Model.Params()...)
			x, y := randomBatch(rng, 4, 12, 3)
			if _, err := rep.Step(context.Background(), x, y, 4); err != nil {
				return err
			}
			var moved float64
			for k, v := range slices.Concat(rep.Model.Params()...) {
				d := float64(v - before[k])
				moved += d * d
			}
			if math.Sqrt(moved) > lr*clip*1.001 {
				t.Errorf("rank %d: a step moved the parameters by %g; the clip allows %g", i, math.Sqrt(moved), lr*clip)
			}
		}
		params[i] = slices.Concat(rep.Model.Params()...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < n; i++ {
		if !slices.Equal(params[i], params[0]) {
			t.Errorf("rank %d's parameters differ from rank 0's", i)
		}
	}
}
