package train

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestNorm2: within float32 rounding of the float64 norm for gradients of
// any size; past float32's range (squares that overflow it) the float64
// norm itself; NaN and Inf as they come.
func TestNorm2(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	for _, tc := range []struct {
		n     int
		scale float64
	}{{0, 1}, {1, 1}, {63, 1e-3}, {1000, 1}, {235_146, 1e-2}, {100, 1e20}, {100, 1e-30}} {
		v := make([]float32, tc.n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * tc.scale)
		}
		got, want := norm2(v), norm2Wide(v)
		if math.Abs(got-want) > 1e-5*want {
			t.Errorf("%d values of scale %g: norm %v, float64 %v", tc.n, tc.scale, got, want)
		}
	}
	if got := norm2([]float32{1, float32(math.NaN())}); !math.IsNaN(got) {
		t.Errorf("with a NaN: %v", got)
	}
	if got := norm2([]float32{1, float32(math.Inf(-1))}); !math.IsInf(got, 1) {
		t.Errorf("with an Inf: %v", got)
	}
}
