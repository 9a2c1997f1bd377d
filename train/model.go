package train

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/ringtrain/ringtrain/train/gemm"
)

// Model is what the training loop needs of a compute engine: forward and
// backward on a batch, and parameters and gradients as float32 slices that
// alias the engine's own storage. Gradients are those of the mean loss over
// the batch.
type Model interface {
	// ForwardBackward computes the mean softmax cross-entropy of the n
	// samples in x (n × features, row-major) with labels y, and its
	// gradients. n may be less than the batch size the model was built for.
	ForwardBackward(x []float32, y []int, n int) (loss float32, err error)
	// Forward computes the loss and the logits alone, in evaluation mode
	// (no dropout), and leaves the gradients as they were.
	Forward(x []float32, y []int, n int) (loss float32, err error)
	// Params returns every parameter tensor, in a fixed order.
	Params() [][]float32
	// Grads returns the gradients, in the order of Params. Valid after
	// ForwardBackward.
	Grads() [][]float32
	// ParamNames names the tensors of Params, for messages.
	ParamNames() []string
	// Logits returns the n × classes outputs of the last ForwardBackward
	// or Forward.
	Logits() []float32
	// Close frees the engine.
	Close() error
}

// MaskSeeder is a Model with random layers (dropout). SeedMasks restarts
// the stream its masks are drawn from, so a step's masks depend on the seed
// alone: Replica seeds them with its rank and step count, which makes a
// resumed run draw the masks an uninterrupted one would.
type MaskSeeder interface {
	SeedMasks(seed uint64)
}

// ModelConfig is a model to build: its spec, the largest batch it takes,
// and the seed of its initial weights.
type ModelConfig struct {
	Spec  Spec   `json:"spec"`
	Batch int    `json:"batch"`
	Seed  uint64 `json:"seed"`
	// Threads, if above 0, is how many goroutines the model's products
	// split over; 0 means GOMAXPROCS at each call. A setting of this
	// machine, not of the model: no checkpoint holds it.
	Threads int `json:"-"`
}

// graphModel is a gorgonia graph, built once, run by a tape of its own.
type graphModel struct {
	cfg     ModelConfig
	inputs  int // values per sample
	classes int
	// positions is how many labels a sample has: 1, or a language
	// model's T, each position's next byte.
	positions int
	// targets is how many float targets each row of x carries after its
	// inputs (Spec.Targets); row is inputs+targets.
	targets, row int
	lossScale    float32 // invN's value, which a language model's loss kernel reads
	live         int     // the samples of the batch fed last, which a target loss reads
	g            *G.ExprGraph
	vm           *tape   // forward and backward
	fwd          *tape   // forward alone, for evaluation
	out          *G.Node // the logits
	cost         *G.Node
	last         *tape         // the tape that ran last, whose logits Logits reads
	x, y         *tensor.Dense // inputs, refilled in place every step
	invN         *G.Node
	learn        G.Nodes
	// gradNodes are learn's gradients, in its order (G.Grad's).
	gradNodes G.Nodes
	params    [][]float32
	grads     [][]float32
	names     []string
	drops     []dropout
	masks     *rand.PCG
	blas      *gemm.BLAS // the linear and conv layers' products
	clock     phaseClock
}

// dropout is a layer's mask: an input of the graph multiplied into its
// activations, refilled before every run — 0 or 1/(1−p) while training, 1 in
// evaluation. gorgonia's own Dropout draws one go_rng uniform number per
// element (about +0.8 s a step on the cnn's 64×1024 fc1, measured on these
// machines: 46.8 samples/s); this costs one 64-bit draw per two values.
type dropout struct {
	mask []float32
	keep float32 // 1/(1−p)
	cut  uint32  // a value is dropped when its 32 random bits are below cut
}

// buildMu serialises graph building: gorgonia's node constructors share
// package-level state (internal/encoding's group counter), so two models
// built at once race (seen under -race). Running built graphs does not.
// This lock guards gorgonia's global, not ours.
var buildMu sync.Mutex

