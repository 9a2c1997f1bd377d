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

// biasGradBlock: block j writes db[j], the sum of dy over rows and inner
// positions of channel j, as the kernel's 256 threads do it: thread t sums
// elements t, t+256, …, then a tree adds the partial sums in a fixed order.
// Same order, same bits.
func biasGradBlock(j int, dy, db []float32, rows, cols, inner int) {
	var part [blockSize]float32
	for t := range blockSize {
		sum := float32(0)
		for e := t; e < rows*inner; e += blockSize {
			r, k := e/inner, e%inner
			sum += dy[(r*cols+j)*inner+k]
		}
		part[t] = sum
	}
	for s := blockSize / 2; s > 0; s >>= 1 {
		for t := 0; t < s; t++ {
			part[t] += part[t+s]
		}
	}
	db[j] = part[0]
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
