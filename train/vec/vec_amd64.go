package vec

import (
	"fmt"

	"golang.org/x/sys/cpu"
)

// Vector levels: what the assembly may use on this CPU.
const (
	levelGo     = iota // no assembly
	levelAVX2          // 8 lanes (AVX2)
	levelAVX512        // 16 lanes (AVX-512F)
)

// level is read once; the CPU does not change under a process.
var level = func() int {
	switch {
	case cpu.X86.HasAVX512F:
		return levelAVX512
	case cpu.X86.HasAVX2:
		return levelAVX2
	}
	return levelGo
}()

// Kernel names the optimizers' and ReLU's kernels on this CPU — avx512,
// avx2 or go — and says why. They stream memory rather than compute, so
// the widest vectors this CPU has are taken without a trial.
func Kernel() (name, why string) {
	switch level {
	case levelAVX512:
		return "avx512", "AVX-512F present: 16 lanes"
	case levelAVX2:
		return "avx2", "AVX2 present, no AVX-512F: 8 lanes"
	}
	return "go", "neither AVX2 nor AVX-512F: Go loops"
}

// lanes is how many values one vector of a level holds (0: none).
func lanes(lv int) int { return [...]int{0, 8, 16}[lv] }

// The …Asm functions update the longest prefix the level's vectors cover
// and return its length; the Go loops do the rest.

func sgdMomentumAsm(p, g, v []float32, lr, mu, wd float32) int {
	return sgdMomentumAt(level, p, g, v, lr, mu, wd)
}

func sgdMomentumAt(lv int, p, g, v []float32, lr, mu, wd float32) int {
	n := vectorPart(lv, len(p))
	switch {
	case n == 0:
	case lv == levelAVX512:
		sgdMomentum16(&p[0], &g[0], &v[0], n, lr, mu, wd)
	default:
		sgdMomentum8(&p[0], &g[0], &v[0], n, lr, mu, wd)
	}
	return n
}

func adamAsm(p, g, m, v []float32, c *AdamConsts) int { return adamAt(level, p, g, m, v, c) }

func adamAt(lv int, p, g, m, v []float32, c *AdamConsts) int {
	n := vectorPart(lv, len(p))
	switch {
	case n == 0:
	case lv == levelAVX512:
		adam16(&p[0], &g[0], &m[0], &v[0], n, c)
	default:
		adam8(&p[0], &g[0], &m[0], &v[0], n, c)
	}
	return n
}

func reluAsm(x, y []float32) int { return reluAt(level, x, y) }

func reluAt(lv int, x, y []float32) int {
	n := vectorPart(lv, len(x))
	switch {
	case n == 0:
	case lv == levelAVX512:
		relu16(&x[0], &y[0], n)
	default:
		relu8(&x[0], &y[0], n)
	}
	return n
}

func reluGradAsm(y, dy, dx []float32) int { return reluGradAt(level, y, dy, dx) }

func reluGradAt(lv int, y, dy, dx []float32) int {
	n := vectorPart(lv, len(y))
	switch {
	case n == 0:
	case lv == levelAVX512:
		reluGrad16(&y[0], &dy[0], &dx[0], n)
	default:
		reluGrad8(&y[0], &dy[0], &dx[0], n)
	}
	return n
}

// rowsAsm does AddRows (add) or CopyRows where this CPU has masked vectors
// (AVX-512, whose masks take a row's ragged end in one instruction) and
// reports whether it did; the caller has checked the bounds.
func rowsAsm(add bool, dst []float32, ldd int, src []float32, lds int, rows, n int) bool {
	if level != levelAVX512 {
		return false
	}
	op := 0
	if add {
		op = 1
	}
	rows16(&dst[0], ldd, &src[0], lds, rows, n, op)
	return true
}

// maxPool2Asm and maxPool2GradAsm do MaxPool2's passes in AVX-512 and
// report true, or report false where this CPU has no AVX-512.
func maxPool2Asm(x []float32, w int, y []float32, ow, rows int) bool {
	if level != levelAVX512 {
		return false
	}
	maxPool2x16(&x[0], w, &y[0], nil, nil, ow, rows)
	return true
}

