package train

import (
	"math/rand/v2"
	"testing"

	"github.com/ringtrain/ringtrain/train/gemm"
)

// BenchmarkConv times each of a conv layer's products on the cnn's two
// layers at batch 64, on one thread: where a change to the layer's
// layout or packing shows without the rest of the step's noise.
func BenchmarkConv(b *testing.B) {
	for _, tc := range []struct {
		name string
		g    convGeom
	}{
		{"conv1", convGeom{b: 64, c: 1, h: 28, w: 28, o: 32, k: 5, pad: 2, oh: 28, ow: 28}},
		{"conv2", convGeom{b: 64, c: 32, h: 14, w: 14, o: 64, k: 5, pad: 2, oh: 14, ow: 14}},
	} {
		g := tc.g
		rng := rand.New(rand.NewPCG(1, 1))
		x := randomFloats(rng, g.b*g.c*g.h*g.w)
		w := randomFloats(rng, g.o*g.ckk())
		bias := randomFloats(rng, g.o)
		dy := randomFloats(rng, g.b*g.o*g.p())
		y := make([]float32, len(dy))
		dw := make([]float32, len(w))
		dx := make([]float32, len(x))
		st := newConvState(g, true, gemm.New(1), &phaseClock{})
		st.forward(x, w, bias, y)
		for _, op := range []struct {
			name string
			run  func()
		}{
			{"forward", func() { st.forward(x, w, bias, y) }},
			{"gradW", func() { st.gradW(x, dy, dw) }},
			{"gradX", func() { st.gradX(w, dy, dx) }},
		} {
			b.Run(tc.name+"/"+op.name, func(b *testing.B) {
				for b.Loop() {
					op.run()
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/op")
			})
		}
	}
}

// BenchmarkMaxPool times the cnn's first pool, forward and gradient, at
// batch 64.
func BenchmarkMaxPool(b *testing.B) {
	g := poolGeom{b: 64, c: 32, h: 28, w: 28, k: 2}
	rng := rand.New(rand.NewPCG(1, 1))
	x := randomFloats(rng, g.b*g.c*g.h*g.w)
	for i := range x {
		x[i] = max(x[i], 0) // after a ReLU
	}
	y := make([]float32, g.b*g.c*g.oh()*g.ow())
	dx := make([]float32, len(x))
	b.Run("forward", func(b *testing.B) {
		for b.Loop() {
			maxPool(g, x, y)
		}
	})
	b.Run("grad", func(b *testing.B) {
		for b.Loop() {
			maxPoolGrad(g, x, y, dx)
		}
	})
}
