package train

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ringtrain/ringtrain/ring"
)

// everyStep is the Sync of a Replica without one: every step's gradients
// averaged over the ring — in buckets beside backward where there is a
// plan — and applied by the optimizer, the same bits on every rank.
type everyStep struct{}

func (everyStep) begin(*Replica, []float32, []int, int) (float32, bool, error) { return 0, true, nil }

// exchange is the whole step: forward and backward, the average, the
// optimizer. A Resident model checks its gradients on its device and
// copies them straight into the flat buffer; a DeviceOptimizer applies
// the average there. With both on a ring of one, the whole step stays on
// the device.
func (everyStep) exchange(ctx context.Context, r *Replica, x []float32, y []int, n int, _ float32) (float32, error) {
	t0 := time.Now()
	if dev, ok := r.Opt.(DeviceOptimizer); ok && r.Coll.Size() == 1 {
		return r.stepAlone(dev, x, y, n, t0)
	}
	flat, err := r.buffer()
	if err != nil {
		return 0, err
	}
	defer r.countBytes(len(flat))()
	says := stepSays{leave: r.leaving(), newcomer: r.Waiting != nil && r.Waiting()}
	loss, bad, err := r.average(ctx, x, y, n, flat, &says, t0)
	if err != nil {
		return 0, err
	}
	defer r.timeOptimizer(time.Now())
	badRanks, leaving, err := r.heard(ctx, flat[r.nparams:], says.leave)
	if err != nil {
		return 0, err
	}
	if err = r.apply(flat, bad, badRanks); Skipped(err) {
		r.Stats.Skipped++
	}
	if errors.Is(err, errDevice) {
		return loss, err
	}
	return loss, withLeavers(err, leaving)
}

func (everyStep) undo(*Replica) int                              { return 1 }
func (everyStep) agreed(params [][]float32) [][]float32          { return params }
func (everyStep) roundOpen() bool                                { return false }
func (everyStep) settle(*Replica)                                {}
func (everyStep) abandon()                                       {}
func (everyStep) maxAhead(*Replica) int                          { return 1 }
func (everyStep) state(opt Optimizer) (string, int, [][]float32) { return opt.State() }
func (everyStep) setState(opt Optimizer, step int, tensors, params [][]float32) error {
	return opt.SetState(step, tensors, params)
}

// average computes this rank's gradients into flat with the step's
// trailer, and averages both over the ring, in buckets beside backward
// where there is a plan. bad is this rank's first non-finite tensor, or
// -1. A failed collective is an ErrCollective.
func (r *Replica) average(ctx context.Context, x []float32, y []int, n int, flat []float32, says *stepSays, t0 time.Time) (loss float32, bad int, err error) {
	narrow, err := r.narrow()
	if err != nil {
		return 0, -1, err
	}
	if plan := r.bucketPlan(); plan != nil {
		// Buckets go round while backward computes the layers before them.
		loss, bad, err = r.bucketed(ctx, x, y, n, flat, plan, narrow, says)
		r.Stats.Ring += time.Since(r.bk.backwardDone)
		r.Stats.Compute += r.bk.backwardDone.Sub(t0)
		r.traceCompute(t0, r.bk.backwardDone)
		return loss, bad, err
	}
	bad = -1
	r.inModel = false
	switch res, ok := r.Model.(Resident); {
	case n == 0: // no samples here this step: nothing to add to the mean
		clear(flat[:r.nparams])
	case ok:
		loss, bad, err = res.ForwardBackwardFlat(x, y, n, flat)
	default:
		if loss, err = r.Model.ForwardBackward(x, y, n); err == nil && r.solo() {
			bad, r.inModel = nonFinite(r.Model.Grads()), true
		} else if err == nil {
			bad = gatherFinite(flat, r.Model.Grads())
		}
	}
	if err != nil {
		return 0, bad, err
	}
	if bad < 0 {
		r.scale(flat[:r.nparams])
	}
	return loss, bad, r.send(ctx, flat, bad, says, t0, true, r.allreduce(ctx, narrow))
}

