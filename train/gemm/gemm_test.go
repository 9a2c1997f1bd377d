package gemm

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// withKernel is a BLAS forced onto one kernel and thread count.
func withKernel(k kernel, threads int) *BLAS { return &BLAS{ker: k, threads: threads} }

// testKernels is every kernel this CPU runs, as Chosen would give it (the
// shape picked per product), then each of their other shapes alone, named
// by it; the exact Go kernel stays last.
func testKernels() []kernel {
	ks := kernels()
	var alts []kernel
	for _, k := range ks {
		for _, a := range k.alt {
			a.name = fmt.Sprintf("%s-%dx%d", a.name, a.mr, a.nr)
			alts = append(alts, a)
		}
	}
	return append(alts, ks...)
}

func randMat(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.NormFloat64())
	}
	return s
}

// refGemm is C = alpha·op(A)·op(B) + beta·C in float64.
func refGemm(tA, tB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) []float64 {
	out := make([]float64, m*n)
	for i := range m {
		for j := range n {
			s := 0.0
			for p := range k {
				var av, bv float32
				if tA {
					av = a[p*lda+i]
				} else {
					av = a[i*lda+p]
				}
				if tB {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				s += float64(av) * float64(bv)
			}
			v := float64(alpha) * s
			if beta != 0 {
				v += float64(beta) * float64(c[i*ldc+j])
			}
			out[i*n+j] = v
		}
	}
	return out
}

type gemmCase struct {
	tA, tB      bool
	m, n, k     int
	alpha, beta float32
	pad         int // extra leading-dimension columns
}

func (c gemmCase) String() string {
	return fmt.Sprintf("tA=%v,tB=%v,%dx%dx%d,a=%g,b=%g,pad=%d", c.tA, c.tB, c.m, c.n, c.k, c.alpha, c.beta, c.pad)
}

// operands are a case's matrices, with C as it is before the product.
type operands struct {
	a, b, c       []float32
	lda, ldb, ldc int
}

// operands draws the case's matrices; the same seed gives the same ones.
func (c gemmCase) operands(seed uint64) operands {
	rng := rand.New(rand.NewPCG(seed, 1))
	rowA, colA := c.m, c.k
	if c.tA {
		rowA, colA = c.k, c.m
	}
	rowB, colB := c.k, c.n
	if c.tB {
		rowB, colB = c.n, c.k
	}
	o := operands{lda: max(1, colA) + c.pad, ldb: max(1, colB) + c.pad, ldc: c.n + c.pad}
	o.a = randMat(rng, max(1, rowA*o.lda))
	o.b = randMat(rng, max(1, rowB*o.ldb))
	o.c = randMat(rng, max(1, c.m*o.ldc))
	if c.beta == 0 {
		for i := range o.c {
			o.c[i] = float32(math.NaN()) // must not leak into the result
		}
	}
	return o
}

// want is the case's product in float64, the reference every kernel is
// held to. It is the slow part of a case (and slower still under the race
// detector), so tests that hold several kernels to it compute it once.
func (c gemmCase) want(o operands) []float64 {
	return refGemm(c.tA, c.tB, c.m, c.n, c.k, c.alpha, o.a, o.lda, o.b, o.ldb, c.beta, o.c, o.ldc)
}

// run multiplies the operands with im and returns C (the operands' own C
// is left as it was).
func (c gemmCase) run(im *BLAS, o operands) []float32 {
	ta, tb := blas.NoTrans, blas.NoTrans
	if c.tA {
		ta = blas.Trans
	}
	if c.tB {
		tb = blas.Trans
	}
	cm := slices.Clone(o.c)
	im.Sgemm(ta, tb, c.m, c.n, c.k, c.alpha, o.a, o.lda, o.b, o.ldb, c.beta, cm, o.ldc)
	return cm
}

func gemmCases() []gemmCase {
	var cs []gemmCase
	sizes := []int{1, 3, 17, 255}
	for _, tA := range []bool{false, true} {
		for _, tB := range []bool{false, true} {
			for _, m := range sizes {
				for _, n := range sizes {
					for _, k := range sizes {
						cs = append(cs, gemmCase{tA: tA, tB: tB, m: m, n: n, k: k, alpha: 1, pad: (m + n) % 3})
					}
				}
			}
			cs = append(cs,
				gemmCase{tA: tA, tB: tB, m: 1000, n: 33, k: 1000, alpha: 1},
				gemmCase{tA: tA, tB: tB, m: 64, n: 1000, k: 17, alpha: 0.5, beta: 2, pad: 1},
				gemmCase{tA: tA, tB: tB, m: 40, n: 50, k: 60, alpha: -1.5, beta: 0, pad: 2},
				gemmCase{tA: tA, tB: tB, m: 30, n: 45, k: 33, alpha: 1, beta: 1, pad: 1}, // C += A·B
				gemmCase{tA: tA, tB: tB, m: 13, n: 70, k: 0, alpha: 1, beta: 0.5},
				gemmCase{tA: tA, tB: tB, m: 13, n: 70, k: 9, alpha: 0, beta: 0},
				// A packed B over lazyPackFloats (for every kernel's nr),
				// packed a panel at a time; the last panel ragged.
				gemmCase{tA: tA, tB: tB, m: 7, n: 1100, k: 120, alpha: 1, pad: 1},
				gemmCase{tA: tA, tB: tB, m: 40, n: 1100, k: 120, alpha: 1, beta: 1},
				// With k over kBlock, a B stored k × n is packed kBlock
				// rows at a time and the sums go on from C.
				gemmCase{tA: tA, tB: tB, m: 5, n: 1100, k: 300, alpha: 1, pad: 1},
				gemmCase{tA: tA, tB: tB, m: 13, n: 1100, k: 300, alpha: 0.5, beta: 2},
				// B's rows far apart, packed in blocks of k, with an A
				// stored k × m near enough to be read in place.
				gemmCase{tA: tA, tB: tB, m: 13, n: 90, k: 1850, alpha: 1, pad: 490},
			)
		}
	}
	return cs
}

// TestSgemmMatchesFloat64: every kernel, against a float64 reference, over
// odd sizes and all transposes; each element within float32 rounding of
// a k-term sum.
func TestSgemmMatchesFloat64(t *testing.T) {
	cases := gemmCases()
	ops := make([]operands, len(cases))
	wants := make([][]float64, len(cases))
	for ci, c := range cases {
		ops[ci] = c.operands(uint64(ci))
		wants[ci] = c.want(ops[ci])
	}
	for _, ker := range testKernels() {
		t.Run(ker.name, func(t *testing.T) {
			for ci, c := range cases {
				if ker.name == "go" && c.m*c.n*c.k > 1<<20 {
					continue // the Go kernel is checked bit for bit below
				}
				got, want, ldc := c.run(withKernel(ker, 2), ops[ci]), wants[ci], ops[ci].ldc
				for i := range c.m {
					for j := range c.n {
						g, w := float64(got[i*ldc+j]), want[i*c.n+j]
						tol := 1e-5 * float64(c.k+2) * (1 + math.Abs(w))
						if math.Abs(g-w) > tol || math.IsNaN(g) {
							t.Fatalf("%v: C[%d,%d] = %g, want %g", c, i, j, g, w)
						}
					}
				}
			}
		})
	}
}

// TestSameBitsEverywhere: every kernel and thread count gives the same
// bits, which is what lets replicas on different CPUs agree.
func TestSameBitsEverywhere(t *testing.T) {
	ks := testKernels()
	if len(ks) < 2 {
		t.Skip("this CPU has only the Go kernel")
	}
	for ci, c := range gemmCases() {
		if c.m*c.n*c.k > 1<<20 {
			continue
		}
		o := c.operands(uint64(ci))
		ref := c.run(withKernel(ks[len(ks)-1], 1), o)
		for _, ker := range ks {
			for _, threads := range []int{1, 3} {
				got := c.run(withKernel(ker, threads), o)
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(ref[i]) && !(isNaN32(got[i]) && isNaN32(ref[i])) {
						t.Fatalf("%v: kernel %s, %d threads: element %d is %g, the Go kernel's %g", c, ker.name, threads, i, got[i], ref[i])
					}
				}
			}
		}
	}
}

