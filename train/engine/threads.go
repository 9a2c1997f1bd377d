package engine

import (
	"math"

	"github.com/ringtrain/ringtrain/train/vec"
)

// The bodies of the CUDA kernels in ptx/kernels.cu, one thread each, in Go.
// Host runs them for every thread index; keep each in step with its kernel
// (same names, same arithmetic). i is the global thread index
// (blockIdx.x·blockDim.x + threadIdx.x); the kernels return for i ≥ n, as
// the loops that call these never reach.

// im2colBatchThread: thread i writes col[i] of the (C·K·K) × (B·OH·OW)
// matrix: row r = (c, ky, kx), column s·OH·OW + p; the input value of
// sample s that tap r sees at output position p, or 0 in the padding.
func im2colBatchThread(i int, x, col []float32, g Conv, batch int) {
	P := g.OH * g.OW
	p := i % P
	s := (i / P) % batch
	r := i / (P * batch)
	ox := p % g.OW
	oy := p / g.OW
	kx := r % g.K
	ky := (r / g.K) % g.K
	c := r / (g.K * g.K)
	y := oy + ky - g.Pad
	xx := ox + kx - g.Pad
	v := float32(0)
	if y >= 0 && y < g.H && xx >= 0 && xx < g.W {
		v = x[((s*g.C+c)*g.H+y)*g.W+xx]
	}
	col[i] = v
}

// col2imBatchThread: thread i writes dx[i], input (s, c, y, x): the sum of
// every col entry im2col took from it. A gather, so no two threads write
// the same place and no atomics are needed.
func col2imBatchThread(i int, col, dx []float32, g Conv, batch int) {
	P := g.OH * g.OW
	xx := i % g.W
	y := (i / g.W) % g.H
	c := (i / (g.W * g.H)) % g.C
	s := i / (g.W * g.H * g.C)
	sum := float32(0)
	for ky := 0; ky < g.K; ky++ {
		oy := y + g.Pad - ky
		if oy < 0 || oy >= g.OH {
			continue
		}
		for kx := 0; kx < g.K; kx++ {
			ox := xx + g.Pad - kx
			if ox < 0 || ox >= g.OW {
				continue
			}
			r := (c*g.K+ky)*g.K + kx
			sum += col[(r*batch+s)*P+oy*g.OW+ox]
		}
	}
	dx[i] = sum
}

// unbatchBiasThread: y[s, c, p] = t[c, s, p] + b[c].
func unbatchBiasThread(i int, t, b, y []float32, batch, chans, inner int) {
	p := i % inner
	c := (i / inner) % chans
	s := i / (inner * chans)
	y[i] = t[(c*batch+s)*inner+p] + b[c]
}

// rebatchThread: t[c, s, p] = y[s, c, p].
func rebatchThread(i int, y, t []float32, batch, chans, inner int) {
	p := i % inner
	s := (i / inner) % batch
	c := i / (inner * batch)
	t[i] = y[(s*chans+c)*inner+p]
}

// biasAddThread: y[i] += b[channel of i], y being rows × cols × inner.
func biasAddThread(i int, y, b []float32, cols, inner int) {
	y[i] += b[(i/inner)%cols]
}

// biasGradPartBlock: block b writes part[s·cols + j], j = b mod cols and
// s = b / cols, the sum of channel j's values seg·s … seg·(s+1) − 1 in the
// rows × inner order, as the kernel's 256 threads do it: thread t sums
// every 256th value from the segment's t-th, then a tree adds the partial
// sums in a fixed order. Same order, same bits.
func biasGradPartBlock(b int, dy, part []float32, rows, cols, inner, seg int) {
	j, s := b%cols, b/cols
	hi := min(rows*inner, (s+1)*seg)
	var sh [blockSize]float32
	for t := range blockSize {
		sum := float32(0)
		for e := s*seg + t; e < hi; e += blockSize {
			r, k := e/inner, e%inner
			sum += dy[(r*cols+j)*inner+k]
		}
		sh[t] = sum
	}
	for w := blockSize / 2; w > 0; w >>= 1 {
		for t := 0; t < w; t++ {
			sh[t] += sh[t+w]
		}
	}
	part[s*cols+j] = sh[0]
}

// biasGradRowsThread: for one value a row, part[i], i = s·cols + j, is
// column j summed over rows seg·s … seg·(s+1) − 1 in order.
func biasGradRowsThread(i int, dy, part []float32, rows, cols, seg int) {
	j, s := i%cols, i/cols
	sum := float32(0)
	for r := s * seg; r < min(rows, (s+1)*seg); r++ {
		sum += dy[r*cols+j]
	}
	part[i] = sum
}

