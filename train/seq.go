package train

import (
	"fmt"
	"math"
	"sync"

	"gonum.org/v1/gonum/blas"
	"gorgonia.org/tensor"

	"github.com/ringtrain/ringtrain/train/gemm"
	"github.com/ringtrain/ringtrain/train/vec"
)

// A language model's layers, as kernels (kernelOp) on activations kept
// as matrices of one row per position: [samples × positions, features].
// Every value is computed in an order that does not depend on the
// threads, so every replica holds the same bits whatever its threads.

// embeddingKernel is a byte embedding with learned positions: inputs the
// tokens [samples, T] (byte values as float32s), the token table
// [vocab, dim] and the position table [T, dim]; row r of the output is
// the table row of its token plus that of its position.
type embeddingKernel struct{ vocab, dim, T int }

func (k embeddingKernel) String() string { return "embedding" }

func (k embeddingKernel) shape(in []tensor.Shape) (tensor.Shape, error) {
	if len(in[0]) != 2 || in[0][1] != k.T {
		return nil, fmt.Errorf("%v: tokens %v; want [samples, %d]", k, in[0], k.T)
	}
	return tensor.Shape{in[0][0] * k.T, k.dim}, nil
}

func (k embeddingKernel) forward(out []float32, in [][]float32) error {
	tok, w, p := in[0], in[1], in[2]
	for r, v := range tok {
		t := int(v)
		if float32(t) != v || t < 0 || t >= k.vocab {
			return fmt.Errorf("%v: token %v at sample %d position %d; want a whole number in [0, %d)", k, v, r/k.T, r%k.T, k.vocab)
		}
		row, pos := out[r*k.dim:(r+1)*k.dim], p[(r%k.T)*k.dim:]
		for j, e := range w[t*k.dim : (t+1)*k.dim] {
			row[j] = e + pos[j]
		}
	}
	return nil
}

func (k embeddingKernel) backward(dx [][]float32, dy []float32, in [][]float32, _ []float32) error {
	tok := in[0]
	for i, d := range dx[1:] {
		if d == nil {
			continue
		}
		clear(d)
		for r, v := range tok {
			at := int(v) // the token's row, or the position's
			if i == 1 {
				at = r % k.T
			}
			row := d[at*k.dim : (at+1)*k.dim]
			for j, g := range dy[r*k.dim : (r+1)*k.dim] {
				row[j] += g
			}
		}
	}
	return nil
}

// layerNormEps is torch's LayerNorm eps.
const layerNormEps = 1e-5

// layerNormKernel normalises each row of x [rows, dim] to zero mean and
// unit variance (eps 1e-5), then scales by the gain and adds the bias
// (each [1, dim]): torch's LayerNorm. Its statistics are kept for the
// backward pass.
type layerNormKernel struct {
	dim        int
	bl         *gemm.BLAS
	mean, rstd *[]float32
}

func newLayerNorm(dim int, bl *gemm.BLAS) layerNormKernel {
	return layerNormKernel{dim: dim, bl: bl, mean: new([]float32), rstd: new([]float32)}
}

func (k layerNormKernel) String() string { return "layernorm" }

func (k layerNormKernel) shape(in []tensor.Shape) (tensor.Shape, error) {
	if len(in[0]) != 2 || in[0][1] != k.dim {
		return nil, fmt.Errorf("%v: input %v; want [rows, %d]", k, in[0], k.dim)
	}
	return in[0].Clone(), nil
}

func (k layerNormKernel) forward(out []float32, in [][]float32) error {
	x, g, b := in[0], in[1], in[2]
	rows := len(x) / k.dim
	*k.mean, *k.rstd = grow(*k.mean, rows), grow(*k.rstd, rows)
	mean, rstd := *k.mean, *k.rstd
	n := float32(k.dim)
	rowsEach(k.bl, rows, rows*k.dim, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, yr := x[r*k.dim:(r+1)*k.dim], out[r*k.dim:(r+1)*k.dim]
			mu := vec.Sum(xr) / n
			rs := float32(1 / math.Sqrt(float64(squaresAbout(xr, mu)/n)+layerNormEps))
			mean[r], rstd[r] = mu, rs
			for j, v := range xr {
				yr[j] = float32(float32(float32(v-mu)*rs)*g[j]) + b[j]
			}
		}
	})
	return nil
}