func isNaN32(f float32) bool { return f != f }

// TestFMA32IsCorrectlyRounded holds fma32 against exact arithmetic, on
// random values and on ties and cancellations made on purpose.
func TestFMA32IsCorrectlyRounded(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	exact := func(x, y, z float32) float32 {
		p := new(big.Float).SetPrec(200).SetFloat64(float64(x))
		p.Mul(p, new(big.Float).SetFloat64(float64(y)))
		p.Add(p, new(big.Float).SetFloat64(float64(z)))
		f, _ := p.Float32()
		return f
	}
	type triple struct{ x, y, z float32 }
	cases := []triple{
		{1 + 1.0/(1<<12), 1 + 1.0/(1<<12), -1}, // product needs 25 bits
		{1 + 1.0/(1<<23), 1 - 1.0/(1<<23), -1}, // cancels to -2^-46
		{3, 1.0 / 3, -1},                       // near cancellation
		{1 << 12, 1 << 12, 1.0 / (1 << 30)},    // tiny addend
		// x·y = 1 + 2⁻¹¹ + 2⁻²⁴ is a float32 tie; the addend, lost when
		// the sum is rounded to float64, decides it: rounding twice
		// without round-to-odd gets these wrong.
		{1 + 1.0/(1<<12), 1 + 1.0/(1<<12), float32(math.Ldexp(1, -60))},
		{-1 - 1.0/(1<<12), 1 + 1.0/(1<<12), float32(math.Ldexp(1, -60))},
		{1.5, 1 + 1.0/(1<<23), float32(math.Ldexp(1, -25))},
		{float32(math.Ldexp(1, -70)), float32(math.Ldexp(1, -70)), 0}, // subnormal result
		{math.MaxFloat32, 2, 0}, // overflow
	}
	for range 200000 {
		// Values that share exponents make the hard cases common.
		x := float32(1 + rng.Float64())
		y := float32(1 + rng.Float64())
		z := -float32(math.Float32frombits(math.Float32bits(x*y) ^ uint32(rng.IntN(16))))
		cases = append(cases, triple{x, y, z}, triple{float32(rng.NormFloat64()), float32(rng.NormFloat64()), float32(rng.NormFloat64())})
	}
	for _, c := range cases {
		if got, want := fma32(c.x, c.y, c.z), exact(c.x, c.y, c.z); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("fma32(%g, %g, %g) = %g, exact rounding %g", c.x, c.y, c.z, got, want)
		}
	}
}

