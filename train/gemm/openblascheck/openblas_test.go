//go:build netlib

package openblascheck

import (
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/netlib/blas/netlib"

	"github.com/ringtrain/ringtrain/train/gemm"
)

func randMat(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.NormFloat64())
	}
	return s
}

// TestAgainstOpenBLAS: train/gemm's product (the kernel this CPU runs)
// equals OpenBLAS's sgemm to float32 rounding — random shapes from 1 to 300, each transpose, leading
// dimensions past the rows, random alpha and beta over a random C, one
// thread and several. The bound is what the two summation orders can
// differ by: a few float32 epsilons of Σ|a||b| for each element (and of
// |βc|).
func TestAgainstOpenBLAS(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	ref := netlib.Implementation{}
	trans := []blas.Transpose{blas.NoTrans, blas.Trans}
	const eps = 1.0 / (1 << 23)
	for _, threads := range []int{1, 3} {
		im := gemm.New(threads)
		for range 40 {
			m, n, kk := 1+rng.IntN(300), 1+rng.IntN(300), 1+rng.IntN(300)
			tA, tB := trans[rng.IntN(2)], trans[rng.IntN(2)]
			ar, ac := m, kk
			if tA == blas.Trans {
				ar, ac = kk, m
			}
			br, bc := kk, n
			if tB == blas.Trans {
				br, bc = n, kk
			}
			lda, ldb, ldc := ac+rng.IntN(5), bc+rng.IntN(5), n+rng.IntN(5)
			a, b, c0 := randMat(rng, ar*lda), randMat(rng, br*ldb), randMat(rng, m*ldc)
			alpha, beta := float32(rng.NormFloat64()), float32(rng.NormFloat64())
			if rng.IntN(4) == 0 {
				beta = 0
			}
			got, want := append([]float32(nil), c0...), append([]float32(nil), c0...)
			im.Sgemm(tA, tB, m, n, kk, alpha, a, lda, b, ldb, beta, got, ldc)
			ref.Sgemm(tA, tB, m, n, kk, alpha, a, lda, b, ldb, beta, want, ldc)
			at := func(x []float32, ld int, tr blas.Transpose, i, j int) float64 {
				if tr == blas.Trans {
					return float64(x[j*ld+i])
				}
				return float64(x[i*ld+j])
			}
			for i := range m {
				for j := range n {
					var mag float64
					for p := range kk {
						mag += math.Abs(at(a, lda, tA, i, p) * at(b, ldb, tB, p, j))
					}
					bound := 4*eps*(float64(kk)+2)*(math.Abs(float64(alpha))*mag+math.Abs(float64(beta)*float64(c0[i*ldc+j]))) + 1e-30
					if d := math.Abs(float64(got[i*ldc+j]) - float64(want[i*ldc+j])); d > bound {
						t.Fatalf("%s, %d threads, %v%v %d×%d×%d (ld %d %d %d): C[%d,%d] = %v, OpenBLAS %v, off by %g > %g",
							im.Kernel(), threads, tA, tB, m, n, kk, lda, ldb, ldc, i, j, got[i*ldc+j], want[i*ldc+j], d, bound)
					}
				}
			}
			// Past each row's n columns, C is untouched.
			for i := range m {
				for j := n; j < ldc; j++ {
					if got[i*ldc+j] != c0[i*ldc+j] {
						t.Fatalf("%s: C[%d,%d] past the product's columns was written", im.Kernel(), i, j)
					}
				}
			}
		}
	}
}