// squaresAbout is Σ (x − mu)² in four running sums, added pairwise: one
// would wait on each add before the next.
func squaresAbout(xs []float32, mu float32) float32 {
	var s0, s1, s2, s3 float32
	j := 0
	for ; j+4 <= len(xs); j += 4 {
		d0, d1, d2, d3 := xs[j]-mu, xs[j+1]-mu, xs[j+2]-mu, xs[j+3]-mu
		s0, s1, s2, s3 = s0+float32(d0*d0), s1+float32(d1*d1), s2+float32(d2*d2), s3+float32(d3*d3)
	}
	for ; j < len(xs); j++ {
		d := xs[j] - mu
		s0 += float32(d * d)
	}
	return (s0 + s1) + (s2 + s3)
}

func (k layerNormKernel) backward(dx [][]float32, dy []float32, in [][]float32, _ []float32) error {
	x, g := in[0], in[1]
	rows := len(x) / k.dim
	mean, rstd := *k.mean, *k.rstd
	if dx[0] != nil {
		n := float32(k.dim)
		rowsEach(k.bl, rows, rows*k.dim, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				xr, dyr, dxr := x[r*k.dim:(r+1)*k.dim], dy[r*k.dim:(r+1)*k.dim], dx[0][r*k.dim:(r+1)*k.dim]
				mu, rs := mean[r], rstd[r]
				a, c := gradMeans(xr, dyr, g, mu, rs) // the sums of dŷ and dŷ·x̂
				am, cm := a/n, c/n
				for j, v := range xr {
					d := float32(dyr[j] * g[j])
					xh := float32(float32(v-mu) * rs)
					dxr[j] = float32(rs * float32(float32(d-am)-float32(xh*cm)))
				}
			}
		})
	}
	// The gain's and bias's gradients sum over the rows, in row order.
	dg, db := dx[1], dx[2]
	if dg != nil {
		clear(dg)
	}
	if db != nil {
		clear(db)
	}
	for r := range rows {
		xr, dyr := x[r*k.dim:(r+1)*k.dim], dy[r*k.dim:(r+1)*k.dim]
		mu, rs := mean[r], rstd[r]
		if dg != nil {
			for j, d := range dyr {
				dg[j] += d * ((xr[j] - mu) * rs)
			}
		}
		if db != nil {
			for j, d := range dyr {
				db[j] += d
			}
		}
	}
	return nil
}

// gradMeans is Σ dŷ and Σ dŷ·x̂ over a row — dŷ = dy·g, x̂ = (x − mu)·rs
// — each in two running sums.
func gradMeans(x, dy, g []float32, mu, rs float32) (a, c float32) {
	var a0, a1, c0, c1 float32
	j := 0
	for ; j+2 <= len(x); j += 2 {
		d0, d1 := float32(dy[j]*g[j]), float32(dy[j+1]*g[j+1])
		h0, h1 := float32(float32(x[j]-mu)*rs), float32(float32(x[j+1]-mu)*rs)
		a0, a1 = a0+d0, a1+d1
		c0, c1 = c0+float32(d0*h0), c1+float32(d1*h1)
	}
	for ; j < len(x); j++ {
		d := float32(dy[j] * g[j])
		a0 += d
		c0 += float32(d * float32(float32(x[j]-mu)*rs))
	}
	return a0 + a1, c0 + c1
}

// sum4 is the sum of xs in float64, in four running sums added pairwise
// at the end: one sum would wait on each add before the next.
func sum4(xs []float32) float64 {
	var s0, s1, s2, s3 float64
	j := 0
	for ; j+4 <= len(xs); j += 4 {
		s0 += float64(xs[j])
		s1 += float64(xs[j+1])
		s2 += float64(xs[j+2])
		s3 += float64(xs[j+3])
	}
	for ; j < len(xs); j++ {
		s0 += float64(xs[j])
	}
	return (s0 + s1) + (s2 + s3)
}

