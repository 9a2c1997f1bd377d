package train

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"

	"github.com/ringtrain/ringtrain/train/vec"
)

// Optimizer updates parameters from gradients, in place. Its state lives in
// plain slices so that it can be checkpointed and sent to a joining peer.
type Optimizer interface {
	Step(params, grads [][]float32)
	// State returns the optimizer's name, its step count and its state
	// tensors (which alias the optimizer's own).
	State() (name string, step int, tensors [][]float32)
	// SetState restores what State returned, for these params.
	SetState(step int, tensors, params [][]float32) error
	// SetLR changes the learning rate (a schedule calls it every epoch).
	SetLR(lr float32)
}

// restore copies saved tensors into fresh ones shaped like want.
func restore(saved [][]float32, want [][]float32) ([][]float32, error) {
	if len(saved) != len(want) {
		return nil, fmt.Errorf("train: optimizer state has %d tensors, want %d: %w", len(saved), len(want), ErrCheckpoint)
	}
	out := zerosLike(want)
	for i := range want {
		if len(saved[i]) != len(want[i]) {
			return nil, fmt.Errorf("train: optimizer state tensor %d has %d values, want %d: %w", i, len(saved[i]), len(want[i]), ErrCheckpoint)
		}
		copy(out[i], saved[i])
	}
	return out, nil
}

// SGD is torch.optim.SGD: with weight decay wd and momentum mu,
// g ← g + wd·p; v ← mu·v + g; p ← p − lr·v.
type SGD struct {
	LR, Momentum, WeightDecay float32
	velocity                  [][]float32
}

// Step applies one update.
func (o *SGD) Step(params, grads [][]float32) {
	if o.Momentum != 0 && o.velocity == nil {
		o.velocity = zerosLike(params)
	}
	// train/vec runs the loop in AVX-512 or AVX2 where it can, with the
	// same bits as the Go loop: a vector pays the CPU's slow path for
	// subnormal momentum once per 8–16 values where the scalar loop paid
	// it per value (a third of the mlp's step).
	for i, p := range params {
		var v []float32
		if o.Momentum != 0 {
			v = o.velocity[i]
		}
		g := grads[i]
		split(len(p), func(lo, hi int) {
			var vv []float32
			if v != nil {
				vv = v[lo:hi]
			}
			vec.SGD(p[lo:hi], g[lo:hi], vv, o.LR, o.Momentum, o.WeightDecay)
		})
	}
}

// SetLR changes the learning rate.
func (o *SGD) SetLR(lr float32) { o.LR = lr }

// State is the momentum buffers (none before the first step or without
// momentum).
func (o *SGD) State() (string, int, [][]float32) { return "sgd", 0, o.velocity }

// SetState restores momentum buffers.
func (o *SGD) SetState(_ int, tensors, params [][]float32) error {
	if len(tensors) == 0 {
		o.velocity = nil
		return nil
	}
	v, err := restore(tensors, params)
	o.velocity = v
	return err
}

// Adam is torch.optim.Adam (weight decay added to the gradient).
type Adam struct {
	LR, Beta1, Beta2, Eps, WeightDecay float32
	m, v                               [][]float32
	t                                  int
}

// NewAdam returns Adam with torch's defaults for everything but lr.
func NewAdam(lr float32) *Adam { return &Adam{LR: lr, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8} }

// Step applies one update.
func (o *Adam) Step(params, grads [][]float32) { o.step(params, grads, o.WeightDecay, nil) }

// step is Adam's update with wd added to the gradient; keep, if set,
// scales tensor i's parameters first (AdamW's decoupled decay; 1 leaves
// them).
func (o *Adam) step(params, grads [][]float32, wd float32, keep func(i int) float32) {
	if o.m == nil {
		o.m, o.v = zerosLike(params), zerosLike(params)
	}
	o.t++
	bc1 := 1 - math.Pow(float64(o.Beta1), float64(o.t))
	bc2 := 1 - math.Pow(float64(o.Beta2), float64(o.t))
	step := o.LR / float32(bc1)
	sq := float32(math.Sqrt(bc2))
	for i, p := range params {
		g, m, v := grads[i], o.m[i], o.v[i]
		k := float32(1)
		if keep != nil {
			k = keep(i)
		}
		split(len(p), func(lo, hi int) {
			if k != 1 {
				for j := lo; j < hi; j++ {
					p[j] *= k
				}
			}
			vec.Adam(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], step, sq, o.Beta1, o.Beta2, wd, o.Eps)
		})
	}
}

// SetLR changes the learning rate.
func (o *Adam) SetLR(lr float32) { o.LR = lr }

// State is the first moments, then the second, and the step count.
func (o *Adam) State() (string, int, [][]float32) { return "adam", o.t, slices.Concat(o.m, o.v) }

// SetState restores moments and step count.
func (o *Adam) SetState(step int, tensors, params [][]float32) error {
	if len(tensors) == 0 {
		o.m, o.v, o.t = nil, nil, 0
		return nil
	}
	if len(tensors) != 2*len(params) {
		return fmt.Errorf("train: Adam state has %d tensors, want %d: %w", len(tensors), 2*len(params), ErrCheckpoint)
	}
	m, err := restore(tensors[:len(params)], params)
	if err != nil {
		return err
	}
	v, err := restore(tensors[len(params):], params)
	if err != nil {
		return err
	}
	o.m, o.v, o.t = m, v, step
	return nil
}

// AdamW is torch.optim.AdamW: Adam whose weight decay is decoupled from
// the gradient — each decayed tensor is first scaled by 1 − lr·wd, then
// takes Adam's update without decay — and applied only to the tensors
// Decay marks (the reference's: those of two or more dimensions, weights
// and embeddings, not biases or LayerNorm's; DecayWeights marks them by
// name). Each value's update is its own, so every replica holds the same
// bits whatever its threads.
type AdamW struct {
	Adam
	Decay []bool // per parameter tensor; nil decays none
}

// NewAdamW returns AdamW with betas (0.9, 0.95) and eps 1e-8, a GPT's
// usual settings (torch_gpt.py's), weight decay wd on the tensors decay
// marks.
func NewAdamW(lr, wd float32, decay []bool) *AdamW {
	return &AdamW{Adam: Adam{LR: lr, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: wd}, Decay: decay}
}

// DecayWeights marks the parameters that weight decay applies to, by
// their names (Model.ParamNames): every layer's weight, not its bias, and
// not a layernorm's gain.
func DecayWeights(names []string) []bool {
	out := make([]bool, len(names))
	for i, n := range names {
		out[i] = strings.HasSuffix(n, ".weight") && !strings.Contains(n, ".layernorm.")
	}
	return out
}

// Step applies one update.
func (o *AdamW) Step(params, grads [][]float32) {
	o.step(params, grads, 0, func(i int) float32 {
		if i < len(o.Decay) && o.Decay[i] {
			return 1 - o.LR*o.WeightDecay
		}
		return 1
	})
}

// State is Adam's, named for AdamW.
func (o *AdamW) State() (string, int, [][]float32) {
	_, t, s := o.Adam.State()
	return "adamw", t, s
}

func zerosLike(params [][]float32) [][]float32 {
	out := make([][]float32, len(params))
	for i, p := range params {
		out[i] = make([]float32, len(p))
	}
	return out
}

// split runs f over [0, n) in parts, one per thread Go has where n is
// worth it (splitValues): each value's update is its own, so the bits do
// not depend on the cut.
func split(n int, f func(lo, hi int)) {
	parallelFor(min(runtime.GOMAXPROCS(0), n/splitValues), n, func(_, lo, hi int) { f(lo, hi) })
}
