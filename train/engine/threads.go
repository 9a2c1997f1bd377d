package engine

import "math"

// The bodies of the CUDA kernels in ptx/kernels.cu, one thread each, in Go.
// Host runs them for every thread index; keep each in step with its kernel
// (same names, same arithmetic). i is the global thread index
// (blockIdx.x·blockDim.x + threadIdx.x); the kernels return for i ≥ n, as
// the loops that call these never reach.

// im2colThread: thread i writes col[i] of the (C·K·K) × (OH·OW) matrix:
// the input value that kernel tap (c, ky, kx) sees at output (oy, ox), or 0
// in the padding.
func im2colThread(i int, x, col []float32, g Conv) {
	ox := i % g.OW
	oy := (i / g.OW) % g.OH
	r := i / (g.OW * g.OH) // row of col: (c, ky, kx)
	kx := r % g.K
	ky := (r / g.K) % g.K
	c := r / (g.K * g.K)
	y := oy + ky - g.Pad
	xx := ox + kx - g.Pad
	v := float32(0)
	if y >= 0 && y < g.H && xx >= 0 && xx < g.W {
		v = x[(c*g.H+y)*g.W+xx]
	}
	col[i] = v
}

// col2imThread: thread i writes dx[i], input (c, y, x): the sum of every
// col entry im2col took from it. A gather, so no two threads write the same
// place and no atomics are needed.
func col2imThread(i int, col, dx []float32, g Conv) {
	xx := i % g.W
	y := (i / g.W) % g.H
	c := i / (g.W * g.H)
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
			sum += col[r*g.OH*g.OW+oy*g.OW+ox]
		}
	}
	dx[i] = sum
}

// biasAddThread: y[i] += b[channel of i], y being rows × cols × inner.
func biasAddThread(i int, y, b []float32, cols, inner int) {
	y[i] += b[(i/inner)%cols]
}

// biasGradThread: thread j (one per channel) writes db[j], the sum of dy
// over rows and inner positions of channel j.
func biasGradThread(j int, dy, db []float32, rows, cols, inner int) {
	sum := float32(0)
	for r := 0; r < rows; r++ {
		base := (r*cols + j) * inner
		for k := 0; k < inner; k++ {
			sum += dy[base+k]
		}
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