// geluKernel is the GELU of every value, exact (torch's default):
// x·Φ(x), Φ the standard normal's distribution function, which the
// forward pass keeps for the backward's Φ(x) + x·φ(x).
type geluKernel struct {
	bl  *gemm.BLAS
	cdf *[]float32
}

func newGELU(bl *gemm.BLAS) geluKernel { return geluKernel{bl: bl, cdf: new([]float32)} }

func (k geluKernel) String() string { return "gelu" }

func (k geluKernel) shape(in []tensor.Shape) (tensor.Shape, error) { return in[0].Clone(), nil }

// The GELU's elementwise work is train/vec's (GELU, GELUGrad): the
// scalar loop, and its twin in vector instructions.
func (k geluKernel) forward(out []float32, in [][]float32) error {
	x := in[0]
	*k.cdf = grow(*k.cdf, len(x))
	cdf := *k.cdf
	rowsEach(k.bl, len(x), len(x), func(lo, hi int) { vec.GELU(out[lo:hi], cdf[lo:hi], x[lo:hi]) })
	return nil
}

func (k geluKernel) backward(dx [][]float32, dy []float32, in [][]float32, _ []float32) error {
	x, d, cdf := in[0], dx[0], *k.cdf
	rowsEach(k.bl, len(x), len(x), func(lo, hi int) { vec.GELUGrad(d[lo:hi], dy[lo:hi], x[lo:hi], cdf[lo:hi]) })
	return nil
}

// attentionKernel is causal multi-head self-attention: from qkv
// [samples × T, 3·dim] — each row's queries, keys and values, head h's
// at columns [h·d, (h+1)·d) of each third — the output [samples × T,
// dim], position i of head h attending to positions 0…i by
// softmax(q·kᵀ/√d). The probabilities are kept for the backward pass.
type attentionKernel struct {
	T, dim, heads int
	bl            *gemm.BLAS
	probs         *[]float32 // [samples, heads, T, T]
	scratch       *sync.Pool // *[]float32 of T×T, a task's dP
}

func newAttention(T, dim, heads int, bl *gemm.BLAS) attentionKernel {
	return attentionKernel{T: T, dim: dim, heads: heads, bl: bl, probs: new([]float32),
		scratch: &sync.Pool{New: func() any { s := make([]float32, T*T); return &s }}}
}

func (k attentionKernel) String() string { return "attention" }

func (k attentionKernel) shape(in []tensor.Shape) (tensor.Shape, error) {
	if len(in[0]) != 2 || in[0][1] != 3*k.dim || in[0][0]%k.T != 0 {
		return nil, fmt.Errorf("%v: input %v; want [samples × %d, %d]", k, in[0], k.T, 3*k.dim)
	}
	return tensor.Shape{in[0][0], k.dim}, nil
}

// tasks runs f for every (sample, head) pair, split over the threads;
// each pair's values are its own.
func (k attentionKernel) tasks(samples int, f func(s, h int)) {
	n := samples * k.heads
	rowsEach(k.bl, n, n*k.T*k.T*(k.dim/k.heads), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			f(i/k.heads, i%k.heads)
		}
	})
}

func (k attentionKernel) forward(out []float32, in [][]float32) error {
	qkv, T, C := in[0], k.T, k.dim
	d, samples, scale := k.geom(qkv)
	*k.probs = grow(*k.probs, samples*k.heads*T*T)
	k.tasks(samples, func(s, h int) {
		q, kk, v, p := k.head(qkv, s, h)
		k.bl.SgemmSerial(blas.NoTrans, blas.Trans, T, T, d, scale, q, 3*C, kk, 3*C, 0, p, T)
		causalSoftmax(p, T)
		k.bl.SgemmSerial(blas.NoTrans, blas.NoTrans, T, d, T, 1, p, T, v, 3*C, 0, out[s*T*C+h*d:], C)
	})
	return nil
}

// geom is a head's width, the samples in qkv and the scores' scale, 1/√d.
func (k attentionKernel) geom(qkv []float32) (d, samples int, scale float32) {
	d = k.dim / k.heads
	return d, len(qkv) / (k.T * 3 * k.dim), float32(1 / math.Sqrt(float64(d)))
}

