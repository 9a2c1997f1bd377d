package train

import (
	"errors"
	"fmt"
	"strings"
)

// ErrSpec means a model spec is wrong; the message names the layer.
var ErrSpec = errors.New("train: bad model spec")

// Spec is a model as a list of layers, the form the job config takes:
//
//	{"input": [1, 28, 28], "layers": [
//	  {"type": "conv2d", "out": 32, "kernel": 5, "pad": 2}, {"type": "relu", "save": "a"},
//	  {"type": "conv2d", "out": 32, "kernel": 3, "pad": 1}, {"type": "add", "from": "a"},
//	  {"type": "maxpool2d", "kernel": 2}, {"type": "flatten"}, {"type": "linear", "out": 10}]}
//
// Types: linear (out), conv2d (out, kernel, pad; stride 1), maxpool2d
// (kernel; stride = kernel), relu, sigmoid, tanh, flatten, dropout (p: the
// share zeroed while training; the rest are scaled by 1/(1−p), and nothing
// is dropped in evaluation, as in torch), and add (from:
// the name a layer before it saved its output under with "save"; the shapes
// must match). The last layer's output are the logits; the loss is softmax
// cross-entropy.
//
// A language model's spec takes T bytes per sample ("input": [T]) and
// begins with an embedding (out: the width; vocab, 256 unless given; and
// learned positions, T of them), after which a sample is T rows of
// features: linear layers act on each row, layernorm normalises each,
// attention (heads) is causal multi-head self-attention of rows of
// queries, keys and values side by side (3 × the width) into rows of the
// width, gelu is exact, and add adds rows alike. Its last layer gives
// every position its logits for the next byte; the loss is the mean
// cross-entropy over every position. Init "gpt" draws every linear and
// embedding weight from N(0, 0.02), as GPT-2 and torch_gpt.py do.
type Spec struct {
	Input  []int   `json:"input"` // C, H, W for images; F for flat features; T for bytes
	Layers []Layer `json:"layers"`
	Init   string  `json:"init,omitempty"` // "" (He and Glorot) or "gpt"
	// Loss is what training minimises: cross-entropy over class scores
	// (the default), or, for float targets, mse or bce (see Loss).
	Loss Loss `json:"loss,omitempty"`
}

// Loss names a loss function.
type Loss string

// The losses a Spec may name. CrossEntropy compares class scores with a
// class label. MSE and BCE compare the last layer's K outputs with K float
// targets that every input row carries after its features (a table's
// target columns): MSE is the mean of (output − target)² over the batch and
// the K values, as torch's MSELoss; BCE the mean of −(t·log p +
// (1−t)·log(1−p)), each log held at −100 or above, as torch's BCELoss — the
// outputs are probabilities, so a BCE model ends in a sigmoid.
const (
	CrossEntropy Loss = ""
	MSE          Loss = "mse"
	BCE          Loss = "bce"
)

// Targets is how many float targets a sample's row carries after its
// features: the last layer's width for MSE and BCE, none for cross-entropy.
func (s Spec) Targets() int {
	if s.Loss != MSE && s.Loss != BCE {
		return 0
	}
	shapes, err := s.Shapes()
	if err != nil {
		return 0
	}
	last := shapes[len(shapes)-1]
	return last[len(last)-1]
}

// RowValues is how many values one sample of a batch's x holds: its
// features, then its targets.
func (s Spec) RowValues() int {
	n, _ := values(s.Input...)
	return n + s.Targets()
}

// LayerType is a kind of layer, as a spec names it.
type LayerType string

// The kinds of layer a Spec may list.
const (
	LayerLinear    LayerType = "linear"
	LayerConv2D    LayerType = "conv2d"
	LayerMaxPool2D LayerType = "maxpool2d"
	LayerReLU      LayerType = "relu"
	LayerSigmoid   LayerType = "sigmoid"
	LayerTanh      LayerType = "tanh"
	LayerFlatten   LayerType = "flatten"
	LayerAdd       LayerType = "add"
	LayerDropout   LayerType = "dropout"
	LayerEmbedding LayerType = "embedding"
	LayerLayerNorm LayerType = "layernorm"
	LayerAttention LayerType = "attention"
	LayerGELU      LayerType = "gelu"
)

// HasParams says whether the layer has parameters: two tensors, a weight
// and a bias (an embedding's: its token and position tables; a
// layernorm's: its gain and bias).
func (t LayerType) HasParams() bool {
	return t == LayerLinear || t == LayerConv2D || t == LayerEmbedding || t == LayerLayerNorm
}