// biasGradSumThread: db[j], the parts of column j added in order.
func biasGradSumThread(j int, part, db []float32, cols, parts int) {
	sum := float32(0)
	for s := range parts {
		sum += part[s*cols+j]
	}
	db[j] = sum
}

func reluThread(i int, x, y []float32) {
	v := x[i]
	if v < 0 {
		v = 0
	}
	y[i] = v
}

// reluBackwardThread: dx = dy where the output was positive, else 0.
func reluBackwardThread(i int, y, dy, dx []float32) {
	v := float32(0)
	if y[i] > 0 {
		v = dy[i]
	}
	dx[i] = v
}

// maxPoolThread: thread i writes output i (plane p, oy, ox): the largest
// value of its window, the first one on ties.
func maxPoolThread(i int, x, y []float32, g Pool) {
	ox := i % g.OW
	oy := (i / g.OW) % g.OH
	p := i / (g.OW * g.OH)
	base := p * g.H * g.W
	best := x[base+(oy*g.K)*g.W+ox*g.K]
	for ky := 0; ky < g.K; ky++ {
		for kx := 0; kx < g.K; kx++ {
			v := x[base+(oy*g.K+ky)*g.W+ox*g.K+kx]
			if v > best {
				best = v
			}
		}
	}
	y[i] = best
}

// maxPoolBackwardThread: thread i writes dx[i], input (p, y, x): its
// window's gradient if it is the window's first largest value, else 0.
// Windows do not overlap (stride = kernel), so this is a gather too.
func maxPoolBackwardThread(i int, x, dy, dx []float32, g Pool) {
	xx := i % g.W
	y := (i / g.W) % g.H
	p := i / (g.W * g.H)
	oy, ox := y/g.K, xx/g.K
	v := float32(0)
	if oy < g.OH && ox < g.OW {
		base := p * g.H * g.W
		arg := base + (oy*g.K)*g.W + ox*g.K
		for ky := 0; ky < g.K; ky++ {
			for kx := 0; kx < g.K; kx++ {
				j := base + (oy*g.K+ky)*g.W + ox*g.K + kx
				if x[j] > x[arg] {
					arg = j
				}
			}
		}
		if arg == i {
			v = dy[(p*g.OH+oy)*g.OW+ox]
		}
	}
	dx[i] = v
}

// softmaxXentThread: thread r (one per row of logits) writes row r of the
// gradient of the mean loss over the first n rows, (softmax − one-hot)/n,
// and the row's loss, −log softmax[label]; rows from n on are padding and
// get zeros. Labels are class indices stored as floats.
func softmaxXentThread(r int, logits, labels, grad, loss []float32, n, classes int) {
	row := logits[r*classes : (r+1)*classes]
	g := grad[r*classes : (r+1)*classes]
	if r >= n {
		for k := range classes {
			g[k] = 0
		}
		loss[r] = 0
		return
	}
	m := row[0]
	for k := 1; k < classes; k++ {
		if row[k] > m {
			m = row[k]
		}
	}
	sum := float32(0)
	for k := 0; k < classes; k++ {
		sum += float32(math.Exp(float64(row[k] - m)))
	}
	label := int(labels[r])
	inv := 1 / float32(n)
	for k := 0; k < classes; k++ {
		p := float32(math.Exp(float64(row[k]-m))) / sum
		if k == label {
			p -= 1
		}
		g[k] = p * inv
	}
	loss[r] = float32(math.Log(float64(sum))) - (row[label] - m)
}

// nonfiniteThread: flag[0] = 1 if g[i] is NaN or Inf.
func nonfiniteThread(i int, g, flag []float32) {
	v := float64(g[i])
	if math.IsNaN(v) || math.IsInf(v, 0) {
		flag[0] = 1
	}
}

// sgdThread is train.SGD's update of value i; hyper is (lr, momentum,
// weight decay). The explicit float32 conversions forbid the compiler a
// fused multiply-add, as -fmad=false does nvcc.
func sgdThread(i int, p, g, v, hyper, skip []float32) {
	if skip[0] != 0 {
		return
	}
	lr, mu, wd := hyper[0], hyper[1], hyper[2]
	w := p[i]
	if mu == 0 {
		p[i] = w - float32(lr*float32(g[i]+float32(wd*w)))
		return
	}
	m := vec.Flush(float32(mu*v[i]) + float32(g[i]+float32(wd*w)))
	v[i] = m
	p[i] = w - float32(lr*m)
}