// NewModel builds the network a spec describes, with He initialisation
// (Glorot for layers not followed by a ReLU) from the seed. The loss is
// −Σ(log softmax ⊙ one-hot)/n with n fed each step, so a short last batch
// is padded with zero rows that add nothing to it.
func NewModel(cfg ModelConfig) (_ Model, err error) {
	shapes, err := cfg.Shapes()
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	last := shapes[len(shapes)-1]
	m := &graphModel{cfg: cfg, g: G.NewGraph(), inputs: 1, classes: last[len(last)-1], positions: 1,
		masks: rand.NewPCG(cfg.Seed, 0x64726f70), blas: gemm.New(cfg.Threads)}
	if len(last) == 2 { // a language model: every position's next byte
		m.positions = last[0]
	}
	for _, d := range cfg.Spec.Input {
		m.inputs *= d
	}
	m.targets = cfg.Spec.Targets()
	m.row = m.inputs + m.targets
	b := cfg.Batch
	xShape := append([]int{b}, cfg.Spec.Input...)
	m.x = tensor.New(tensor.WithShape(xShape...), tensor.Of(tensor.Float32))
	m.y = tensor.New(tensor.WithShape(b*m.positions, m.classes), tensor.Of(tensor.Float32))
	var x *G.Node
	if len(xShape) == 2 {
		x = G.NewMatrix(m.g, G.Float32, G.WithShape(xShape...), G.WithName("x"), G.WithValue(m.x))
	} else {
		x = G.NewTensor(m.g, G.Float32, 4, G.WithShape(xShape...), G.WithName("x"), G.WithValue(m.x))
	}
	y := G.NewMatrix(m.g, G.Float32, G.WithShape(b*m.positions, m.classes), G.WithName("y"), G.WithValue(m.y))
	m.invN = G.NewScalar(m.g, G.Float32, G.WithName("invN"), G.WithValue(float32(1)))
	init, err := InitParams(cfg)
	if err != nil {
		return nil, err
	}

	// gorgonia panics on shape errors; Shapes has checked them, but a
	// panic must not cross the package boundary all the same.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("train: building the model: %v", r)
		}
	}()
	lg := &layerGraph{g: m.g, cfg: cfg, shapes: shapes, init: init, blas: m.blas, clock: &m.clock,
		saved: map[string]*G.Node{}, savedLearned: map[string]bool{}}
	h := G.Must(lg.build(x, 0, len(cfg.Spec.Layers), false))
	m.learn, m.drops = lg.learn, lg.drops
	cost, err := lossOf(h, y, m.invN, lossParams{loss: cfg.Spec.Loss, classes: m.classes, positions: m.positions,
		bl: m.blas, scale: &m.lossScale, live: &m.live})
	if err != nil {
		return nil, err
	}
	m.out, m.cost = h, cost
	// The forward tape runs what the logits and the loss need, which holds
	// no gradient node.
	m.fwd = newTape(h, cost)
	grads, err := G.Grad(cost, m.learn...)
	if err != nil {
		return nil, fmt.Errorf("train: gradients: %w", err)
	}
	// The gradients are read from their nodes' values after each run.
	// Bound as dual values instead, gorgonia adds each into a tensor of
	// its own, which the step must clear first: two more passes over
	// every gradient, a sixth of the mlp's step.
	m.gradNodes = grads
	m.vm = newTape(append(G.Nodes{h, cost}, grads...)...)
	for _, n := range m.learn {
		m.params = append(m.params, n.Value().Data().([]float32))
		m.names = append(m.names, n.Name())
	}
	return m, nil
}

// logSoftMax is log softmax along each row of h, as s − log Σ exp(s) with
// s = h − the row's max, so that every sum is between 1 and the row's
// length. gorgonia's own LogSoftMax (gorgonia.org/tensor v0.9.23) takes
// each row's max from the first row's first element and the row's others,
// so a row far from that value overflows or underflows to ±Inf: a NaN loss
// once a model grows confident. The max needs no gradient of its own (log
// softmax is the same for every shift of a row), and the one gorgonia
// gives it cancels.
func logSoftMax(h *G.Node) (*G.Node, error) {
	top, err := G.Max(h, 1)
	if err != nil {
		return nil, err
	}
	s, err := G.BroadcastSub(h, top, nil, []byte{1})
	if err != nil {
		return nil, err
	}
	e, err := G.Exp(s)
	if err != nil {
		return nil, err
	}
	sum, err := G.Sum(e, 1)
	if err != nil {
		return nil, err
	}
	lse, err := G.Log(sum)
	if err != nil {
		return nil, err
	}
	return G.BroadcastSub(s, lse, nil, []byte{1})
}

// Param is one parameter tensor of a model: its name, shape and values.
type Param struct {
	Name  string
	Shape []int
	Data  []float32
}

