package train

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/ringtrain/ringtrain/ring"
)

// Layered is a Model whose backward pass hands its gradients over layer by
// layer, last layer first (the own engine's Net): the replica can then
// send the last layers' gradients round the ring while the first ones
// still compute.
type Layered interface {
	Model
	// ForwardBackwardLayers runs forward and backward, copying each
	// layer's gradients into flat (Params end to end) as soon as they are
	// final and then calling ready with where they start: flat[lo:] is
	// final from then on. An error from ready stops the pass and is
	// returned.
	ForwardBackwardLayers(x []float32, y []int, n int, flat []float32, ready func(lo int) error) (loss float32, err error)
}

// FirstBucketBytes is the size of the first bucket, the last tensors' —
// small, as in PyTorch DDP, so the ring starts early (or BucketBytes, if
// that is smaller).
const FirstBucketBytes = 1 << 20

// bucketPlan cuts the gradients into the buckets a step sends, last
// tensors first: whole tensors, each bucket closed once it holds
// FirstBucketBytes (the first) or BucketBytes (the rest) or more. The plan
// depends on the tensors' sizes alone, so every rank sends the same
// buckets whatever computes its gradients; a Layered model sends each
// while backward goes on, any other once backward is done. It is nil —
// the plain path, one allreduce — without BucketBytes, on a ring of one,
// or where the plan is a single bucket. Call it after buffer.
func (r *Replica) bucketPlan() [][2]int {
	if r.BucketBytes <= 0 || r.Coll.Size() < 2 {
		return nil
	}
	if r.bk.planFor == r.BucketBytes && r.bk.planOf == r.nparams {
		return r.bk.plan
	}
	var plan [][2]int
	hi, limit := r.nparams, min(FirstBucketBytes, r.BucketBytes)
	lo := r.nparams
	for k := len(r.views) - 1; k >= 0; k-- {
		lo -= len(r.views[k])
		if 4*(hi-lo) >= limit {
			plan = append(plan, [2]int{lo, hi})
			hi, limit = lo, r.BucketBytes
		}
	}
	if hi > 0 {
		plan = append(plan, [2]int{0, hi})
	}
	if len(plan) < 2 {
		plan = nil
	}
	r.bk.plan, r.bk.planFor, r.bk.planOf = plan, r.BucketBytes, r.nparams
	return plan
}

// bucketed is the forward and backward pass and the allreduce of a step
// with buckets: each bucket is checked (NaN, Inf), passed through error
// feedback and counted into the norm once its gradients are final, then
// handed to a goroutine that allreduces the buckets in order — for a
// Layered model while backward goes on. The step's trailer (the
// non-finite flag, the leave slots, the norm) goes last, once every bucket
// has, so it still decides the step for all ranks together. It sets
// r.bk.backwardDone. A failed collective is an ErrCollective; the allreduces
// have stopped when it returns.
func (r *Replica) bucketed(ctx context.Context, x []float32, y []int, n int, flat []float32, plan [][2]int,
	narrow NarrowAllreducer, says *stepSays) (loss float32, bad int, err error) {
	jobs := make(chan [2]int, len(plan)+1)
	done := make(chan error, 1)
	go func() {
		var err error
		k := 0
		for b := range jobs {
			if err != nil {
				continue // the ring is down: drain
			}
			buf := flat[b[0]:b[1]]
			t := time.Now()
			if r.Wire == ring.F32 || b[0] >= r.nparams {
				err = r.Coll.AllreduceMean(ctx, buf)
			} else {
				err = narrow.AllreduceMeanAs(ctx, buf, r.Wire)
			}
			if r.Trace != nil {
				r.Trace.Span("allreduce", t, time.Now(), r.Steps, k)
			}
			k++
		}
		done <- err
	}()
	bad = -1
	checked := false // bad is known already: the buckets need no scan
	var squares float64
	next := 0
	ready := func(lo int) error { // flat[lo:] is final: send the buckets it completes
		for ; next < len(plan) && plan[next][0] >= lo; next++ {
			b := plan[next]
			g := flat[b[0]:b[1]]
			if !checked && bad < 0 && !finite(g) {
				bad = r.tensorAt(b[0], g)
			}
			if bad < 0 {
				r.scale(g)
				if r.Wire == ring.I8 {
					r.feedback(flat, b[0], b[1])
				}
				if r.NormGuard > 0 {
					v := norm2(g)
					squares += v * v
				}
			}
			jobs <- b
		}
		return nil
	}
	if lm, ok := r.Model.(Layered); ok && n > 0 {
		loss, err = lm.ForwardBackwardLayers(x, y, n, flat, ready)
	} else if n == 0 { // no samples here this step: nothing to add to the mean
		clear(flat[:r.nparams])
		checked = true
		err = ready(0)
	} else {
		if res, ok := r.Model.(Resident); ok {
			loss, bad, err = res.ForwardBackwardFlat(x, y, n, flat)
		} else if loss, err = r.Model.ForwardBackward(x, y, n); err == nil {
			bad = gatherFinite(flat, r.Model.Grads())
		}
		if err == nil {
			checked = true
			err = ready(0)
		}
	}
	r.bk.backwardDone = time.Now()
	if err == nil && next != len(plan) {
		err = fmt.Errorf("train: backward handed over %d of %d gradient buckets", next, len(plan))
	}
	if err != nil {
		close(jobs)
		<-done
		return 0, -1, err
	}
	tail := flat[r.nparams:]
	if r.NormGuard > 0 && bad < 0 {
		says.norm = float32(math.Sqrt(squares))
	}
	says.nonFinite = bad >= 0
	says.leave = says.leave || r.leaving() // as in average
	says.put(tail, r.Coll.Rank(), r.Coll.Size())
	jobs <- [2]int{r.nparams, len(flat)}
	close(jobs)
	if err := <-done; err != nil {
		return 0, -1, fmt.Errorf("%w: averaging gradients: %w", ErrCollective, err)
	}
	return loss, bad, nil
}

// tensorAt returns the index of the first tensor with a NaN or Inf in g,
// the gradients from flat offset lo on.
func (r *Replica) tensorAt(lo int, g []float32) int {
	o := 0
	for k, v := range r.views {
		if end := o + len(v); end > lo && !finite(g[max(o, lo)-lo:min(end-lo, len(g))]) {
			return k
		}
		o += len(v)
	}
	return -1
}
