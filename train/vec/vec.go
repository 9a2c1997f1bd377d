package vec

import "math"

// SGD updates p in place as torch.optim.SGD does with weight decay wd:
// d = g + wd·p; with momentum mu, v ← mu·v + d and p ← p − lr·v, else
// p ← p − lr·d. v is ignored when mu is 0. g and v must be at least as
// long as p.
//
// A v below the smallest normal float32 in magnitude becomes +0 (Flush)
// before it is stored or used. A weight whose gradient stays 0 (a dead
// ReLU's, an always-black pixel's) has its momentum shrink by mu every
// step into the subnormals, where it stays (0.9 times the smallest
// subnormal rounds back to it), and x86 takes a microcode assist of a
// hundred cycles or more for every operation on one: a tenth of the
// mlp's momentum made its optimizer step 3.3 times slower.
func SGD(p, g, v []float32, lr, mu, wd float32) {
	g = g[:len(p)]
	if mu == 0 {
		sgdGo(p, g, lr, wd)
		return
	}
	v = v[:len(p)]
	done := sgdMomentumAsm(p, g, v, lr, mu, wd)
	sgdMomentumGo(p[done:], g[done:], v[done:], lr, mu, wd)
}

// Adam updates p in place as torch.optim.Adam does: d = g + wd·p;
// m ← b1·m + (1−b1)·d; v ← b2·v + (1−b2)·d·d;
// p ← p − step·m / (√v / sq + eps), where step = lr / (1 − b1ᵗ) and
// sq = √(1 − b2ᵗ) are the caller's bias corrections. Subnormal m and v
// become +0, as SGD's momentum does, for the same reason.
func Adam(p, g, m, v []float32, step, sq, b1, b2, wd, eps float32) {
	g, m, v = g[:len(p)], m[:len(p)], v[:len(p)]
	c := AdamConsts{Step: step, Sq: sq, B1: b1, C1: 1 - b1, B2: b2, C2: 1 - b2, WD: wd, Eps: eps}
	done := adamAsm(p, g, m, v, &c)
	adamGo(p[done:], g[done:], m[done:], v[done:], &c)
}

// AdamConsts are Adam's scalars as the kernels take them.
type AdamConsts struct {
	Step, Sq, B1, C1, B2, C2, WD, Eps float32
}

// The float32() conversions below keep every product rounded on its own:
// without them a compiler may fuse a multiply and an add (Go allows it,
// and does on arm64 and with GOAMD64=v3), and the bits would differ from
// the vector code's.

func sgdGo(p, g []float32, lr, wd float32) {
	g = g[:len(p)]
	for j, w := range p {
		p[j] = w - float32(lr*(g[j]+float32(wd*w)))
	}
}

// MinNormal is the smallest normal float32, 2⁻¹²⁶.
const MinNormal = 0x1p-126

// Flush is x, or +0 if x is subnormal or ±0: what the optimizers keep of
// a state value (see SGD). NaN and ±Inf pass.
func Flush(x float32) float32 {
	if x > -MinNormal && x < MinNormal {
		return 0
	}
	return x
}

func sgdMomentumGo(p, g, v []float32, lr, mu, wd float32) {
	g, v = g[:len(p)], v[:len(p)]
	for j, w := range p {
		m := Flush(float32(mu*v[j]) + (g[j] + float32(wd*w)))
		v[j] = m
		p[j] = w - float32(lr*m)
	}
}

func adamGo(p, g, m, v []float32, c *AdamConsts) {
	g, m, v = g[:len(p)], m[:len(p)], v[:len(p)]
	for j, w := range p {
		d := g[j] + float32(c.WD*w)
		mj := Flush(float32(c.B1*m[j]) + float32(c.C1*d))
		vj := Flush(float32(c.B2*v[j]) + float32(float32(c.C2*d)*d))
		m[j], v[j] = mj, vj
		p[j] = w - float32(c.Step*mj)/(sqrt32(vj)/c.Sq+c.Eps)
	}
}

