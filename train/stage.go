package train

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/ringtrain/ringtrain/train/gemm"
)

// ErrStage means a stage was handed tensors it cannot take: the wrong
// number, the wrong size, or gradients for the last stage.
var ErrStage = errors.New("train: bad stage input")

// StageConfig is one pipeline stage: layers [Lo, Hi) of Model.Spec, run on
// micro-batches of up to Model.Batch samples. Its parameters are the
// whole model's from Model.Seed, so a split model starts where the whole
// one does.
type StageConfig struct {
	Model  ModelConfig
	Lo, Hi int
	// Threads is how many goroutines one matrix product is split over;
	// 0 means GOMAXPROCS.
	Threads int
}

// Carry is a tensor that crosses a stage boundary: the activation (Name
// "") or an output a layer saved (Name: its save name) for a later one.
// Shape is per sample.
type Carry struct {
	Name  string
	Shape []int
}

// Values is how many values one sample of c has.
func (c Carry) Values() int {
	n, _ := values(c.Shape...)
	return n
}

// Stage is one pipeline stage of a model: a gorgonia graph of its layers
// whose inputs are the activation that enters it (the data, on the first
// stage) and the saved outputs of earlier stages its layers use; and whose
// outputs are its last layer's activation and the outputs it saves for
// later stages — or, on the last stage, the loss.
//
// Activations are not kept between Forward and Backward: Backward runs the
// forward pass again from the stage's input before it differentiates (as
// GPipe does), so what a stage holds per micro-batch in flight is its
// input, and the caller holds that. Parameter gradients add up over the
// Backward calls, in call order, until ZeroGrads.
type Stage struct {
	cfg     StageConfig
	first   bool // takes the data
	last    bool // computes the loss
	in, out []Carry
	classes int
	// positions is the labels a sample has: 1, or a language model's
	// context.
	positions int
	targets   int     // float targets per sample (Spec.Targets); 0 for labels
	lossScale float32 // invN's value, which a language model's loss kernel reads
	live      int     // the samples fed last, which a target loss reads

	g       *G.ExprGraph
	vm      *tape // forward and backward
	fwd     *tape // forward alone
	inputs  []*tensor.Dense
	inNodes G.Nodes
	outs    G.Nodes         // output nodes, in the order of out
	gouts   []*tensor.Dense // the gradients of outs, fed to Backward
	y       *tensor.Dense
	invN    *G.Node
	learn   G.Nodes
	params  [][]float32
	grads   [][]float32 // the graph's, one micro-batch's
	// gradNodes are the gradients of the learnables, then of the inputs
	// (for all but the first stage), in that order (G.Grad's).
	gradNodes G.Nodes
	acc       [][]float32 // summed over micro-batches
	names     []string
	logits    *G.Node // the last stage's
	cost      *G.Node // the last stage's loss
	ran       *tape   // the tape that ran last

	drops  []dropout
	dropAt []int
	masks  uint64 // the seed of this step's masks
}

// StageCarries returns what crosses into layer lo of spec (the boundary
// after layer lo−1): the activation, then every output a layer before lo
// saved that a layer from lo on uses, in the order of the saving layers.
func StageCarries(spec Spec, lo int) ([]Carry, error) {
	shapes, err := spec.Shapes()
	if err != nil {
		return nil, err
	}
	if lo < 1 || lo >= len(spec.Layers) {
		return nil, fmt.Errorf("boundary before layer %d of %d: %w", lo, len(spec.Layers), ErrSpec)
	}
	out := []Carry{{Shape: shapes[lo-1]}}
	for i, l := range spec.Layers[:lo] {
		if l.Save == "" {
			continue
		}
		for _, later := range spec.Layers[lo:] {
			if later.From == l.Save {
				out = append(out, Carry{Name: l.Save, Shape: shapes[i]})
				break
			}
		}
	}
	return out, nil
}

