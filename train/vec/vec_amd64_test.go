package vec

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestEveryLevelMatchesTheGoLoops: each vector level this CPU has (AVX2 and
// AVX-512 here), held to the Go loops bit for bit — so a replica on a
// machine without AVX-512 computes what one with it does.
func TestEveryLevelMatchesTheGoLoops(t *testing.T) {
	for lv := levelAVX2; lv <= level; lv++ {
		for _, n := range []int{7, 8, 9, 16, 23, 1001} {
			rng := rand.New(rand.NewPCG(uint64(lv), uint64(n)))
			p, g, m, v := values(rng, n), values(rng, n), values(rng, n), values(rng, n)
			for i := range v {
				v[i] = float32(math.Abs(float64(v[i])))
			}
			for i := range p {
				if i%5 == 0 {
					p[i] = float32(math.NaN())
				}
			}
			// finish runs a level's kernel, then the Go loop on the tail.
			p1, v1 := slices.Clone(p), slices.Clone(v)
			k := sgdMomentumAt(lv, p1, g, v1, 0.01, 0.9, 1e-4)
			sgdMomentumGo(p1[k:], g[k:], v1[k:], 0.01, 0.9, 1e-4)
			p2, v2 := slices.Clone(p), slices.Clone(v)
			sgdMomentumGo(p2, g, v2, 0.01, 0.9, 1e-4)
			sameBitsNaN(t, lv, "sgd p", p1, p2)
			sameBitsNaN(t, lv, "sgd v", v1, v2)

			c := AdamConsts{Step: 0.01, Sq: 0.03, B1: 0.9, C1: 1 - float32(0.9), B2: 0.999, C2: 1 - float32(0.999), WD: 1e-4, Eps: 1e-8}
			p1, m1, v1 := slices.Clone(p), slices.Clone(m), slices.Clone(v)
			k = adamAt(lv, p1, g, m1, v1, &c)
			adamGo(p1[k:], g[k:], m1[k:], v1[k:], &c)
			p2, m2, v2 := slices.Clone(p), slices.Clone(m), slices.Clone(v)
			adamGo(p2, g, m2, v2, &c)
			sameBitsNaN(t, lv, "adam p", p1, p2)
			sameBitsNaN(t, lv, "adam m", m1, m2)
			sameBitsNaN(t, lv, "adam v", v1, v2)

			y1, y2 := make([]float32, n), make([]float32, n)
			k = reluAt(lv, p, y1)
			reluGo(p[k:], y1[k:])
			reluGo(p, y2)
			sameBitsNaN(t, lv, "relu", y1, y2)
			d1, d2 := make([]float32, n), make([]float32, n)
			k = reluGradAt(lv, p, g, d1)
			reluGradGo(p[k:], g[k:], d1[k:])
			reluGradGo(p, g, d2)
			sameBitsNaN(t, lv, "reluGrad", d1, d2)
		}
	}
}

// sameBitsNaN is sameBits where two NaNs count as equal (their payloads
// may differ between instructions).
func sameBitsNaN(t *testing.T, lv int, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if got[i] != got[i] && want[i] != want[i] {
			continue
		}
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("level %d: %s[%d] = %g, the Go loop's %g", lv, what, i, got[i], want[i])
		}
	}
}

// TestFiniteAtEveryLevel: at every level this CPU runs, one NaN, +Inf or
// −Inf anywhere — in the vector part or the Go tail — makes x not finite,
// and the largest float32, subnormals and −0 do not.
func TestFiniteAtEveryLevel(t *testing.T) {
	for lv := levelGo; lv <= level; lv++ {
		for _, n := range []int{0, 1, 15, 16, 17, 40, 67} {
			x := make([]float32, n)
			for i := range x {
				x[i] = [...]float32{math.MaxFloat32, -math.MaxFloat32, 0x1p-149, float32(math.Copysign(0, -1)), 1}[i%5]
			}
			check := func(x []float32) bool {
				k, ok := finiteAt(lv, x)
				return ok && finiteGo(x[k:])
			}
			if !check(x) {
				t.Fatalf("level %d, %d values: finite ones reported not finite", lv, n)
			}
			for i := range n {
				for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
					y := slices.Clone(x)
					y[i] = bad
					if check(y) || Finite(y) {
						t.Fatalf("level %d, %d values: %v at %d reported finite", lv, n, bad, i)
					}
				}
			}
		}
	}
}