// Sum returns the sum of x in a fixed order that vectors can follow: 64
// running sums, x[i] going to sum i mod 64 in turn, then halved pairwise
// (sum l plus sum l+32, then l+16, …, l+1). The same bits at every
// level; more accurate, and several times faster, than one running sum.
func Sum(x []float32) float32 {
	if s, ok := sumAsm(x); ok {
		return s
	}
	return sumGo(x)
}

func sumGo(x []float32) float32 {
	var s [64]float32
	for len(x) >= 64 {
		for l, v := range x[:64] {
			s[l] += v
		}
		x = x[64:]
	}
	for l, v := range x {
		s[l] += v
	}
	return halve(&s)
}

// halve adds Sum's 64 running sums pairwise: sum l plus sum l+32, then
// l+16, …, l+1.
func halve(s *[64]float32) float32 {
	for w := 32; w >= 1; w /= 2 {
		for l := range w {
			s[l] += s[l+w]
		}
	}
	return s[0]
}

// SumSquares returns the sum of the squares of x in Sum's order: each
// square rounded to float32, added to running sum i mod 64 in turn, then
// halved pairwise. The same bits at every level.
func SumSquares(x []float32) float32 {
	if s, ok := sumSquaresAsm(x); ok {
		return s
	}
	return sumSquaresGo(x)
}

func sumSquaresGo(x []float32) float32 {
	var s [64]float32
	for len(x) >= 64 {
		for l, v := range x[:64] {
			s[l] += float32(v * v) // the conversion rounds: never fused
		}
		x = x[64:]
	}
	for l, v := range x {
		s[l] += float32(v * v)
	}
	return halve(&s)
}

// SketchScan reads the whole blocks of src — values 64i to 64i+63 — in
// one pass, and for each: copies it to dst, unless dst is nil; adds its
// squares, folded to 16 lanes, to sq; and adds its values, value 64i+j
// negated where bit j of signs[i] is set, folded to 16 lanes, to bucket
// buckets[i] of lanes — its values 16·buckets[i] to 16·buckets[i]+15. A
// fold's lane l is (x_l + x_{16+l}) + (x_{32+l} + x_{48+l}) (each square
// rounded first), added to the lane it goes to block after block: the
// same order at every level. It returns the blocks done: those all of
// src, signs, buckets and dst (unless nil) cover. A bucket outside lanes
// panics. One pass for a count sketch's share of each block and a norm,
// beside a copy the caller makes anyway; the caller sums a bucket's
// lanes once for all its blocks.
func SketchScan(dst, src []float32, signs []uint64, buckets []int32, lanes []float32, sq *[16]float32) int {
	n := min(len(src)/64, len(signs), len(buckets))
	if dst != nil {
		n = min(n, len(dst)/64)
	}
	if n == 0 || sketchScanAsm(dst, src, signs, buckets, lanes, sq, n) {
		return n
	}
	sketchScanGo(dst, src[:64*n], signs[:n], buckets[:n], lanes, sq)
	return n
}

func sketchScanGo(dst, src []float32, signs []uint64, buckets []int32, lanes []float32, sq *[16]float32) {
	for i, m := range signs {
		b := src[64*i : 64*i+64]
		if dst != nil {
			copy(dst[64*i:64*i+64], b)
		}
		var t, q [64]float32
		for j, x := range b {
			t[j] = math.Float32frombits(math.Float32bits(x) ^ uint32(m>>uint(j)&1)<<31)
			q[j] = float32(x * x)
		}
		acc := lanes[16*int(buckets[i]) : 16*int(buckets[i])+16]
		for l := range acc {
			sq[l] += (q[l] + q[16+l]) + (q[32+l] + q[48+l])
			acc[l] += (t[l] + t[16+l]) + (t[32+l] + t[48+l])
		}
	}
}

