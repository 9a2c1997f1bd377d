package train

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestColumnsMatchDense: the columns merged from sparse entries are, bit
// for bit, those gathered from the dense updates; the aggregate, scores,
// cosines and spread over them are the dense versions'
// (robustref_test.go) but for rounding — a rank's lone coordinates are
// summed apart, and stepped as a multiple of its values — on updates from
// one value a coordinate to every value set, with ties, values alike on
// every rank, and explicit zeros among the entries; and the same bits on
// the same updates whichever way the columns were made.
func TestColumnsMatchDense(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, n := range []int{3, 4, 5, 8, 9} {
		for _, density := range []float64{0.01, 0.1, 0.4, 1} {
			for trial := range 4 {
				name := fmt.Sprintf("%d ranks, density %v, trial %d", n, density, trial)
				xs, idx, val := sparseUpdates(rng, n, 300, density, trial)
				sup := refSupport(xs)
				dense := new(columns).gather(xs, sup)
				merged := new(columns).merge(300, idx, val)
				if !sameColumns(merged, dense) {
					t.Fatalf("%s: merged columns differ from gathered", name)
				}
				lone := 0
				for _, a := range merged.aloneAt {
					lone += len(a)
				}
				if n >= lonesFrom && density <= 0.1 && lone == 0 {
					t.Fatalf("%s: no lone coordinates: the test shows nothing of them", name)
				}
				want, got, again := make([]float32, 300), make([]float32, 300), make([]float32, 300)
				wantScores := refCenteredClip(want, xs, sup, 2, 3)
				gotCos := make([]float64, n)
				gotScores := centeredClip(got, merged, 2, 3, gotCos)
				if centeredClip(again, dense, 2, 3, nil); !sameBits(again, got) {
					t.Fatalf("%s: other bits from the gathered columns", name)
				}
				if d := maxDiff32(got, want); d > 1e-5*maxAbs32(want) {
					t.Fatalf("%s: the aggregate is %g off the dense version's", name, d)
				}
				if !near(gotScores, wantScores, 1e-9) {
					t.Fatalf("%s: scores %v; want %v", name, gotScores, wantScores)
				}
				if c, w := merged.othersCosines(), refOthersCosines(xs, sup); !near(c, w, 1e-12) || !slices.Equal(gotCos, c) {
					t.Fatalf("%s: cosines %v and %v from the aggregate's pass; want %v", name, c, gotCos, w)
				}
				dist, cos := spread(new(columns).gather(xs, nil), 2)
				if w := refSpread(xs, 2); !near(dist, w, 1e-9) {
					t.Fatalf("%s: spread %v; want %v", name, dist, w)
				}
				if w := refOthersCosines(xs, nil); !near(cos, w, 1e-12) {
					t.Fatalf("%s: spread's cosines %v; want %v", name, cos, w)
				}
			}
		}
	}
}

func sameColumns(a, b *columns) bool {
	if a.n != b.n || !slices.Equal(a.at, b.at) || !slices.Equal(a.nz, b.nz) || !sameBits(a.v, b.v) || !slices.Equal(a.own, b.own) {
		return false
	}
	for i := range a.n {
		if !slices.Equal(a.aloneAt[i], b.aloneAt[i]) || !sameBits(a.alone[i], b.alone[i]) {
			return false
		}
	}
	return true
}