// TestBadArgumentsPanicLikeGonum: gorgonia relies on BLAS panics for
// shape errors, as gonum raises them.
func TestBadArgumentsPanicLikeGonum(t *testing.T) {
	im := New(1)
	a := make([]float32, 6)
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"m<0", func() { im.Sgemm(blas.NoTrans, blas.NoTrans, -1, 2, 3, 1, a, 3, a, 2, 0, a, 2) }},
		{"short a", func() { im.Sgemm(blas.NoTrans, blas.NoTrans, 3, 2, 3, 1, a, 3, a, 2, 0, a, 2) }},
		{"lda", func() { im.Sgemm(blas.NoTrans, blas.NoTrans, 2, 2, 3, 1, a, 2, a, 2, 0, a, 2) }},
		{"transpose", func() { im.Sgemm('x', blas.NoTrans, 2, 2, 3, 1, a, 3, a, 2, 0, a, 2) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", tc.name)
				}
			}()
			tc.f()
		}()
	}
}

// FuzzSgemmEdges: sizes around the kernels' tile edges, transposes and
// padding, every kernel against the Go kernel bit for bit.
func FuzzSgemmEdges(f *testing.F) {
	f.Add(uint8(1), uint8(1), uint8(1), uint8(0), uint8(0), uint64(1))
	f.Add(uint8(12), uint8(32), uint8(5), uint8(3), uint8(1), uint64(2))
	f.Add(uint8(13), uint8(33), uint8(0), uint8(1), uint8(2), uint64(3))
	f.Fuzz(func(t *testing.T, m, n, k, flags, pad uint8, seed uint64) {
		c := gemmCase{tA: flags&1 != 0, tB: flags&2 != 0, m: int(m)%70 + 1, n: int(n)%70 + 1, k: int(k) % 70,
			alpha: 1, pad: int(pad) % 4}
		if flags&4 != 0 {
			c.alpha, c.beta = 0.75, -0.5
		}
		ks := testKernels()
		o := c.operands(seed)
		ref, want, ldc := c.run(withKernel(ks[len(ks)-1], 1), o), c.want(o), o.ldc
		for i := range c.m {
			for j := range c.n {
				g, w := float64(ref[i*ldc+j]), want[i*c.n+j]
				if math.Abs(g-w) > 1e-5*float64(c.k+2)*(1+math.Abs(w)) {
					t.Fatalf("%v: go kernel C[%d,%d] = %g, want %g", c, i, j, g, w)
				}
			}
		}
		for _, ker := range ks {
			got := c.run(withKernel(ker, 2), o)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(ref[i]) {
					t.Fatalf("%v: %s element %d = %g, Go kernel %g", c, ker.name, i, got[i], ref[i])
				}
			}
		}
	})
}

