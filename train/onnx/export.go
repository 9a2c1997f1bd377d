// Package onnx writes a trained ringtrain model as an ONNX file, for
// runtimes outside ringtrain (onnxruntime, PyTorch, TensorRT …).
//
// The file uses opset 13 (ONNX 1.8, IR version 7), which every maintained
// runtime reads. Its input, "input", is a batch of samples as ToTensor
// makes them — C×H×W floats in [0, 1] (or the flat vector an mlp spec
// takes), the batch size left free — and its output, "logits", the
// classes' scores before softmax. The job's Normalize is written as two
// explicit nodes at the start (Sub the mean, Div by the std, per channel,
// in float32 as ringtrain computes it), so the file takes what an image
// decoder and a division by 255 give; transforms before ToTensor (Resize,
// Grayscale, crops) are the caller's, as they are in torchvision. Dropout
// is the identity at inference and writes nothing. The class names, the
// transforms and the input layout go into the model's metadata. A
// language model's input is its T bytes as floats, and its output every
// position's logits for the next byte, [batch, T, 256] (lm.go).
//
// The protobuf is onnx.proto compiled with protoc-gen-go (package onnxpb).
package onnx

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/train"
	pb "github.com/ringtrain/ringtrain/train/onnx/onnxpb"
)

const (
	// Opset is the ONNX operator set version the files use.
	Opset = 13
	// IRVersion is the ONNX IR version of opset 13 (ONNX 1.8).
	IRVersion = 7
	// MaxBytes bounds a model's parameters: protobuf cannot encode a
	// message of 2 GiB or more, and this exporter writes no external data.
	MaxBytes = 1<<31 - 64<<20
)

// ErrExport means a checkpoint cannot be written as ONNX; the error says
// which part and why.
var ErrExport = errors.New("onnx: cannot export")

// Export returns the ONNX model of a checkpoint.
func Export(c *train.Checkpoint) (*pb.ModelProto, error) { return exportWithin(c, MaxBytes) }

// exportErr is an ErrExport saying why.
func exportErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrExport, fmt.Sprintf(format, args...))
}

// exportWithin is Export with a limit on the parameters' bytes.
func exportWithin(c *train.Checkpoint, maxBytes int) (*pb.ModelProto, error) {
	spec := c.Model.Spec
	shapes, err := spec.Shapes()
	if err != nil {
		return nil, exportErr("the checkpoint's model: %v", err)
	}
	want, err := train.InitParams(c.Model) // names and shapes, in order
	if err != nil {
		return nil, exportErr("the checkpoint's model: %v", err)
	}
	if err := fitParams(c.Params, want, maxBytes); err != nil {
		return nil, err
	}
	mean, std, err := normalizeOf(c.Transforms, spec.Input)
	if err != nil {
		return nil, exportErr("%v", err)
	}

	lm := newGraph()
	g, init, node := lm.g, lm.init, lm.node
	sample := append([]int{1}, spec.Input...)
	h := "input"
	if mean != nil {
		init("normalize.mean", sample, mean)
		init("normalize.std", sample, std)
		h = node("Div", "normalize.div", []string{node("Sub", "normalize.sub", []string{h, "normalize.mean"}), "normalize.std"})
	}
	h, err = lm.layers(h, spec, shapes, want, c.Params)
	if err != nil {
		return nil, err
	}
	node("Identity", "logits", []string{h})
	g.Input = []*pb.ValueInfoProto{valueInfo("input", spec.Input)}
	g.Output = []*pb.ValueInfoProto{valueInfo("logits", shapes[len(shapes)-1])}

	return modelProto(c, g, mean != nil), nil
}