// Finite reports whether every value of x is finite: no NaN, no ±Inf.
func Finite(x []float32) bool {
	done, ok := finiteAsm(x)
	return ok && finiteGo(x[done:])
}

// CopyFinite copies src into dst (at least as long) and reports whether
// every value of src is finite: Finite and copy in one pass over memory,
// for gradients gathered into a buffer of tens of megabytes.
func CopyFinite(dst, src []float32) bool {
	dst = dst[:len(src)]
	done, ok := copyFiniteAsm(dst, src)
	copy(dst[done:], src[done:])
	return finiteGo(src[done:]) && ok
}

// finiteGo: x − x is 0 for a finite x and NaN otherwise; four sums keep
// the loop free of branches and dependencies.
func finiteGo(x []float32) bool {
	var s0, s1, s2, s3 float32
	j := 0
	for ; j+4 <= len(x); j += 4 {
		s0 += x[j] - x[j]
		s1 += x[j+1] - x[j+1]
		s2 += x[j+2] - x[j+2]
		s3 += x[j+3] - x[j+3]
	}
	for ; j < len(x); j++ {
		s0 += x[j] - x[j]
	}
	return s0+s1+s2+s3 == 0
}

// Relu sets y = x where x > 0 or x is NaN (so a NaN stays visible to the
// step's finite check), else 0. y must be as long as x.
func Relu(x, y []float32) {
	y = y[:len(x)]
	done := reluAsm(x, y)
	reluGo(x[done:], y[done:])
}

// ReluGrad sets dx = dy where y > 0, else 0: the gradient of Relu given
// its output y. dy and dx must be as long as y.
func ReluGrad(y, dy, dx []float32) {
	dy, dx = dy[:len(y)], dx[:len(y)]
	done := reluGradAsm(y, dy, dx)
	reluGradGo(y[done:], dy[done:], dx[done:])
}

func reluGo(x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		if v <= 0 {
			v = 0
		}
		y[i] = v
	}
}

func reluGradGo(y, dy, dx []float32) {
	dy, dx = dy[:len(y)], dx[:len(y)]
	for i, v := range y {
		g := dy[i]
		if !(v > 0) {
			g = 0
		}
		dx[i] = g
	}
}

// AddRows adds rows of src into dst: dst[r·ldd + i] += src[r·lds + i] for
// r < rows and i < n, each sum rounded once as a Go loop's — the scatter
// of a convolution's input gradient, whose rows are a few values long.
func AddRows(dst []float32, ldd int, src []float32, lds int, rows, n int) {
	eachRow(true, dst, ldd, src, lds, rows, n)
}

// CopyRows copies rows of src into dst: dst[r·ldd + i] = src[r·lds + i]
// for r < rows and i < n — the gather of a convolution's im2col, whose
// rows are a few values long, shorter than a call to memmove is worth.
func CopyRows(dst []float32, ldd int, src []float32, lds int, rows, n int) {
	eachRow(false, dst, ldd, src, lds, rows, n)
}

// eachRow is AddRows (add) or CopyRows: the bounds checked once, then the
// CPU's masked vectors where it has them, else the Go loop.
func eachRow(add bool, dst []float32, ldd int, src []float32, lds int, rows, n int) {
	if rows <= 0 || n <= 0 {
		return
	}
	_ = dst[(rows-1)*ldd+n-1]
	_ = src[(rows-1)*lds+n-1]
	if !rowsAsm(add, dst, ldd, src, lds, rows, n) {
		rowsGo(add, dst, ldd, src, lds, rows, n)
	}
}

func rowsGo(add bool, dst []float32, ldd int, src []float32, lds int, rows, n int) {
	for r := range rows {
		d := dst[r*ldd : r*ldd+n]
		if !add {
			copy(d, src[r*lds:r*lds+n])
			continue
		}
		for i, v := range src[r*lds : r*lds+n] {
			d[i] += v
		}
	}
}
