package vec

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// Erf32 and Exp32 against float64's, over their ranges, finely.
func TestMath32(t *testing.T) {
	var worstErf, worstExp float64
	for i := -120000; i <= 120000; i++ {
		x := float32(i) / 10000 // −12 … 12
		if e := math.Abs(float64(Erf32(x)) - math.Erf(float64(x))); e > worstErf {
			worstErf = e
		}
	}
	for i := -870000; i <= 880000; i++ {
		x := float32(i) / 10000
		want := math.Exp(float64(x))
		if e := math.Abs(float64(Exp32(x))-want) / want; e > worstExp && want > 1e-37 {
			worstExp = e
		}
	}
	if worstErf > 5e-7 || worstExp > 2e-7 {
		t.Errorf("worst errors: erf %.3g absolute, exp %.3g relative; want within 5e-7 and 2e-7", worstErf, worstExp)
	}
	if Exp32(-100) != 0 || !math.IsInf(float64(Exp32(100)), 1) || Exp32(0) != 1 || Erf32(0) != 0 || Erf32(9) != 1 || Erf32(-9) != -1 {
		t.Errorf("edges: exp(−100) %v, exp(100) %v, exp(0) %v, erf(0) %v, erf(±9) %v %v", Exp32(-100), Exp32(100), Exp32(0), Erf32(0), Erf32(9), Erf32(-9))
	}
	if v := Exp32(float32(math.NaN())); v == v {
		t.Errorf("exp(NaN) = %v; want NaN", v)
	}
}

// ExpSlice and ErfSlice are Exp32 and Erf32 bit for bit, the vector lanes
// and the tail alike: over a sweep of each one's range, its edges, NaN,
// ±Inf, ±0 and the subnormal results.
func TestMath32Slices(t *testing.T) {
	var xs []float32
	for i := -2000000; i <= 2000000; i += 7 {
		xs = append(xs, float32(i)/20000) // −100 … 100
	}
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1), 88.72283, 88.72284, -87.33655, -87.33656,
		-86.5, -87, 88.5, 88.7, 1e-30, -1e-30, 4, -4, 4.0000005, -3.9999998, 1e30, -1e30} {
		xs = append(xs, float32(v))
	}
	for n := range 40 { // every tail length
		xs = append(xs, float32(n)/3-6)
	}
	rng := rand.New(rand.NewPCG(8, 8))
	for range 100000 {
		xs = append(xs, math.Float32frombits(rng.Uint32()))
	}
	for _, f := range []struct {
		name   string
		slice  func(dst, src []float32)
		scalar func(float32) float32
	}{{"exp", ExpSlice, Exp32}, {"erf", ErfSlice, Erf32}} {
		got := make([]float32, len(xs))
		f.slice(got, xs)
		for i, x := range xs {
			if want := f.scalar(x); math.Float32bits(got[i]) != math.Float32bits(want) && !(want != want && got[i] != got[i]) {
				t.Fatalf("%s(%v) [%d]: the slice gives %v (%#x), the scalar %v (%#x)", f.name, x, i, got[i], math.Float32bits(got[i]), want, math.Float32bits(want))
			}
		}
		in := slices.Clone(xs[:37])
		f.slice(in, in) // in place
		for i, x := range xs[:37] {
			if want := f.scalar(x); math.Float32bits(in[i]) != math.Float32bits(want) && !(want != want && in[i] != in[i]) {
				t.Fatalf("%s in place [%d]: %v; want %v", f.name, i, in[i], want)
			}
		}
	}
}

// GELU and GELUGrad are their scalar loops bit for bit, the vector lanes
// and the tail alike: each value against the same call on it alone,
// which no vector covers.
func TestGELUSlices(t *testing.T) {
	var xs []float32
	for i := -400000; i <= 400000; i += 3 {
		xs = append(xs, float32(i)/20000) // −20 … 20
	}
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1), 13.3, -13.3, 1e-30, 1e30, -1e30} {
		xs = append(xs, float32(v))
	}
	rng := rand.New(rand.NewPCG(9, 9))
	for range 50000 {
		xs = append(xs, math.Float32frombits(rng.Uint32()))
	}
	dy := make([]float32, len(xs))
	for i := range dy {
		dy[i] = float32(rng.NormFloat64())
	}
	out, cdf, dx := make([]float32, len(xs)), make([]float32, len(xs)), make([]float32, len(xs))
	GELU(out, cdf, xs)
	GELUGrad(dx, dy, xs, cdf)
	same := func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b }
	for i, x := range xs {
		var o, c, d [1]float32
		GELU(o[:], c[:], xs[i:i+1])
		GELUGrad(d[:], dy[i:i+1], xs[i:i+1], c[:])
		if !same(out[i], o[0]) || !same(cdf[i], c[0]) || !same(dx[i], d[0]) {
			t.Fatalf("x = %v [%d]: the slice gives %v, Φ %v, gradient %v; alone %v, %v, %v", x, i, out[i], cdf[i], dx[i], o[0], c[0], d[0])
		}
	}
	// The values themselves: GELU(1) = 0.8413447·1, its slope Φ(1) + φ(1).
	var o, c, d [1]float32
	GELU(o[:], c[:], []float32{1})
	GELUGrad(d[:], []float32{1}, []float32{1}, c[:])
	if math.Abs(float64(o[0])-0.8413447460685429) > 1e-6 || math.Abs(float64(d[0])-(0.8413447460685429+0.24197072451914337)) > 1e-6 {
		t.Errorf("GELU(1) = %v, slope %v; want 0.8413447, 1.0833155", o[0], d[0])
	}
}
