package engine

import (
	"errors"
	"fmt"

	"github.com/ringtrain/ringtrain/train"
)

// ErrUnsupported means a spec has a layer this engine does not have.
var ErrUnsupported = errors.New("engine: layer not supported")

// layer is one step of the plan.
type layer struct {
	kind    string
	in, out int  // values per sample, before and after
	w, b    int  // indices of weight and bias in params; -1 if none
	conv    Conv // conv2d
	pool    Pool // maxpool2d, per sample (Planes = channels)
	outC    int  // conv2d: output channels
}

// Net is a model of linear, conv2d, maxpool2d, relu and flatten layers run
// on an Ops. It is a train.Model; its parameters are the ones
// train.InitParams draws, in the same order, shapes and names as the
// gorgonia model's, so the two start alike and share checkpoints.
type Net struct {
	ops     Ops
	batch   int
	classes int
	layers  []layer
	params  [][]float32 // host: the optimizer's
	grads   [][]float32 // host: for the ring
	names   []string
	dParams []Buf
	dGrads  []Buf
	acts    []Buf // acts[i] is layer i's input; the last, the logits
	dActs   []Buf // gradients of the loss by acts
	col     Buf   // one sample's im2col matrix, for the largest conv
	dCol    Buf
	labels  Buf
	dLoss   Buf       // per-row losses
	xPad    []float32 // a whole batch of input, zero-padded
	yHost   []float32 // labels as floats
	lossRow []float32
	logits  []float32
}

var _ train.Model = (*Net)(nil)

// New builds the network of cfg on ops; the Net owns ops from then on.
func New(ops Ops, cfg train.ModelConfig) (_ *Net, err error) {
	shapes, err := cfg.Spec.Shapes()
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if cfg.Batch < 1 {
		return nil, fmt.Errorf("engine: batch %d; want at least 1", cfg.Batch)
	}
	init, err := train.InitParams(cfg)
	if err != nil {
		return nil, err
	}
	n := &Net{ops: ops, batch: cfg.Batch, classes: shapes[len(shapes)-1][0]}
	defer func() {
		if err != nil {
			ops.Close()
		}
	}()
	size := func(s []int) int {
		v := 1
		for _, d := range s {
			v *= d
		}
		return v
	}
	in := cfg.Spec.Input
	maxCol := 0
	for i, l := range cfg.Spec.Layers {
		ly := layer{kind: l.Type, in: size(in), out: size(shapes[i]), w: -1, b: -1}
		switch l.Type {
		case "linear":
			ly.w, ly.b = len(n.params), len(n.params)+1
		case "conv2d":
			ly.w, ly.b = len(n.params), len(n.params)+1
			ly.conv = NewConv(in[0], in[1], in[2], l.Kernel, l.Pad)
			ly.outC = l.Out
			maxCol = max(maxCol, ly.conv.ColRows()*ly.conv.ColCols())
		case "maxpool2d":
			ly.pool = NewPool(in[0], in[1], in[2], l.Kernel)
		case "relu", "flatten":
		default:
			return nil, fmt.Errorf("engine: layer %d (%s): %w; this engine has linear, conv2d, maxpool2d, relu and flatten (use the cpu device)",
				i, l.Type, ErrUnsupported)
		}
		if ly.w >= 0 {
			for _, p := range init[ly.w : ly.w+2] {
				n.params = append(n.params, p.Data)
				n.grads = append(n.grads, make([]float32, len(p.Data)))
				n.names = append(n.names, p.Name)
			}
		}
		n.layers = append(n.layers, ly)
		in = shapes[i]
	}
	alloc := func(size int) Buf {
		if err != nil {
			return nil
		}
		var b Buf
		b, err = ops.Alloc(size)
		return b
	}
	for _, p := range n.params {
		n.dParams = append(n.dParams, alloc(len(p)))
		n.dGrads = append(n.dGrads, alloc(len(p)))
	}
	first := size(cfg.Spec.Input)
	n.acts = []Buf{alloc(n.batch * first)}
	n.dActs = []Buf{alloc(n.batch * first)}
	for _, ly := range n.layers {
		if ly.kind == "flatten" { // the same values, seen flat
			n.acts = append(n.acts, n.acts[len(n.acts)-1])
			n.dActs = append(n.dActs, n.dActs[len(n.dActs)-1])
			continue
		}
		n.acts = append(n.acts, alloc(n.batch*ly.out))
		n.dActs = append(n.dActs, alloc(n.batch*ly.out))
	}
	if maxCol > 0 {
		n.col, n.dCol = alloc(maxCol), alloc(maxCol)
	}
	n.labels, n.dLoss = alloc(n.batch), alloc(n.batch)
	if err != nil {
		return nil, fmt.Errorf("engine: allocating on %s: %w", ops.Name(), err)
	}
	n.xPad = make([]float32, n.batch*first)
	n.yHost = make([]float32, n.batch)
	n.lossRow = make([]float32, n.batch)
	n.logits = make([]float32, n.batch*n.classes)
	return n, nil
}