func BenchmarkSgemm(b *testing.B) {
	shapes := []struct {
		name    string
		tA, tB  bool
		m, n, k int
	}{
		{"mlp-fc1-fwd", false, false, 64, 256, 784},
		{"mlp-fc1-dW", true, false, 784, 256, 64},
		{"mlp-fc1-dX", false, true, 64, 784, 256},
		{"cnn-fc1-fwd", false, false, 64, 1024, 3136},
		{"cnn-fc1-dW", true, false, 3136, 1024, 64},
		{"cnn-fc1-dX", false, true, 64, 3136, 1024},
		{"cnn-conv2-fwd", false, false, 12544, 64, 800},
		{"square-512", false, false, 512, 512, 512},
		{"conv2-fwd-sample", false, false, 64, 196, 800},
		{"conv2-dW-sample", false, true, 64, 800, 196},
		{"conv2-dX-sample", true, false, 800, 196, 64},
		{"conv2-dXT-sample", true, false, 196, 800, 64},
	}
	// "gonum" is gonum's own Sgemm on one thread: what the product would
	// take without this package.
	type impl struct {
		name string
		blas.Float32
	}
	impls := []impl{{"gonum", gonum.Implementation{}}}
	for _, ker := range testKernels() {
		if ker.name != "go" { // far slower; checked for bits, not speed
			impls = append(impls, impl{ker.name, withKernel(ker, 1)})
		}
	}
	for _, im := range impls {
		name := im.name
		for _, s := range shapes {
			b.Run(name+"/"+s.name, func(b *testing.B) {
				if name == "gonum" {
					defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
				}
				c := gemmCase{tA: s.tA, tB: s.tB, m: s.m, n: s.n, k: s.k, alpha: 1}
				rng := rand.New(rand.NewPCG(1, 1))
				a := randMat(rng, s.m*s.k)
				bb := randMat(rng, s.k*s.n)
				cc := make([]float32, s.m*s.n)
				ta, tb := blas.NoTrans, blas.NoTrans
				lda, ldb := s.k, s.n
				if c.tA {
					ta, lda = blas.Trans, s.m
				}
				if c.tB {
					tb, ldb = blas.Trans, s.k
				}
				for b.Loop() {
					im.Sgemm(ta, tb, s.m, s.n, s.k, 1, a, lda, bb, ldb, 0, cc, s.n)
				}
				b.ReportMetric(2*float64(s.m*s.n*s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// TestChoose: the fastest of the fast kernels is chosen, whatever their
// order; the exact Go kernel only where nothing else runs; and the trial
// of every kernel this CPU runs gives a rate.
func TestChoose(t *testing.T) {
	k := func(name string) kernel { return kernel{name: name, mr: 4, nr: 16} }
	for _, tc := range []struct {
		ks    []kernel
		rates map[string]float64
		want  string
	}{
		{[]kernel{k("avx512"), k("avx2"), k("go")}, map[string]float64{"avx512": 90, "avx2": 60}, "avx512"},
		// A CPU that halves its 512-bit operations: the AVX2 kernel wins.
		{[]kernel{k("avx512"), k("avx2"), k("go")}, map[string]float64{"avx512": 40, "avx2": 55}, "avx2"},
		{[]kernel{k("go-fma"), k("go")}, nil, "go-fma"},
		{[]kernel{k("go")}, nil, "go"},
	} {
		tried := map[string]int{}
		c := choose(tc.ks, func(k kernel) float64 { tried[k.name]++; return tc.rates[k.name] })
		if c.Kernel != tc.want || c.ker.name != tc.want || c.Why == "" {
			t.Errorf("rates %v: chose %q (%s); want %q", tc.rates, c.Kernel, c.Why, tc.want)
		}
		if tried["go"] > 0 || (tc.rates == nil) != (len(tried) == 0) || (tc.rates != nil && len(c.Rates) != len(tc.rates)) {
			t.Errorf("rates %v: tried %v, reported %v", tc.rates, tried, c.Rates)
		}
	}
	for _, ker := range kernels() {
		if r := trialRate(ker); !(r > 0) {
			t.Errorf("%s: a trial rate of %v", ker.name, r)
		}
	}
}

// The trial's clock counts the thread's work, not its waits: a sleep of
// 50 ms adds (almost) nothing, and spinning makes it advance, never faster
// than the wall clock — so a process that waits for a core mid-trial does
// not take a kernel for a slower one. The spin runs until the clock has
// counted 20 ms rather than for 20 ms of wall time, since a loaded machine
// may give the thread only part of that.
func TestTrialClockCountsWork(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the thread clock is the wall clock off Linux")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	used := threadClock()
	time.Sleep(50 * time.Millisecond)
	slept := used()
	if slept > 10*time.Millisecond {
		t.Errorf("the trial clock counted %v over a 50 ms sleep; want ~0", slept)
	}
	t0 := time.Now()
	for used()-slept < 20*time.Millisecond && time.Since(t0) < 10*time.Second {
	}
	spun, wall := used()-slept, time.Since(t0)
	if spun < 20*time.Millisecond || spun > wall+time.Millisecond {
		t.Errorf("the trial clock counted %v over %v of spinning; want 20 ms within 10 s, and no more than the wall clock", spun, wall)
	}
}
