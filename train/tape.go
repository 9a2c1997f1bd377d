package train

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// tape runs the ops of a gorgonia graph that some root nodes need, each
// after the nodes it reads, on the calling goroutine, and keeps their
// values. gorgonia's TapeMachine runs its program on a goroutine of its
// own while it holds the caller locked to its OS thread (for CUDA, which
// no model here runs through gorgonia): two threads hand every step back
// and forth, and the step's memory moves between their cores. On this
// machine's 2-core VM that cost the mlp's step at one thread a quarter of
// its time.
//
// A node's value is its op's Do of its children's values, or a leaf's own
// (inputs and parameters, bound with G.WithValue and refilled in place).
type tape struct {
	ops    []*G.Node // op nodes, each after its children
	args   [][]int   // per op, its children: ≥ 0 an index in ops, else −1 − an index in leaves
	leaves []*G.Node
	vals   []G.Value // per op, its value from the last run
	at     map[*G.Node]int
	in     []G.Value // run's scratch: one op's inputs
	// sums are the outputs of the elementwise adds of tensors (autodiff's
	// sums of a node's gradients, mostly), kept from run to run: see sum.
	sums []*tensor.Dense
}

// newTape orders the ops that roots need.
func newTape(roots ...*G.Node) *tape {
	t := &tape{at: map[*G.Node]int{}}
	leafAt := map[*G.Node]int{}
	var visit func(n *G.Node) int
	visit = func(n *G.Node) int {
		if i, ok := t.at[n]; ok {
			return i
		}
		if n.Op() == nil {
			i, ok := leafAt[n]
			if !ok {
				i = len(t.leaves)
				leafAt[n] = i
				t.leaves = append(t.leaves, n)
			}
			return -1 - i
		}
		var refs []int
		for it := n.Graph().From(n.ID()); it.Next(); { // its children, in order
			refs = append(refs, visit(it.Node().(*G.Node)))
		}
		t.at[n] = len(t.ops)
		t.ops, t.args = append(t.ops, n), append(t.args, refs)
		return len(t.ops) - 1
	}
	for _, r := range roots {
		visit(r)
	}
	t.vals = make([]G.Value, len(t.ops))
	t.sums = make([]*tensor.Dense, len(t.ops))
	return t
}

// run runs every op in order. gorgonia's ops panic on what they cannot
// do; the panic comes back as an error.
func (t *tape) run() (err error) {
	at := -1
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v: %v", t.ops[at].Op(), r)
		}
	}()
	for i, n := range t.ops {
		at = i
		t.in = t.in[:0]
		for _, r := range t.args[i] {
			if r >= 0 {
				t.in = append(t.in, t.vals[r])
			} else {
				t.in = append(t.in, t.leaves[-1-r].Value())
			}
		}
		if v := t.sum(i, n.Op()); v != nil {
			t.vals[i] = v
			continue
		}
		v, err := n.Op().Do(t.in...)
		if err != nil {
			return fmt.Errorf("%v: %w", n.Op(), err)
		}
		t.vals[i] = v
	}
	clear(t.in)
	return nil
}

// value is n's value from the last run: an op's, or a leaf's own; nil
// for a node the tape does not hold.
func (t *tape) value(n *G.Node) G.Value {
	if i, ok := t.at[n]; ok {
		return t.vals[i]
	}
	if n.Op() == nil {
		return n.Value()
	}
	return nil
}

// sum runs op i when it is gorgonia's elementwise add of two float32
// tensors of one shape, into memory the tape keeps for it, and returns
// the sum; else nil, and the op runs as gorgonia's. gorgonia's Add clones
// its first input and adds into the clone: an allocation and a copy of
// the whole tensor every run, for what is one pass (the same bits).
func (t *tape) sum(i int, op G.Op) G.Value {
	if len(t.in) != 2 || op.String() != "+ false" {
		return nil
	}
	a, ok1 := t.in[0].(*tensor.Dense)
	b, ok2 := t.in[1].(*tensor.Dense)
	if !ok1 || !ok2 || a.Dims() == 0 || !a.Shape().Eq(b.Shape()) || a.Dtype() != tensor.Float32 || b.Dtype() != tensor.Float32 {
		return nil
	}
	x, y := a.Data().([]float32), b.Data().([]float32)
	out := t.sums[i]
	if out == nil || !out.Shape().Eq(a.Shape()) {
		out = tensor.New(tensor.WithShape(a.Shape().Clone()...), tensor.Of(tensor.Float32))
		t.sums[i] = out
	}
	z := out.Data().([]float32)[:len(x)]
	y = y[:len(x)]
	for j := range z {
		z[j] = x[j] + y[j]
	}
	return out
}