// errs keeps the first error of a run of calls.
type errs struct{ err error }

func (e *errs) do(err error) {
	if e.err == nil && err != nil {
		e.err = err
	}
}

// ForwardBackward computes the mean loss of the first n samples and its
// gradients, which it leaves in Grads (host memory).
func (n *Net) ForwardBackward(x []float32, y []int, rows int) (float32, error) {
	loss, err := n.forward(x, y, rows)
	if err != nil {
		return 0, err
	}
	var e errs
	for i := len(n.layers) - 1; i >= 0; i-- {
		e.do(n.backward(i))
	}
	for i, g := range n.dGrads {
		e.do(n.ops.Download(n.grads[i], g))
	}
	if e.err != nil {
		return 0, fmt.Errorf("engine: backward on %s: %w", n.ops.Name(), e.err)
	}
	return loss, nil
}

// Forward computes the loss and the logits alone.
func (n *Net) Forward(x []float32, y []int, rows int) (float32, error) {
	return n.forward(x, y, rows)
}

func (n *Net) forward(x []float32, y []int, rows int) (float32, error) {
	per := len(n.xPad) / n.batch
	if rows < 1 || rows > n.batch || len(x) != rows*per || len(y) != rows {
		return 0, fmt.Errorf("engine: batch of %d samples with %d values and %d labels; model takes up to %d samples of %d values",
			rows, len(x), len(y), n.batch, per)
	}
	copy(n.xPad, x)
	clear(n.xPad[len(x):])
	clear(n.yHost)
	for i, l := range y {
		if l < 0 || l >= n.classes {
			return 0, fmt.Errorf("engine: label %d of sample %d outside [0, %d)", l, i, n.classes)
		}
		n.yHost[i] = float32(l)
	}
	var e errs
	e.do(n.ops.Upload(n.acts[0], n.xPad))
	e.do(n.ops.Upload(n.labels, n.yHost))
	for i, p := range n.params {
		e.do(n.ops.Upload(n.dParams[i], p))
	}
	for i := range n.layers {
		e.do(n.forwardLayer(i))
	}
	logits := n.acts[len(n.acts)-1]
	dLogits := n.dActs[len(n.dActs)-1]
	e.do(n.ops.SoftmaxXent(logits, n.labels, dLogits, n.dLoss, n.batch, rows, n.classes))
	e.do(n.ops.Download(n.lossRow, n.dLoss))
	e.do(n.ops.Download(n.logits, logits))
	if e.err != nil {
		return 0, fmt.Errorf("engine: forward on %s: %w", n.ops.Name(), e.err)
	}
	sum := float32(0)
	for _, l := range n.lossRow[:rows] {
		sum += l
	}
	return sum / float32(rows), nil
}

