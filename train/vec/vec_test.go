package vec

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// values mixes normal, tiny (subnormal-producing) and zero values.
func values(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		switch rng.IntN(4) {
		case 0:
			s[i] = float32(rng.NormFloat64())
		case 1:
			s[i] = float32(rng.NormFloat64() * 1e-3)
		case 2:
			s[i] = float32(rng.NormFloat64() * 1e-39)
		}
	}
	return s
}

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %g, the Go loop's %g", what, i, got[i], want[i])
		}
	}
}

// TestKernelsMatchTheGoLoops: the exported updates (assembly where the CPU
// has it, then the Go tail) give the Go loops' bits, for lengths around
// the vector width and values that go subnormal.
func TestKernelsMatchTheGoLoops(t *testing.T) {
	for _, n := range []int{0, 1, 15, 16, 17, 33, 1000, 4099} {
		for seed := range uint64(3) {
			rng := rand.New(rand.NewPCG(seed, uint64(n)))
			p, g, m, v := values(rng, n), values(rng, n), values(rng, n), values(rng, n)
			for i := range v {
				v[i] = float32(math.Abs(float64(v[i]))) // Adam's second moment
			}
			lr, mu, wd := float32(0.01), float32(0.9), float32(seed)*1e-4

			p1, v1 := slices.Clone(p), slices.Clone(v)
			SGD(p1, g, v1, lr, mu, wd)
			p2, v2 := slices.Clone(p), slices.Clone(v)
			sgdMomentumGo(p2, g, v2, lr, mu, wd)
			sameBits(t, "sgd p", p1, p2)
			sameBits(t, "sgd v", v1, v2)

			p1 = slices.Clone(p)
			SGD(p1, g, nil, lr, 0, wd)
			p2 = slices.Clone(p)
			sgdGo(p2, g, lr, wd)
			sameBits(t, "plain sgd p", p1, p2)

			c := AdamConsts{Step: 0.001 / 0.1, Sq: float32(math.Sqrt(0.001)), B1: 0.9, C1: 1 - float32(0.9), B2: 0.999, C2: 1 - float32(0.999), WD: wd, Eps: 1e-8}
			p1, m1, v1 := slices.Clone(p), slices.Clone(m), slices.Clone(v)
			Adam(p1, g, m1, v1, c.Step, c.Sq, c.B1, c.B2, c.WD, c.Eps)
			p2, m2, v2 := slices.Clone(p), slices.Clone(m), slices.Clone(v)
			adamGo(p2, g, m2, v2, &c)
			sameBits(t, "adam p", p1, p2)
			sameBits(t, "adam m", m1, m2)
			sameBits(t, "adam v", v1, v2)
		}
	}
}

// TestGoLoopsAreTorchsFormulas: the Go loops against the formulas written
// out plainly, one rounding per operation, a subnormal momentum made +0.
func TestGoLoopsAreTorchsFormulas(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	p, g, v := values(rng, 100), values(rng, 100), values(rng, 100)
	lr, mu, wd := float32(0.05), float32(0.8), float32(0.01)
	want, wantV := slices.Clone(p), slices.Clone(v)
	for j := range want {
		d := g[j] + float32(wd*want[j])
		wantV[j] = float32(mu*wantV[j]) + d
		if math.Abs(float64(wantV[j])) < 0x1p-126 {
			wantV[j] = 0
		}
		want[j] -= float32(lr * wantV[j])
	}
	SGD(p, g, v, lr, mu, wd)
	sameBits(t, "p", p, want)
	sameBits(t, "v", v, wantV)
}

