package train

import (
	"fmt"
	"math"
	"time"

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
	// Fragments, if above 1, streams the outer sync (Streaming DiLoCo,
	// arXiv 2501.18512): the parameters, end to end, in this many equal
	// ranges, each with an outer step of its own every Every steps,
	// staggered — fragment k's at steps (k+1)·Every/Fragments of each
	// cycle — so that a round's bytes go out in Fragments pieces spread
	// over it rather than in one burst. A streaming round lasts the
	// epoch: at its end (Run's last step of an epoch) every fragment
	// goes at once and every rank holds the same bits again.
	Fragments int
	// Overlap is how many inner steps a fragment's exchange runs beside:
	// it goes out in the background, the inner steps go on, and its outer
	// step is applied Overlap steps later, keeping what those steps did
	// to the fragment (θ ← new anchor + their change). 0 waits for it.
	// Under Every/Fragments, so that one exchange is in flight at a time.
	Overlap int
	// Deadline, if above 0, lets a round close without a rank slow to
	// compute (a quorum round, DiLoCo's asynchronous variants): once a
	// rank has begun round k, a rank not yet at its step k·Every posts
	// the pseudo-gradient it has at its next step and computes on; if
	// that step is not done within Deadline, the round closes without it
	// and what it did goes into the next round. See Replica.quorumStep.
	// Not with Fragments or Overlap.
	Deadline time.Duration
	// Quorum is the fewest ranks a round with a Deadline closes with (the
	// job's min_world_size); a round with fewer in is skipped on every
	// rank (ErrNoQuorum), and each carries its pseudo-gradient on. 0 is 1.
	Quorum int

	velocity [][]float32 // the outer momentum, shaped like the parameters
	outer    int         // outer steps applied
	anchor   []float32   // the parameters at the last outer step, end to end
	open     bool        // a round is under way: anchor holds its start
	done     int         // inner steps taken in the open round
	// coders hold this rank's error feedback, one per fragment; encoded
	// says which wait for their last Encode to be committed by an outer
	// step.
	coders  []*sparse.Coder
	encoded []bool
	// inflight is a streaming round's exchange under way, if any; began
	// is done when the last exchange began.
	inflight *exchange
	began    int
	// xbuf and xat are the exchange's scratch (exchange.buf and .at).
	xbuf, xat []float32
	// qx is a round with a Deadline under way; qround the rounds closed in
	// the epoch part; qpos the steps in it, where Run does not say; qat
	// the parameters when this rank posted early, and qdone its inner
	// steps then.
	qx           *quorumRound
	qround, qpos int
	qat          []float32
	qdone        int
	// after is the Deadline's timer: time.After, or a test's fake.
	after func(time.Duration) <-chan time.Time
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
	o.qx, o.qround, o.qpos = nil, 0, 0 // Level drops a round under way first (settle)
	o.coders, o.encoded = nil, nil     // the error feedback is this rank's alone: not in a checkpoint
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
		if err := o.Sparse.Validate(); err != nil {
			return err
		}
	}
	if err := CheckStreaming(o.Every, o.Fragments, o.Overlap); err != nil {
		return fmt.Errorf("train: local SGD: %w", err)
	}
	return CheckDeadline(o.Deadline, o.Quorum, o.streaming())
}

// CheckDeadline says what is wrong with outer rounds closing by deadline
// with a quorum of quorum ranks, streaming or not (LocalSGD's Deadline and
// Quorum).
func CheckDeadline(deadline time.Duration, quorum int, streaming bool) error {
	switch {
	case deadline < 0 || quorum < 0:
		return fmt.Errorf("train: local SGD with a deadline of %v and a quorum of %d; want neither below 0", deadline, quorum)
	case deadline > 0 && streaming:
		return fmt.Errorf("train: local SGD: a deadline with fragments or overlap; a round with a deadline is the whole model, and a rank behind computes on beside it already")
	}
	return nil
}

