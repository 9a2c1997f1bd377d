package train

import (
	"math"
	"math/rand/v2"
	"testing"
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
