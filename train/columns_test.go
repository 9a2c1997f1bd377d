package train

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestColumnsMatchDense: the aggregate, scores, cosines and spread over
// columns — gathered from dense updates or merged from sparse entries —
// are, bit for bit, the dense versions' (robustref_test.go) on updates
// from one value a coordinate to every value set, with ties, values
// alike on every rank, and explicit zeros among the entries; the columns
// merged from entries are the ones gathered from the dense updates.
func TestColumnsMatchDense(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, n := range []int{3, 4, 5, 8, 9} {
		for _, density := range []float64{0.01, 0.1, 0.4, 1} {
			for trial := range 4 {
				xs, idx, val := sparseUpdates(rng, n, 300, density, trial)
				sup := refSupport(xs)
				dense := new(columns).gather(xs, sup)
				merged := new(columns).merge(300, idx, val)
				if !slices.Equal(merged.at, dense.at) || !slices.Equal(merged.nz, dense.nz) || !sameBits(merged.v, dense.v) {
					t.Fatalf("%d ranks, density %v, trial %d: merged columns differ from gathered", n, density, trial)
				}
				want, got := make([]float32, 300), make([]float32, 300)
				wantScores := refCenteredClip(want, xs, sup, 2, 3)
				gotCos := make([]float64, n)
				gotScores := centeredClip(got, merged, 2, 3, gotCos)
				if !sameBits(got, want) || !slices.Equal(gotScores, wantScores) {
					t.Fatalf("%d ranks, density %v, trial %d: the aggregate or scores differ from the dense version's", n, density, trial)
				}
				if c, w := merged.othersCosines(), refOthersCosines(xs, sup); !slices.Equal(c, w) || !slices.Equal(gotCos, w) {
					t.Fatalf("%d ranks, density %v, trial %d: cosines %v and %v from the aggregate's pass; want %v", n, density, trial, c, gotCos, w)
				}
				dist, cos := spread(new(columns).gather(xs, nil), 2)
				if w := refSpread(xs, 2); !slices.Equal(dist, w) {
					t.Fatalf("%d ranks, density %v, trial %d: spread %v; want %v", n, density, trial, dist, w)
				}
				if w := refOthersCosines(xs, nil); !slices.Equal(cos, w) {
					t.Fatalf("%d ranks, density %v, trial %d: spread's cosines %v; want %v", n, density, trial, cos, w)
				}
			}
		}
	}
}

// sparseUpdates is n updates of size values, each set with probability
// density (trial 1: small integers, many ties; trial 2: one value shared
// by every rank at some coordinates; trial 3: some entries an explicit 0),
// dense and as ascending entries.
func sparseUpdates(rng *rand.Rand, n, size int, density float64, trial int) ([][]float32, [][]int32, [][]float32) {
	xs := make([][]float32, n)
	idx, val := make([][]int32, n), make([][]float32, n)
	for i := range xs {
		xs[i] = make([]float32, size)
	}
	for j := range size {
		shared := float32(rng.NormFloat64())
		for i := range xs {
			if rng.Float64() >= density {
				if trial == 3 && rng.IntN(4) == 0 {
					idx[i], val[i] = append(idx[i], int32(j)), append(val[i], 0)
				}
				continue
			}
			v := float32(rng.NormFloat64())
			switch {
			case trial == 1:
				v = float32(rng.IntN(5) - 2)
			case trial == 2 && j%3 == 0:
				v = shared
			}
			xs[i][j] = v
			idx[i], val[i] = append(idx[i], int32(j)), append(val[i], v)
		}
	}
	return xs, idx, val
}

func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}
