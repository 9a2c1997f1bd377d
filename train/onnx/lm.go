package onnx

import (
	"encoding/binary"
	"math"

	"google.golang.org/protobuf/proto"

	"github.com/ringtrain/ringtrain/train"
	pb "github.com/ringtrain/ringtrain/train/onnx/onnxpb"
)

// A language model's layers in opset 13: its activations are [batch, T,
// features]; its input the bytes as floats, cast to indices for Gather;
// layernorm spelt out in reductions (LayerNormalization is opset 17's);
// attention as MatMul, a causal mask added, Softmax and MatMul per head;
// GELU through Erf, exact as ringtrain's.

// lmGraph is the graph being written, g, with its builders (newGraph):
// every layer goes in through init and node, a language model's through
// its methods.
type lmGraph struct {
	g    *pb.GraphProto
	init func(name string, dims []int, v []float32)
	node func(op, name string, in []string, attrs ...*pb.AttributeProto) string
}

// weightAndBias adds the weight and the bias of a layer of out outputs,
// the parameters at *next (want: their names and shapes), as
// initializers, moves *next past them and returns their names.
func (m *lmGraph) weightAndBias(out int, want []train.Param, params [][]float32, next *int) (w, b string) {
	wp, bp := want[*next], want[*next+1]
	m.init(wp.Name, wp.Shape, params[*next])
	m.init(bp.Name, []int{out}, params[*next+1])
	*next += 2
	return wp.Name, bp.Name
}

// int64s adds an int64 initializer.
func (m *lmGraph) int64s(name string, v ...int64) string {
	raw := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(raw[8*i:], uint64(x))
	}
	m.g.Initializer = append(m.g.Initializer, &pb.TensorProto{Name: proto.String(name), DataType: proto.Int32(int32(pb.TensorProto_INT64)),
		Dims: []int64{int64(len(v))}, RawData: raw})
	return name
}

// scalar adds a float32 initializer of one value.
func (m *lmGraph) scalar(name string, v float32) string {
	m.init(name, nil, []float32{v})
	return name
}

// layer writes layer l on h (per-sample shape in), its parameters from
// params at *next, and returns its output.
func (m *lmGraph) layer(h, name string, l train.Layer, in []int, want []train.Param, params [][]float32, next *int) string {
	node := m.node
	switch l.Type {
	case train.LayerEmbedding:
		w, p := want[*next], want[*next+1]
		m.init(w.Name, w.Shape, params[*next])
		m.init(p.Name, p.Shape, params[*next+1])
		*next += 2
		tokens := node("Cast", name+".tokens", []string{h}, ints1("to", int(pb.TensorProto_INT64)))
		return node("Add", name, []string{node("Gather", name+".gather", []string{w.Name, tokens}), p.Name})
	case train.LayerLayerNorm:
		g, b := want[*next], want[*next+1]
		width := in[len(in)-1]
		m.init(g.Name, []int{width}, params[*next])
		m.init(b.Name, []int{width}, params[*next+1])
		*next += 2
		axes := ints("axes", -1)
		mean := node("ReduceMean", name+".mean", []string{h}, axes)
		d := node("Sub", name+".centred", []string{h, mean})
		v := node("ReduceMean", name+".var", []string{node("Mul", name+".square", []string{d, d})}, axes)
		std := node("Sqrt", name+".std", []string{node("Add", name+".eps", []string{v, m.scalar(name+".epsilon", 1e-5)})})
		n := node("Div", name+".norm", []string{d, std})
		return node("Add", name, []string{node("Mul", name+".gain", []string{n, g.Name}), b.Name})
	case train.LayerGELU:
		erf := node("Erf", name+".erf", []string{node("Div", name+".scaled", []string{h, m.scalar(name+".sqrt2", float32(math.Sqrt2))})})
		cdf := node("Mul", name+".cdf", []string{node("Add", name+".one", []string{erf, m.scalar(name+".1", 1)}), m.scalar(name+".half", 0.5)})
		return node("Mul", name, []string{h, cdf})
	}
	return m.attention(h, name, l, in)
}

// attention writes causal multi-head self-attention of h [batch, T,
// 3·width].
func (m *lmGraph) attention(h, name string, l train.Layer, in []int) string {
	node := m.node
	T, C := in[0], in[1]/3
	d := C / l.Heads
	parts := []string{name + ".q", name + ".k", name + ".v"}
	m.g.Node = append(m.g.Node, &pb.NodeProto{OpType: proto.String("Split"), Name: proto.String(name + ".split"),
		Input: []string{h, m.int64s(name+".thirds", int64(C), int64(C), int64(C))}, Output: parts, Attribute: []*pb.AttributeProto{ints1("axis", 2)}})
	heads := m.int64s(name+".heads", 0, 0, int64(l.Heads), int64(d))
	split := func(x string, perm ...int) string {
		return node("Transpose", x+".t", []string{node("Reshape", x+".h", []string{x, heads})}, ints("perm", perm...))
	}
	q, k, v := split(parts[0], 0, 2, 1, 3), split(parts[1], 0, 2, 3, 1), split(parts[2], 0, 2, 1, 3)
	mask := make([]float32, T*T)
	for i := range T {
		for j := i + 1; j < T; j++ {
			mask[i*T+j] = float32(math.Inf(-1))
		}
	}
	m.init(name+".mask", []int{T, T}, mask)
	scores := node("Mul", name+".scores", []string{node("MatMul", name+".qk", []string{q, k}), m.scalar(name+".scale", float32(1/math.Sqrt(float64(d))))})
	p := node("Softmax", name+".p", []string{node("Add", name+".masked", []string{scores, name + ".mask"})}, ints1("axis", -1))
	y := node("Transpose", name+".y", []string{node("MatMul", name+".pv", []string{p, v})}, ints("perm", 0, 2, 1, 3))
	return node("Reshape", name, []string{y, m.int64s(name+".width", 0, 0, int64(C))})
}