// TestOptimizerStateIsFlushed: on every path (the vector kernels for the
// first 16 values, the Go loop for the rest), a momentum or moment that
// would be subnormal is stored as +0 — a weight with no gradient does not
// keep one forever — while the smallest normal, NaN and Inf are kept.
func TestOptimizerStateIsFlushed(t *testing.T) {
	const n = 35
	tiny := float32(math.Float32frombits(1)) // the smallest subnormal
	cases := []struct {
		v    float32
		want float32
	}{
		{tiny, 0}, {-tiny, 0}, {0x1p-130, 0}, {float32(math.Copysign(0, -1)), 0},
		{0x1p-126 / 0.9, 0x1p-126}, {float32(math.NaN()), float32(math.NaN())}, {float32(math.Inf(1)), float32(math.Inf(1))},
	}
	for _, tc := range cases {
		p, q, g, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
		m, v2 := make([]float32, n), make([]float32, n)
		for i := range v {
			v[i], m[i], v2[i], p[i], q[i] = tc.v, tc.v, tc.v, 1, 1
		}
		SGD(p, g, v, 0.01, 0.9, 0)
		Adam(q, g, m, v2, 0.001, 1, 0.9, 0.9, 0, 1e-8)
		for i := range n {
			for what, got := range map[string]float32{"sgd v": v[i], "adam m": m[i], "adam v": v2[i]} {
				if math.Float32bits(got) != math.Float32bits(tc.want) && !(got != got && tc.want != tc.want) {
					t.Errorf("%s from %g, value %d: %g (bits %#x); want %g", what, tc.v, i, got, math.Float32bits(got), tc.want)
				}
			}
		}
	}
}

func BenchmarkSGD(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const n = 235146
	p, g, v := values(rng, n), values(rng, n), values(rng, n)
	b.Run("vec", func(b *testing.B) {
		for b.Loop() {
			SGD(p, g, v, 0.01, 0.9, 0)
		}
	})
	b.Run("go", func(b *testing.B) {
		for b.Loop() {
			sgdMomentumGo(p, g, v, 0.01, 0.9, 0)
		}
	})
}

// TestReluMatchesGo: the kernels against the Go loops, NaN, ±0 and
// subnormals included.
func TestReluMatchesGo(t *testing.T) {
	for _, n := range []int{0, 1, 16, 17, 100, 1029} {
		rng := rand.New(rand.NewPCG(5, uint64(n)))
		x, dy := values(rng, n), values(rng, n)
		for i := range x {
			switch i % 7 {
			case 3:
				x[i] = float32(math.NaN())
			case 4:
				x[i] = float32(math.Copysign(0, -1))
			case 5:
				x[i] = -x[i]
			}
		}
		y1, y2 := make([]float32, n), make([]float32, n)
		Relu(x, y1)
		reluGo(x, y2)
		d1, d2 := make([]float32, n), make([]float32, n)
		ReluGrad(x, dy, d1)
		reluGradGo(x, dy, d2)
		for i := range x {
			if math.Float32bits(y1[i]) != math.Float32bits(y2[i]) && !(y1[i] != y1[i] && y2[i] != y2[i]) {
				t.Fatalf("Relu(%g) = %g, Go %g", x[i], y1[i], y2[i])
			}
			if math.Float32bits(d1[i]) != math.Float32bits(d2[i]) {
				t.Fatalf("ReluGrad at y=%g = %g, Go %g", x[i], d1[i], d2[i])
			}
			if x[i] != x[i] && y1[i] == y1[i] {
				t.Fatalf("Relu hid a NaN at %d", i)
			}
		}
	}
}

// TestFinite: one NaN or ±Inf anywhere makes a vector not finite; the
// largest float32, subnormals and −0 do not.
func TestFinite(t *testing.T) {
	x := make([]float32, 37)
	for i := range x {
		x[i] = [...]float32{math.MaxFloat32, 0x1p-149, float32(math.Copysign(0, -1)), -3}[i%4]
	}
	if !Finite(x) || !Finite(nil) {
		t.Fatal("finite values reported not finite")
	}
	for i := range x {
		for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
			y := slices.Clone(x)
			y[i] = bad
			if Finite(y) {
				t.Fatalf("%v at %d reported finite", bad, i)
			}
		}
	}
}

