package train

import (
	"math"
	"math/rand/v2"
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
					tc.ref(want[i], g64, s1[i], s2[i], step)
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