// scale multiplies this rank's gradients by its share of the step's
// samples (share), where that is not 1.
func (r *Replica) scale(g []float32) {
	if f := r.share; f != 0 && f != 1 {
		for i := range g {
			g[i] *= f
		}
	}
}

// solo reports whether this step's gradients stay where the model keeps
// them: on a ring of one, with float32 on the wire, no norm guard, and
// no model that computes into the buffer itself, the average is the
// rank's own gradients, and gathering them into the ring's buffer (tens
// of megabytes for the cnn) would only copy them. They are checked for
// NaN and Inf where they are, and applied from there.
func (r *Replica) solo() bool {
	_, resident := r.Model.(Resident)
	return r.Coll.Size() == 1 && r.Wire == ring.F32 && r.NormGuard <= 0 && !resident && (r.share == 0 || r.share == 1)
}

// errDevice marks a device optimizer's failure to apply a step: not a
// skip, the run's end.
var errDevice = errors.New("train: the device failed to apply the step")

// apply applies the averaged gradients in flat, or says why every rank
// skips them: a rank flagged NaN or Inf (badRanks; bad is this rank's own
// tensor, or -1), the norm guard, or an average that is not finite. Every
// rank holds the same average and trailer, so every rank decides alike. A
// DeviceOptimizer checks the average itself, where it applies it; the host
// checks it otherwise.
func (r *Replica) apply(flat []float32, bad, badRanks int) error {
	avg, tail := flat[:r.nparams], flat[r.nparams:]
	applied, err := false, r.skipped(avg, tail, bad, badRanks)
	switch dev, onDevice := r.Opt.(DeviceOptimizer); {
	case err != nil:
	case onDevice:
		if applied, err = dev.StepFlat(avg); err != nil {
			return fmt.Errorf("%w: %w", errDevice, err)
		}
	case r.inModel:
		if applied = bad < 0; applied {
			r.Opt.Step(r.Model.Params(), r.Model.Grads())
		}
	case finite(avg):
		r.Opt.Step(r.Model.Params(), r.views)
		applied = true
	}
	return r.applied(applied, err)
}

// applied is the outcome of applying an average that every rank flagged
// finite, or err: where it was not applied, its average held a NaN or
// Inf — a rank sent one and hid it (or the sum overflowed). Error
// feedback keeps the step's remainder only once it is applied.
func (r *Replica) applied(applied bool, err error) error {
	if err != nil {
		return err
	}
	if !applied {
		return fmt.Errorf("train: the averaged gradients hold a NaN or Inf though all %d ranks flagged theirs finite (a rank hid its own, or the sum overflowed); step skipped on all: %w",
			r.Coll.Size(), ErrNonFinite)
	}
	if r.Wire == ring.I8 {
		r.residual, r.pending = r.pending, r.residual
	}
	return nil
}

// stepAlone is Step for a ring of one with a DeviceOptimizer: the same
// outcomes (ErrNonFinite, LeaveError) without the flat buffer, which a ring
// of one would only average with itself.
func (r *Replica) stepAlone(dev DeviceOptimizer, x []float32, y []int, n int, t0 time.Time) (float32, error) {
	leave := r.leaving()
	r.out.newcomer = r.Waiting != nil && r.Waiting()
	loss, bad, err := dev.StepAlone(x, y, n)
	r.Stats.Compute += time.Since(t0)
	if r.Trace != nil {
		r.Trace.Span("forward+backward", t0, time.Now(), r.Steps, -1)
	}
	if err != nil {
		return 0, err
	}
	if bad >= 0 {
		r.Stats.Skipped++
		err = fmt.Errorf("train: 1 of 1 ranks had NaN or Inf gradients (rank %d: its %s gradient is not); step skipped on all: %w",
			r.Coll.Rank(), r.Model.ParamNames()[bad], ErrNonFinite)
	}
	if leave {
		le := &LeaveError{Ranks: []int{r.Coll.Rank()}}
		if err == nil {
			return loss, le
		}
		err = errors.Join(err, le)
	}
	return loss, err
}
