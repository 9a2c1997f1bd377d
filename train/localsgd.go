package train

import (
	"fmt"
	"math"

	"github.com/ringtrain/ringtrain/train/sparse"
)

// LocalSGD is DiLoCo: each rank takes Every steps on its own with Inner
// (the job's optimizer), never talking to the others; then the ranks
// average their parameter changes since the last outer step (the
// "pseudo-gradient", anchor − θ) in one allreduce and every rank applies
// the same outer step to the anchor — SGD with momentum, Nesterov's if
// asked, which DiLoCo uses (arXiv 2311.08105). A round sends the
// parameters' bytes once where synchronous training sends them Every times.
//
// Set as a Replica's Opt, it makes Step take inner steps and close a round
// every Every steps (and at every epoch's end, when Run drives it). All
// that ranks must agree on lives in the outer step: its non-finite flags,
// leave requests, norm guard and compression are those of a synchronous
// step. Between rounds every rank holds the same bits — parameters, outer
// momentum, and an inner optimizer started afresh each round — so
// checkpoints, the parameter-hash check, admission and resuming work as
// in synchronous training; as its State, LocalSGD offers the outer
// momentum. (With Sparse each rank also keeps error feedback of its own,
// which no checkpoint holds: a restored or admitted rank starts without.) (DiLoCo's paper keeps each worker's own inner Adam state across
// rounds; that would need a checkpoint per rank and a way to hand a lost
// rank's to its successor, so here each round starts its inner optimizer
// afresh.)
//
// A failed allreduce at the outer step makes every rank that did not
// finish it go back to the anchor: the round is redone by the survivors,
// from the last outer step, on the round's share of the data.
type LocalSGD struct {
	Inner Optimizer
	// Every is the inner steps per round, H; 1 with a plain SGD inner and
	// an outer LR of 1 without momentum is synchronous SGD.
	Every int
	// Outer step: v ← μv + Δ; θ ← anchor − LR·(Δ + μv) with Nesterov,
	// anchor − LR·v without (torch.optim.SGD's two forms).
	LR, Momentum float32
	Nesterov     bool
	// Sparse, if set, sends each rank's pseudo-gradient as its top
	// entries in a few bits (train/sparse), gathered from every rank
	// rather than summed round the ring, with error feedback kept per
	// rank; nil sends it whole, in the ring's encoding.
	Sparse *sparse.Config

	velocity [][]float32 // the outer momentum, shaped like the parameters
	outer    int         // outer steps applied
	anchor   []float32   // the parameters at the last outer step, end to end
	open     bool        // a round is under way: anchor holds its start
	done     int         // inner steps taken in the open round
	// coder holds this rank's error feedback; encoded says its last
	// Encode waits to be committed by the round's outer step.
	coder   *sparse.Coder
	encoded bool
}

// Step is an inner step: LocalSGD's Replica takes its inner steps itself,
// so this is only for those that drive it without one.
func (o *LocalSGD) Step(params, grads [][]float32) { o.Inner.Step(params, grads) }

// SetLR sets the inner optimizer's learning rate: a schedule shapes the
// inner steps; the outer LR stays.
func (o *LocalSGD) SetLR(lr float32) { o.Inner.SetLR(lr) }

// State is the outer momentum and the outer steps taken; the name says
// the inner optimizer too. Between rounds that is all the state there is.
func (o *LocalSGD) State() (string, int, [][]float32) {
	name, _, _ := o.Inner.State()
	return "diloco+" + name, o.outer, o.velocity
}

// SetState restores the outer momentum and ends any open round: what is
// restored is a state between rounds.
func (o *LocalSGD) SetState(step int, tensors, params [][]float32) error {
	o.open, o.done, o.outer = false, 0, step
	o.coder, o.encoded = nil, false // the error feedback is this rank's alone: not in a checkpoint
	o.velocity = nil
	if len(tensors) > 0 {
		v, err := restore(tensors, params)
		if err != nil {
			return err
		}
		o.velocity = v
	}
	return o.Inner.SetState(0, nil, params)
}

// validate says what is wrong with the settings.
func (o *LocalSGD) validate() error {
	switch {
	case o.Inner == nil:
		return fmt.Errorf("train: local SGD without an inner optimizer")
	case o.Every < 1:
		return fmt.Errorf("train: local SGD every %d steps; want 1 or more", o.Every)
	case !(o.LR > 0) || !(o.Momentum >= 0 && o.Momentum < 1):
		return fmt.Errorf("train: outer lr %v, momentum %v; want lr > 0 and momentum in [0, 1)", o.LR, o.Momentum)
	case o.Sparse != nil:
		return o.Sparse.Validate()
	}
	return nil
}

// encode codes the round's pseudo-gradient d (anchor − θ, end to end)
// with this rank's error feedback; the feedback it leaves is kept only if
// the round's outer step is taken.
func (o *LocalSGD) encode(d []float32) ([]byte, error) {
	if o.coder == nil {
		c, err := sparse.NewCoder(*o.Sparse, len(d))
		if err != nil {
			return nil, err
		}
		o.coder = c
	}
	p, err := o.coder.Encode(d)
	o.encoded = err == nil
	return p, err
}

// begin opens a round at the parameters as they are.
func (o *LocalSGD) begin(params [][]float32) {
	o.anchor = o.anchor[:0]
	for _, p := range params {
		o.anchor = append(o.anchor, p...)
	}
	o.open, o.done = true, 0
}

// delta writes the round's pseudo-gradient, anchor − θ, into dst and
// returns the first tensor that holds a NaN or Inf, or -1.
func (o *LocalSGD) delta(dst []float32, params [][]float32) int {
	bad, off := -1, 0
	for k, p := range params {
		for i, v := range p {
			d := o.anchor[off+i] - v
			dst[off+i] = d
			if bad < 0 && (math.IsNaN(float64(d)) || math.IsInf(float64(d), 0)) {
				bad = k
			}
		}
		off += len(p)
	}
	return bad
}

// apply takes the outer step with the averaged pseudo-gradient avg and
// closes the round: every rank's parameters become the new anchor.
func (o *LocalSGD) apply(params [][]float32, avg []float32) {
	if o.Momentum != 0 && o.velocity == nil {
		o.velocity = zerosLike(params)
	}
	off := 0
	for k, p := range params {
		for i := range p {
			d := avg[off+i]
			upd := d
			if o.Momentum != 0 {
				v := o.Momentum*o.velocity[k][i] + d
				o.velocity[k][i] = v
				if o.Nesterov {
					upd = d + o.Momentum*v
				} else {
					upd = v
				}
			}
			o.anchor[off+i] -= o.LR * upd
		}
		off += len(p)
	}
	o.outer++
	if o.encoded {
		o.coder.Commit()
	}
	o.back(params)
}

// back closes the round without an outer step: every rank returns to the
// anchor, and the inner optimizer starts afresh. It returns the inner
// steps the round had taken.
func (o *LocalSGD) back(params [][]float32) int {
	off := 0
	for _, p := range params {
		copy(p, o.anchor[off:off+len(p)])
		off += len(p)
	}
	done := o.done
	o.open, o.done, o.encoded = false, 0, false
	o.Inner.SetState(0, nil, params) // empty state: always accepted
	return done
}