func (p Param) tensor() *tensor.Dense {
	return tensor.New(tensor.WithShape(p.Shape...), tensor.WithBacking(p.Data))
}

// InitParams draws a model's initial parameters from its seed, in the order
// and shapes every engine keeps them (so checkpoints move between engines):
// per linear layer i, "i.linear.weight" (in, out) and "i.linear.bias"
// (1, out); per conv2d, "i.conv2d.weight" (out, in, k, k) and
// "i.conv2d.bias" (1, out, 1, 1). Weights are He, N(0, 2/fanIn), before a
// ReLU and Glorot, N(0, 2/(fanIn+fanOut)), elsewhere; biases are zero.
func InitParams(cfg ModelConfig) ([]Param, error) {
	shapes, err := cfg.Spec.Shapes()
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6d6c70))
	draw := func(fanIn, fanOut int, relu bool, shape ...int) []float32 {
		std := math.Sqrt(2 / float64(fanIn))
		if !relu {
			std = math.Sqrt(2 / float64(fanIn+fanOut))
		}
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * std)
		}
		return v
	}
	normal := func(std float64, shape ...int) []float32 {
		v := make([]float32, shape[0]*shape[1])
		for i := range v {
			v[i] = float32(rng.NormFloat64() * std)
		}
		return v
	}
	gpt := cfg.Spec.Init == "gpt"
	var out []Param
	in := cfg.Spec.Input
	layers := cfg.Spec.Layers
	for i, l := range layers {
		relu := i+1 < len(layers) && layers[i+1].Type == LayerReLU
		name := fmt.Sprintf("%d.%s", i, l.Type)
		switch l.Type {
		case LayerLinear:
			f := in[len(in)-1] // features, or each row's
			w := Param{name + ".weight", []int{f, l.Out}, nil}
			if gpt {
				w.Data = normal(0.02, f, l.Out)
			} else {
				w.Data = draw(f, l.Out, relu, f, l.Out)
			}
			out = append(out, w, Param{name + ".bias", []int{1, l.Out}, make([]float32, l.Out)})
		case LayerEmbedding:
			std := 1.0 // torch's nn.Embedding
			if gpt {
				std = 0.02
			}
			out = append(out,
				Param{name + ".weight", []int{l.vocab(), l.Out}, normal(std, l.vocab(), l.Out)},
				Param{name + ".pos.weight", []int{in[0], l.Out}, normal(std, in[0], l.Out)})
		case LayerLayerNorm:
			w := in[len(in)-1]
			gain := make([]float32, w)
			for j := range gain {
				gain[j] = 1
			}
			out = append(out, Param{name + ".weight", []int{1, w}, gain}, Param{name + ".bias", []int{1, w}, make([]float32, w)})
		case LayerConv2D:
			k := l.Kernel
			out = append(out,
				Param{name + ".weight", []int{l.Out, in[0], k, k}, draw(in[0]*k*k, l.Out*k*k, relu, l.Out, in[0], k, k)},
				Param{name + ".bias", []int{1, l.Out, 1, 1}, make([]float32, l.Out)})
		}
		in = shapes[i]
	}
	return out, nil
}

func (m *graphModel) ForwardBackward(x []float32, y []int, n int) (loss float32, err error) {
	if err := m.feed(x, y, n, true); err != nil {
		return 0, err
	}
	m.clock.arm()
	loss, err = m.run(m.vm)
	if err != nil {
		return loss, err
	}
	// Read each run: an op of gorgonia's may put its result elsewhere
	// from one run to the next (ours keep theirs).
	m.grads = m.grads[:0]
	for i, n := range m.gradNodes {
		d, err := nodeFloats(m.vm.value(n), len(m.params[i]))
		if err != nil {
			return 0, fmt.Errorf("train: the gradient of %s: %w", m.names[i], err)
		}
		m.grads = append(m.grads, d[:len(m.params[i])])
	}
	return loss, nil
}

// Spec is the spec the model was built from.
func (m *graphModel) Spec() Spec { return m.cfg.Spec }

func (m *graphModel) Forward(x []float32, y []int, n int) (float32, error) {
	if err := m.feed(x, y, n, false); err != nil {
		return 0, err
	}
	return m.run(m.fwd)
}