func (n *Net) forwardLayer(i int) error {
	ly, x, y, ops := n.layers[i], n.acts[i], n.acts[i+1], n.ops
	switch ly.kind {
	case "linear":
		if err := ops.Gemm(false, false, n.batch, ly.out, ly.in, x, n.dParams[ly.w], 0, y); err != nil {
			return err
		}
		return ops.BiasAdd(y, n.dParams[ly.b], n.batch, ly.out, 1)
	case "conv2d":
		g := ly.conv
		col := ops.Slice(n.col, 0, g.ColRows()*g.ColCols())
		for s := range n.batch {
			if err := ops.Im2col(ops.Slice(x, s*ly.in, ly.in), col, g); err != nil {
				return err
			}
			if err := ops.Gemm(false, false, ly.outC, g.ColCols(), g.ColRows(), n.dParams[ly.w], col, 0, ops.Slice(y, s*ly.out, ly.out)); err != nil {
				return err
			}
		}
		return ops.BiasAdd(y, n.dParams[ly.b], n.batch, ly.outC, g.ColCols())
	case "maxpool2d":
		g := ly.pool
		g.Planes *= n.batch
		return ops.MaxPool(x, y, g)
	case "relu":
		return ops.Relu(x, y)
	}
	return nil // flatten
}

// backward turns dActs[i+1] into the layer's parameter gradients and, but
// for the first layer, dActs[i].
func (n *Net) backward(i int) error {
	ly, x, dy, dx, ops := n.layers[i], n.acts[i], n.dActs[i+1], n.dActs[i], n.ops
	needDx := i > 0
	switch ly.kind {
	case "linear":
		if err := ops.Gemm(true, false, ly.in, ly.out, n.batch, x, dy, 0, n.dGrads[ly.w]); err != nil {
			return err
		}
		if err := ops.BiasGrad(dy, n.dGrads[ly.b], n.batch, ly.out, 1); err != nil {
			return err
		}
		if needDx {
			return ops.Gemm(false, true, n.batch, ly.in, ly.out, dy, n.dParams[ly.w], 0, dx)
		}
	case "conv2d":
		g := ly.conv
		col := ops.Slice(n.col, 0, g.ColRows()*g.ColCols())
		dCol := ops.Slice(n.dCol, 0, g.ColRows()*g.ColCols())
		if err := ops.BiasGrad(dy, n.dGrads[ly.b], n.batch, ly.outC, g.ColCols()); err != nil {
			return err
		}
		for s := range n.batch {
			dys := ops.Slice(dy, s*ly.out, ly.out)
			if err := ops.Im2col(ops.Slice(x, s*ly.in, ly.in), col, g); err != nil {
				return err
			}
			beta := float32(1) // sum over the samples
			if s == 0 {
				beta = 0
			}
			if err := ops.Gemm(false, true, ly.outC, g.ColRows(), g.ColCols(), dys, col, beta, n.dGrads[ly.w]); err != nil {
				return err
			}
			if !needDx {
				continue
			}
			if err := ops.Gemm(true, false, g.ColRows(), g.ColCols(), ly.outC, n.dParams[ly.w], dys, 0, dCol); err != nil {
				return err
			}
			if err := ops.Col2im(dCol, ops.Slice(dx, s*ly.in, ly.in), g); err != nil {
				return err
			}
		}
	case "maxpool2d":
		if needDx {
			g := ly.pool
			g.Planes *= n.batch
			return ops.MaxPoolBackward(x, dy, dx, g)
		}
	case "relu":
		if needDx {
			return ops.ReluBackward(n.acts[i+1], dy, dx)
		}
	}
	return nil
}

func (n *Net) Params() [][]float32  { return n.params }
func (n *Net) Grads() [][]float32   { return n.grads }
func (n *Net) ParamNames() []string { return n.names }

// Logits returns the outputs of the last Forward or ForwardBackward.
func (n *Net) Logits() []float32 { return n.logits }

// Device names the Ops the net runs on.
func (n *Net) Device() string { return n.ops.Name() }

func (n *Net) Close() error { return n.ops.Close() }