// TestAddRowsAtEveryLevel: the masked rows add what the Go loop adds, and
// copy what copy copies, bit for bit, and touch nothing between or after
// the rows — for row lengths under, at and over a vector, with NaN and
// subnormals among them.
func TestAddRowsAtEveryLevel(t *testing.T) {
	if level < levelAVX512 {
		t.Skip("AVX-512 rows only; the Go loop everywhere else")
	}
	for _, c := range []struct{ rows, n, ldd, lds int }{{1, 1, 1, 1}, {3, 14, 18, 14}, {5, 16, 16, 20}, {2, 33, 40, 33}, {4, 28, 32, 30}} {
		rng := rand.New(rand.NewPCG(uint64(c.n), uint64(c.rows)))
		src := values(rng, (c.rows-1)*c.lds+c.n+5)
		src[0], src[len(src)/2] = float32(math.NaN()), 1e-40
		dst := values(rng, (c.rows-1)*c.ldd+c.n+5)
		want := slices.Clone(dst)
		rowsGo(true, want, c.ldd, src, c.lds, c.rows, c.n)
		got := slices.Clone(dst)
		if !rowsAsm(true, got, c.ldd, src, c.lds, c.rows, c.n) {
			t.Fatal("no AVX-512 rows on a CPU with AVX-512")
		}
		sameBitsNaN(t, levelAVX512, "AddRows", got, want)

		want = slices.Clone(dst)
		for r := range c.rows {
			copy(want[r*c.ldd:r*c.ldd+c.n], src[r*c.lds:r*c.lds+c.n])
		}
		got = slices.Clone(dst)
		if !rowsAsm(false, got, c.ldd, src, c.lds, c.rows, c.n) {
			t.Fatal("no AVX-512 rows on a CPU with AVX-512")
		}
		sameBits(t, "CopyRows", got, want)
	}
}

// TestMaxPool2AtEveryLevel: the AVX-512 pool gives the Go loop's values
// and gradients bit for bit — ties, NaN first and later, −Inf windows —
// for rows shorter than, as long as and longer than a vector, and writes
// nothing outside the windows.
func TestMaxPool2AtEveryLevel(t *testing.T) {
	if level < levelAVX512 {
		t.Skip("AVX-512 pool only; the Go loop everywhere else")
	}
	for _, c := range []struct{ ow, rows, w int }{{1, 1, 2}, {7, 7, 14}, {14, 3, 28}, {16, 2, 33}, {17, 3, 35}, {33, 2, 66}} {
		rng := rand.New(rand.NewPCG(uint64(c.ow), uint64(c.w)))
		x := make([]float32, 2*c.rows*c.w+3)
		for i := range x {
			x[i] = float32(rng.IntN(4)) // ties
			switch rng.IntN(16) {
			case 0:
				x[i] = float32(math.NaN())
			case 1:
				x[i] = float32(math.Inf(-1))
			}
		}
		dy := values(rng, c.rows*c.ow+2)
		y1, y2 := values(rng, len(dy)), values(rng, len(dy))
		copy(y2, y1)
		maxPool2Asm(x, c.w, y1, c.ow, c.rows)
		maxPool2Go(x, c.w, y2, c.ow, c.rows)
		sameBits(t, "MaxPool2", y1, y2)
		d1, d2 := values(rng, len(x)), values(rng, len(x))
		copy(d2, d1)
		maxPool2GradAsm(x, c.w, dy, d1, c.ow, c.rows)
		maxPool2GradGo(x, c.w, dy, d2, c.ow, c.rows)
		sameBits(t, "MaxPool2Grad", d1, d2)
	}
}

// TestSumAtEveryLevel: the AVX-512 sum is sumGo's, and its sum of
// squares sumSquaresGo's, bit for bit, for
// lengths under, at and over its 64 lanes, with NaN, infinities, signed
// zeros and subnormals among the values.
func TestSumAtEveryLevel(t *testing.T) {
	if level < levelAVX512 {
		t.Skip("AVX-512 sum only; the Go loop everywhere else")
	}
	for _, n := range []int{0, 1, 15, 16, 17, 63, 64, 65, 127, 196, 784, 1001} {
		for trial := range 4 {
			rng := rand.New(rand.NewPCG(uint64(n), uint64(trial)))
			x := values(rng, n)
			for i := range x {
				switch rng.IntN(40) {
				case 0:
					x[i] = float32(math.Copysign(0, -1))
				case 1:
					x[i] = 1e-40
				case 2:
					if trial == 3 {
						x[i] = float32(math.Inf(1 - 2*rng.IntN(2)))
					}
				case 3:
					if trial == 2 {
						x[i] = float32(math.NaN())
					}
				}
			}
			got, ok := sumAsm(x)
			if !ok {
				t.Fatal("no AVX-512 sum on a CPU with AVX-512")
			}
			want := sumGo(x)
			if math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
				t.Fatalf("n %d trial %d: Sum %v (%#x), sumGo %v (%#x)", n, trial, got, math.Float32bits(got), want, math.Float32bits(want))
			}
			got, _ = sumSquaresAsm(x)
			want = sumSquaresGo(x)
			if math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
				t.Fatalf("n %d trial %d: SumSquares %v (%#x), sumSquaresGo %v (%#x)", n, trial, got, math.Float32bits(got), want, math.Float32bits(want))
			}
		}
	}
}