// feed checks a batch and loads it, with fresh dropout masks when training
// and masks of ones when not.
func (m *graphModel) feed(x []float32, y []int, n int, training bool) error {
	if n < 1 || n > m.cfg.Batch || len(x) != n*m.row || len(y) != n*m.positions {
		return fmt.Errorf("train: batch of %d samples with %d values and %d labels; model takes up to %d samples of %d values and %d labels",
			n, len(x), len(y), m.cfg.Batch, m.row, m.positions)
	}
	loadFeatures(m.x.Data().([]float32), x, n, m.row, m.inputs)
	if m.targets > 0 {
		loadTargets(m.y.Data().([]float32), x, n, m.row, m.targets)
	} else if err := oneHot(m.y.Data().([]float32), y, m.classes); err != nil {
		return err
	}
	m.live = n
	for _, d := range m.drops {
		if training {
			d.fill(m.masks)
		} else {
			for i := range d.mask {
				d.mask[i] = 1
			}
		}
	}
	m.lossScale = float32(1) / float32(n*m.positions)
	return G.Let(m.invN, m.lossScale)
}

// lossParams say which loss lossOf builds, and where the values it reads
// each run live.
type lossParams struct {
	loss               Loss
	classes, positions int
	bl                 *gemm.BLAS
	scale              *float32 // invN's value
	live               *int     // the samples fed
}

// lossOf is the loss node of outputs h against targets y, times invN: for
// cross-entropy, y one-hot, −Σ(log softmax ⊙ y)·invN, or, for a language
// model (positions > 1), the same fused into one kernel
// (crossEntropyKernel); for MSE and BCE, y the float targets (targetLoss).
func lossOf(h, y, invN *G.Node, p lossParams) (*G.Node, error) {
	if p.loss != CrossEntropy || p.positions > 1 {
		var k kernel = targetLoss{loss: p.loss, k: p.classes, scale: p.scale, live: p.live}
		if p.loss == CrossEntropy {
			k = newCrossEntropy(p.classes, p.bl, p.scale)
		}
		l, err := applyKernel(k, []bool{true, false}, h, y)
		if err != nil {
			return nil, err
		}
		return G.Sum(l)
	}
	logp, err := logSoftMax(h)
	if err != nil {
		return nil, err
	}
	prod, err := G.HadamardProd(logp, y)
	if err != nil {
		return nil, err
	}
	sum, err := G.Sum(prod)
	if err != nil {
		return nil, err
	}
	scaled, err := G.Mul(sum, invN)
	if err != nil {
		return nil, err
	}
	return G.Neg(scaled)
}

// oneHot writes labels y as one-hot rows of classes values into ys, and
// zeros after them.
func oneHot(ys []float32, y []int, classes int) error {
	clear(ys)
	for i, l := range y {
		if l < 0 || l >= classes {
			return fmt.Errorf("train: label %d of sample %d outside [0, %d)", l, i, classes)
		}
		ys[i*classes+l] = 1
	}
	return nil
}

func (d dropout) fill(src *rand.PCG) {
	for i := 0; i < len(d.mask); i += 2 {
		r := src.Uint64()
		for k, bits := range [2]uint32{uint32(r), uint32(r >> 32)} {
			if i+k < len(d.mask) {
				d.mask[i+k] = d.keep
				if bits < d.cut {
					d.mask[i+k] = 0
				}
			}
		}
	}
}

// run runs a tape and returns the loss.
func (m *graphModel) run(t *tape) (loss float32, err error) {
	if err := t.run(); err != nil {
		return 0, fmt.Errorf("train: forward/backward: %w", err)
	}
	c, ok := t.value(m.cost).Data().(float32)
	if !ok {
		return 0, errors.New("train: loss is not a float32 scalar")
	}
	m.last = t
	return c, nil
}

// randomLayers reports whether the model has dropout, whose masks a
// step draws from its rank's own stream.
func (m *graphModel) randomLayers() bool { return len(m.drops) > 0 }

// SeedMasks restarts the dropout masks' stream at (model seed, seed).
func (m *graphModel) SeedMasks(seed uint64) { m.masks.Seed(m.cfg.Seed, seed^0x64726f70) }

func (m *graphModel) Params() [][]float32  { return m.params }
func (m *graphModel) Grads() [][]float32   { return m.grads }
func (m *graphModel) ParamNames() []string { return m.names }
func (m *graphModel) Close() error         { return nil }
func (m *graphModel) Logits() []float32    { return m.last.value(m.out).Data().([]float32) }