// Layer is one entry of a Spec.
type Layer struct {
	Type   LayerType `json:"type"`
	Out    int       `json:"out,omitempty"`
	Kernel int       `json:"kernel,omitempty"`
	Pad    int       `json:"pad,omitempty"`
	Save   string    `json:"save,omitempty"`
	From   string    `json:"from,omitempty"`
	// P is dropout's share of values zeroed while training, in (0, 1).
	P float64 `json:"p,omitempty"`
	// Heads is attention's heads; Vocab an embedding's tokens (0: 256).
	Heads int `json:"heads,omitempty"`
	Vocab int `json:"vocab,omitempty"`
}

// DefaultVocab is an embedding's tokens where its layer does not say:
// the byte values.
const DefaultVocab = 256

// vocab is an embedding layer's tokens.
func (l Layer) vocab() int {
	if l.Vocab == 0 {
		return DefaultVocab
	}
	return l.Vocab
}

// MLPSpec is `mlp` in general: linear layers with ReLU between them.
func MLPSpec(inputs int, hidden []int, classes int) Spec {
	s := Spec{Input: []int{inputs}}
	for _, h := range hidden {
		s.Layers = append(s.Layers, Layer{Type: LayerLinear, Out: h}, Layer{Type: LayerReLU})
	}
	s.Layers = append(s.Layers, Layer{Type: LayerLinear, Out: classes})
	return s
}

// GPTSpec is a byte-level GPT as a layer list: an embedding of the bytes
// and their positions, then per block, pre-LayerNorm, causal multi-head
// attention (queries, keys and values from one linear layer, then an
// output projection) added to the block's input, and a GELU MLP of four
// times the width added to that; a final layernorm and an untied output
// layer of 256 logits per position; GPT initialisation.
// ../shared/bench/torch_gpt.py's model, layer for layer.
func GPTSpec(blocks, dim, heads, context int) Spec {
	s := Spec{Input: []int{context}, Init: "gpt", Layers: []Layer{{Type: LayerEmbedding, Out: dim, Save: "x0"}}}
	for b := range blocks {
		in, mid, out := fmt.Sprintf("x%d", b), fmt.Sprintf("a%d", b), fmt.Sprintf("x%d", b+1)
		s.Layers = append(s.Layers,
			Layer{Type: LayerLayerNorm}, Layer{Type: LayerLinear, Out: 3 * dim}, Layer{Type: LayerAttention, Heads: heads},
			Layer{Type: LayerLinear, Out: dim}, Layer{Type: LayerAdd, From: in, Save: mid},
			Layer{Type: LayerLayerNorm}, Layer{Type: LayerLinear, Out: 4 * dim}, Layer{Type: LayerGELU},
			Layer{Type: LayerLinear, Out: dim}, Layer{Type: LayerAdd, From: mid, Save: out})
	}
	return Spec{Input: s.Input, Init: s.Init, Layers: append(s.Layers, Layer{Type: LayerLayerNorm}, Layer{Type: LayerLinear, Out: DefaultVocab})}
}

// BuiltinSpec returns the built-in models for C×H×W inputs: "mlp"
// (784-256-128-10 on Fashion-MNIST) and "cnn", the classic 2-conv
// Fashion-MNIST network (conv 32 5×5 pad 2, ReLU, pool 2; conv 64 5×5 pad 2,
// ReLU, pool 2; linear 1024, ReLU; linear classes).
func BuiltinSpec(name string, c, h, w, classes int) (Spec, error) {
	switch name {
	case "mlp":
		return MLPSpec(c*h*w, []int{256, 128}, classes), nil
	case "cnn":
		return Spec{Input: []int{c, h, w}, Layers: []Layer{
			{Type: LayerConv2D, Out: 32, Kernel: 5, Pad: 2}, {Type: LayerReLU}, {Type: LayerMaxPool2D, Kernel: 2},
			{Type: LayerConv2D, Out: 64, Kernel: 5, Pad: 2}, {Type: LayerReLU}, {Type: LayerMaxPool2D, Kernel: 2},
			{Type: LayerFlatten}, {Type: LayerLinear, Out: 1024}, {Type: LayerReLU}, {Type: LayerLinear, Out: classes},
		}}, nil
	}
	return Spec{}, fmt.Errorf("train: unknown model %q; built in: mlp, cnn (or give a layer spec): %w", name, ErrSpec)
}

