package engine

import (
	"fmt"

	"gonum.org/v1/gonum/blas"
)

// Buf is a buffer of float32s in an Ops's memory.
type Buf interface {
	// Len is its length in float32s.
	Len() int
}

// Ops are the primitives Net is written against, on buffers in the
// device's memory. Matrices are row-major. Every call may fail (a device
// can), and no call keeps a slice it is given.
//
// Calls are ordered as they are made but may return before the device has
// run them (on a GPU they are queued on one stream): the Go memory passed
// to Upload and Download is done with when they return; memory from Pinned,
// passed to the Async calls, only after Sync.
type Ops interface {
	// Name says which device, for logs.
	Name() string
	// Alloc returns n values of device memory, zeroed.
	Alloc(n int) (Buf, error)
	// Free says how many bytes of device memory are free, and how many the
	// device has; 0, 0 where it does not tell.
	Free() (free, total int64)
	// Slice is n values of b from off on, sharing b's memory.
	Slice(b Buf, off, n int) Buf
	Upload(dst Buf, src []float32) error
	Download(dst []float32, src Buf) error
	// Pinned returns n values of host memory the device copies to and from
	// without a staging copy (page-locked on a GPU). It lives until Close.
	Pinned(n int) ([]float32, error)
	// UploadAsync and DownloadAsync copy from and to memory from Pinned,
	// in order with the other calls; the host side may be touched again
	// only after Sync.
	UploadAsync(dst Buf, src []float32) error
	DownloadAsync(dst []float32, src Buf) error
	// DownloadBeside copies src into dst (memory from Pinned) once every
	// call made so far has run, beside the calls made after it (on a GPU,
	// on a stream of its own, so the device computes on while the copy
	// runs); wait returns once that copy is done, and dst may be read.
	// Call each wait once; Sync waits for these copies too. Inside
	// Capture, the copy is captured as well, and wait is for each replay:
	// call it once after each.
	DownloadBeside(dst []float32, src Buf) (wait func() error, err error)
	// UploadBeside copies src (memory from Pinned, not to be written until
	// Sync) into dst after the copies DownloadBeside and UploadBeside
	// queued before it, beside the other calls; Sync waits for it.
	UploadBeside(dst Buf, src []float32) error
	// Zero sets b to zeros.
	Zero(b Buf) error
	// Sync waits until every call made so far has run.
	Sync() error
	// Capture runs f and returns a replay of what it queued: on a GPU, the
	// calls captured into a CUDA graph, launched as one. What f reads from
	// the host when it is called is read again on replay only through
	// memory from Pinned; everything else is fixed at capture.
	Capture(f func() error) (replay func() error, err error)
	// Gemm sets c (m×n) to op(a)·op(b) + beta·c, op transposing when asked;
	// op(a) is m×k and op(b) k×n.
	Gemm(transA, transB bool, m, n, k int, a, b Buf, beta float32, c Buf) error
	// Im2colBatch unrolls a batch x (batch×C×H×W) into col ((C·K·K) ×
	// (batch·OH·OW)): one GEMM then convolves the whole batch.
	Im2colBatch(x, col Buf, g Conv, batch int) error
	// Col2imBatch is Im2colBatch's adjoint: dx gets, for every input place,
	// the sum of the col entries taken from it.
	Col2imBatch(col, dx Buf, g Conv, batch int) error
	// UnbatchBias sets y[s, c, p] to t[c, s, p] + b[c] (batch × chans ×
	// inner values): the batched GEMM's output in the layout layers read.
	UnbatchBias(t, b, y Buf, batch, chans, inner int) error
	// Rebatch sets t[c, s, p] to y[s, c, p], the other way.
	Rebatch(y, t Buf, batch, chans, inner int) error
	// BiasAdd adds b[c] to every y[r, c, i] of y (rows × cols × inner).
	BiasAdd(y, b Buf, rows, cols, inner int) error
	// BiasGrad sets db[c] to the sum of dy[r, c, i] over r and i, in an
	// order fixed by the shape alone.
	BiasGrad(dy, db Buf, rows, cols, inner int) error
	Relu(x, y Buf) error
	ReluBackward(y, dy, dx Buf) error
	MaxPool(x, y Buf, g Pool) error
	MaxPoolBackward(x, dy, dx Buf, g Pool) error
	// SoftmaxXent takes rows × classes logits and labels (one float per
	// row) and writes grad, the gradient of the mean loss of the first n
	// rows, and loss, each row's loss (0 past n).
	SoftmaxXent(logits, labels, grad, loss Buf, rows, n, classes int) error
	// NonFinite sets flag[0] to 1 if any of g is NaN or Inf (and leaves it
	// otherwise).
	NonFinite(g, flag Buf) error
	// SGD and Adam are train.SGD's and train.Adam's updates of p from g,
	// bit for bit, with their hyperparameters in hyper (see sgdThread and
	// adamThread), skipped when skip[0] is not 0.
	SGD(p, g, v, hyper, skip Buf) error
	Adam(p, g, m, v, hyper, skip Buf) error
	// GemmStrided is batch products, c_i = alpha·op(a_i)·op(b_i) +
	// beta·c_i, with leading dimensions given, operand i starting stride
	// values after operand i−1: a head of attention for every sample.
	GemmStrided(transA, transB bool, m, n, k int, alpha float32, a Buf, lda, strideA int, b Buf, ldb, strideB int,
		beta float32, c Buf, ldc, strideC int, batch int) error
	// Embed sets row r of y (rows × dim) to the table's row tok[r] plus
	// pos's row r mod T. The tokens, floats, must be whole numbers inside
	// the table: the caller checks them.
	Embed(tok, table, pos, y Buf, rows, T, dim int) error
	// EmbedGrad sets dTable's row v to the sum of dy's rows whose token is
	// v, and dPos's row t to the sum of those at position t.
	EmbedGrad(tok, dy, dTable, dPos Buf, rows, T, dim int) error
	// LayerNorm normalises each row of x (rows × dim) to mean 0 and
	// variance 1 (eps 1e-5), then scales by g and adds b, into y; stats
	// gets each row's mean and 1/σ (2 × rows values).
	LayerNorm(x, g, b, y, stats Buf, rows, dim int) error
	// LayerNormBackward sets dx from dy with LayerNorm's stats;
	// NormalizedProduct sets out to dy times the normalised x, whose
	// column sums (BiasGrad) are the gain's gradient.
	LayerNormBackward(x, g, stats, dy, dx Buf, rows, dim int) error
	NormalizedProduct(x, stats, dy, out Buf, rows, dim int) error
	// GELU is x·Φ(x), the exact form; GELUBackward its gradient.
	GELU(x, y Buf) error
	GELUBackward(x, dy, dx Buf) error
	// CausalSoftmax turns each row of s (rows of T, in blocks of T rows)
	// into the softmax of its first (row mod T)+1 values, zeros after;
	// CausalSoftmaxBackward turns dp into the scores' gradient, in place,
	// with the probabilities p.
	CausalSoftmax(s Buf, rows, T int) error
	CausalSoftmaxBackward(p, dp Buf, rows, T int) error
	// Add sets y to a + b; Accumulate adds x to y.
	Add(a, b, y Buf) error
	Accumulate(y, x Buf) error
	// Scale multiplies p by hyper[at] unless skip[0] is not 0.
	Scale(p, hyper Buf, at int, skip Buf) error
	// Close frees what the Ops hold; buffers die with it.
	Close() error
}