// adamThread is train.Adam's update of value i; hyper is (lr/(1−b1ᵗ),
// √(1−b2ᵗ), weight decay, b1, b2, eps).
func adamThread(i int, p, g, m, v, hyper, skip []float32) {
	if skip[0] != 0 {
		return
	}
	step, sq, wd, b1, b2, eps := hyper[0], hyper[1], hyper[2], hyper[3], hyper[4], hyper[5]
	d := g[i] + float32(wd*p[i])
	mi := vec.Flush(float32(b1*m[i]) + float32((1-b1)*d))
	vi := vec.Flush(float32(b2*v[i]) + float32(float32((1-b2)*d)*d))
	m[i] = mi
	v[i] = vi
	p[i] = p[i] - float32(step*mi)/(float32(math.Sqrt(float64(vi)))/sq+eps)
}

// The language model's kernels. Activations are rows of one position each:
// [samples × T, width].

// embedThread: y[i] (row r, column j) is the token table's row tok[r]
// plus the position table's row r mod T. Tokens are whole numbers in
// [0, vocab), checked on the host before they are uploaded.
func embedThread(i int, tok, table, pos, y []float32, T, dim int) {
	r, j := i/dim, i%dim
	y[i] = table[int(tok[r])*dim+j] + pos[(r%T)*dim+j]
}

// embedGradThread: thread i writes dTable[i] (token v, column j), the sum
// of dy[r, j] over the rows r whose token is v, in row order; a gather,
// so no two threads write one place.
func embedGradThread(i int, tok, dy, dTable []float32, rows, dim int) {
	v, j := i/dim, i%dim
	sum := float32(0)
	for r := 0; r < rows; r++ {
		if int(tok[r]) == v {
			sum += dy[r*dim+j]
		}
	}
	dTable[i] = sum
}

// tokenRowsBlock: block v lists the rows whose token is v, in row order,
// as ints (their bits in float32s) in lists[v·rows …], and their count in
// counts[v]. Its threads take a chunk of rows at a time and place their
// hits by a ballot; the list is the same whichever thread finds a row.
func tokenRowsBlock(v int, tok, lists, counts []float32, rows int) {
	n := 0
	for r := range rows {
		if int(tok[r]) == v {
			lists[v*rows+n] = math.Float32frombits(uint32(r))
			n++
		}
	}
	counts[v] = math.Float32frombits(uint32(n))
}

// embedGradListsThread is embedGradThread from tokenRowsBlock's lists: it
// reads only token v's rows, in the same order, so it writes the same
// bits.
func embedGradListsThread(i int, lists, counts, dy, dTable []float32, rows, dim int) {
	v, j := i/dim, i%dim
	count := int(math.Float32bits(counts[v]))
	sum := float32(0)
	for k := range count {
		sum += dy[int(math.Float32bits(lists[v*rows+k]))*dim+j]
	}
	dTable[i] = sum
}

// posGradThread: thread i writes dPos[i] (position t, column j), the sum
// of dy over the rows of position t, in row order.
func posGradThread(i int, dy, dPos []float32, rows, T, dim int) {
	t, j := i/dim, i%dim
	sum := float32(0)
	for r := t; r < rows; r += T {
		sum += dy[r*dim+j]
	}
	dPos[i] = sum
}

// layerNormEps is torch's LayerNorm eps.
const layerNormEps = 1e-5

// The row kernels (layernorm, the causal softmax) run a warp of 32
// threads per row: lane l takes the row's values l, l+32, …, so a warp
// reads whole lines, and sums what it took in order; the lanes' sums are
// then folded in halves (lanes 0–15 add lanes 16–31's, then 0–7 8–15's,
// …), as the kernels' shuffles do; each *Block function is one row's block.

// warp is the threads a row kernel gives a row.
const warp = 32

// warpFold folds the lanes' partial results in halves with op and
// returns lane 0's.
func warpFold(part *[warp]float32, op func(a, b float32) float32) float32 {
	for s := warp / 2; s > 0; s >>= 1 {
		for l := range s {
			part[l] = op(part[l], part[l+s])
		}
	}
	return part[0]
}

func add32(a, b float32) float32 { return a + b }

// warpSum is the row sum of f(j) over j < n, as a row kernel's warp sums
// it.
func warpSum(n int, f func(j int) float32) float32 {
	var part [warp]float32
	for l := range warp {
		for j := l; j < n; j += warp {
			part[l] += f(j)
		}
	}
	return warpFold(&part, add32)
}

// warpMax is the largest of f(j) over j < n (a NaN makes a NaN row all
// the same, through the exps that follow).
func warpMax(n int, f func(j int) float32) float32 {
	var part [warp]float32
	for l := range warp {
		part[l] = f(0)
		for j := l; j < n; j += warp {
			part[l] = max32(part[l], f(j))
		}
	}
	return warpFold(&part, max32)
}

// max32 is CUDA's fmaxf for numbers: the larger.
func max32(a, b float32) float32 {
	if b > a {
		return b
	}
	return a
}

