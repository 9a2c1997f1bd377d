package engine

// Conv is the geometry of one sample's 2-D convolution, stride 1: C input
// channels of H×W, K×K kernels, Pad on every side, an OH×OW output.
type Conv struct {
	C, H, W, K, Pad int
	OH, OW          int
}

// NewConv fills in the output size.
func NewConv(c, h, w, k, pad int) Conv {
	return Conv{C: c, H: h, W: w, K: k, Pad: pad, OH: h + 2*pad - k + 1, OW: w + 2*pad - k + 1}
}

// ColRows is the rows of the im2col matrix: one per (channel, ky, kx).
func (g Conv) ColRows() int { return g.C * g.K * g.K }

// ColCols is its columns: one per output position.
func (g Conv) ColCols() int { return g.OH * g.OW }

// Pool is the geometry of a max-pool over B·C planes of H×W with K×K
// windows and stride K (the tail that does not fill a window is dropped, as
// in torch).
type Pool struct {
	Planes, H, W, K int
	OH, OW          int
}

// NewPool fills in the output size.
func NewPool(planes, h, w, k int) Pool {
	return Pool{Planes: planes, H: h, W: w, K: k, OH: h / k, OW: w / k}
}

// BiasSplit is how every engine sums a bias gradient, so that every replica
// gets the same bits: a channel's rows × inner values are cut into Parts
// segments of Seg values (of Seg rows where inner is 1), each segment is
// summed on its own, and the parts are then added in order. One block a
// channel, summing all of it, left most of a GPU idle on a convolution,
// whose few channels each hold batch × positions values.
type BiasSplit struct{ Seg, Parts int }

// Segment sizes: a block's worth of work for 256 threads, and rows enough
// that a thread's sum amortizes its launch.
const (
	biasSegValues = 32 * blockSize
	biasSegRows   = 64
)

// NewBiasSplit is the split of a rows × cols × inner gradient.
func NewBiasSplit(rows, inner int) BiasSplit {
	if inner == 1 {
		return BiasSplit{Seg: biasSegRows, Parts: max(1, (rows+biasSegRows-1)/biasSegRows)}
	}
	return BiasSplit{Seg: biasSegValues, Parts: max(1, (rows*inner+biasSegValues-1)/biasSegValues)}
}

// Threads per block of every elementwise kernel.
const blockSize = 256

// tokenBlock is token_rows' block: TOKEN_BLOCK in kernels.cu.
const tokenBlock = 256

// Launch returns the grid and block sizes that give every one of n
// elements a thread: ⌈n/256⌉ blocks of 256. The kernels check i < n, so
// the last block may run over.
func Launch(n int) (grid, block int) {
	if n <= 0 {
		return 0, blockSize
	}
	return (n + blockSize - 1) / blockSize, blockSize
}
