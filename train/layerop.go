package train

import (
	"hash"
	"hash/fnv"
	"time"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/ringtrain/ringtrain/train/gemm"
)

// What conv.go's and linear.go's ops share: a layer of (x, w, b) is four
// gorgonia ops — the forward pass and the three gradients — that differ
// only in shapes and arithmetic.

// layerKind is which of a layer's four ops an op is.
type layerKind int

const (
	layerFwd layerKind = iota // (x, w, b) → y
	layerDW                   // (x, dy) → dw
	layerDB                   // (dy) → db
	layerDX                   // (w, dy) → dx
)

func (k layerKind) arity() int {
	switch k {
	case layerFwd:
		return 3
	case layerDB:
		return 1
	}
	return 2
}

// fnType is the op's type: every input and the output of tensor type t.
func (k layerKind) fnType(t hm.Type) hm.Type {
	ts := make([]hm.Type, k.arity()+1)
	for i := range ts {
		ts[i] = t
	}
	return hm.NewFnType(ts...)
}

// diffWRT: the forward op is differentiable in its weights and bias, and in
// its input when that needs a gradient (not the graph's input); the
// gradient ops are not differentiated again.
func (k layerKind) diffWRT(needX bool, n int) []bool {
	if k != layerFwd {
		return make([]bool, n)
	}
	return []bool{needX, true, true}
}

// hashOf is a Hashcode from an op's WriteHash.
func hashOf(op interface{ WriteHash(hash.Hash) }) uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}

// layerGrads is SymDiff for a layer op of (x, w, b): the gradient nodes
// dx = dxOp(w, grad) (nil when x needs none), dw = dwOp(x, grad) and
// db = dbOp(grad).
func layerGrads(inputs G.Nodes, grad *G.Node, needX bool, dxOp, dwOp, dbOp G.Op) (G.Nodes, error) {
	x, w := inputs[0], inputs[1]
	dw, err := G.ApplyOp(dwOp, x, grad)
	if err != nil {
		return nil, err
	}
	db, err := G.ApplyOp(dbOp, grad)
	if err != nil {
		return nil, err
	}
	var dx *G.Node
	if needX {
		if dx, err = G.ApplyOp(dxOp, w, grad); err != nil {
			return nil, err
		}
	}
	return G.Nodes{dx, dw, db}, nil
}

// phaseClock notes when a step's backward pass began: when the first
// gradient op of ours ran (the loss's own gradient, just before, counts
// as forward). A nil clock notes nothing.
type phaseClock struct {
	backward time.Time
	armed    bool
}

// arm starts a step.
func (c *phaseClock) arm() { c.backward, c.armed = time.Time{}, true }

// grad is a gradient op running.
func (c *phaseClock) grad() {
	if c != nil && c.armed {
		c.backward, c.armed = time.Now(), false
	}
}

// ForwardEnd is when the forward pass of the last ForwardBackward ended.
func (m *graphModel) ForwardEnd() time.Time { return m.clock.backward }

// parallelFor runs f(t, lo, hi) over [0, n) cut into at most threads
// contiguous parts, t numbering them, the last on the calling goroutine,
// and returns when all are done. Element-wise work only, or sums whose
// order does not follow the cut: what a part computes may not depend on
// how many there are.
func parallelFor(threads, n int, f func(t, lo, hi int)) {
	threads = max(1, min(threads, n))
	done := make(chan struct{}, threads)
	for t := range threads - 1 {
		go func() {
			defer func() { done <- struct{}{} }()
			f(t, t*n/threads, (t+1)*n/threads)
		}()
	}
	f(threads-1, (threads-1)*n/threads, n)
	for range threads - 1 {
		<-done
	}
}

// pairOp is what the ReLU and max-pool ops share: one type for a
// forward op (x → y) and its gradient (x or y, dy → dx), a result kept
// from run to run (see convOp.Do), and the BLAS whose thread budget
// their loops split over.
type pairOp struct {
	grad bool
	out  **tensor.Dense
	blas *gemm.BLAS // nil: one thread
}

func (op pairOp) Arity() int {
	if op.grad {
		return 2
	}
	return 1
}

// fnType is t → t, or (t, t) → t for the gradient.
func (op pairOp) fnType(t hm.Type) hm.Type {
	if op.grad {
		return hm.NewFnType(t, t, t)
	}
	return hm.NewFnType(t, t)
}

func (op pairOp) DiffWRT(n int) []bool {
	if op.grad {
		return make([]bool, n)
	}
	return []bool{true}
}

func (op pairOp) ReturnsPtr() bool     { return false }
func (op pairOp) CallsExtern() bool    { return true } // see convOp.CallsExtern
func (op pairOp) OverwritesInput() int { return -1 }

// splitValues is the fewest values worth a thread of their own: about
// 30 µs of one core's streaming.
const splitValues = 1 << 17

// each runs f over [0, n) in parts, one per thread where the values it
// touches (values) are worth it.
func (op pairOp) each(n, values int, f func(lo, hi int)) {
	threads := 1
	if op.blas != nil {
		threads = min(op.blas.Threads(), values/splitValues)
	}
	parallelFor(threads, n, func(_, lo, hi int) { f(lo, hi) })
}