// stageCarries are what stage cfg takes in — the data on the first stage,
// else the previous layer's output and the saved outputs its layers use —
// and, but on the last, what it hands on: its output and the saved
// outputs of its own layers that later stages use. A carried output that
// no layer of the stage uses passes by it (the pipeline forwards it).
func stageCarries(cfg StageConfig) (in, out []Carry, err error) {
	layers := cfg.Model.Spec.Layers
	if cfg.Lo == 0 {
		in = []Carry{{Shape: cfg.Model.Spec.Input}}
	} else if in, err = StageCarries(cfg.Model.Spec, cfg.Lo); err != nil {
		return nil, nil, err
	}
	uses, savedHere := map[string]bool{}, map[string]bool{}
	for _, l := range layers[cfg.Lo:cfg.Hi] {
		if l.From != "" {
			uses[l.From] = true
		}
		if l.Save != "" {
			savedHere[l.Save] = true
		}
	}
	in = slices.DeleteFunc(in, func(c Carry) bool { return c.Name != "" && !uses[c.Name] })
	if cfg.Hi == len(layers) {
		return in, nil, nil
	}
	next, err := StageCarries(cfg.Model.Spec, cfg.Hi)
	if err != nil {
		return nil, nil, err
	}
	return in, slices.DeleteFunc(next, func(c Carry) bool { return c.Name != "" && !savedHere[c.Name] }), nil
}

// NewStage builds layers [Lo, Hi) of a model as a stage.
func NewStage(cfg StageConfig) (_ *Stage, err error) {
	shapes, err := cfg.Model.Shapes()
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	layers := cfg.Model.Spec.Layers
	if cfg.Lo < 0 || cfg.Lo >= cfg.Hi || cfg.Hi > len(layers) {
		return nil, fmt.Errorf("train: stage of layers [%d, %d) of %d: %w", cfg.Lo, cfg.Hi, len(layers), ErrSpec)
	}
	lastShape := shapes[len(shapes)-1]
	s := &Stage{cfg: cfg, first: cfg.Lo == 0, last: cfg.Hi == len(layers), classes: lastShape[len(lastShape)-1], positions: 1,
		targets: cfg.Model.Spec.Targets()}
	if len(lastShape) == 2 { // a language model: a label per position
		s.positions = lastShape[0]
	}
	if s.in, s.out, err = stageCarries(cfg); err != nil {
		return nil, err
	}
	init, err := InitParams(cfg.Model)
	if err != nil {
		return nil, err
	}

	buildMu.Lock()
	defer buildMu.Unlock()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("train: building stage [%d, %d): %v", cfg.Lo, cfg.Hi, r)
		}
	}()
	b := cfg.Model.Batch
	s.g = G.NewGraph()
	lg := &layerGraph{g: s.g, cfg: cfg.Model, shapes: shapes, init: init, blas: gemm.New(cfg.Threads),
		saved: map[string]*G.Node{}, savedLearned: map[string]bool{}}
	s.inputNodes(lg, b)
	h, err := lg.build(s.inNodes[0], cfg.Lo, cfg.Hi, !s.first)
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	s.learn, s.drops, s.dropAt = lg.learn, lg.drops, lg.dropAt
	s.invN = G.NewScalar(s.g, G.Float32, G.WithName("invN"), G.WithValue(float32(1)))
	var cost *G.Node
	var roots G.Nodes
	if s.last {
		s.y = tensor.New(tensor.WithShape(b*s.positions, s.classes), tensor.Of(tensor.Float32))
		y := G.NewMatrix(s.g, G.Float32, G.WithShape(b*s.positions, s.classes), G.WithName("y"), G.WithValue(s.y))
		if cost, err = lossOf(h, y, s.invN, lossParams{loss: cfg.Model.Spec.Loss, classes: s.classes,
			positions: s.positions, bl: lg.blas, scale: &s.lossScale, live: &s.live}); err != nil {
			return nil, fmt.Errorf("train: %w", err)
		}
		s.logits, s.cost = h, cost
		roots = append(roots, h, cost)
	} else {
		cost = s.outputNodes(lg, h, b)
		roots = append(roots, s.outs...)
	}
	s.fwd = newTape(roots...)
	wrt := append(G.Nodes{}, s.learn...)
	if !s.first {
		wrt = append(wrt, s.inNodes...)
	}
	if len(wrt) > 0 {
		// Read from their nodes after each run, as graphModel's are: bound
		// as dual values, each would be added into a tensor cleared first.
		grads, err := G.Grad(cost, wrt...)
		if err != nil {
			return nil, fmt.Errorf("train: stage gradients: %w", err)
		}
		s.gradNodes = grads
	}
	s.vm = newTape(append(roots, s.gradNodes...)...)
	for _, n := range s.learn {
		p := n.Value().Data().([]float32)
		s.params = append(s.params, p)
		s.acc = append(s.acc, make([]float32, len(p)))
		s.names = append(s.names, n.Name())
	}
	return s, nil
}

