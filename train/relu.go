package train

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/ringtrain/ringtrain/train/gemm"
	"github.com/ringtrain/ringtrain/train/vec"
)

// reluOp is ReLU as a gorgonia op that writes into an output it keeps.
// gorgonia's Rectify builds its gradient from a comparison and a product
// that clone their inputs every step; on the cnn those clones (fresh
// memory, faulted in each time) took about an eighth of the step.
// A NaN input stays NaN, so the step's finite check still sees it.
// grad: (y, dy) → dy where y > 0, else 0 — torch's choice at 0.
type reluOp struct{ pairOp }

var anyTensor = hm.TypeVariable('a')

func (op reluOp) Type() hm.Type { return op.fnType(anyTensor) }

func (op reluOp) InferShape(shapes ...G.DimSizer) (tensor.Shape, error) {
	if len(shapes) == 0 {
		return nil, fmt.Errorf("%v: no input shape", op)
	}
	s, ok := shapes[0].(tensor.Shape)
	if !ok {
		return nil, fmt.Errorf("%v: input shape is a %T", op, shapes[0])
	}
	return s.Clone(), nil
}

func (op reluOp) Do(inputs ...G.Value) (G.Value, error) {
	if len(inputs) == 0 {
		return nil, fmt.Errorf("%v: no inputs", op)
	}
	return op.UsePreallocDo(kept(op.out, inputs[0].Shape()), inputs...)
}

func (op reluOp) UsePreallocDo(prealloc G.Value, inputs ...G.Value) (G.Value, error) {
	if len(inputs) != op.Arity() {
		return nil, fmt.Errorf("%v: %d inputs, want %d", op, len(inputs), op.Arity())
	}
	out, ok := prealloc.Data().([]float32)
	x, ok2 := inputs[0].Data().([]float32)
	if !ok || !ok2 || len(x) != len(out) {
		return nil, fmt.Errorf("%v: want float32 tensors of one size, got %v and %v", op, inputs[0].Shape(), prealloc.Shape())
	}
	if !op.grad {
		op.each(len(x), len(x), func(lo, hi int) { vec.Relu(x[lo:hi], out[lo:hi]) })
		return prealloc, nil
	}
	dy, ok := inputs[1].Data().([]float32)
	if !ok || len(dy) != len(out) {
		return nil, fmt.Errorf("%v: gradient %v does not match %v", op, inputs[1].Shape(), inputs[0].Shape())
	}
	op.each(len(x), len(x), func(lo, hi int) { vec.ReluGrad(x[lo:hi], dy[lo:hi], out[lo:hi]) })
	return prealloc, nil
}

func (op reluOp) WriteHash(h hash.Hash) { fmt.Fprintf(h, "ringtrain.%v@%p", op, op.out) }

func (op reluOp) Hashcode() uint32 { return hashOf(op) }

func (op reluOp) String() string {
	if op.grad {
		return "reluGrad"
	}
	return "relu"
}

func (op reluOp) SymDiff(_ G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if op.grad {
		return nil, fmt.Errorf("%v: no second derivative", op)
	}
	dx, err := G.ApplyOp(reluOp{pairOp{grad: true, out: new(*tensor.Dense), blas: op.blas}}, output, grad)
	return G.Nodes{dx}, err
}

// relu adds a ReLU to a graph, split over b's threads (nil: one).
func relu(x *G.Node, b *gemm.BLAS) (*G.Node, error) {
	return G.ApplyOp(reluOp{pairOp{out: new(*tensor.Dense), blas: b}}, x)
}