// TestCopyFiniteAtEveryLevel: each level copies every value, NaN and
// infinities included, writes nothing past src's length, and reports
// finiteness as Finite does — a bad value first, last, in the vector
// part, in the tail, or none.
func TestCopyFiniteAtEveryLevel(t *testing.T) {
	for lv := levelAVX2; lv <= level; lv++ {
		for _, n := range []int{0, 7, 8, 9, 16, 33, 1001} {
			for _, at := range []int{-1, 0, n - 1, n / 2} {
				if n == 0 && at >= 0 {
					continue
				}
				rng := rand.New(rand.NewPCG(uint64(n), uint64(at+2)))
				src := values(rng, n)
				if at >= 0 {
					src[at] = [...]float32{float32(math.NaN()), float32(math.Inf(-1))}[rng.IntN(2)]
				}
				dst := values(rng, n+3)
				want := slices.Clone(dst)
				copy(want, src)
				got := slices.Clone(dst)
				k, ok := copyFiniteAt(lv, got, src)
				copy(got[k:n], src[k:])
				ok = finiteGo(src[k:]) && ok
				sameBitsNaN(t, lv, fmt.Sprintf("CopyFinite n %d bad at %d", n, at), got, want)
				if ok != Finite(src) || ok != (at < 0) {
					t.Fatalf("level %d, n %d, bad at %d: CopyFinite says finite %v", lv, n, at, ok)
				}
				got = slices.Clone(dst)
				if CopyFinite(got, src) != (at < 0) {
					t.Fatalf("n %d, bad at %d: CopyFinite wrong", n, at)
				}
				sameBitsNaN(t, level, "CopyFinite", got, want)
			}
		}
	}
}

// TestSketchScanAtEveryLevel: the AVX-512 scan is sketchScanGo's, bit
// for bit — copy, squares and lanes — over 1 to 9 blocks with masks of
// every kind, blocks that share a bucket, signed zeros, subnormals and
// non-finite values among the values; a bucket outside lanes panics
// there too.
func TestSketchScanAtEveryLevel(t *testing.T) {
	if level < levelAVX512 {
		t.Skip("AVX-512 scan only; the Go loop everywhere else")
	}
	same := func(what string, got, want []float32) {
		t.Helper()
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s %d: asm %v, Go %v", what, i, got[i], want[i])
			}
		}
	}
	for blocks := 1; blocks <= 9; blocks++ {
		rng := rand.New(rand.NewPCG(uint64(blocks), 5))
		x := values(rng, 64*blocks)
		x[rng.IntN(len(x))] = float32(math.Copysign(0, -1))
		x[rng.IntN(len(x))] = 1e-40
		x[rng.IntN(len(x))] = 3e19
		if blocks == 7 {
			x[rng.IntN(len(x))] = float32(math.NaN())
		}
		signs, buckets := make([]uint64, blocks), make([]int32, blocks)
		for i := range signs {
			signs[i] = [...]uint64{0, ^uint64(0), 1 << 63, 0xffff0000ffff, rng.Uint64()}[rng.IntN(5)]
			buckets[i] = int32(rng.IntN(3))
		}
		for _, copied := range []bool{false, true} {
			got, want := values(rng, 48), make([]float32, 48)
			copy(want, got)
			var gotSq, wantSq [16]float32
			for l := range gotSq {
				gotSq[l] = float32(l)
				wantSq[l] = float32(l)
			}
			var gotDst, wantDst []float32
			if copied {
				gotDst, wantDst = make([]float32, len(x)), make([]float32, len(x))
			}
			if !sketchScanAsm(gotDst, x, signs, buckets, got, &gotSq, blocks) {
				t.Fatal("no AVX-512 scan on a CPU with AVX-512")
			}
			sketchScanGo(wantDst, x, signs, buckets, want, &wantSq)
			same("lane", got, want)
			same("square lane", gotSq[:], wantSq[:])
			same("copied value", gotDst, wantDst)
		}
	}
	for _, bucket := range []int32{3, -1} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("bucket %d of 3: no panic", bucket)
				}
			}()
			var sq [16]float32
			sketchScanAsm(nil, make([]float32, 128), []uint64{0, 0}, []int32{0, bucket}, make([]float32, 48), &sq, 2)
		}()
	}
}