// inputNodes are the stage's inputs (s.in) as graph nodes of batch b,
// with the tensors they read; a saved output carried in is also where
// the stage's layers find it by name.
func (s *Stage) inputNodes(lg *layerGraph, b int) {
	for k, c := range s.in {
		shape := activation(b, c.Shape)
		t := tensor.New(tensor.WithShape(shape...), tensor.Of(tensor.Float32))
		n := G.NewTensor(s.g, G.Float32, len(shape), G.WithShape(shape...), G.WithName(fmt.Sprintf("in.%d", k)), G.WithValue(t))
		s.inputs, s.inNodes = append(s.inputs, t), append(s.inNodes, n)
		if c.Name != "" {
			lg.saved[c.Name], lg.savedLearned[c.Name] = n, true
		}
	}
}

// outputNodes makes the stage's outputs (s.out: h, the last layer's, or a
// saved one) and the gradients that will come back for them, and returns
// backward's objective for a stage before the last: Σ out ⊙ ∂L/∂out over
// the outputs, whose gradient with respect to anything before them is
// the loss's, bit for bit (the ones Sum hands back multiply exactly).
func (s *Stage) outputNodes(lg *layerGraph, h *G.Node, b int) *G.Node {
	var cost *G.Node
	for k, c := range s.out {
		n := h
		if c.Name != "" {
			n = lg.saved[c.Name]
		}
		shape := activation(b, c.Shape)
		t := tensor.New(tensor.WithShape(shape...), tensor.Of(tensor.Float32))
		gn := G.NewTensor(s.g, G.Float32, len(shape), G.WithShape(shape...), G.WithName(fmt.Sprintf("gout.%d", k)), G.WithValue(t))
		s.outs, s.gouts = append(s.outs, n), append(s.gouts, t)
		term := G.Must(G.Sum(G.Must(G.HadamardProd(n, gn))))
		if cost == nil {
			cost = term
		} else {
			cost = G.Must(G.Add(cost, term))
		}
	}
	return cost
}

// Inputs is what Forward and Backward take, in order: the activation (the
// data on the first stage), then the saved outputs of earlier stages that
// this stage's layers use.
func (s *Stage) Inputs() []Carry { return s.in }

// Outputs is what Forward returns and Backward takes the gradients of: the
// activation, then the outputs this stage saves for later stages. None on
// the last stage.
func (s *Stage) Outputs() []Carry { return s.out }

// Last says whether the stage computes the loss.
func (s *Stage) Last() bool { return s.last }

// SetLossScale sets what the loss of every sample is multiplied by: one
// over the samples of the whole batch, so that the gradients summed over
// its micro-batches are those of the batch's mean loss.
func (s *Stage) SetLossScale(invN float32) error {
	s.lossScale = invN
	return G.Let(s.invN, invN)
}

// SeedMasks restarts the dropout masks at seed; each micro-batch's masks
// are drawn from (seed, layer, micro-batch), so they do not depend on how
// the layers are split or in which order micro-batches run.
func (s *Stage) SeedMasks(seed uint64) { s.masks = seed }

