package gemm

import "math"

// kernel is a micro-kernel: it computes one mr × nr tile of a product from
// k steps of an A strip (k rows of mr values, lda apart: mr when packed,
// A's own row stride when A is stored k × m and read in place) and a B
// panel (k rows of nr values, ldb apart, likewise) and stores the tile at
// c with row stride ldc, overwriting it; with load, each sum starts from
// the tile's value in c instead of zero (a product taken k in blocks: the
// same bits as in one go). The caller guarantees the slices are long
// enough.
type kernel struct {
	name   string
	mr, nr int
	run    func(k int, a, b, c []float32, ldc, ldb, lda int, load bool)
	// alt are the same instructions in other tile shapes: a product
	// takes the shape that pads it least (shapeFor).
	alt []kernel
}

// shapeFor is the shape of k (k itself or one of its alt) whose tiles
// cover an m × n product with the fewest padded values; k on a tie.
func (k kernel) shapeFor(m, n int) kernel {
	padded := func(s kernel) int { return (m + s.mr - 1) / s.mr * s.mr * ((n + s.nr - 1) / s.nr * s.nr) }
	best := k
	for _, s := range k.alt {
		if padded(s) < padded(best) {
			best = s
		}
	}
	return best
}

// goKernel is the portable kernel: the same arithmetic as the assembly
// ones, element by element.
func goKernel(mr, nr int) kernel {
	return kernel{name: "go", mr: mr, nr: nr, run: func(k int, a, b, c []float32, ldc, ldb, lda int, load bool) {
		for r := range mr {
			row := c[r*ldc : r*ldc+nr]
			for q := range row {
				acc := float32(0)
				if load {
					acc = row[q]
				}
				for p := range k {
					acc = fma32(a[p*lda+r], b[p*ldb+q], acc)
				}
				row[q] = acc
			}
		}
	}}
}

// fma32 returns x·y+z rounded once to float32, as the FMA instructions do.
// x·y is exact in float64; the sum is rounded to odd (its last bit set when
// inexact), and a float64 rounded to odd and then to float32 is the
// correctly rounded float32, since 53 ≥ 2·24+2 (Boldo & Melquiond, "Emulation
// of FMA and correctly rounded sums: proved algorithms using rounding to
// odd", IEEE TC 2008).
func fma32(x, y, z float32) float32 {
	p := float64(x) * float64(y)
	zz := float64(z)
	s := p + zz
	if math.IsInf(s, 0) || math.IsNaN(s) {
		return float32(s)
	}
	// TwoSum: e is exactly (p + zz) − s.
	bb := s - p
	e := (p - (s - bb)) + (zz - bb)
	if e != 0 {
		bits := math.Float64bits(s)
		if bits&1 == 0 {
			// Move s one ulp toward the exact sum: away from zero when the
			// error has s's sign, toward it otherwise.
			if (e > 0) == (s > 0) {
				bits++
			} else {
				bits--
			}
			s = math.Float64frombits(bits)
		}
	}
	return float32(s)
}
