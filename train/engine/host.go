package engine

import (
	"fmt"

	"gonum.org/v1/gonum/blas/blas32"

	"github.com/ringtrain/ringtrain/train/gemm"
)

// Host is Ops in main memory and pure Go: the reference the CUDA Ops are
// held to, and an engine that runs anywhere.
type Host struct {
	// BLAS, if set, multiplies the matrices, over its own thread budget;
	// unset, gonum's SGEMM does, over GOMAXPROCS goroutines. A budget
	// under GOMAXPROCS leaves Go a thread for the ring to run on while a
	// step computes (gradient buckets): with every thread computing, the
	// ring's goroutines wait for 10 ms preemption slices.
	BLAS *gemm.BLAS
}

type hostBuf []float32

func (b hostBuf) Len() int { return len(b) }

func f32(b Buf) []float32 { return b.(hostBuf) }

func (Host) Name() string                             { return "host" }
func (Host) Alloc(n int) (Buf, error)                 { return make(hostBuf, n), nil }
func (Host) Free() (int64, int64)                     { return 0, 0 }
func (Host) Slice(b Buf, off, n int) Buf              { return hostBuf(f32(b)[off : off+n : off+n]) }
func (Host) Close() error                             { return nil }
func (Host) Upload(dst Buf, src []float32) error      { return copyChecked(f32(dst), src) }
func (Host) Download(dst []float32, src Buf) error    { return copyChecked(dst, f32(src)) }
func (Host) Pinned(n int) ([]float32, error)          { return make([]float32, n), nil }
func (Host) UploadAsync(dst Buf, src []float32) error { return copyChecked(f32(dst), src) }
func (Host) DownloadAsync(dst []float32, src Buf) error {
	return copyChecked(dst, f32(src))
}

// DownloadBeside copies at once: the host computes nothing beside it.
func (Host) DownloadBeside(dst []float32, src Buf) (func() error, error) {
	if err := copyChecked(dst, f32(src)); err != nil {
		return nil, err
	}
	return func() error { return nil }, nil
}
func (Host) UploadBeside(dst Buf, src []float32) error { return copyChecked(f32(dst), src) }
func (Host) Zero(b Buf) error                          { clear(f32(b)); return nil }
func (Host) Sync() error                               { return nil }

// Capture runs f, and its replay is f again: what the host engine reads
// is read anew each time, which a CUDA graph does only through pinned
// memory — Net keeps to that, and the CUDA tests hold the two together.
func (Host) Capture(f func() error) (func() error, error) { return f, f() }

func copyChecked(dst, src []float32) error {
	if len(dst) != len(src) {
		return fmt.Errorf("engine: copy of %d values into %d", len(src), len(dst))
	}
	copy(dst, src)
	return nil
}

func (h Host) Gemm(transA, transB bool, m, n, k int, a, b Buf, beta float32, c Buf) error {
	ta, tb, lda, ldb := gemmArgs(transA, transB, m, n, k)
	if h.BLAS != nil {
		h.BLAS.Sgemm(ta, tb, m, n, k, 1, f32(a), lda, f32(b), ldb, beta, f32(c), n)
		return nil
	}
	blas32.Implementation().Sgemm(ta, tb, m, n, k, 1, f32(a), lda, f32(b), ldb, beta, f32(c), n)
	return nil
}

func (Host) Im2colBatch(x, col Buf, g Conv, batch int) error {
	xs, cs := f32(x), f32(col)
	for i := range g.ColRows() * batch * g.ColCols() {
		im2colBatchThread(i, xs, cs, g, batch)
	}
	return nil
}

func (Host) Col2imBatch(col, dx Buf, g Conv, batch int) error {
	cs, d := f32(col), f32(dx)
	for i := range batch * g.C * g.H * g.W {
		col2imBatchThread(i, cs, d, g, batch)
	}
	return nil
}

func (Host) UnbatchBias(t, b, y Buf, batch, chans, inner int) error {
	ts, bs, ys := f32(t), f32(b), f32(y)
	for i := range batch * chans * inner {
		unbatchBiasThread(i, ts, bs, ys, batch, chans, inner)
	}
	return nil
}

func (Host) Rebatch(y, t Buf, batch, chans, inner int) error {
	ys, ts := f32(y), f32(t)
	for i := range batch * chans * inner {
		rebatchThread(i, ys, ts, batch, chans, inner)
	}
	return nil
}

func (Host) BiasAdd(y, b Buf, rows, cols, inner int) error {
	ys, bs := f32(y), f32(b)
	for i := range rows * cols * inner {
		biasAddThread(i, ys, bs, cols, inner)
	}
	return nil
}

func (Host) BiasGrad(dy, db Buf, rows, cols, inner int) error {
	sp := NewBiasSplit(rows, inner)
	part := f32(db)
	if sp.Parts > 1 {
		part = make([]float32, sp.Parts*cols)
	}
	if inner == 1 {
		// Row by row, every column at once: the same sums in the same
		// order as one thread a column, in the order memory holds them.
		clear(part)
		for r := range rows {
			s := r / sp.Seg
			p, d := part[s*cols:(s+1)*cols], f32(dy)[r*cols:(r+1)*cols]
			for j := range p {
				p[j] += d[j]
			}
		}
	} else {
		for b := range sp.Parts * cols {
			biasGradPartBlock(b, f32(dy), part, rows, cols, inner, sp.Seg)
		}
	}
	if sp.Parts > 1 {
		for j := range cols {
			biasGradSumThread(j, part, f32(db), cols, sp.Parts)
		}
	}
	return nil
}

