package train

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
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
	// Params returns every parameter tensor, in a fixed order.
	Params() [][]float32
	// Grads returns the gradients, in the order of Params. Valid after
	// ForwardBackward.
	Grads() [][]float32
	// ParamNames names the tensors of Params, for messages.
	ParamNames() []string
	// Logits returns the n × classes outputs of the last ForwardBackward.
	Logits() []float32
	// Close frees the engine.
	Close() error
}

// MLPConfig describes a fully connected ReLU network.
type MLPConfig struct {
	Inputs  int   // features per sample
	Hidden  []int // widths of the hidden layers
	Classes int
	Batch   int    // largest batch the graph takes
	Seed    uint64 // for He initialisation
}

// mlp is a gorgonia graph run by one TapeMachine, built once; Reset before
// every run (without it RunAll silently does nothing).
type mlp struct {
	cfg     MLPConfig
	g       *G.ExprGraph
	vm      G.VM
	x, y    *tensor.Dense // inputs, refilled in place every step
	invN    *G.Node
	learn   G.Nodes
	params  [][]float32
	grads   [][]float32
	names   []string
	costVal G.Value
	outVal  G.Value // logits, batch × classes
}

// NewMLP builds the network. The loss is −Σ(log softmax ⊙ one-hot)/n with n
// fed each step, so a short last batch is padded with zero rows that add
// nothing to it.
func NewMLP(cfg MLPConfig) (_ Model, err error) {
	if cfg.Inputs < 1 || cfg.Classes < 2 || cfg.Batch < 1 {
		return nil, fmt.Errorf("train: MLP with %d inputs, %d classes, batch %d: want ≥ 1, ≥ 2, ≥ 1", cfg.Inputs, cfg.Classes, cfg.Batch)
	}
	m := &mlp{cfg: cfg, g: G.NewGraph()}
	m.x = tensor.New(tensor.WithShape(cfg.Batch, cfg.Inputs), tensor.Of(tensor.Float32))
	m.y = tensor.New(tensor.WithShape(cfg.Batch, cfg.Classes), tensor.Of(tensor.Float32))
	x := G.NewMatrix(m.g, G.Float32, G.WithShape(cfg.Batch, cfg.Inputs), G.WithName("x"), G.WithValue(m.x))
	y := G.NewMatrix(m.g, G.Float32, G.WithShape(cfg.Batch, cfg.Classes), G.WithName("y"), G.WithValue(m.y))
	m.invN = G.NewScalar(m.g, G.Float32, G.WithName("invN"), G.WithValue(float32(1)))
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6d6c70))

	// gorgonia panics on shape errors; the shapes here are ours, but a
	// panic must not cross the package boundary all the same.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("train: building MLP: %v", r)
		}
	}()
	h := x
	in := cfg.Inputs
	widths := append(append([]int(nil), cfg.Hidden...), cfg.Classes)
	for i, out := range widths {
		w := heInit(rng, in, out)
		wn := G.NewMatrix(m.g, G.Float32, G.WithShape(in, out), G.WithName(fmt.Sprintf("fc%d.weight", i+1)), G.WithValue(w))
		bn := G.NewMatrix(m.g, G.Float32, G.WithShape(1, out), G.WithName(fmt.Sprintf("fc%d.bias", i+1)), G.WithInit(G.Zeroes()))
		h = G.Must(G.BroadcastAdd(G.Must(G.Mul(h, wn)), bn, nil, []byte{0}))
		if i < len(widths)-1 {
			h = G.Must(G.Rectify(h))
		}
		m.learn = append(m.learn, wn, bn)
		in = out
	}
	G.Read(h, &m.outVal)
	logp := G.Must(G.LogSoftMax(h))
	cost := G.Must(G.Neg(G.Must(G.Mul(G.Must(G.Sum(G.Must(G.HadamardProd(logp, y)))), m.invN))))
	G.Read(cost, &m.costVal)
	if _, err := G.Grad(cost, m.learn...); err != nil {
		return nil, fmt.Errorf("train: MLP gradients: %w", err)
	}
	m.vm = G.NewTapeMachine(m.g, G.BindDualValues(m.learn...))
	for _, n := range m.learn {
		m.params = append(m.params, n.Value().Data().([]float32))
		m.names = append(m.names, n.Name())
	}
	return m, nil
}

// heInit draws weights from N(0, 2/fanIn), He initialisation for ReLU.
func heInit(rng *rand.Rand, fanIn, fanOut int) *tensor.Dense {
	std := math.Sqrt(2 / float64(fanIn))
	v := make([]float32, fanIn*fanOut)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * std)
	}
	return tensor.New(tensor.WithShape(fanIn, fanOut), tensor.WithBacking(v))
}

func (m *mlp) ForwardBackward(x []float32, y []int, n int) (loss float32, err error) {
	if n < 1 || n > m.cfg.Batch || len(x) != n*m.cfg.Inputs || len(y) != n {
		return 0, fmt.Errorf("train: batch of %d samples with %d features and %d labels; model takes up to %d samples of %d features",
			n, len(x), len(y), m.cfg.Batch, m.cfg.Inputs)
	}
	xs := m.x.Data().([]float32)
	copy(xs, x)
	clear(xs[len(x):])
	ys := m.y.Data().([]float32)
	clear(ys)
	for i, l := range y {
		if l < 0 || l >= m.cfg.Classes {
			return 0, fmt.Errorf("train: label %d of sample %d outside [0, %d)", l, i, m.cfg.Classes)
		}
		ys[i*m.cfg.Classes+l] = 1
	}
	if err := G.Let(m.invN, float32(1)/float32(n)); err != nil {
		return 0, err
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("train: forward/backward: %v", r)
		}
	}()
	// Backward adds into the gradient tensors, and neither Reset nor
	// RunAll clears them (gorgonia's own solvers do, in Step): without
	// this, every step's gradient would carry all the earlier ones.
	for _, g := range m.grads {
		clear(g)
	}
	m.vm.Reset()
	if err := m.vm.RunAll(); err != nil {
		return 0, fmt.Errorf("train: forward/backward: %w", err)
	}
	if m.grads == nil {
		// Gradient storage is allocated by the first run and stays put.
		for _, n := range m.learn {
			gv, err := n.Grad()
			if err != nil {
				return 0, err
			}
			m.grads = append(m.grads, gv.Data().([]float32))
		}
	}
	c, ok := m.costVal.Data().(float32)
	if !ok {
		return 0, errors.New("train: loss is not a float32 scalar")
	}
	return c, nil
}

func (m *mlp) Params() [][]float32  { return m.params }
func (m *mlp) Grads() [][]float32   { return m.grads }
func (m *mlp) ParamNames() []string { return m.names }
func (m *mlp) Close() error         { return m.vm.Close() }
func (m *mlp) Logits() []float32    { return m.outVal.Data().([]float32) }
