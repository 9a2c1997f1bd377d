package engine

import "gonum.org/v1/gonum/blas"

// Buf is a buffer of float32s in an Ops's memory.
type Buf interface {
	// Len is its length in float32s.
	Len() int
}

// Ops are the primitives Net is written against, on buffers in the
// device's memory. Matrices are row-major. Every call may fail (a device
// can), and no call keeps a slice it is given.
type Ops interface {
	// Name says which device, for logs.
	Name() string
	Alloc(n int) (Buf, error)
	// Slice is n values of b from off on, sharing b's memory.
	Slice(b Buf, off, n int) Buf
	Upload(dst Buf, src []float32) error
	Download(dst []float32, src Buf) error
	// Gemm sets c (m×n) to op(a)·op(b) + beta·c, op transposing when asked;
	// op(a) is m×k and op(b) k×n.
	Gemm(transA, transB bool, m, n, k int, a, b Buf, beta float32, c Buf) error
	// Im2col unrolls one sample x (C×H×W) into col ((C·K·K) × (OH·OW)).
	Im2col(x, col Buf, g Conv) error
	// Col2im is Im2col's adjoint: dx (C×H×W) gets the sum of the col
	// entries taken from each place.
	Col2im(col, dx Buf, g Conv) error
	// BiasAdd adds b[c] to every y[r, c, i] of y (rows × cols × inner).
	BiasAdd(y, b Buf, rows, cols, inner int) error
	// BiasGrad sets db[c] to the sum of dy[r, c, i] over r and i.
	BiasGrad(dy, db Buf, rows, cols, inner int) error
	Relu(x, y Buf) error
	ReluBackward(y, dy, dx Buf) error
	MaxPool(x, y Buf, g Pool) error
	MaxPoolBackward(x, dy, dx Buf, g Pool) error
	// SoftmaxXent takes rows × classes logits and labels (one float per
	// row) and writes grad, the gradient of the mean loss of the first n
	// rows, and loss, each row's loss (0 past n).
	SoftmaxXent(logits, labels, grad, loss Buf, rows, n, classes int) error
	// Close frees what the Ops hold; buffers die with it.
	Close() error
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