// Shapes checks the spec and returns each layer's output shape (without
// the batch dimension); errors name the layer.
func (s Spec) Shapes() ([][]int, error) {
	shapes, _, err := s.walk()
	return shapes, err
}

// ParamSizes returns how many values each parameter tensor of the spec has,
// in InitParams' order, without allocating them: a file's claim can be
// checked against it before a model is built.
func (s Spec) ParamSizes() ([]int, error) {
	_, sizes, err := s.walk()
	return sizes, err
}

// StageParamSizes is ParamSizes for layers [lo, hi) alone.
func (s Spec) StageParamSizes(lo, hi int) ([]int, error) {
	sizes, err := s.ParamSizes()
	if err != nil {
		return nil, err
	}
	if lo < 0 || lo >= hi || hi > len(s.Layers) {
		return nil, fmt.Errorf("layers [%d, %d) of %d: %w", lo, hi, len(s.Layers), ErrSpec)
	}
	first, n := 0, 0
	for i, l := range s.Layers[:hi] {
		if l.Type.HasParams() {
			if i < lo {
				first += 2
			} else {
				n += 2
			}
		}
	}
	return sizes[first : first+n], nil
}

// Bounds on a spec, checked before anything is allocated, so a config or a
// checkpoint header cannot make a model panic in allocation: MaxValues per
// sample in any layer's output and in any one parameter tensor, MaxParams
// in all.
const (
	MaxValues = 1 << 28
	MaxParams = 1 << 30
)

// MaxBatchValues bounds a batch's values in any one layer.
const MaxBatchValues = 1 << 31

// Shapes checks the config — its spec and its batch size — and returns
// the spec's shapes.
func (c ModelConfig) Shapes() ([][]int, error) {
	shapes, err := c.Spec.Shapes()
	if err != nil {
		return nil, err
	}
	if c.Batch < 1 {
		return nil, fmt.Errorf("batch %d; want at least 1: %w", c.Batch, ErrSpec)
	}
	widest, _ := values(c.Spec.Input...)
	for _, sh := range shapes {
		n, _ := values(sh...)
		widest = max(widest, n)
	}
	if widest > MaxBatchValues/c.Batch {
		return nil, fmt.Errorf("batch %d of layers up to %d values each is more than %d values: %w", c.Batch, widest, MaxBatchValues, ErrSpec)
	}
	return shapes, nil
}

// MemoryBytes is about what a model of c holds: five times each layer's
// output for a batch (the output, its gradient, the graph's and the
// kernels' scratch: a 1×4096×4096 convolution net measured 886 MiB
// against 1,090 estimated), and the parameters with their gradients and
// two optimizer states — an estimate
// made before anything is allocated, so that a model that cannot fit in
// a machine's memory is refused with words, not killed by the kernel.
func (c ModelConfig) MemoryBytes() (int64, error) {
	shapes, err := c.Shapes()
	if err != nil {
		return 0, err
	}
	in, _ := values(c.Spec.Input...)
	acts := int64(in)
	for _, sh := range shapes {
		n, _ := values(sh...)
		acts += int64(n)
	}
	sizes, err := c.Spec.ParamSizes()
	if err != nil {
		return 0, err
	}
	var params int64
	for _, n := range sizes {
		params += int64(n)
	}
	return 4 * (5*acts*int64(c.Batch) + 4*params), nil
}

// values is the product of dims, or false past MaxValues.
func values(dims ...int) (int, bool) {
	n := 1
	for _, d := range dims {
		if d < 0 || d > MaxValues || n > MaxValues/max(d, 1) {
			return 0, false
		}
		n *= d
	}
	return n, true
}

// walk checks the spec and returns every layer's output shape and every
// parameter tensor's size.
func (s Spec) walk() ([][]int, []int, error) {
	shapes, sizes, err := s.walkShapes()
	if err != nil {
		return nil, nil, err
	}
	total := 0
	for _, n := range sizes {
		if total += n; total > MaxParams {
			return nil, nil, fmt.Errorf("more than %d parameters: %w", MaxParams, ErrSpec)
		}
	}
	return shapes, sizes, nil
}

