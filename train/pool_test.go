package train

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ringtrain/ringtrain/train/vec"
)

// TestMaxPoolMatchesItsDefinition: each window's value is its first
// largest, from its first value on (a NaN there stays; a window of −Inf
// gives −Inf), and its gradient goes to that position alone — for the
// unrolled 2×2 window and the general loop, on planes that the windows do
// not tile.
func TestMaxPoolMatchesItsDefinition(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, g := range []poolGeom{
		{b: 2, c: 3, h: 6, w: 8, k: 2},
		{b: 1, c: 2, h: 7, w: 5, k: 2},
		{b: 2, c: 1, h: 9, w: 10, k: 3},
		{b: 1, c: 1, h: 4, w: 4, k: 1},
	} {
		rng := rand.New(rand.NewPCG(uint64(g.h), uint64(g.k)))
		x := make([]float32, g.b*g.c*g.h*g.w)
		for i := range x {
			// Few distinct values, so that windows hold ties.
			x[i] = float32(rng.IntN(4))
		}
		// A NaN starting window (0, 0) of plane 0, a NaN inside window
		// (0, 1), and a window of −Inf at (1, 0).
		x[0] = nan
		if g.k > 1 {
			x[g.k+1] = nan
		}
		for ky := range g.k {
			for kx := range g.k {
				x[(g.k+ky)*g.w+kx] = -inf
			}
		}
		oh, ow := g.h/g.k, g.w/g.k
		dy := make([]float32, g.b*g.c*oh*ow)
		for i := range dy {
			dy[i] = float32(i + 1)
		}
		y := make([]float32, len(dy))
		dx := make([]float32, len(x))
		for i := range dx {
			dx[i] = 99 // all must be written
		}
		maxPool(g, x, y)
		maxPoolGrad(g, x, dy, dx)

		wantDx := make([]float32, len(x))
		for p := range g.b * g.c {
			for oy := range oh {
				for ox := range ow {
					var at []int
					for ky := range g.k {
						for kx := range g.k {
							at = append(at, p*g.h*g.w+(oy*g.k+ky)*g.w+ox*g.k+kx)
						}
					}
					arg := at[0]
					for _, i := range at[1:] {
						if x[i] > x[arg] {
							arg = i
						}
					}
					o := (p*oh+oy)*ow + ox
					if math.Float32bits(y[o]) != math.Float32bits(x[arg]) {
						t.Fatalf("%+v: y[%d] = %v, want %v", g, o, y[o], x[arg])
					}
					wantDx[arg] = dy[o]
				}
			}
		}
		for i := range dx {
			if dx[i] != wantDx[i] {
				t.Fatalf("%+v: dx[%d] = %v, want %v", g, i, dx[i], wantDx[i])
			}
		}
		if !math.IsNaN(float64(y[0])) || (g.k > 1 && !(y[ow] == -inf)) {
			t.Errorf("%+v: a window starting with NaN gave %v; a window of −Inf %v", g, y[0], y[ow])
		}
	}
}

// TestReluThenPoolIsPoolThenRelu: the model builds a ReLU followed by a
// max-pool as the pool followed by the ReLU, on a quarter of the values;
// on windows of negatives, zeros of both signs, ties and NaNs the two
// give the same values and the same input gradients, bit for bit.
func TestReluThenPoolIsPoolThenRelu(t *testing.T) {
	g := poolGeom{b: 2, c: 3, h: 8, w: 6, k: 2}
	rng := rand.New(rand.NewPCG(8, 8))
	specials := []float32{0, float32(math.Copysign(0, -1)), -1, 1, -2, float32(math.NaN()), float32(math.Inf(-1))}
	x := make([]float32, g.b*g.c*g.h*g.w)
	for i := range x {
		x[i] = specials[rng.IntN(len(specials))]
	}
	dy := make([]float32, g.b*g.c*g.oh()*g.ow())
	for i := range dy {
		dy[i] = float32(i + 1)
	}
	// ReLU, then the pool.
	r := make([]float32, len(x))
	vec.Relu(x, r)
	y1 := make([]float32, len(dy))
	maxPool(g, r, y1)
	dr := make([]float32, len(x))
	maxPoolGrad(g, r, dy, dr)
	dx1 := make([]float32, len(x))
	vec.ReluGrad(r, dr, dx1)
	// The pool, then ReLU.
	p := make([]float32, len(dy))
	maxPool(g, x, p)
	y2 := make([]float32, len(dy))
	vec.Relu(p, y2)
	dp := make([]float32, len(dy))
	vec.ReluGrad(y2, dy, dp)
	dx2 := make([]float32, len(x))
	maxPoolGrad(g, x, dp, dx2)
	for i := range y1 {
		if math.Float32bits(y1[i]) != math.Float32bits(y2[i]) {
			t.Fatalf("value %d: %v (ReLU first), %v (pool first)", i, y1[i], y2[i])
		}
	}
	for i := range dx1 {
		if math.Float32bits(dx1[i]) != math.Float32bits(dx2[i]) {
			t.Fatalf("gradient %d (x = %v): %v (ReLU first), %v (pool first)", i, x[i], dx1[i], dx2[i])
		}
	}
}
