package train

import (
	"context"
	"errors"
	"fmt"
	"math"
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
	if dev, ok := r.Opt.(DeviceOptimizer); ok && r.Coll.Size() == 1 && r.ClipNorm <= 0 {
		// The whole step on the device; clipping needs the gradients'
		// norm on the host, and takes the path below.
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
	badRanks, leaving, err := r.heard(ctx, r.tailOf(flat), says.leave)
	if err != nil {
		return 0, err
	}
	var named *LiarError
	if r.sketching() && badRanks == 0 {
		// Every rank holds the same average and sketches: all decide
		// alike.
		slots, seed, got := flat[r.nparams+r.trailerLen():], r.sk.seed(r.Sketch), r.scanAverage(flat[:r.nparams])
		if err = r.sk.check(r.Sketch, got, slots, r.Wire); errors.As(err, &named) {
			err = nil
		}
		if err == nil && named == nil {
			if named, err = r.auditStep(got, r.tailOf(flat), slots, seed); named != nil {
				err = fmt.Errorf("%w: %s", ErrAudited, named.Why)
			}
		}
	}
	if err == nil {
		err = r.apply(flat, bad, badRanks)
	}
	if Skipped(err) {
		r.Stats.Skipped++
	}
	if err == nil || Skipped(err) {
		r.out.named = named
	}
	if r.sketching() && badRanks == 0 && r.NormGuard > 0 && named == nil {
		r.out.named = r.sk.guard(r.Sketch, r.out.far, r.NormGuard)
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
			bad = r.gatherGrads(flat)
		}
	}
	if err != nil {
		return 0, bad, err
	}
	if bad < 0 {
		r.scale(flat[:r.nparams])
		if r.tamper != nil {
			r.tamper(flat[:r.nparams], 0)
		}
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

// gatherGrads gathers the model's gradients into flat and returns the
// index of the first tensor that holds a NaN or Inf, or -1. Where this
// step's sketch is of them as they are — no share to scale them by, no
// int8 error feedback, no attack — the same pass sketches them and sums
// their squares for the norm guard (out.own): a pass of its own over the
// gradients, fresh out of cache, costs a step more than the sketch's
// arithmetic does.
func (r *Replica) gatherGrads(flat []float32) int {
	grads := r.Model.Grads()
	if !r.sketching() || r.tamper != nil || r.Wire == ring.I8 || (r.share != 0 && r.share != 1) {
		return gatherFinite(flat, grads)
	}
	r.sketchBegin()
	bad, o, squares := -1, 0, 0.0
	for i, t := range grads {
		sq := r.sk.scan(r.Sketch, r.sk.own, flat[o:o+len(t)], t, o)
		if bad < 0 && !scannedFinite(sq, t) {
			bad = i
		}
		squares += sq
		o += len(t)
	}
	r.out.own = scanned{done: true, squares: squares}
	return bad
}

// scanAverage is the step's sketch of the averaged gradients avg, from a
// pass that also sums their squares for the norm guard's and apply's
// checks (out.avg).
func (r *Replica) scanAverage(avg []float32) []float64 {
	if len(r.sk.avg) != r.Sketch.dims() {
		r.sk.avg = make([]float64, r.Sketch.dims())
	}
	clear(r.sk.avg)
	r.out.avg = scanned{done: true, squares: r.sk.scan(r.Sketch, r.sk.avg, nil, avg, 0)}
	return r.sk.avg
}

// avgNorm is the norm of the averaged gradients avg, from the step's
// scan of them where it had one.
func (r *Replica) avgNorm(avg []float32) float64 {
	if r.out.avg.done {
		return scannedNorm(r.out.avg.squares, avg)
	}
	return norm2(avg)
}

// avgFinite reports whether the averaged gradients avg are finite, from
// the step's scan of them where it had one.
func (r *Replica) avgFinite(avg []float32) bool {
	if r.out.avg.done {
		return scannedFinite(r.out.avg.squares, avg)
	}
	return finite(avg)
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
	avg, tail := flat[:r.nparams], r.tailOf(flat)
	applied, err := false, r.skipped(avg, tail, bad, badRanks)
	if err == nil && r.ClipNorm > 0 {
		if r.inModel {
			clipNorm(r.Model.Grads(), r.ClipNorm)
		} else {
			clipNorm([][]float32{avg}, r.ClipNorm)
		}
	}
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
	case r.avgFinite(avg):
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

// narrow is the collective as a NarrowAllreducer, where the gradients go
// narrowed (Wire); an error if it cannot send them so.
func (r *Replica) narrow() (NarrowAllreducer, error) {
	narrow, _ := r.Coll.(NarrowAllreducer)
	if r.Wire != ring.F32 && narrow == nil {
		return nil, fmt.Errorf("train: gradients to send as %v, but the collective (%T) sends float32 only", r.Wire, r.Coll)
	}
	return narrow, nil
}

// countBytes starts counting what a step's allreduce of n values sends;
// the func it returns adds it to Stats.BytesSent: measured where the
// Collective counts what it sends, else a ring allreduce's 2(n−1)/n of
// the buffer.
func (r *Replica) countBytes(n int) func() {
	if counter, ok := r.Coll.(byteCounter); ok {
		sent0 := counter.Stats().BytesSent
		return func() { r.Stats.BytesSent += counter.Stats().BytesSent - sent0 }
	}
	if size := int64(r.Coll.Size()); size > 1 {
		payload := int64(r.Wire.Size(r.nparams) + 4*(n-r.nparams))
		return func() { r.Stats.BytesSent += 2 * (size - 1) * payload / size }
	}
	return func() {}
}

// timeOptimizer counts the time from t0 to its call as the optimizer's.
func (r *Replica) timeOptimizer(t0 time.Time) {
	r.Stats.Optimizer += time.Since(t0)
	if r.Trace != nil {
		r.Trace.Span("optimizer", t0, time.Now(), r.Steps, -1)
	}
}

// send finishes what this rank puts in flat — error feedback on its
// gradients (or pseudo-gradient), its norm, its trailer (says; bad is its
// first non-finite tensor, or -1) — and averages it over the ring with
// allreduce. The compute that began at t0 ends here; traced says whether
// to trace it as forward and backward. A failed collective is an
// ErrCollective.
func (r *Replica) send(ctx context.Context, flat []float32, bad int, says *stepSays, t0 time.Time, traced bool, allreduce func(flat []float32) error) error {
	if r.Wire == ring.I8 && bad < 0 {
		r.feedback(flat, 0, r.nparams)
	}
	if r.NormGuard > 0 && bad < 0 {
		if r.out.own.done {
			says.norm = float32(scannedNorm(r.out.own.squares, flat[:r.nparams]))
		} else {
			says.norm = float32(norm2(flat[:r.nparams]))
		}
	}
	says.nonFinite = bad >= 0
	// Asked during the computation (a pipeline stage hears it in the
	// step's frames): this step's trailer carries it.
	says.leave = says.leave || r.leaving()
	says.put(r.tailOf(flat), r.Coll.Rank(), r.Coll.Size())
	if r.sketching() {
		if !r.out.own.done {
			r.sketchBegin()
			if bad < 0 {
				r.sk.scan(r.Sketch, r.sk.own, nil, flat[:r.nparams], 0)
			}
		}
		r.sketchPut(flat, bad)
	}
	t1 := time.Now()
	r.Stats.Compute += t1.Sub(t0)
	if traced {
		r.traceCompute(t0, t1)
	}
	err := allreduce(flat)
	comm, wait := time.Since(t1), time.Duration(0)
	if counter, ok := r.Coll.(byteCounter); ok {
		wait = min(counter.Stats().LastWait, comm)
	}
	r.Stats.Wait += wait
	r.Stats.Ring += comm - wait
	if r.Trace != nil {
		r.Trace.Span("allreduce", t1, t1.Add(comm), r.Steps, -1)
		if wait > 0 {
			r.Trace.Span("wait", t1, t1.Add(wait), r.Steps, -1)
		}
	}
	if err != nil {
		return fmt.Errorf("%w: averaging gradients: %w", ErrCollective, err)
	}
	return nil
}

// allreduce is how a step's values go round: all in one float32
// allreduce, or the gradients narrowed (Wire) and the trailer, which must
// stay exact, in a second, small one.
func (r *Replica) allreduce(ctx context.Context, narrow NarrowAllreducer) func(flat []float32) error {
	return func(flat []float32) error {
		if r.Wire == ring.F32 {
			return r.Coll.AllreduceMean(ctx, flat)
		}
		if err := narrow.AllreduceMeanAs(ctx, flat[:r.nparams], r.Wire); err != nil {
			return err
		}
		return r.Coll.AllreduceMean(ctx, flat[r.nparams:])
	}
}

// heard reads what the ranks said in an averaged trailer: how many had
// non-finite gradients, whether a newcomer waits, and which ranks leave —
// their requests confirmed (leavers). asked is this rank's own request.
func (r *Replica) heard(ctx context.Context, tail []float32, asked bool) (badRanks int, leaving []int, err error) {
	badRanks, newcomer, leaving := stepFlagsOf(tail, r.Coll.Size())
	r.out.newcomer = r.out.newcomer || newcomer
	leaving, err = r.leavers(ctx, leaving, asked)
	return badRanks, leaving, err
}

// clipNorm scales ts, end to end one vector, to a norm of at most max,
// as torch's clip_grad_norm_ does: by max/(norm+1e-6) where that is
// below 1. Each tensor's norm is norm2's (one order, the same bits on
// every CPU), their squares summed in float64.
func clipNorm(ts [][]float32, max float64) {
	var sum float64
	for _, t := range ts {
		n := norm2(t)
		sum += n * n
	}
	f := max / (math.Sqrt(sum) + 1e-6)
	if !(f < 1) {
		return
	}
	for _, t := range ts {
		for i := range t {
			t[i] *= float32(f)
		}
	}
}

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

// Stager is a Resident model that takes the averaged gradients back to its
// device a bucket at a time, as the ring finishes each, while later
// buckets still go round — instead of all at once when its
// DeviceOptimizer steps, which then sends only what was not staged.
type Stager interface {
	// StageGrads sends flat[lo:hi], averaged, towards the device.
	StageGrads(flat []float32, lo, hi int) error
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
	st := r.stager(flat, len(plan))
	go func() { done <- r.allreduceBuckets(ctx, flat, narrow, jobs, st.reduced) }()
	bad = -1
	checked := false // bad is known already: the buckets need no scan
	var squares float64
	r.sketchBegin()
	next := 0
	ready := func(lo int) error { // flat[lo:] is final: send the buckets it completes
		for ; next < len(plan) && plan[next][0] >= lo; next++ {
			b := plan[next]
			g := flat[b[0]:b[1]]
			if !checked && bad < 0 && !finite(g) {
				bad = r.tensorAt(b[0], g)
			}
			if bad < 0 {
				squares += r.prepareBucket(flat, b)
			}
			jobs <- b
		}
		st.drain()
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
	if r.NormGuard > 0 && bad < 0 {
		says.norm = float32(math.Sqrt(squares))
	}
	says.nonFinite = bad >= 0
	says.leave = says.leave || r.leaving() // as in average
	says.put(r.tailOf(flat), r.Coll.Rank(), r.Coll.Size())
	r.sketchPut(flat, bad)
	jobs <- [2]int{r.nparams, len(flat)}
	close(jobs)
	if err = st.await(done); err != nil {
		return 0, -1, fmt.Errorf("%w: averaging gradients: %w", ErrCollective, err)
	}
	if st.drain(); st.err != nil {
		return 0, -1, fmt.Errorf("%w: %w", errDevice, st.err)
	}
	return loss, bad, nil
}

// bucketStager hands a Stager model the buckets the ring has averaged, as
// they come on reduced. Its zero value (no Stager) stages nothing: a nil
// channel never delivers.
type bucketStager struct {
	st      Stager
	flat    []float32
	reduced chan [2]int
	err     error // the first StageGrads error; nothing is staged after it
}

// stager is a bucketStager for this step's buckets, which stages them
// where the model is a Stager and the average goes to its device
// optimizer as the ring leaves it — not where clipping changes it on the
// host first.
func (r *Replica) stager(flat []float32, buckets int) *bucketStager {
	st, ok := r.Model.(Stager)
	if _, dev := r.Opt.(DeviceOptimizer); !ok || !dev || r.ClipNorm > 0 {
		return &bucketStager{}
	}
	return &bucketStager{st: st, flat: flat, reduced: make(chan [2]int, buckets)}
}

func (s *bucketStager) take(b [2]int) {
	if s.err == nil {
		s.err = s.st.StageGrads(s.flat, b[0], b[1])
	}
}

// drain stages the buckets averaged so far.
func (s *bucketStager) drain() {
	for {
		select {
		case b := <-s.reduced:
			s.take(b)
		default:
			return
		}
	}
}

// await returns the allreduces' error once done delivers it, staging
// each bucket they finish meanwhile.
func (s *bucketStager) await(done <-chan error) error {
	for {
		select {
		case b := <-s.reduced:
			s.take(b)
		case err := <-done:
			return err
		}
	}
}

// allreduceBuckets allreduces the buckets of flat that come on jobs, in
// order, until jobs is closed, and returns the first collective's error:
// after one, the rest are drained unsent (the ring is down). Each bucket
// of gradients averaged goes on reduced, unless that is nil; it has room
// for all.
func (r *Replica) allreduceBuckets(ctx context.Context, flat []float32, narrow NarrowAllreducer, jobs <-chan [2]int, reduced chan<- [2]int) error {
	var err error
	k := 0
	for b := range jobs {
		if err != nil {
			continue
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
		if err == nil && reduced != nil && b[0] < r.nparams {
			reduced <- b
		}
		k++
	}
	return err
}

// prepareBucket readies the finite gradients flat[b[0]:b[1]] to go
// round, as average readies all of them: scaled by the rank's share,
// rounded for int8 with error feedback, added to the step's sketch; it
// returns their squared norm where the norm guard needs it.
func (r *Replica) prepareBucket(flat []float32, b [2]int) float64 {
	g := flat[b[0]:b[1]]
	r.scale(g)
	if r.tamper != nil {
		r.tamper(g, b[0]) // bucket by bucket
	}
	if r.Wire == ring.I8 {
		r.feedback(flat, b[0], b[1])
	}
	if r.sketching() {
		// One pass for the sketch and the norm.
		sq := r.sk.scan(r.Sketch, r.sk.own, nil, g, b[0])
		if r.NormGuard <= 0 {
			return 0
		}
		v := scannedNorm(sq, g)
		return v * v
	}
	if r.NormGuard > 0 {
		v := norm2(g)
		return v * v
	}
	return 0
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