// layerNormBlock: row r of x normalised to mean 0 and variance 1, then
// scaled by g and shifted by b; stats[2r] and stats[2r+1] keep its mean
// and 1/σ for the backward pass.
func layerNormBlock(r int, x, g, b, y, stats []float32, dim int) {
	row, out := x[r*dim:(r+1)*dim], y[r*dim:(r+1)*dim]
	mu := warpSum(dim, func(j int) float32 { return row[j] }) / float32(dim)
	sq := warpSum(dim, func(j int) float32 { d := row[j] - mu; return float32(d * d) })
	rs := float32(1 / math.Sqrt(float64(sq/float32(dim)+layerNormEps)))
	for j, v := range row {
		out[j] = float32(float32((v-mu)*rs)*g[j]) + b[j]
	}
	stats[2*r], stats[2*r+1] = mu, rs
}

// layerNormBackwardBlock: row r of dx, rs·(dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂))
// with dx̂ = dy·g and x̂ the normalised row.
func layerNormBackwardBlock(r int, x, g, stats, dy, dx []float32, dim int) {
	row, d, out := x[r*dim:(r+1)*dim], dy[r*dim:(r+1)*dim], dx[r*dim:(r+1)*dim]
	mu, rs := stats[2*r], stats[2*r+1]
	a := warpSum(dim, func(j int) float32 { return float32(d[j] * g[j]) }) / float32(dim)
	c := warpSum(dim, func(j int) float32 { return float32(float32(d[j]*g[j]) * float32((row[j]-mu)*rs)) }) / float32(dim)
	for j, v := range row {
		h := float32(d[j] * g[j])
		out[j] = float32(rs * float32(float32(h-a)-float32(float32((v-mu)*rs)*c)))
	}
}

// normalizedProductThread: out[i] = dy[i]·x̂[i], x̂ the row's value
// normalised with its mean and 1/σ from stats.
func normalizedProductThread(i int, x, stats, dy, out []float32, dim int) {
	r := i / dim
	out[i] = float32(dy[i] * float32((x[i]-stats[2*r])*stats[2*r+1]))
}

// geluThread: y = x·Φ(x), the exact GELU (erf, not tanh's fit), in
// float64; the CUDA kernel computes in float32 (erff, within a few units
// in the last place), close to it but not bit for bit.
func geluThread(i int, x, y []float32) {
	v := float64(x[i])
	y[i] = float32(0.5 * v * (1 + math.Erf(v/math.Sqrt2)))
}

// geluBackwardThread: dx = dy·(Φ(x) + x·φ(x)).
func geluBackwardThread(i int, x, dy, dx []float32) {
	v := float64(x[i])
	d := 0.5*(1+math.Erf(v/math.Sqrt2)) + v*math.Exp(-0.5*v*v)/math.Sqrt(2*math.Pi)
	dx[i] = float32(float64(dy[i]) * d)
}

// causalSoftmaxBlock turns row r of the scores s (blocks of T rows of T,
// row r at position r mod T) into the softmax of its first (r mod T)+1
// values, and zeros after them.
func causalSoftmaxBlock(r int, s []float32, T int) {
	row, n := s[r*T:(r+1)*T], r%T+1
	m := warpMax(n, func(k int) float32 { return row[k] })
	for k := range n {
		row[k] = float32(math.Exp(float64(row[k] - m)))
	}
	inv := 1 / warpSum(n, func(k int) float32 { return row[k] })
	for k := range T {
		if k < n {
			row[k] *= inv
		} else {
			row[k] = 0
		}
	}
}

// causalSoftmaxBackwardBlock sets row r of dp to the scores' gradient, p ⊙
// (dp − Σ p·dp) over the row's first (r mod T)+1, zeros after.
func causalSoftmaxBackwardBlock(r int, p, dp []float32, T int) {
	pr, dr, n := p[r*T:(r+1)*T], dp[r*T:(r+1)*T], r%T+1
	dot := warpSum(n, func(k int) float32 { return float32(pr[k] * dr[k]) })
	for k := range T {
		if k < n {
			dr[k] = float32(pr[k] * float32(dr[k]-dot))
		} else {
			dr[k] = 0
		}
	}
}

// addThread: y = a + b (a residual connection).
func addThread(i int, a, b, y []float32) { y[i] = a[i] + b[i] }

// accumulateThread: y += x (gradients meeting where an activation was
// used twice).
func accumulateThread(i int, y, x []float32) { y[i] += x[i] }

// scaleThread: p *= hyper[at], unless skip[0] is not 0: AdamW's decoupled
// decay of a tensor before the Adam step.
func scaleThread(i int, p, hyper, skip []float32, at int) {
	if skip[0] != 0 {
		return
	}
	p[i] *= hyper[at]
}