func maxDiff32(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

func maxAbs32(a []float32) float64 {
	var m float64
	for _, v := range a {
		m = max(m, math.Abs(float64(v)))
	}
	return m
}

// near reports whether a and b are equal within rel of the larger of
// each pair (or 1).
func near(a, b []float64, rel float64) bool {
	return slices.EqualFunc(a, b, func(x, y float64) bool {
		return math.Abs(x-y) <= rel*max(1, math.Abs(x), math.Abs(y))
	})
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

// othersCosines is each rank's cosine against the median of the others'
// alone, as median's pass gives it.
func (c *columns) othersCosines() []float64 {
	cos := make([]float64, c.n)
	c.median(make([]float32, len(c.nz)), nil, cos)
	return cos
}

// TestSortRanksIsStable: sortRanks orders a column's ranks as a stable
// sort by value does — ties, −0 beside +0 and all — for the four ranks
// its network sorts and for the others.
func TestSortRanksIsStable(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	pool := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 0.5, -0.5, math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32}
	for n := 1; n <= 20; n++ {
		for range 500 {
			row := make([]float32, n)
			for i := range row {
				row[i] = pool[rng.IntN(len(pool))]
				if rng.IntN(3) == 0 {
					row[i] = float32(rng.NormFloat64())
				}
			}
			want := make([]int, n)
			for i := range want {
				want[i] = i
			}
			slices.SortStableFunc(want, func(a, b int) int {
				switch {
				case row[a] < row[b]:
					return -1
				case row[a] > row[b]:
					return 1
				}
				return 0
			})
			idx, col := make([]int, n), make([]float32, n)
			sortRanks(idx, col, row, make([]uint64, n))
			if !slices.Equal(idx, want) {
				t.Fatalf("row %v: ranks %v; want %v", row, idx, want)
			}
			for p, i := range idx {
				if math.Float32bits(col[p]) != math.Float32bits(row[i]) {
					t.Fatalf("row %v: col[%d] = %v; want row[%d] = %v", row, p, col[p], i, row[i])
				}
			}
		}
	}
}

// TestClipStep4MatchesClipStep: four ranks' fused step gives the bits of
// the step and the distances taken apart, zeros' signs included.
func TestClipStep4MatchesClipStep(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, density := range []float64{0.01, 0.1, 0.4, 1} {
		for trial := range 4 {
			_, idx, val := sparseUpdates(rng, 4, 300, density, trial)
			c := new(columns).merge(300, idx, val)
			v := make([]float32, len(c.at))
			for k := range v {
				v[k] = float32(rng.NormFloat64())
				if k%7 == 0 {
					v[k] = float32(math.Copysign(0, -1))
				}
			}
			w := []float64{0.25, 0.1, 0.25, 0.05}
			alpha := []float64{0.3, 0.2, 0, 0.1}
			v1, a1, d1 := slices.Clone(v), slices.Clone(alpha), make([]float64, 4)
			c.clipStep(v1, a1, w, d1) // fused
			v2, a2, d2 := slices.Clone(v), slices.Clone(alpha), make([]float64, 4)
			c.clipStep(v2, a2, w, nil) // the general step, then the distances
			c.distances(d2, v2, a2)
			if !sameBits(v1, v2) || !slices.Equal(a1, a2) || !slices.Equal(d1, d2) {
				t.Fatalf("density %v, trial %d: fused %v %v; apart %v %v", density, trial, a1, d1, a2, d2)
			}
		}
	}
}

// TestMedianOfFourIsMedianAt: four ranks' columns, in registers, give
// medianAt's bits — medians, distances and cosines — on updates with
// ties, −0 and values alike on every rank.
func TestMedianOfFourIsMedianAt(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	for trial := range 4 {
		for _, density := range []float64{0.1, 1} {
			xs, idx, val := sparseUpdates(rng, 4, 500, density, trial)
			xs[1][7], xs[2][7] = float32(math.Copysign(0, -1)), 1
			for _, c := range []*columns{new(columns).merge(500, idx, val), new(columns).gather(xs, nil)} {
				if slices.ContainsFunc(c.nz, func(z uint16) bool { return z < 2 }) {
					t.Fatalf("trial %d: a column of four with fewer than two values: median4 would not run", trial)
				}
				m, dist, cos := make([]float32, len(c.nz)), make([]float64, 4), make([]float64, 4)
				c.median(m, dist, cos)
				want, wantDist, wantCos := make([]float32, len(c.nz)), make([]float64, 4), make([]float64, 4)
				oc := &othersCos{xa: make([]float64, 4), aa: make([]float64, 4)}
				s := medianScratch{make([]int, 4), make([]float32, 4), make([]uint64, 4)}
				for k := range c.nz {
					c.medianAt(k, want, oc, s)
				}
				c.distances(wantDist, want, nil)
				oc.xx = make([]float64, 4)
				c.squares(oc.xx, nil)
				for i, o := range c.own {
					oc.xx[i] += o
				}
				oc.cosines(wantCos)
				if !sameBits(m, want) || !slices.Equal(dist, wantDist) || !slices.Equal(cos, wantCos) {
					t.Fatalf("trial %d, density %v: medians, distances, cosines differ from medianAt's: %v %v / %v %v", trial, density, dist, cos, wantDist, wantCos)
				}
			}
		}
	}
}