// head is sample s's head h in qkv (or its gradient): its queries, keys
// and values, each a column block of rows 3·dim apart, and its
// probabilities [T, T].
func (k attentionKernel) head(qkv []float32, s, h int) (q, kk, v, p []float32) {
	T, C, d := k.T, k.dim, k.dim/k.heads
	base := s*T*3*C + h*d
	i := s*k.heads + h
	return qkv[base:], qkv[base+C:], qkv[base+2*C:], (*k.probs)[i*T*T : (i+1)*T*T]
}

// causalSoftmax turns each row i of the scores p [T, T] into the softmax
// of its first i+1, and zeros after them.
func causalSoftmax(p []float32, T int) {
	for i := range T {
		row := p[i*T : (i+1)*T]
		top := vec.Max(row[:i+1])
		// exp over whole vectors of 16: the lanes past i are thrown away
		// below, and the scalar tail would cost as much as the rest.
		n := min(T, (i+16)&^15)
		vec.AddScalar(row[:n], row[:n], -top)
		vec.ExpSlice(row[:n], row[:n])
		vec.Scale(row[:i+1], row[:i+1], 1/vec.Sum(row[:i+1]))
		clear(row[i+1:])
	}
}

func (k attentionKernel) backward(dx [][]float32, dy []float32, in [][]float32, _ []float32) error {
	qkv, T, C := in[0], k.T, k.dim
	d, samples, scale := k.geom(qkv)
	k.tasks(samples, func(s, h int) {
		q, kk, v, p := k.head(qkv, s, h)
		dq, dk, dv, _ := k.head(dx[0], s, h)
		g := dy[s*T*C+h*d:]
		buf := k.scratch.Get().(*[]float32)
		defer k.scratch.Put(buf)
		dp := *buf
		// dV = Pᵀ·dY; dP = dY·Vᵀ; dS = P ⊙ (dP − rowsum(P ⊙ dP)).
		k.bl.SgemmSerial(blas.Trans, blas.NoTrans, T, d, T, 1, p, T, g, C, 0, dv, 3*C)
		k.bl.SgemmSerial(blas.NoTrans, blas.Trans, T, T, d, 1, g, C, v, 3*C, 0, dp, T)
		for i := range T {
			pr, dr := p[i*T:(i+1)*T], dp[i*T:(i+1)*T]
			vec.MulSub(dr[:i+1], pr, float32(dot4(pr[:i+1], dr[:i+1])))
			clear(dr[i+1:])
		}
		// dQ = dS·K/√d; dK = dSᵀ·Q/√d.
		k.bl.SgemmSerial(blas.NoTrans, blas.NoTrans, T, d, T, scale, dp, T, kk, 3*C, 0, dq, 3*C)
		k.bl.SgemmSerial(blas.Trans, blas.NoTrans, T, d, T, scale, dp, T, q, 3*C, 0, dk, 3*C)
	})
	return nil
}

// dot4 is Σ a[j]·b[j] (b at least as long as a) in float64, in four
// running sums.
func dot4(a, b []float32) float64 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float64
	j := 0
	for ; j+4 <= len(a); j += 4 {
		s0 += float64(a[j]) * float64(b[j])
		s1 += float64(a[j+1]) * float64(b[j+1])
		s2 += float64(a[j+2]) * float64(b[j+2])
		s3 += float64(a[j+3]) * float64(b[j+3])
	}
	for ; j < len(a); j++ {
		s0 += float64(a[j]) * float64(b[j])
	}
	return (s0 + s1) + (s2 + s3)
}

// rowsEach runs f over [0, n) in parts, one per thread bl has where the
// values it touches are worth one (splitValues); each part's values are
// its own, so the bits do not depend on the cut.
func rowsEach(bl *gemm.BLAS, n, values int, f func(lo, hi int)) {
	threads := 1
	if bl != nil {
		threads = min(bl.Threads(), max(1, values/splitValues))
	}
	parallelFor(threads, n, func(_, lo, hi int) { f(lo, hi) })
}

