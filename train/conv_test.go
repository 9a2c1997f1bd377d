package train

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/ringtrain/ringtrain/train/gemm"
)

// naiveConv is the layer by its definition, in float64: y, and the
// gradients of Σ y·dy with respect to x, w and b.
func naiveConv(g convGeom, x, w, b, dy []float32) (y, dx, dw, db []float64) {
	y = make([]float64, g.b*g.o*g.p())
	dx = make([]float64, len(x))
	dw = make([]float64, len(w))
	db = make([]float64, g.o)
	for s := range g.b {
		for o := range g.o {
			for oy := range g.oh {
				for ox := range g.ow {
					at := ((s*g.o+o)*g.oh+oy)*g.ow + ox
					sum := float64(b[o])
					db[o] += float64(dy[at])
					for c := range g.c {
						for ky := range g.k {
							for kx := range g.k {
								iy, ix := oy+ky-g.pad, ox+kx-g.pad
								if iy < 0 || iy >= g.h || ix < 0 || ix >= g.w {
									continue
								}
								xi := ((s*g.c+c)*g.h+iy)*g.w + ix
								wi := ((o*g.c+c)*g.k+ky)*g.k + kx
								sum += float64(x[xi]) * float64(w[wi])
								dx[xi] += float64(w[wi]) * float64(dy[at])
								dw[wi] += float64(x[xi]) * float64(dy[at])
							}
						}
					}
					y[at] = sum
				}
			}
		}
	}
	return
}

func close32(t *testing.T, what string, got []float32, want []float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); d > 1e-4*(1+math.Abs(want[i])) || math.IsNaN(float64(got[i])) {
			t.Fatalf("%s[%d] = %g, want %g", what, i, got[i], want[i])
		}
	}
}

// TestConvMatchesItsDefinition: the conv ops' forward and three gradients
// against the layer written out, for odd shapes, paddings and kernels,
// each of the forward's and the weight gradient's two ways taken.
func TestConvMatchesItsDefinition(t *testing.T) {
	for _, g := range []convGeom{
		{b: 3, c: 2, h: 7, w: 5, o: 5, k: 3, pad: 1},
		{b: 2, c: 1, h: 6, w: 6, o: 4, k: 5, pad: 2},
		{b: 1, c: 3, h: 4, w: 9, o: 13, k: 2, pad: 0},
		{b: 5, c: 2, h: 3, w: 3, o: 33, k: 3, pad: 2},
		// 100 taps: the forward's product transposed, and the weight
		// gradient's patches channels last (k·c = 20).
		{b: 3, c: 4, h: 6, w: 7, o: 9, k: 5, pad: 2},
	} {
		g.oh, g.ow = g.h+2*g.pad-g.k+1, g.w+2*g.pad-g.k+1
		rng := rand.New(rand.NewPCG(uint64(g.o), 1))
		x, w := randomFloats(rng, g.b*g.c*g.h*g.w), randomFloats(rng, g.o*g.ckk())
		b, dy := randomFloats(rng, g.o), randomFloats(rng, g.b*g.o*g.p())
		st := newConvState(g, true, gemm.New(2), nil)
		y := make([]float32, len(dy))
		dx, dw, db := make([]float32, len(x)), make([]float32, len(w)), make([]float32, g.o)
		st.forward(x, w, b, y)
		st.gradW(x, dy, dw)
		st.gradB(dy, db)
		st.gradX(w, dy, dx)
		wy, wdx, wdw, wdb := naiveConv(g, x, w, b, dy)
		close32(t, "y", y, wy)
		close32(t, "dx", dx, wdx)
		close32(t, "dw", dw, wdw)
		close32(t, "db", db, wdb)
	}
}

func randomFloats(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.NormFloat64())
	}
	return s
}

// TestSameBitsWhateverTheThreads: the cnn's loss and gradients do not
// depend on how many threads computed them, so replicas with different
// core budgets stay identical.
func TestSameBitsWhateverTheThreads(t *testing.T) {
	spec, err := BuiltinSpec("cnn", 1, 28, 28, 10)
	if err != nil {
		t.Fatal(err)
	}
	const batch = 4
	rng := rand.New(rand.NewPCG(2, 2))
	x, y := randomBatch(rng, batch, 784, 10)
	run := func(threads int) (float32, [][]float32) {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(threads))
		m, err := NewModel(ModelConfig{Spec: spec, Batch: batch, Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		loss, err := m.ForwardBackward(x, y, batch)
		if err != nil {
			t.Fatal(err)
		}
		var grads [][]float32
		for _, g := range m.Grads() {
			grads = append(grads, append([]float32(nil), g...))
		}
		return loss, grads
	}
	loss1, g1 := run(1)
	loss3, g3 := run(3)
	if math.Float32bits(loss1) != math.Float32bits(loss3) {
		t.Fatalf("loss %g with 1 thread, %g with 3", loss1, loss3)
	}
	for i := range g1 {
		for j := range g1[i] {
			if math.Float32bits(g1[i][j]) != math.Float32bits(g3[i][j]) {
				t.Fatalf("gradient %d[%d]: %g with 1 thread, %g with 3", i, j, g1[i][j], g3[i][j])
			}
		}
	}
}
