package train

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// kernel is a layer that our own code computes on flat float32 slices,
// every input and the output a matrix: the forward pass, and one
// backward pass that gives every input's gradient at once (a language
// model's layers share what their gradients need: attention's
// probabilities, layernorm's statistics).
type kernel interface {
	String() string
	// shape is the output's shape for the inputs'.
	shape(in []tensor.Shape) (tensor.Shape, error)
	forward(out []float32, in [][]float32) error
	// backward writes the gradient of each input i whose dx[i] is not nil
	// (len(in[i]) values), from dy, the forward's inputs and its output.
	backward(dx [][]float32, dy []float32, in [][]float32, out []float32) error
}

// kernelOp runs a kernel in a gorgonia graph: its forward pass (grad −1)
// of the inputs, or the gradient of input grad, of the inputs, the
// forward's output and the output's gradient. The first gradient op a
// run meets computes every input's gradient (kernel.backward); the others
// return theirs.
type kernelOp struct {
	k    kernel
	grad int
	st   *kernelState
}

// kernelState is what a kernel's ops share: which inputs need gradients,
// the buffers they are kept in, and which forward run they are of.
type kernelState struct {
	n        int // inputs
	need     []bool
	out      *tensor.Dense
	dx       []*tensor.Dense
	fwd, bwd int // forward runs, and the run whose gradients dx hold
}

// applyKernel adds k to the graph, of inputs that each need a gradient
// where need says.
func applyKernel(k kernel, need []bool, inputs ...*G.Node) (*G.Node, error) {
	st := &kernelState{n: len(inputs), need: need, dx: make([]*tensor.Dense, len(inputs))}
	return G.ApplyOp(kernelOp{k: k, grad: -1, st: st}, inputs...)
}

func (op kernelOp) Arity() int {
	if op.grad < 0 {
		return op.st.n
	}
	return op.st.n + 2
}

func (op kernelOp) Type() hm.Type {
	ts := make([]hm.Type, op.Arity()+1)
	for i := range ts {
		ts[i] = matrix
	}
	return hm.NewFnType(ts...)
}

func (op kernelOp) InferShape(shapes ...G.DimSizer) (tensor.Shape, error) {
	in := make([]tensor.Shape, op.st.n)
	for i := range in {
		s, ok := shapes[i].(tensor.Shape)
		if !ok {
			return nil, fmt.Errorf("%v: input %d's shape is a %T", op, i, shapes[i])
		}
		in[i] = s
	}
	if op.grad >= 0 {
		return in[op.grad].Clone(), nil
	}
	return op.k.shape(in)
}

func (op kernelOp) Do(inputs ...G.Value) (G.Value, error) {
	if len(inputs) != op.Arity() {
		return nil, fmt.Errorf("%v: %d inputs, want %d", op, len(inputs), op.Arity())
	}
	in := make([][]float32, op.st.n)
	shapes := make([]tensor.Shape, op.st.n)
	for i := range in {
		d, ok := inputs[i].Data().([]float32)
		if !ok {
			return nil, fmt.Errorf("%v: input %d holds %T, not float32s", op, i, inputs[i].Data())
		}
		in[i], shapes[i] = d, inputs[i].Shape()
	}
	if op.grad < 0 {
		shape, err := op.k.shape(shapes)
		if err != nil {
			return nil, err
		}
		out := kept(&op.st.out, shape)
		op.st.fwd++
		return out, op.k.forward(out.Data().([]float32), in)
	}
	st := op.st
	if st.bwd != st.fwd {
		out, ok1 := inputs[st.n].Data().([]float32)
		dy, ok2 := inputs[st.n+1].Data().([]float32)
		if !ok1 || !ok2 || len(dy) != len(out) {
			return nil, fmt.Errorf("%v: the output's gradient (%v) does not match it (%v)", op, inputs[st.n+1].Shape(), inputs[st.n].Shape())
		}
		dx := make([][]float32, st.n)
		for i, need := range st.need {
			if need {
				dx[i] = kept(&st.dx[i], shapes[i]).Data().([]float32)
			}
		}
		if err := op.k.backward(dx, dy, in, out); err != nil {
			return nil, err
		}
		st.bwd = st.fwd
	}
	return st.dx[op.grad], nil
}

func (op kernelOp) ReturnsPtr() bool     { return false }
func (op kernelOp) CallsExtern() bool    { return true } // see convOp.CallsExtern
func (op kernelOp) OverwritesInput() int { return -1 }

func (op kernelOp) WriteHash(h hash.Hash) { fmt.Fprintf(h, "ringtrain.%v.%d@%p", op.k, op.grad, op.st) }
func (op kernelOp) Hashcode() uint32      { return hashOf(op) }

func (op kernelOp) String() string {
	if op.grad < 0 {
		return op.k.String()
	}
	return fmt.Sprintf("%vGrad%d", op.k, op.grad)
}

func (op kernelOp) DiffWRT(n int) []bool {
	if op.grad >= 0 {
		return make([]bool, n)
	}
	return op.st.need
}

func (op kernelOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if op.grad >= 0 {
		return nil, fmt.Errorf("%v: no second derivative", op)
	}
	args := append(append(G.Nodes{}, inputs...), output, grad)
	out := make(G.Nodes, len(inputs))
	for i, need := range op.st.need {
		if !need {
			continue
		}
		d, err := G.ApplyOp(kernelOp{k: op.k, grad: i, st: op.st}, args...)
		if err != nil {
			return nil, err
		}
		out[i] = d
	}
	return out, nil
}