// layerGraph adds a spec's layers to a gorgonia graph: the whole model's,
// or one pipeline stage's.
type layerGraph struct {
	g      *G.ExprGraph
	cfg    ModelConfig
	shapes [][]int // every layer's output shape, from Spec.Shapes
	init   []Param // the whole spec's initial parameters
	blas   *gemm.BLAS
	clock  *phaseClock // the model's: its gradient ops mark backward's start
	// saved holds the outputs layers saved, by name, and savedLearned
	// whether each depends on a parameter (or on an input whose gradient
	// is wanted).
	saved        map[string]*G.Node
	savedLearned map[string]bool
	learn        G.Nodes   // the parameters added, in InitParams' order
	drops        []dropout // the dropout layers added
	dropAt       []int     // the layer index of each of drops
}

// build adds layers [lo, hi) on top of h and returns the last one's
// output. learned says whether h needs a gradient: before the first layer
// with weights of a whole model it does not, and the layers skip computing
// it.
func (lg *layerGraph) build(h *G.Node, lo, hi int, learned bool) (*G.Node, error) {
	b := lg.cfg.Batch
	next := 0 // the next tensor of init
	layers := lg.cfg.Spec.Layers
	for _, l := range layers[:lo] {
		if l.Type.HasParams() {
			next += 2
		}
	}
	in := lg.cfg.Spec.Input
	if lo > 0 {
		in = lg.shapes[lo-1]
	}
	for i := lo; i < hi; i++ {
		l := layers[i]
		var err error
		switch l.Type {
		case LayerLinear, LayerConv2D:
			h, err = lg.learned(h, i, next, in, learned)
			next += 2
			learned = true
		case LayerEmbedding, LayerLayerNorm:
			h, err = lg.sequence(h, i, next, in, learned)
			next += 2
			learned = true
		case LayerAttention, LayerGELU:
			h, err = lg.sequence(h, i, -1, in, learned)
		case LayerMaxPool2D:
			h, err = maxPool2d(h, poolGeom{b: b, c: in[0], h: in[1], w: in[2], k: l.Kernel}, lg.blas)
		case LayerReLU:
			if j := i + 1; j < hi && layers[j].Type == LayerMaxPool2D && l.Save == "" {
				// ReLU then a max-pool is the pool then ReLU, bit for bit,
				// gradients too (both keep order, and a window whose
				// largest is not above 0 passes back 0 either way), on a
				// quarter of the values. The pool's layer is done here.
				pool := layers[j]
				h, err = maxPool2d(h, poolGeom{b: b, c: in[0], h: in[1], w: in[2], k: pool.Kernel}, lg.blas)
				if err == nil {
					h, err = relu(h, lg.blas)
				}
				if err != nil {
					return nil, fmt.Errorf("layers %d and %d (%s, %s): %w", i, j, l.Type, pool.Type, err)
				}
				if pool.Save != "" {
					lg.saved[pool.Save], lg.savedLearned[pool.Save] = h, learned
				}
				i, in = j, lg.shapes[j]
				continue
			}
			h, err = relu(h, lg.blas)
		case LayerSigmoid:
			h, err = G.Sigmoid(h)
		case LayerTanh:
			h, err = G.Tanh(h)
		case LayerFlatten:
			h, err = G.Reshape(h, tensor.Shape{b, lg.shapes[i][0]})
		case LayerAdd:
			if h.Dims() == 2 { // the kernel op is typed for matrices; conv activations take gorgonia's
				h, err = applyKernel(addKernel{}, []bool{true, true}, h, lg.saved[l.From])
			} else {
				h, err = G.Add(h, lg.saved[l.From])
			}
			learned = learned || lg.savedLearned[l.From]
		case LayerDropout:
			h, err = lg.dropout(h, i, in)
		}
		if err != nil {
			return nil, fmt.Errorf("layer %d (%s): %w", i, l.Type, err)
		}
		if l.Save != "" {
			lg.saved[l.Save], lg.savedLearned[l.Save] = h, learned
		}
		in = lg.shapes[i]
	}
	return h, nil
}

// dropout builds layer i, a dropout, on h, whose input shape is in: h
// times a mask that is refilled before every run.
func (lg *layerGraph) dropout(h *G.Node, i int, in []int) (*G.Node, error) {
	l, shape := lg.cfg.Spec.Layers[i], activation(lg.cfg.Batch, in)
	mt := tensor.New(tensor.WithShape(shape...), tensor.Of(tensor.Float32))
	mn := G.NewTensor(lg.g, G.Float32, len(shape), G.WithShape(shape...), G.WithName(fmt.Sprintf("%d.%s.mask", i, l.Type)), G.WithValue(mt))
	lg.drops = append(lg.drops, dropout{mask: mt.Data().([]float32), keep: float32(1 / (1 - l.P)),
		cut: uint32(math.Min(l.P*(1<<32), math.MaxUint32))})
	lg.dropAt = append(lg.dropAt, i)
	return G.HadamardProd(h, mn)
}