func (Host) Relu(x, y Buf) error {
	xs, ys := f32(x), f32(y)
	for i := range xs {
		reluThread(i, xs, ys)
	}
	return nil
}

func (Host) ReluBackward(y, dy, dx Buf) error {
	ys, dys, dxs := f32(y), f32(dy), f32(dx)
	for i := range ys {
		reluBackwardThread(i, ys, dys, dxs)
	}
	return nil
}

func (Host) MaxPool(x, y Buf, g Pool) error {
	for i := range g.Planes * g.OH * g.OW {
		maxPoolThread(i, f32(x), f32(y), g)
	}
	return nil
}

func (Host) MaxPoolBackward(x, dy, dx Buf, g Pool) error {
	for i := range g.Planes * g.H * g.W {
		maxPoolBackwardThread(i, f32(x), f32(dy), f32(dx), g)
	}
	return nil
}

func (Host) SoftmaxXent(logits, labels, grad, loss Buf, rows, n, classes int) error {
	for r := range rows {
		softmaxXentThread(r, f32(logits), f32(labels), f32(grad), f32(loss), n, classes)
	}
	return nil
}

func (Host) NonFinite(g, flag Buf) error {
	gs, fs := f32(g), f32(flag)
	for i := range gs {
		nonfiniteThread(i, gs, fs)
	}
	return nil
}

func (Host) SGD(p, g, v, hyper, skip Buf) error {
	ps, gs, vs, hs, ss := f32(p), f32(g), f32(v), f32(hyper), f32(skip)
	for i := range ps {
		sgdThread(i, ps, gs, vs, hs, ss)
	}
	return nil
}

func (Host) Adam(p, g, m, v, hyper, skip Buf) error {
	ps, gs, ms, vs, hs, ss := f32(p), f32(g), f32(m), f32(v), f32(hyper), f32(skip)
	for i := range ps {
		adamThread(i, ps, gs, ms, vs, hs, ss)
	}
	return nil
}

// GemmStrided runs the batch's products one after another.
func (h Host) GemmStrided(transA, transB bool, m, n, k int, alpha float32, a Buf, lda, strideA int, b Buf, ldb, strideB int,
	beta float32, c Buf, ldc, strideC int, batch int) error {
	ta, tb, _, _ := gemmArgs(transA, transB, m, n, k)
	as, bs, cs := f32(a), f32(b), f32(c)
	for i := range batch {
		a, b, c := as[i*strideA:], bs[i*strideB:], cs[i*strideC:]
		if h.BLAS != nil {
			h.BLAS.Sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		} else {
			blas32.Implementation().Sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		}
	}
	return nil
}

func (Host) Embed(tok, table, pos, y Buf, rows, T, dim int) error {
	ts, tb, ps, ys := f32(tok), f32(table), f32(pos), f32(y)
	for i := range rows * dim {
		embedThread(i, ts, tb, ps, ys, T, dim)
	}
	return nil
}

func (Host) EmbedGrad(tok, dy, dTable, dPos Buf, rows, T, dim int) error {
	ts, ds, dt, dp := f32(tok), f32(dy), f32(dTable), f32(dPos)
	for i := range len(dt) {
		embedGradThread(i, ts, ds, dt, rows, dim)
	}
	for i := range T * dim {
		posGradThread(i, ds, dp, rows, T, dim)
	}
	return nil
}

func (Host) LayerNorm(x, g, b, y, stats Buf, rows, dim int) error {
	for r := range rows {
		layerNormBlock(r, f32(x), f32(g), f32(b), f32(y), f32(stats), dim)
	}
	return nil
}

func (Host) LayerNormBackward(x, g, stats, dy, dx Buf, rows, dim int) error {
	for r := range rows {
		layerNormBackwardBlock(r, f32(x), f32(g), f32(stats), f32(dy), f32(dx), dim)
	}
	return nil
}

func (Host) NormalizedProduct(x, stats, dy, out Buf, rows, dim int) error {
	xs, ss, ds, os := f32(x), f32(stats), f32(dy), f32(out)
	for i := range rows * dim {
		normalizedProductThread(i, xs, ss, ds, os, dim)
	}
	return nil
}

func (Host) GELU(x, y Buf) error {
	xs, ys := f32(x), f32(y)
	for i := range xs {
		geluThread(i, xs, ys)
	}
	return nil
}

func (Host) GELUBackward(x, dy, dx Buf) error {
	xs, dys, dxs := f32(x), f32(dy), f32(dx)
	for i := range xs {
		geluBackwardThread(i, xs, dys, dxs)
	}
	return nil
}

func (Host) CausalSoftmax(s Buf, rows, T int) error {
	for r := range rows {
		causalSoftmaxBlock(r, f32(s), T)
	}
	return nil
}

func (Host) CausalSoftmaxBackward(p, dp Buf, rows, T int) error {
	for r := range rows {
		causalSoftmaxBackwardBlock(r, f32(p), f32(dp), T)
	}
	return nil
}

func (Host) Add(a, b, y Buf) error {
	as, bs, ys := f32(a), f32(b), f32(y)
	for i := range ys {
		addThread(i, as, bs, ys)
	}
	return nil
}

func (Host) Accumulate(y, x Buf) error {
	ys, xs := f32(y), f32(x)
	for i := range ys {
		accumulateThread(i, ys, xs)
	}
	return nil
}

func (Host) Scale(p, hyper Buf, at int, skip Buf) error {
	ps, hs, ss := f32(p), f32(hyper), f32(skip)
	for i := range ps {
		scaleThread(i, ps, hs, ss, at)
	}
	return nil
}
