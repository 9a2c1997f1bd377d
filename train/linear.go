package train

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	"gonum.org/v1/gonum/blas"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/ringtrain/ringtrain/train/gemm"
	"github.com/ringtrain/ringtrain/train/vec"
)

// A linear layer, y = x·W + b, as gorgonia ops of our own, for the reasons
// conv.go gives: outputs kept from step to step, the bias added in place
// rather than through a broadcast (and its gradient a plain column sum),
// and no gradient for the graph's input — gorgonia's Mul computed that
// product too, the largest of the mlp's step, only to drop it.

type linearState struct {
	batch, in, out int
	needX          bool
	blas           *gemm.BLAS
	clock          *phaseClock
	res            [4]*tensor.Dense // each op's result, by layerKind, reused
}

type linearOp struct {
	kind layerKind
	st   *linearState
}

var matrix = G.TensorType{Dims: 2, Of: hm.TypeVariable('a')}

func (op linearOp) Arity() int { return op.kind.arity() }

func (op linearOp) Type() hm.Type { return op.kind.fnType(matrix) }

func (op linearOp) shape() tensor.Shape {
	st := op.st
	switch op.kind {
	case layerDW:
		return tensor.Shape{st.in, st.out}
	case layerDB:
		return tensor.Shape{1, st.out}
	case layerDX:
		return tensor.Shape{st.batch, st.in}
	}
	return tensor.Shape{st.batch, st.out}
}

func (op linearOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.shape(), nil }

// Do writes into a tensor the op keeps (see convOp.Do).
func (op linearOp) Do(inputs ...G.Value) (G.Value, error) {
	return op.UsePreallocDo(kept(&op.st.res[op.kind], op.shape()), inputs...)
}

func (op linearOp) UsePreallocDo(prealloc G.Value, inputs ...G.Value) (G.Value, error) {
	st := op.st
	if op.kind != layerFwd {
		st.clock.grad()
	}
	B, I, O := st.batch, st.in, st.out
	data, err := floatsOf(op, op.sizes(), prealloc, inputs)
	if err != nil {
		return nil, err
	}
	switch op.kind {
	case layerFwd:
		x, w, b, y := data[0], data[1], data[2], data[3]
		st.blas.Sgemm(blas.NoTrans, blas.NoTrans, B, O, I, 1, x, I, w, O, 0, y, O)
		vec.AddRows(y, O, b, 0, B, O) // b onto every row
	case layerDW:
		st.blas.Sgemm(blas.Trans, blas.NoTrans, I, O, B, 1, data[0], I, data[1], O, 0, data[2], O)
	case layerDB:
		dy, db := data[0], data[1]
		clear(db)
		vec.AddRows(db, 0, dy, O, B, O) // every row of dy onto db, in order
	case layerDX:
		st.blas.Sgemm(blas.NoTrans, blas.Trans, B, I, O, 1, data[1], O, data[0], O, 0, data[2], I)
	}
	return prealloc, nil
}

// sizes is how many values each input and the output hold.
func (op linearOp) sizes() []int {
	B, I, O := op.st.batch, op.st.in, op.st.out
	switch op.kind {
	case layerDW:
		return []int{B * I, B * O, I * O}
	case layerDB:
		return []int{B * O, O}
	case layerDX:
		return []int{I * O, B * O, B * I}
	}
	return []int{B * I, I * O, O, B * O}
}

func (op linearOp) ReturnsPtr() bool     { return false }
func (op linearOp) CallsExtern() bool    { return true } // see convOp.CallsExtern
func (op linearOp) OverwritesInput() int { return -1 }

func (op linearOp) WriteHash(h hash.Hash) { fmt.Fprintf(h, "ringtrain.%v@%p", op, op.st) }

func (op linearOp) Hashcode() uint32 { return hashOf(op) }

func (op linearOp) String() string {
	name := [...]string{"linear", "linearGradW", "linearGradB", "linearGradX"}[op.kind]
	return fmt.Sprintf("%s<%d→%d>", name, op.st.in, op.st.out)
}

func (op linearOp) DiffWRT(n int) []bool { return op.kind.diffWRT(op.st.needX, n) }

func (op linearOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if op.kind != layerFwd {
		return nil, fmt.Errorf("%v: no second derivative", op)
	}
	return layerGrads(inputs, grad, op.st.needX, linearOp{layerDX, op.st}, linearOp{layerDW, op.st}, linearOp{layerDB, op.st})
}

// linear adds a linear layer to a graph: x is batch × in, w in × out, b 1 × out.
func linear(x, w, b *G.Node, batch, in, out int, needX bool, bl *gemm.BLAS, clock *phaseClock) (*G.Node, error) {
	st := &linearState{batch: batch, in: in, out: out, needX: needX, blas: bl, clock: clock}
	return G.ApplyOp(linearOp{layerFwd, st}, x, w, b)
}