// CheckStreaming says what is wrong with a streaming outer sync of
// fragments every steps, each exchange overlapping overlap inner steps
// (LocalSGD's Every, Fragments and Overlap; 0 and 0 do not stream).
func CheckStreaming(every, fragments, overlap int) error {
	switch {
	case fragments < 0 || overlap < 0:
		return fmt.Errorf("%d fragments, overlapping %d steps; want neither below 0", fragments, overlap)
	case fragments > every:
		return fmt.Errorf("%d fragments with an outer step every %d steps; want no more fragments than steps", fragments, every)
	case (fragments > 1 || overlap > 0) && overlap >= every/max(fragments, 1):
		return fmt.Errorf("a fragment's exchange overlapping %d steps, with one beginning every %d; want fewer, so that one is in flight at a time",
			overlap, every/max(fragments, 1))
	}
	return nil
}

// streaming reports whether the outer sync goes in fragments, or beside
// inner steps.
func (o *LocalSGD) streaming() bool { return o.Fragments > 1 || o.Overlap > 0 }

// fragments is how many fragments the parameters are in: 1 unless
// streaming.
func (o *LocalSGD) fragments() int { return max(o.Fragments, 1) }

// fragment is fragment k's range of the n parameters, end to end.
func (o *LocalSGD) fragment(k, n int) (lo, hi int) {
	f := o.fragments()
	return k * n / f, (k + 1) * n / f
}

// due is the fragment whose exchange begins after done inner steps of a
// streaming round: fragment k at (k+1)·Every/Fragments steps into each
// cycle of Every.
func (o *LocalSGD) due(done int) (k int, ok bool) {
	if done <= 0 {
		return 0, false
	}
	s, f := done%o.Every, o.fragments()
	if s == 0 {
		s = o.Every
	}
	for k := range f {
		if (k+1)*o.Every/f == s {
			return k, true
		}
	}
	return 0, false
}

// encode codes fragment k's pseudo-gradient d with this rank's error
// feedback for it; the feedback it leaves is kept only if the fragment's
// outer step is taken.
func (o *LocalSGD) encode(k int, d []float32) ([]byte, error) {
	if len(o.coders) != o.fragments() {
		o.coders, o.encoded = make([]*sparse.Coder, o.fragments()), make([]bool, o.fragments())
	}
	if o.coders[k] == nil {
		c, err := sparse.NewCoder(*o.Sparse, len(d))
		if err != nil {
			return nil, err
		}
		o.coders[k] = c
	}
	p, err := o.coders[k].Encode(d)
	o.encoded[k] = err == nil
	return p, err
}

// commit keeps the error feedback of fragments [from, to): their outer
// step was taken.
func (o *LocalSGD) commit(from, to int) {
	for k := from; k < to && k < len(o.encoded); k++ {
		if o.encoded[k] {
			o.coders[k].Commit()
			o.encoded[k] = false
		}
	}
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
	o.outerStep(params, 0, len(o.anchor), avg)
	o.outer++
	o.commit(0, o.fragments())
	o.back(params)
}

// outerStep moves the anchor's range [lo, hi) by the outer step for its
// averaged pseudo-gradient avg (hi − lo values).
func (o *LocalSGD) outerStep(params [][]float32, lo, hi int, avg []float32) {
	if o.Momentum != 0 && o.velocity == nil {
		o.velocity = zerosLike(params)
	}
	eachSpan(params, lo, hi, func(k, a, b, off int) {
		for i := a; i < b; i++ {
			d := avg[off+i-a-lo]
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
			o.anchor[off+i-a] -= o.LR * upd
		}
	})
}

// eachSpan calls f with each tensor's part of the flat range [lo, hi) of
// ts end to end: tensor k's entries [a, b), the first at flat index off.
func eachSpan(ts [][]float32, lo, hi int, f func(k, a, b, off int)) {
	start := 0
	for k, t := range ts {
		end := start + len(t)
		if a, b := max(lo, start), min(hi, end); a < b {
			f(k, a-start, b-start, a)
		}
		if end >= hi {
			return
		}
		start = end
	}
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
	o.open, o.done = false, 0
	clear(o.encoded)
	o.Inner.SetState(0, nil, params) // empty state: always accepted
	return done
}