// TestSumOrder: Sum adds in its stated order — 64 running sums, then
// halved pairwise — and is within float32 rounding of the exact sum.
func TestSumOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, n := range []int{0, 1, 5, 64, 100, 196, 5000} {
		x := values(rng, n)
		var s [64]float32
		for i, v := range x {
			s[i%64] += v
		}
		for w := 32; w >= 1; w /= 2 {
			for l := range w {
				s[l] += s[l+w]
			}
		}
		if got := Sum(x); math.Float32bits(got) != math.Float32bits(s[0]) {
			t.Fatalf("n %d: Sum %v, the stated order %v", n, got, s[0])
		}
		exact, mag := 0.0, 0.0
		for _, v := range x {
			exact += float64(v)
			mag += math.Abs(float64(v))
		}
		if d := math.Abs(float64(Sum(x)) - exact); d > 1e-6*float64(n)*mag+1e-30 {
			t.Fatalf("n %d: Sum %v, exact %v", n, Sum(x), exact)
		}
	}
}

// TestSumSquaresOrder: SumSquares is Sum of the rounded squares, and
// within float32 rounding of the exact sum of squares.
func TestSumSquaresOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, n := range []int{0, 1, 5, 64, 100, 196, 5000} {
		x := values(rng, n)
		sq := make([]float32, n)
		exact := 0.0
		for i, v := range x {
			sq[i] = v * v
			exact += float64(v) * float64(v)
		}
		if got := SumSquares(x); math.Float32bits(got) != math.Float32bits(sumGo(sq)) {
			t.Fatalf("n %d: SumSquares %v, Sum of the squares %v", n, got, sumGo(sq))
		}
		if d := math.Abs(float64(SumSquares(x)) - exact); d > 1e-6*float64(n)*exact+1e-30 {
			t.Fatalf("n %d: SumSquares %v, exact %v", n, SumSquares(x), exact)
		}
	}
}

// TestSketchScan: each block's signed values, summed over its bucket's
// 16 lanes, near the float64 sum, blocks that share a bucket adding up
// there; the squares' lanes near the sum of squares; the blocks copied;
// nothing past the blocks all the slices cover.
func TestSketchScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	x := values(rng, 64*3+5)
	signs := []uint64{0, ^uint64(0), 0xa5a5a5a5a5a5a5a5, 7}
	buckets := []int32{1, 0, 1, 2}
	lanes := make([]float32, 48)
	lanes[32] = 42
	dst := make([]float32, len(x))
	var sq [16]float32
	if n := SketchScan(dst, x, signs, buckets, lanes, &sq); n != 3 {
		t.Fatalf("%d blocks done; want 3", n)
	}
	want := make([]float64, 3)
	var squares float64
	for i := range 3 {
		for j := range 64 {
			v := float64(x[64*i+j])
			squares += v * v
			if signs[i]>>uint(j)&1 == 1 {
				v = -v
			}
			want[buckets[i]] += v
		}
	}
	sum := func(v []float32) (s float64) {
		for _, x := range v {
			s += float64(x)
		}
		return s
	}
	for b := range 2 {
		if got := sum(lanes[16*b : 16*b+16]); math.Abs(got-want[b]) > 1e-4 {
			t.Errorf("bucket %d: %v; want %v", b, got, want[b])
		}
	}
	if got := sum(sq[:]); math.Abs(got-squares) > 1e-4*squares {
		t.Errorf("squares %v; want %v", got, squares)
	}
	if lanes[32] != 42 || slices.ContainsFunc(lanes[33:], func(v float32) bool { return v != 0 }) {
		t.Errorf("a block past the values was added: %v", lanes[32:])
	}
	if !slices.Equal(dst[:192], x[:192]) || slices.ContainsFunc(dst[192:], func(v float32) bool { return v != 0 }) {
		t.Error("the blocks, and only they, should be copied")
	}
	if n := SketchScan(dst[:100], x, signs, buckets, lanes, &sq); n != 1 {
		t.Errorf("%d blocks done into 100 values; want 1", n)
	}
}