// learned builds layer i, a linear or conv2d layer, on h, whose input
// shape is in, its weight and bias made from init[k] and init[k+1];
// inLearned says whether h depends on learned parameters already.
func (lg *layerGraph) learned(h *G.Node, i, k int, in []int, inLearned bool) (*G.Node, error) {
	l, b := lg.cfg.Spec.Layers[i], lg.cfg.Batch
	name := fmt.Sprintf("%d.%s", i, l.Type)
	w, bias := lg.init[k].tensor(), lg.init[k+1].tensor()
	var wn, bn *G.Node
	var err error
	if l.Type == LayerLinear {
		rows, f := b, in[0]
		if len(in) == 2 { // each row of a sequence
			rows, f = b*in[0], in[1]
		}
		wn = G.NewMatrix(lg.g, G.Float32, G.WithShape(f, l.Out), G.WithName(name+".weight"), G.WithValue(w))
		bn = G.NewMatrix(lg.g, G.Float32, G.WithShape(1, l.Out), G.WithName(name+".bias"), G.WithValue(bias))
		h, err = linear(h, wn, bn, rows, f, l.Out, inLearned, lg.blas, lg.clock)
	} else {
		wn = G.NewTensor(lg.g, G.Float32, 4, G.WithShape(l.Out, in[0], l.Kernel, l.Kernel), G.WithName(name+".weight"), G.WithValue(w))
		bn = G.NewTensor(lg.g, G.Float32, 4, G.WithShape(1, l.Out, 1, 1), G.WithName(name+".bias"), G.WithValue(bias))
		oh, ow := in[1]+2*l.Pad-l.Kernel+1, in[2]+2*l.Pad-l.Kernel+1
		cg := convGeom{b: b, c: in[0], h: in[1], w: in[2], o: l.Out, k: l.Kernel, pad: l.Pad, oh: oh, ow: ow}
		h, err = conv2d(h, wn, bn, cg, inLearned, lg.blas, lg.clock)
	}
	lg.learn = append(lg.learn, wn, bn)
	return h, err
}

// sequence builds layer i, a language model's layer, on h, whose input
// shape is in — an embedding's or a layernorm's two tensors made from
// init[k] and init[k+1]; inLearned says whether h depends on learned
// parameters already.
func (lg *layerGraph) sequence(h *G.Node, i, k int, in []int, inLearned bool) (*G.Node, error) {
	l := lg.cfg.Spec.Layers[i]
	switch l.Type {
	case LayerAttention:
		return applyKernel(newAttention(in[0], in[1]/3, l.Heads, lg.blas), []bool{inLearned}, h)
	case LayerGELU:
		return applyKernel(newGELU(lg.blas), []bool{inLearned}, h)
	}
	a, b := lg.init[k], lg.init[k+1]
	an := G.NewMatrix(lg.g, G.Float32, G.WithShape(a.Shape...), G.WithName(a.Name), G.WithValue(a.tensor()))
	bn := G.NewMatrix(lg.g, G.Float32, G.WithShape(b.Shape...), G.WithName(b.Name), G.WithValue(b.tensor()))
	lg.learn = append(lg.learn, an, bn)
	if l.Type == LayerEmbedding {
		return applyKernel(embeddingKernel{vocab: l.vocab(), dim: l.Out, T: in[0]}, []bool{false, true, true}, h, an, bn)
	}
	if len(in) == 1 { // flat features: one row per sample
		return applyKernel(newLayerNorm(in[0], lg.blas), []bool{inLearned, true, true}, h, an, bn)
	}
	return applyKernel(newLayerNorm(in[1], lg.blas), []bool{inLearned, true, true}, h, an, bn)
}

// nodeFloats is a node's value as float32s, at least want of them.
func nodeFloats(v G.Value, want int) ([]float32, error) {
	if v == nil {
		return nil, fmt.Errorf("no value")
	}
	d, ok := v.Data().([]float32)
	if !ok || len(d) < want {
		return nil, fmt.Errorf("%d values, want %d", len(d), want)
	}
	return d, nil
}