// layers adds the spec's layers after h, the parameters taken in order
// (want: their names and shapes), and returns the last one's output.
func (m *lmGraph) layers(h string, spec train.Spec, shapes [][]int, want []train.Param, params [][]float32) (string, error) {
	saved := map[string]string{}
	next := 0
	for i, l := range spec.Layers {
		name := fmt.Sprintf("%d.%s", i, l.Type)
		switch l.Type {
		case train.LayerEmbedding, train.LayerLayerNorm, train.LayerAttention, train.LayerGELU:
			var in []int
			if i > 0 {
				in = shapes[i-1]
			} else {
				in = spec.Input
			}
			h = m.layer(h, name, l, in, want, params, &next)
		case train.LayerLinear:
			w, b := m.weightAndBias(l.Out, want, params, &next)
			if i > 0 && len(shapes[i-1]) == 2 { // each position's row: [batch, T, features]
				h = m.node("Add", name, []string{m.node("MatMul", name+".matmul", []string{h, w}), b})
				break
			}
			h = m.node("Gemm", name, []string{h, w, b})
		case train.LayerConv2D:
			w, b := m.weightAndBias(l.Out, want, params, &next)
			h = m.node("Conv", name, []string{h, w, b},
				ints("kernel_shape", l.Kernel, l.Kernel), ints("pads", l.Pad, l.Pad, l.Pad, l.Pad), ints("strides", 1, 1))
		case train.LayerMaxPool2D:
			h = m.node("MaxPool", name, []string{h}, ints("kernel_shape", l.Kernel, l.Kernel), ints("strides", l.Kernel, l.Kernel))
		case train.LayerReLU:
			h = m.node("Relu", name, []string{h})
		case train.LayerSigmoid:
			h = m.node("Sigmoid", name, []string{h})
		case train.LayerTanh:
			h = m.node("Tanh", name, []string{h})
		case train.LayerFlatten:
			h = m.node("Flatten", name, []string{h}, ints1("axis", 1))
		case train.LayerAdd:
			from, ok := saved[l.From]
			if !ok {
				return "", exportErr("layer %d adds %q, which no earlier layer saved", i, l.From)
			}
			h = m.node("Add", name, []string{h, from})
		case train.LayerDropout:
			// The identity at inference.
		default:
			return "", exportErr("layer %d is a %q, which has no ONNX form here", i, l.Type)
		}
		if l.Save != "" {
			saved[l.Save] = h
		}
	}
	return h, nil
}

// modelProto is graph g as c's model, with what a user of the file needs
// to feed it: the input's layout, the classes and the transforms.
func modelProto(c *train.Checkpoint, g *pb.GraphProto, normalized bool) *pb.ModelProto {
	spec := c.Model.Spec
	classes, _ := json.Marshal(c.Classes)
	transforms, _ := json.Marshal(c.Transforms)
	layout, output := describeIO(spec, normalized)
	return &pb.ModelProto{
		IrVersion:       proto.Int64(IRVersion),
		OpsetImport:     []*pb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(Opset)}},
		ProducerName:    proto.String("ringtrain"),
		ProducerVersion: proto.String("1"),
		DocString:       proto.String("A ringtrain model. Input: " + layout + ". Output: " + output + "."),
		Graph:           g,
		MetadataProps: []*pb.StringStringEntryProto{
			{Key: proto.String("classes"), Value: proto.String(string(classes))},
			{Key: proto.String("input"), Value: proto.String(layout)},
			{Key: proto.String("transforms"), Value: proto.String(string(transforms))},
		},
	}
}

// newGraph is an empty graph with its two builders: init adds a float
// initializer, node a node whose one output is named as the node.
func newGraph() *lmGraph {
	g := &pb.GraphProto{Name: proto.String("ringtrain")}
	init := func(name string, dims []int, v []float32) {
		raw := make([]byte, 4*len(v)) // raw_data is little-endian, as ONNX says
		for i, x := range v {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(x))
		}
		t := &pb.TensorProto{Name: proto.String(name), DataType: proto.Int32(int32(pb.TensorProto_FLOAT)), RawData: raw}
		for _, d := range dims {
			t.Dims = append(t.Dims, int64(d))
		}
		g.Initializer = append(g.Initializer, t)
	}
	node := func(op, name string, in []string, attrs ...*pb.AttributeProto) string {
		g.Node = append(g.Node, &pb.NodeProto{OpType: proto.String(op), Name: proto.String(name), Input: in,
			Output: []string{name}, Attribute: attrs})
		return name
	}
	return &lmGraph{g: g, init: init, node: node}
}

// fitParams checks a checkpoint's parameters against the tensors its model
// has (want: names and shapes, in order), and their bytes against maxBytes.
func fitParams(params [][]float32, want []train.Param, maxBytes int) error {
	if len(params) != len(want) {
		return fmt.Errorf("%w: the checkpoint holds %d parameter tensors; its model has %d", ErrExport, len(params), len(want))
	}
	total := 0
	for i, p := range want {
		if len(params[i]) != len(p.Data) {
			return fmt.Errorf("%w: the checkpoint's %s has %d values; the model's is %v (%d)", ErrExport, p.Name, len(params[i]), p.Shape, len(p.Data))
		}
		total += 4 * len(p.Data)
	}
	if total > maxBytes {
		return fmt.Errorf("%w: %d bytes of parameters; an ONNX file without external data holds at most %d", ErrExport, total, maxBytes)
	}
	return nil
}