// crossEntropyKernel is a language model's loss, fused: from logits
// [rows, classes] and one-hot targets [rows, classes] (a row of zeros: no
// target, a short batch's padding), the sum over rows of each row's
// cross-entropy, times *scale (one over the labels of the batch), as a
// 1×1 matrix. Each row's softmax is kept for the backward pass, which is
// (softmax − target)·scale — where gorgonia's log-softmax, product and
// sum would make a dozen passes over rows × 256 values, and copies.
type crossEntropyKernel struct {
	classes int
	bl      *gemm.BLAS
	scale   *float32
	probs   *[]float32
	rowLoss *[]float64
}

func newCrossEntropy(classes int, bl *gemm.BLAS, scale *float32) crossEntropyKernel {
	return crossEntropyKernel{classes: classes, bl: bl, scale: scale, probs: new([]float32), rowLoss: new([]float64)}
}

func (k crossEntropyKernel) String() string { return "crossEntropy" }

func (k crossEntropyKernel) shape(in []tensor.Shape) (tensor.Shape, error) {
	if len(in[0]) != 2 || in[0][1] != k.classes || !in[0].Eq(in[1]) {
		return nil, fmt.Errorf("%v: logits %v and targets %v; want matrices of one shape, %d wide", k, in[0], in[1], k.classes)
	}
	return tensor.Shape{1, 1}, nil
}

func (k crossEntropyKernel) forward(out []float32, in [][]float32) error {
	x, y, V := in[0], in[1], k.classes
	rows := len(x) / V
	*k.probs = grow(*k.probs, len(x))
	if cap(*k.rowLoss) < rows {
		*k.rowLoss = make([]float64, rows)
	}
	losses, probs := (*k.rowLoss)[:rows], *k.probs
	rowsEach(k.bl, rows, len(x), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, yr, pr := x[r*V:(r+1)*V], y[r*V:(r+1)*V], probs[r*V:(r+1)*V]
			top := vec.Max(xr)
			vec.AddScalar(pr, xr, -top)
			vec.ExpSlice(pr, pr)
			sum := sum4(pr)
			lse := float64(top) + math.Log(sum)
			inv := float32(1 / sum)
			var loss float64
			for j := range pr {
				pr[j] *= inv
				if yr[j] != 0 {
					loss += float64(yr[j]) * (lse - float64(xr[j]))
				}
			}
			losses[r] = loss
		}
	})
	var total float64 // in row order
	for _, l := range losses {
		total += l
	}
	out[0] = float32(total) * *k.scale
	return nil
}

func (k crossEntropyKernel) backward(dx [][]float32, dy []float32, in [][]float32, _ []float32) error {
	y, d, V := in[1], dx[0], k.classes
	g := dy[0] * *k.scale
	probs := *k.probs
	rowsEach(k.bl, len(y)/V, len(y), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			yr, pr, dr := y[r*V:(r+1)*V], probs[r*V:(r+1)*V], d[r*V:(r+1)*V]
			var mass float32 // the row's targets: 1, or 0 for padding
			for _, t := range yr {
				mass += t
			}
			for j, p := range pr {
				dr[j] = g * (p*mass - yr[j])
			}
		}
	})
	return nil
}

// addKernel is a residual add, a + b, into memory kept from step to step:
// gorgonia's Add clones its first input first, an allocation and a copy
// of the whole activation every step.
type addKernel struct{}

func (addKernel) String() string { return "add" }

func (addKernel) shape(in []tensor.Shape) (tensor.Shape, error) {
	if !in[0].Eq(in[1]) {
		return nil, fmt.Errorf("add: %v and %v; want one shape", in[0], in[1])
	}
	return in[0].Clone(), nil
}

func (addKernel) forward(out []float32, in [][]float32) error {
	a, b := in[0], in[1][:len(in[0])]
	for i := range out {
		out[i] = a[i] + b[i]
	}
	return nil
}

func (addKernel) backward(dx [][]float32, dy []float32, _ [][]float32, _ []float32) error {
	for _, d := range dx {
		if d != nil {
			copy(d, dy)
		}
	}
	return nil
}