// feed loads a micro-batch's inputs (rows samples; the rest of the
// micro-batch is zero) and labels, and its dropout masks.
func (s *Stage) feed(mb int, in [][]float32, y Labels, rows int, training bool) error {
	if rows < 1 || rows > s.cfg.Model.Batch {
		return fmt.Errorf("stage [%d, %d): %d samples; it takes 1 to %d: %w", s.cfg.Lo, s.cfg.Hi, rows, s.cfg.Model.Batch, ErrStage)
	}
	if len(in) != len(s.in) {
		return fmt.Errorf("stage [%d, %d): %d input tensors; want %d: %w", s.cfg.Lo, s.cfg.Hi, len(in), len(s.in), ErrStage)
	}
	for k, c := range s.in {
		if want := rows * c.Values(); len(in[k]) != want {
			return fmt.Errorf("stage [%d, %d): input %d (%q) has %d values; want %d: %w", s.cfg.Lo, s.cfg.Hi, k, c.Name, len(in[k]), want, ErrStage)
		}
		d := s.inputs[k].Data().([]float32)
		copy(d, in[k])
		clear(d[len(in[k]):])
	}
	if s.last {
		if err := s.feedLabels(y, rows); err != nil {
			return err
		}
	}
	for k, d := range s.drops {
		if training {
			d.fill(rand.NewPCG(s.cfg.Model.Seed^uint64(s.dropAt[k])<<32, s.masks^uint64(mb)*0x9e3779b97f4a7c15))
		} else {
			for i := range d.mask {
				d.mask[i] = 1
			}
		}
	}
	return nil
}

// Labels are what the last stage's loss compares its outputs with: a
// class per position, or, for a model with float targets (MSE, BCE), each
// sample's targets, rows × Spec.Targets.
type Labels struct {
	Class  []int
	Target []float32
}

func (s *Stage) feedLabels(y Labels, rows int) error {
	s.live = rows
	if s.targets > 0 {
		if len(y.Target) != rows*s.targets {
			return fmt.Errorf("stage [%d, %d): %d targets for %d samples of %d: %w", s.cfg.Lo, s.cfg.Hi, len(y.Target), rows, s.targets, ErrStage)
		}
		ys := s.y.Data().([]float32)
		copy(ys, y.Target)
		clear(ys[len(y.Target):])
		return nil
	}
	if len(y.Class) != rows*s.positions {
		return fmt.Errorf("stage [%d, %d): %d labels for %d samples of %d: %w", s.cfg.Lo, s.cfg.Hi, len(y.Class), rows, s.positions, ErrStage)
	}
	return oneHot(s.y.Data().([]float32), y.Class, s.classes)
}

// run runs a tape and returns the loss on the last stage.
func (s *Stage) run(t *tape) (loss float32, err error) {
	if err := t.run(); err != nil {
		return 0, fmt.Errorf("train: stage [%d, %d): %w", s.cfg.Lo, s.cfg.Hi, err)
	}
	s.ran = t
	if !s.last {
		return 0, nil
	}
	c, ok := t.value(s.cost).Data().(float32)
	if !ok {
		return 0, errors.New("train: loss is not a float32 scalar")
	}
	return c, nil
}

// Forward runs micro-batch mb forward and returns the stage's outputs,
// rows samples each (slices of the stage's own memory, valid until the
// next call) — or, on the last stage, the loss. training draws dropout
// masks; without it dropout passes everything.
func (s *Stage) Forward(mb int, in [][]float32, y Labels, rows int, training bool) (out [][]float32, loss float32, err error) {
	if err := s.feed(mb, in, y, rows, training); err != nil {
		return nil, 0, err
	}
	if loss, err = s.run(s.fwd); err != nil {
		return nil, 0, err
	}
	for k, n := range s.outs {
		out = append(out, s.fwd.value(n).Data().([]float32)[:rows*s.out[k].Values()])
	}
	return out, loss, nil
}