func maxPool2GradAsm(x []float32, w int, dy, dx []float32, ow, rows int) bool {
	if level != levelAVX512 {
		return false
	}
	maxPool2x16(&x[0], w, nil, &dy[0], &dx[0], ow, rows)
	return true
}

// maxPool2x16 is both of MaxPool2's passes: the values into y when dx is
// nil, else the gradient dy into dx.
//
//go:noescape
func maxPool2x16(x *float32, w int, y, dy, dx *float32, ow, rows int)

//go:noescape
func rows16(dst *float32, ldd int, src *float32, lds, rows, n, add int)

// vectorPart is the longest prefix of n values whole vectors of level lv
// cover.
func finiteAsm(x []float32) (int, bool) { return finiteAt(level, x) }

// sumAsm is Sum in AVX-512, reporting false where this CPU has none: the
// 64 sums in four vectors, the last values under masks that leave the
// other lanes' sums untouched, as sumGo leaves them.
func sumAsm(x []float32) (float32, bool) {
	if level != levelAVX512 {
		return 0, false
	}
	if len(x) == 0 {
		return 0, true
	}
	m := tailMasks(len(x))
	return sum16(&x[0], len(x)/64, m[0], m[1], m[2], m[3]), true
}

// tailMasks are the four vectors' masks over the last len(x) mod 64
// values, lane by lane.
func tailMasks(n int) [4]int {
	rest := n % 64
	var m [4]int
	for v := range m {
		m[v] = 1<<min(16, max(0, rest-16*v)) - 1
	}
	return m
}

// sumSquaresAsm is SumSquares in AVX-512, as sumAsm is Sum: each square
// rounded (a multiply, then an add; no fused one), under the same masks.
func sumSquaresAsm(x []float32) (float32, bool) {
	if level != levelAVX512 {
		return 0, false
	}
	if len(x) == 0 {
		return 0, true
	}
	m := tailMasks(len(x))
	return sumSquares16(&x[0], len(x)/64, m[0], m[1], m[2], m[3]), true
}

// finiteAt checks the longest prefix of x the level's vectors cover: its
// length, and whether all of it is finite.
func finiteAt(lv int, x []float32) (int, bool) {
	n := vectorPart(lv, len(x))
	switch {
	case n == 0:
		return 0, true
	case lv == levelAVX512:
		return n, finite16(&x[0], n)
	default:
		return n, finite8(&x[0], n)
	}
}

//go:noescape
func finite16(x *float32, n int) bool

func copyFiniteAsm(dst, src []float32) (int, bool) { return copyFiniteAt(level, dst, src) }

// copyFiniteAt copies the longest prefix of src the level's vectors cover
// into dst: its length, and whether all of it is finite. Every value is
// copied, finite or not.
func copyFiniteAt(lv int, dst, src []float32) (int, bool) {
	n := vectorPart(lv, len(src))
	switch {
	case n == 0:
		return 0, true
	case lv == levelAVX512:
		_ = dst[n-1]
		return n, copyFinite16(&dst[0], &src[0], n)
	default:
		_ = dst[n-1]
		return n, copyFinite8(&dst[0], &src[0], n)
	}
}

//go:noescape
func copyFinite16(dst, src *float32, n int) bool

//go:noescape
func copyFinite8(dst, src *float32, n int) bool

//go:noescape
func finite8(x *float32, n int) bool

func vectorPart(lv, n int) int {
	if l := lanes(lv); l > 0 {
		return n / l * l
	}
	return 0
}

//go:noescape
func sgdMomentum16(p, grad, v *float32, n int, lr, mu, wd float32)

//go:noescape
func adam16(p, grad, m, v *float32, n int, c *AdamConsts)

//go:noescape
func relu16(x, y *float32, n int)

//go:noescape
func reluGrad16(y, dy, dx *float32, n int)

//go:noescape
func sgdMomentum8(p, grad, v *float32, n int, lr, mu, wd float32)

//go:noescape
func adam8(p, grad, m, v *float32, n int, c *AdamConsts)

