package gemm

import (
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/blas"
)

// TestTransposeBlocks: each block comes out transposed, every value in
// its place, the rows past the block's as zeros, and nothing outside the
// cols of each output row written — for full blocks and a packed strip's
// shapes (12 and 6 lanes, a ragged last strip), one block or a run.
func TestTransposeBlocks(t *testing.T) {
	const lds, ldd = 53, 19
	rng := rand.New(rand.NewPCG(4, 4))
	for _, c := range []struct{ rows, cols, blocks int }{{16, 16, 1}, {12, 12, 3}, {5, 12, 2}, {6, 6, 1}, {1, 4, 3}, {16, 3, 2}} {
		src := make([]float32, (c.rows-1)*lds+16*c.blocks)
		for i := range src {
			src[i] = rng.Float32()
		}
		dst := make([]float32, 16*c.blocks*ldd)
		for i := range dst {
			dst[i] = -1
		}
		if !transposeBlocks(src, lds, dst, ldd, c.rows, c.cols, c.blocks) {
			t.Skip("no block transpose on this CPU")
		}
		for i := range 16 * c.blocks {
			for j := range ldd {
				want := float32(-1)
				switch {
				case j < min(c.rows, c.cols):
					want = src[j*lds+i]
				case j < c.cols:
					want = 0
				}
				if got := dst[i*ldd+j]; got != want {
					t.Fatalf("%+v: dst[%d][%d] = %v, want %v", c, i, j, got, want)
				}
			}
		}
	}
}

// bigCase is the size (m·n·k) past which a serial kernel's case is left
// out under the race detector.
const bigCase = 100_000

// TestSgemmTMatchesSgemm: a product with B packed once and C written
// transposed gives the bits of the same product from SgemmSerial, for
// every kernel, either form of A and B (A read in place or packed, a
// ragged last strip and panel), and a PackedB reused across shapes; C's
// values outside the product are left alone.
func TestSgemmTMatchesSgemm(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, ker := range testKernels() {
		im := withKernel(ker, 1)
		var p PackedB
		// pad: A stored k × m has rows RowMultiple-rounded m + pad long,
		// NaNs past m, which a ragged last strip read in place must not
		// carry into C.
		for _, c := range []struct{ m, n, k, pad int }{{196, 64, 800, 0}, {196, 64, 800, 1}, {196, 800, 64, 0}, {13, 70, 9, 0}, {1, 1, 1, 0}, {30, 33, 17, 0}, {30, 33, 17, 1}, {5, 3, 0, 0}, {40, 20, 2000, 0}} {
			if underRace && c.m*c.n*c.k > bigCase {
				continue // make test runs them without the detector (test-norace)
			}
			for _, tA := range []blas.Transpose{blas.NoTrans, blas.Trans} {
				for _, tB := range []blas.Transpose{blas.NoTrans, blas.Trans} {
					a, b := randMat(rng, (c.m+RowMultiple+1)*(c.k+1)), randMat(rng, (c.k+1)*(c.n+1))
					lda, ldb := max(c.k, 1), c.n
					if tA == blas.Trans {
						lda = c.m
						if c.pad > 0 {
							lda = (c.m+RowMultiple-1)/RowMultiple*RowMultiple + c.pad - 1
							for p := range c.k {
								for i := c.m; i < lda; i++ {
									a[p*lda+i] = float32(math.NaN())
								}
							}
						}
					}
					if tB == blas.Trans {
						ldb = max(c.k, 1)
					}
					want := make([]float32, c.m*c.n)
					im.SgemmSerial(tA, tB, c.m, c.n, c.k, 1, a, lda, b, ldb, 0, want, c.n)
					ldc := c.m + 1
					got := randMat(rng, c.n*ldc)
					pad := make([]float32, c.n)
					for q := range pad {
						pad[q] = got[q*ldc+c.m]
					}
					im.PackB(&p, tB, c.k, c.n, b, ldb)
					im.SgemmTSerial(tA, c.m, a, lda, &p, got, ldc)
					for i := range c.m {
						for q := range c.n {
							if g, w := got[q*ldc+i], want[i*c.n+q]; math.Float32bits(g) != math.Float32bits(w) {
								t.Fatalf("%s %+v tA %v tB %v: C[%d][%d] = %v, want %v", ker.name, c, tA, tB, q, i, g, w)
							}
						}
					}
					for q, v := range pad {
						if got[q*ldc+c.m] != v {
							t.Fatalf("%s %+v tA %v tB %v: C[%d][%d], outside the product, was written", ker.name, c, tA, tB, q, c.m)
						}
					}
				}
			}
		}
	}
}

// TestPackedAMatchesSgemm: a product with A packed once gives the bits of
// the same product packing A itself, for every kernel, either form of A
// and B, beta 0 or 1, and a PackedA reused across shapes.
func TestPackedAMatchesSgemm(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, ker := range testKernels() {
		im := withKernel(ker, 1)
		var p PackedA
		for _, c := range []struct{ m, n, k int }{{64, 196, 800}, {13, 70, 9}, {1, 1, 1}, {30, 33, 17}, {5, 3, 0}} {
			if underRace && c.m*c.n*c.k > bigCase {
				continue // make test runs them without the detector (test-norace)
			}
			for _, tA := range []blas.Transpose{blas.NoTrans, blas.Trans} {
				for _, tB := range []blas.Transpose{blas.NoTrans, blas.Trans} {
					for _, beta := range []float32{0, 1} {
						a, b := randMat(rng, (c.m+1)*(c.k+1)), randMat(rng, (c.k+1)*(c.n+1))
						lda, ldb := max(c.k, 1), c.n
						if tA == blas.Trans {
							lda = c.m
						}
						if tB == blas.Trans {
							ldb = max(c.k, 1)
						}
						c0 := randMat(rng, c.m*c.n)
						want, got := append([]float32(nil), c0...), append([]float32(nil), c0...)
						im.SgemmSerial(tA, tB, c.m, c.n, c.k, 1, a, lda, b, ldb, beta, want, c.n)
						im.PackA(&p, tA, c.m, c.k, a, lda)
						im.SgemmPackedSerial(&p, tB, c.n, b, ldb, beta, got, c.n)
						for i := range want {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("%s %+v tA %v tB %v beta %v: element %d = %v, want %v", ker.name, c, tA, tB, beta, i, got[i], want[i])
							}
						}
					}
				}
			}
		}
	}
}

// TestTranspose: Transpose against the definition, for sizes under, at
// and over the 16 × 16 blocks, with strides wider than the matrices, and
// nothing written outside dst's matrix.
func TestTranspose(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, c := range []struct{ rows, cols, lds, ldd int }{{1, 1, 1, 1}, {196, 32, 32, 196}, {17, 33, 40, 20}, {16, 16, 16, 16}, {5, 48, 50, 7}, {33, 7, 7, 40}} {
		src := randMat(rng, c.rows*c.lds)
		dst := randMat(rng, c.cols*c.ldd)
		want := append([]float32(nil), dst...)
		for r := range c.rows {
			for q := range c.cols {
				want[q*c.ldd+r] = src[r*c.lds+q]
			}
		}
		Transpose(dst, c.ldd, src, c.lds, c.rows, c.cols)
		for i := range want {
			if math.Float32bits(dst[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%+v: dst[%d] = %v, want %v", c, i, dst[i], want[i])
			}
		}
	}
}