func (s Spec) walkShapes() ([][]int, []int, error) {
	if s.Init != "" && s.Init != "gpt" {
		return nil, nil, fmt.Errorf("init %q; want gpt, or none for He and Glorot: %w", s.Init, ErrSpec)
	}
	if len(s.Input) != 1 && len(s.Input) != 3 {
		return nil, nil, fmt.Errorf("input %v; want [features] or [channels, height, width]: %w", s.Input, ErrSpec)
	}
	for _, d := range s.Input {
		if d < 1 {
			return nil, nil, fmt.Errorf("input %v has a dimension below 1: %w", s.Input, ErrSpec)
		}
	}
	if _, ok := values(s.Input...); !ok {
		return nil, nil, fmt.Errorf("input %v has more than %d values: %w", s.Input, MaxValues, ErrSpec)
	}
	var sizes []int
	if len(s.Layers) == 0 {
		return nil, nil, fmt.Errorf("no layers: %w", ErrSpec)
	}
	shape := s.Input
	saved := map[string][]int{}
	var out [][]int
	for i, l := range s.Layers {
		where := fmt.Sprintf("layer %d (%s)", i, l.Type)
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%s: %s: %w", where, fmt.Sprintf(format, args...), ErrSpec)
		}
		if l.Type == LayerEmbedding && i > 0 {
			return nil, nil, bad("an embedding reads the bytes a sample holds: it comes first")
		}
		next, params, err := l.outShape(shape, saved)
		if err != nil {
			return nil, nil, bad("%v", err)
		}
		shape, sizes = next, append(sizes, params...)
		if _, ok := values(shape...); !ok {
			return nil, nil, bad("gives %v, more than %d values per sample", shape, MaxValues)
		}
		if l.Save != "" {
			if _, dup := saved[l.Save]; dup {
				return nil, nil, bad("save %q is used twice", l.Save)
			}
			saved[l.Save] = shape
		}
		out = append(out, shape)
	}
	return out, sizes, s.checkLoss(out[len(out)-1])
}

// checkLoss checks the last layer's shape against the loss.
func (s Spec) checkLoss(last []int) error {
	switch s.Loss {
	case CrossEntropy:
		if len(last) < 1 || len(last) > 2 || last[len(last)-1] < 2 || len(last) == 2 && s.Layers[0].Type != LayerEmbedding {
			return fmt.Errorf("the last layer gives %v; want a flat vector of at least 2 class scores (or, after an embedding, each position's): %w", last, ErrSpec)
		}
	case MSE, BCE:
		if len(last) != 1 {
			return fmt.Errorf("loss %s: the last layer gives %v; want a flat vector of outputs, one per target: %w", s.Loss, last, ErrSpec)
		}
		if len(s.Input) != 1 {
			return fmt.Errorf("loss %s: input %v; float targets come in rows of features: want [features]: %w", s.Loss, s.Input, ErrSpec)
		}
	default:
		return fmt.Errorf("loss %q; want mse, bce, or none for cross-entropy: %w", s.Loss, ErrSpec)
	}
	return nil
}