//go:noescape
func relu8(x, y *float32, n int)

//go:noescape
func reluGrad8(y, dy, dx *float32, n int)

//go:noescape
func sum16(x *float32, blocks, m0, m1, m2, m3 int) float32

//go:noescape
func sumSquares16(x *float32, blocks, m0, m1, m2, m3 int) float32

//go:noescape
func sketchScan16(dst, src *float32, signs *uint64, buckets *int32, lanes, sq *float32, blocks, limit int) int

// sketchScanAsm is SketchScan in AVX-512 over n blocks, reporting false
// where this CPU has none; it panics at a bucket outside lanes, as the Go
// loop does, with the blocks before it done.
func sketchScanAsm(dst, src []float32, signs []uint64, buckets []int32, lanes []float32, sq *[16]float32, n int) bool {
	if level != levelAVX512 {
		return false
	}
	var d *float32
	if dst != nil {
		d = &dst[0]
	}
	if done := sketchScan16(d, &src[0], &signs[0], &buckets[0], &lanes[0], &sq[0], n, len(lanes)/16); done < n {
		panic(fmt.Sprintf("vec: block %d's bucket %d is outside the %d buckets of lanes", done, buckets[done], len(lanes)/16))
	}
	return true
}

func expAsm(dst, src []float32) int { return lanes16(exp16, dst, src) }

func erfAsm(dst, src []float32) int { return lanes16(erf16, dst, src) }

// lanes16 runs an element-wise kernel of 16 lanes over the longest
// prefix of src it covers, and says how far it went.
func lanes16(kernel func(dst, src *float32, n int), dst, src []float32) int {
	if level != levelAVX512 {
		return 0
	}
	n := vectorPart(levelAVX512, len(src))
	if n > 0 {
		kernel(&dst[0], &src[0], n)
	}
	return n
}

func geluAsm(out, cdf, x []float32) int {
	if level != levelAVX512 {
		return 0
	}
	n := vectorPart(levelAVX512, len(x))
	if n > 0 {
		gelu16(&out[0], &cdf[0], &x[0], n)
	}
	return n
}

func geluGradAsm(dx, dy, x, cdf []float32) int {
	if level != levelAVX512 {
		return 0
	}
	n := vectorPart(levelAVX512, len(x))
	if n > 0 {
		geluGrad16(&dx[0], &dy[0], &x[0], &cdf[0], n)
	}
	return n
}

//go:noescape
func gelu16(out, cdf, x *float32, n int)

//go:noescape
func geluGrad16(dx, dy, x, cdf *float32, n int)

//go:noescape
func exp16(dst, src *float32, n int)

//go:noescape
func erf16(dst, src *float32, n int)

// maxAsm is the largest of the longest prefix of x that whole vectors
// cover, and its length (0: none, and the maximum is to be taken from
// x[0]).
func maxAsm(x []float32) (float32, int) {
	if level != levelAVX512 {
		return 0, 0
	}
	n := vectorPart(levelAVX512, len(x))
	if n == 0 {
		return 0, 0
	}
	return max16(&x[0], n), n
}

func addScalarAsm(dst, src []float32, c float32) int { return scalar16(addScalar16, dst, src, c) }

func scaleAsm(dst, src []float32, c float32) int { return scalar16(scale16, dst, src, c) }

// scalar16 runs a kernel of 16 lanes with a constant over the longest
// prefix of src it covers (dst as long), and says how far it went.
func scalar16(kernel func(dst, src *float32, n int, c float32), dst, src []float32, c float32) int {
	if level != levelAVX512 {
		return 0
	}
	n := vectorPart(levelAVX512, len(src))
	if n > 0 {
		kernel(&dst[0], &src[0], n, c)
	}
	return n
}

func mulSubAsm(d, p []float32, c float32) int { return scalar16(mulSub16, d, p, c) }

//go:noescape
func max16(x *float32, n int) float32

//go:noescape
func addScalar16(dst, src *float32, n int, c float32)

//go:noescape
func scale16(dst, src *float32, n int, c float32)

//go:noescape
func mulSub16(d, p *float32, n int, c float32)
