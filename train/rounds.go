package train

import (
	"context"
	"time"
)

// rounds is LocalSGD (DiLoCo) in whole rounds: Every inner steps on this
// rank alone, then the ranks average their pseudo-gradients in one
// allreduce — with the synchronous step's trailer, norm guard and
// compression, or coded sparse (LocalSGD.Sparse) — and every rank takes
// the same outer step.
type rounds struct{ o *LocalSGD }

// begin is the inner step; the round closes after Every of them, or at
// the epoch part's end.
func (s rounds) begin(r *Replica, x []float32, y []int, n int) (float32, bool, error) {
	loss, err := s.o.inner(r, x, y, n)
	if err != nil {
		return 0, false, err
	}
	return loss, s.o.done >= s.o.Every || r.part.closing, nil
}

// exchange closes the round: the pseudo-gradient averaged, then the outer
// step on every rank, or the round skipped on every rank (every rank back
// at the anchor) for the reasons a synchronous step is.
func (s rounds) exchange(ctx context.Context, r *Replica, _ []float32, _ []int, _ int, loss float32) (float32, error) {
	o := s.o
	narrow, err := r.narrow()
	if err != nil {
		return 0, err
	}
	flat, err := r.buffer()
	if err != nil {
		return 0, err
	}
	defer r.countBytes(len(flat))()
	t0 := time.Now()
	says := stepSays{leave: r.leaving(), newcomer: r.Waiting != nil && r.Waiting()}
	avg, tail := flat[:r.nparams], flat[r.nparams:]
	bad := o.delta(avg, r.Model.Params())
	send := r.allreduce(ctx, narrow)
	var named *LiarError
	if o.Sparse != nil {
		send = func([]float32) (err error) {
			named, err = o.gatherSparse(ctx, r, avg, tail, 0, 1, bad)
			return err
		}
	}
	if err := r.send(ctx, flat, bad, &says, t0, false, send); err != nil {
		return 0, err
	}
	defer r.timeOptimizer(time.Now())
	badRanks, leaving, err := r.heard(ctx, tail, says.leave)
	if err != nil {
		return 0, err
	}
	applied, err := false, r.skipped(avg, tail, bad, badRanks)
	if err == nil {
		if applied = finite(avg); applied {
			o.apply(r.Model.Params(), avg)
			r.out.outerDone, r.out.named = true, named
		}
	}
	if !applied { // the round is skipped on every rank
		o.back(r.Model.Params())
	}
	if err = r.applied(applied, err); Skipped(err) {
		r.Stats.Skipped++
	}
	return loss, withLeavers(err, leaving)
}

// undo takes the round back: this rank returns to the anchor.
func (s rounds) undo(r *Replica) int {
	if s.o.open {
		return s.o.back(r.Model.Params())
	}
	return 1
}

func (s rounds) agreed(params [][]float32) [][]float32 { return params }
func (s rounds) roundOpen() bool                       { return s.o.open }
func (s rounds) settle(*Replica)                       {}
func (s rounds) abandon()                              {}

// maxAhead is a round: the ranks that finished its outer step are at its
// end, the others went back to its start.
func (s rounds) maxAhead(*Replica) int { return max(s.o.Every, 1) }

func (s rounds) state(opt Optimizer) (string, int, [][]float32) { return s.o.state(opt) }
func (s rounds) setState(opt Optimizer, step int, tensors, params [][]float32) error {
	return s.o.setState(opt, step, tensors, params)
}