// describeIO says, for the model's doc string and metadata, what its input
// is (normalized: whether the graph holds the job's Normalize) and what it
// outputs.
func describeIO(spec train.Spec, normalized bool) (layout, output string) {
	layout = "C×H×W floats in [0, 1], as ToTensor makes them; Normalize is in the graph"
	if !normalized {
		layout = "C×H×W floats in [0, 1], as ToTensor makes them (the job had no Normalize)"
	}
	if len(spec.Input) == 1 {
		layout = strings.Replace(layout, "C×H×W floats", "C×H×W floats laid flat", 1)
	}
	output = "logits, one per class (softmax gives probabilities)"
	if spec.Loss != train.CrossEntropy {
		layout = fmt.Sprintf("a row of %d features, the job's CSV table's non-target columns in its order", spec.Input[0])
		output = fmt.Sprintf("the model's outputs, one per target column (trained with %s)", spec.Loss)
	}
	return layout, output
}

// normalizeOf returns the Normalize of transforms expanded to one value per
// input value (nil if there is none), refusing transforms the graph cannot
// hold.
func normalizeOf(specs []data.TransformSpec, input []int) (mean, std []float32, err error) {
	if len(specs) == 0 { // a checkpoint that does not say: no Normalize
		return nil, nil, nil
	}
	if _, err := data.NewPipeline(specs); err != nil {
		return nil, nil, fmt.Errorf("the checkpoint's transforms: %v", err)
	}
	var m, s []float32
	for _, t := range specs {
		if t.Name != "Normalize" {
			continue
		}
		if err := json.Unmarshal(t.Args[0], &m); err == nil {
			err = json.Unmarshal(t.Args[1], &s)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("the checkpoint's Normalize: %v", err)
		}
	}
	if m == nil {
		return nil, nil, nil
	}
	size, chans := 1, 1
	for _, d := range input {
		size *= d
	}
	if len(input) == 3 {
		chans = input[0]
	} else if len(m) > 1 {
		chans = len(m) // a flat input: channels laid end to end
	}
	if size%chans != 0 {
		return nil, nil, fmt.Errorf("Normalize has %d channels; the model's input of %d values does not split into them", len(m), size)
	}
	plane := size / chans
	mean, std = make([]float32, size), make([]float32, size)
	for c := range chans {
		mc, sc := m[0], s[0] // one value for every channel, as data does
		if c < len(m) {
			mc, sc = m[c], s[c]
		}
		for i := c * plane; i < (c+1)*plane; i++ {
			mean[i], std[i] = mc, sc
		}
	}
	return mean, std, nil
}

func ints(name string, v ...int) *pb.AttributeProto {
	a := &pb.AttributeProto{Name: proto.String(name), Type: pb.AttributeProto_INTS.Enum()}
	for _, x := range v {
		a.Ints = append(a.Ints, int64(x))
	}
	return a
}

func ints1(name string, v int) *pb.AttributeProto {
	return &pb.AttributeProto{Name: proto.String(name), Type: pb.AttributeProto_INT.Enum(), I: proto.Int64(int64(v))}
}

// valueInfo is a float tensor of a free batch size and the given shape.
func valueInfo(name string, shape []int) *pb.ValueInfoProto {
	dims := []*pb.TensorShapeProto_Dimension{{Value: &pb.TensorShapeProto_Dimension_DimParam{DimParam: "batch"}}}
	for _, d := range shape {
		dims = append(dims, &pb.TensorShapeProto_Dimension{Value: &pb.TensorShapeProto_Dimension_DimValue{DimValue: int64(d)}})
	}
	return &pb.ValueInfoProto{Name: proto.String(name), Type: &pb.TypeProto{Value: &pb.TypeProto_TensorType{
		TensorType: &pb.TypeProto_Tensor{ElemType: proto.Int32(int32(pb.TensorProto_FLOAT)), Shape: &pb.TensorShapeProto{Dim: dims}}}}}
}

// Write exports a checkpoint to path atomically: to a temporary file in
// the same folder, synced, then renamed over path.
func Write(c *train.Checkpoint, path string) (err error) {
	m, err := Export(c)
	if err != nil {
		return err
	}
	b, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("onnx: encoding: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("onnx: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(b); err != nil {
		return fmt.Errorf("onnx: writing %s: %w", path, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("onnx: writing %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("onnx: writing %s: %w", path, err)
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("onnx: %w", err)
	}
	return nil
}