// Backward runs micro-batch mb forward again from its inputs, then
// backward from gout (the gradients of Outputs; nil on the last stage),
// adds its parameter gradients to the sum, and returns the gradients of
// its inputs (nil on the first stage: nothing wants the data's) and, on
// the last stage, the loss.
func (s *Stage) Backward(mb int, in [][]float32, y Labels, rows int, gout [][]float32) (gin [][]float32, loss float32, err error) {
	if err := s.feed(mb, in, y, rows, true); err != nil {
		return nil, 0, err
	}
	if len(gout) != len(s.out) {
		return nil, 0, fmt.Errorf("stage [%d, %d): %d output gradients; want %d: %w", s.cfg.Lo, s.cfg.Hi, len(gout), len(s.out), ErrStage)
	}
	for k, c := range s.out {
		if want := rows * c.Values(); len(gout[k]) != want {
			return nil, 0, fmt.Errorf("stage [%d, %d): gradient of output %d (%q) has %d values; want %d: %w", s.cfg.Lo, s.cfg.Hi, k, c.Name, len(gout[k]), want, ErrStage)
		}
		d := s.gouts[k].Data().([]float32)
		copy(d, gout[k])
		clear(d[len(gout[k]):])
	}
	if loss, err = s.run(s.vm); err != nil {
		return nil, 0, err
	}
	s.grads = s.grads[:0]
	for i := range s.learn {
		g, err := nodeFloats(s.vm.value(s.gradNodes[i]), len(s.params[i]))
		if err != nil {
			return nil, 0, fmt.Errorf("train: stage [%d, %d): the gradient of %s: %w", s.cfg.Lo, s.cfg.Hi, s.names[i], err)
		}
		s.grads = append(s.grads, g)
	}
	for i, g := range s.grads {
		a := s.acc[i]
		for j, v := range g {
			a[j] += v
		}
	}
	if s.first {
		return nil, loss, nil
	}
	for k := range s.inNodes {
		g, err := nodeFloats(s.vm.value(s.gradNodes[len(s.learn)+k]), rows*s.in[k].Values())
		if err != nil {
			return nil, 0, fmt.Errorf("train: stage [%d, %d): gradient of input %d: %w", s.cfg.Lo, s.cfg.Hi, k, err)
		}
		gin = append(gin, g[:rows*s.in[k].Values()])
	}
	return gin, loss, nil
}

// ZeroGrads starts a new sum of gradients.
func (s *Stage) ZeroGrads() {
	for _, a := range s.acc {
		clear(a)
	}
}

// Params returns the stage's parameter tensors, in the whole model's
// order (and names: ParamNames).
func (s *Stage) Params() [][]float32 { return s.params }

// Grads returns the gradients summed since ZeroGrads, in Params' order.
func (s *Stage) Grads() [][]float32 { return s.acc }

// ParamNames names Params' tensors as the whole model does.
func (s *Stage) ParamNames() []string { return s.names }

// Positions is how many labels a sample has: 1, or a language model's
// context, a label per position.
func (s *Stage) Positions() int { return s.positions }

// Targets is how many float targets a sample has (Spec.Targets): what the
// last stage's Labels.Target holds per sample; 0 where labels are classes.
func (s *Stage) Targets() int { return s.targets }

// Logits returns the last Forward's or Backward's micro-batch × classes
// outputs on the last stage (× positions, for a language model).
func (s *Stage) Logits() []float32 {
	if s.logits == nil || s.ran == nil {
		return nil
	}
	return s.ran.value(s.logits).Data().([]float32)
}

// activation is how a batch of b samples of shape is held in the graph:
// a language model's rows of features as one matrix of b·rows rows, the
// rest as b samples of shape.
func activation(b int, shape []int) []int {
	if len(shape) == 2 {
		return []int{b * shape[0], shape[1]}
	}
	return append([]int{b}, shape...)
}

// Close frees what the stage holds: nothing beyond memory, now.
func (s *Stage) Close() error { return nil }