// outShape is the shape layer l gives for an input of shape, and the
// sizes of its weight and bias, if it has them; saved are the shapes
// earlier layers saved, by name.
func (l Layer) outShape(shape []int, saved map[string][]int) ([]int, []int, error) {
	switch l.Type {
	case LayerLinear:
		if len(shape) != 1 && len(shape) != 2 {
			return nil, nil, fmt.Errorf("input %v is not flat (or rows of features); put a flatten before it", shape)
		}
		if l.Out < 1 {
			return nil, nil, fmt.Errorf("out %d; want at least 1", l.Out)
		}
		in := shape[len(shape)-1]
		n, ok := values(in, l.Out)
		if !ok {
			return nil, nil, fmt.Errorf("a %d×%d weight; at most %d values", in, l.Out, MaxValues)
		}
		if len(shape) == 2 {
			return []int{shape[0], l.Out}, []int{n, l.Out}, nil
		}
		return []int{l.Out}, []int{n, l.Out}, nil
	case LayerEmbedding, LayerLayerNorm, LayerAttention:
		return l.seqShape(shape)
	case LayerGELU:
	case LayerConv2D:
		if len(shape) != 3 {
			return nil, nil, fmt.Errorf("input %v is not C×H×W", shape)
		}
		if l.Out < 1 || l.Kernel < 1 || l.Pad < 0 {
			return nil, nil, fmt.Errorf("out %d, kernel %d, pad %d; want out ≥ 1, kernel ≥ 1, pad ≥ 0", l.Out, l.Kernel, l.Pad)
		}
		if l.Pad > MaxValues || l.Kernel > MaxValues {
			return nil, nil, fmt.Errorf("kernel %d and pad %d; at most %d", l.Kernel, l.Pad, MaxValues)
		}
		h, w := shape[1]+2*l.Pad-l.Kernel+1, shape[2]+2*l.Pad-l.Kernel+1
		if h < 1 || w < 1 {
			return nil, nil, fmt.Errorf("a %d×%d kernel does not fit %d×%d with pad %d", l.Kernel, l.Kernel, shape[1], shape[2], l.Pad)
		}
		n, ok := values(l.Out, shape[0], l.Kernel, l.Kernel)
		if !ok {
			return nil, nil, fmt.Errorf("a %d×%d×%d×%d weight; at most %d values", l.Out, shape[0], l.Kernel, l.Kernel, MaxValues)
		}
		return []int{l.Out, h, w}, []int{n, l.Out}, nil
	case LayerMaxPool2D:
		if len(shape) != 3 {
			return nil, nil, fmt.Errorf("input %v is not C×H×W", shape)
		}
		if l.Kernel < 1 || shape[1] < l.Kernel || shape[2] < l.Kernel {
			return nil, nil, fmt.Errorf("kernel %d for %d×%d", l.Kernel, shape[1], shape[2])
		}
		return []int{shape[0], shape[1] / l.Kernel, shape[2] / l.Kernel}, nil, nil
	case LayerReLU, LayerSigmoid, LayerTanh:
	case LayerFlatten:
		n := 1
		for _, d := range shape {
			n *= d
		}
		return []int{n}, nil, nil
	case LayerAdd:
		s, ok := saved[l.From]
		if !ok {
			return nil, nil, fmt.Errorf("from %q: no earlier layer saved that name", l.From)
		}
		if !equal(s, shape) {
			return nil, nil, fmt.Errorf("adds %q of shape %v to shape %v", l.From, s, shape)
		}
	case LayerDropout:
		if !(l.P > 0 && l.P < 1) {
			return nil, nil, fmt.Errorf("p %v; want the share of values to drop, above 0 and below 1", l.P)
		}
	default:
		return nil, nil, fmt.Errorf("unknown type; want linear, conv2d, maxpool2d, relu, sigmoid, tanh, flatten, dropout, add, embedding, layernorm, attention or gelu")
	}
	return shape, nil, nil
}

// seqShape is outShape for a language model's layers: an embedding, a
// layernorm, attention.
func (l Layer) seqShape(shape []int) ([]int, []int, error) {
	switch l.Type {
	case LayerEmbedding:
		if len(shape) != 1 {
			return nil, nil, fmt.Errorf("input %v; want [T], the bytes of a sample", shape)
		}
		if l.Out < 1 || l.vocab() < 1 {
			return nil, nil, fmt.Errorf("out %d, vocab %d; want both at least 1", l.Out, l.vocab())
		}
		tokens, ok1 := values(l.vocab(), l.Out)
		positions, ok2 := values(shape[0], l.Out)
		if !ok1 || !ok2 {
			return nil, nil, fmt.Errorf("tables of %d and %d rows of %d; at most %d values each", l.vocab(), shape[0], l.Out, MaxValues)
		}
		return []int{shape[0], l.Out}, []int{tokens, positions}, nil
	case LayerLayerNorm:
		if len(shape) != 1 && len(shape) != 2 {
			return nil, nil, fmt.Errorf("input %v; want features, or rows of them", shape)
		}
		w := shape[len(shape)-1]
		return shape, []int{w, w}, nil
	case LayerAttention:
		if len(shape) != 2 || shape[1]%3 != 0 {
			return nil, nil, fmt.Errorf("input %v; want rows of queries, keys and values side by side, [T, 3 × width]", shape)
		}
		if w := shape[1] / 3; l.Heads < 1 || w%l.Heads != 0 {
			return nil, nil, fmt.Errorf("%d heads for a width of %d; want heads that divide it", l.Heads, w)
		}
		return []int{shape[0], shape[1] / 3}, nil, nil
	}
	return nil, nil, fmt.Errorf("not a sequence layer")
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// String is a short form for logs: input, then the layers.
func (s Spec) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v", s.Input)
	for _, l := range s.Layers {
		b.WriteString(" → " + string(l.Type))
		if l.Out > 0 {
			fmt.Fprintf(&b, "(%d)", l.Out)
		}
	}
	return b.String()
}