// convolver is an Ops that convolves directly — cuDNN on a GPU — in place
// of an im2col and a GEMM: no unrolled copy of the input (at batch 256 the
// cnn's second one is 160 MB, written and read twice a step), and kernels
// chosen for the shape. x is batch × C × H × W, w is out × C × K × K, y is
// batch × out × OH × OW, as Net keeps them.
type convolver interface {
	// ConvPlan prepares convolutions of geometry g with out channels over
	// batch samples and returns a handle for the calls below; an error
	// means this shape is left to im2col and a GEMM.
	ConvPlan(g Conv, out, batch int) (int, error)
	// ConvForward sets y to x convolved with w (no bias).
	ConvForward(plan int, x, w, y Buf) error
	// ConvBackwardFilter sets dw to the weights' gradient from x and dy,
	// in an order that is the same every run.
	ConvBackwardFilter(plan int, x, dy, dw Buf) error
	// ConvBackwardData sets dx to the input's gradient from w and dy, as
	// deterministically.
	ConvBackwardData(plan int, w, dy, dx Buf) error
}

// CUDAOptions are the CUDA engine's settings.
type CUDAOptions struct {
	// TF32 lets cuBLAS multiply on tensor cores in TF32 (10-bit
	// mantissas): faster GEMMs, with relative errors near 1e-3 instead of
	// float32's 1e-7; with cuDNN, its convolutions too. Off by default.
	TF32 bool
	// AnyConvAlgo lets cuDNN convolve by its fastest algorithm, whatever
	// it is (FFT, Winograd, sums with atomics), as PyTorch's defaults do.
	// Replicas still agree, since the ring averages what they send, but a
	// run is no longer repeatable bit for bit, and FFT and Winograd round
	// otherwise than float32 sums (errors near 1e-3 of the largest output
	// with 5×5 kernels). Off by default: only exact, deterministic ones.
	AnyConvAlgo bool
}

// ConvAlgos reads a choice of convolution algorithms: "" or "exact"
// keeps cuDNN to the exact, deterministic ones; "any" lets it take the
// fastest (CUDAOptions.AnyConvAlgo).
func ConvAlgos(v string) (anyAlgo bool, err error) {
	switch v {
	case "", "exact":
		return false, nil
	case "any":
		return true, nil
	}
	return false, fmt.Errorf("engine: convolution algorithms %q; want exact or any", v)
}

// gemmArgs turns Gemm's row-major request into BLAS's transpose flags and
// leading dimensions.
func gemmArgs(transA, transB bool, m, n, k int) (ta, tb blas.Transpose, lda, ldb int) {
	ta, tb, lda, ldb = blas.NoTrans, blas.NoTrans, k, n
	if transA {
		ta, lda = blas.Trans, m
	}
	if transB {
		tb, ldb = blas.Trans, k
	}
	return ta, tb, lda, ldb
}
