package train

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train/sparse"
	"github.com/ringtrain/ringtrain/train/vec"
)

// Collective is what a training step needs of a ring. *ring.Ring has it;
// so does a ring of one.
type Collective interface {
	AllreduceMean(ctx context.Context, buf []float32) error
	AllreduceSum(ctx context.Context, buf []float32) error
	Broadcast(ctx context.Context, buf []float32, root int) error
	Rank() int
	Size() int
}

// byteCounter is a Collective that counts what it sends (ring.Ring).
type byteCounter interface{ Stats() ring.Stats }

// ErrCollective means a collective failed — a peer died, left or stalled.
// In a step, the step was applied on no rank whose call failed.
var ErrCollective = errors.New("train: the ring failed")

// ErrNonFinite means a gradient had a NaN or an Inf on some rank; every rank
// skips that step together.
var ErrNonFinite = errors.New("train: non-finite gradient")

// NarrowAllreducer is a Collective that can send an allreduce's values
// narrowed (ring.Ring).
type NarrowAllreducer interface {
	AllreduceMeanAs(ctx context.Context, buf []float32, enc ring.Encoding) error
}

// ErrGradientNorm means the gradient norm guard (Replica.NormGuard) skipped
// a step on every rank: a rank's gradients were far larger than the
// others', or the average was larger than the norms the ranks declared
// allow.
var ErrGradientNorm = errors.New("train: gradient norm guard")

// Skipped reports whether err is a step that every rank skipped together
// (ErrNonFinite, ErrGradientNorm, or an outer round below its quorum,
// ErrNoQuorum): training goes on with the next one.
func Skipped(err error) bool {
	return errors.Is(err, ErrNonFinite) || errors.Is(err, ErrGradientNorm) || errors.Is(err, ErrNoQuorum)
}

// Replica is one rank's copy of the model, kept in step with the others:
// after every backward pass its gradients are averaged over the ring before
// the optimizer applies them, so every replica applies the same bits.
type Replica struct {
	Model Model
	Opt   Optimizer
	Coll  Collective
	// Steps counts the steps run, applied or skipped. With the rank it
	// seeds each step's dropout masks, so they differ between ranks (each
	// drops its own units, as separate GPUs would) and a resumed run, which
	// sets it from the checkpoint, draws what an uninterrupted one would.
	Steps int
	// Leave, once closed, makes this rank ask the ring to stop: its next
	// step carries the request to every rank, all apply that step, and all
	// return a *LeaveError from it — the same step everywhere, where a rank
	// that simply stopped would leave the others stuck in a collective.
	// It is looked at once the step's gradients are computed, so a model
	// may close it during ForwardBackward to stop after that step (a
	// pipeline stage that heard of a stop from the stages beside it).
	Leave <-chan struct{}
	// Waiting, if set, is asked before each step that talks to the ring
	// whether a newcomer waits to be admitted. The answer rides in the
	// step's trailer, so every rank hears it after the same step, and Run
	// stops there with an *Interrupted (ErrNewcomer) for the ring to grow.
	Waiting func() bool
	// NormGuard, if above 0, is the gradient norm guard's factor: every rank
	// declares its gradient norm in the step's allreduce, and a step where
	// one rank's norm is over NormGuard times the median (the lower one
	// for an even count) is skipped on every rank, naming that rank. It
	// also skips a step whose averaged gradient is longer than the mean of
	// the declared norms (the triangle inequality), which no honest set of
	// ranks can send: so a member that declares a small norm and sends a
	// huge gradient cannot get it applied either — what it can add unseen
	// is bounded by the honest ranks' own norms. Every rank must hold the
	// same value (the job config's grad_norm_guard, part of its hash).
	NormGuard float64
	// Wire is how the gradients travel in the step's allreduce: ring.F32
	// (the default), or narrowed to ring.BF16 or ring.FP16 — half the bytes;
	// the sums are still float32 and every rank ends with the same bits.
	// The step's trailer (flags, leave slots, norms) then goes in a second,
	// small float32 allreduce, as it must stay exact. The Collective must
	// be a NarrowAllreducer (ring.Ring is). Every rank must hold the same
	// value (the job config's compression, part of its hash).
	//
	// ring.I8 (blockwise int8, a little over a quarter of the bytes) comes
	// with error feedback: each rank adds to its gradients what rounding
	// took from them at its last applied step, rounds the sum as the ring
	// will, sends that and keeps the new remainder — so what int8 cannot
	// carry is delayed, not lost. The remainder is this rank's own and
	// lives in memory only: a restarted rank starts it from zero, which
	// loses at most one step's rounding.
	Wire ring.Encoding
	// BucketBytes, if above 0, sends the gradients in buckets of about
	// this many bytes (the first, the last tensors', of FirstBucketBytes),
	// and for a Layered model (the own engine) overlaps them with
	// backward: each goes round as soon as backward has finished its
	// layers, while the layers before it still compute. Every rank must
	// hold the same value (the job config's bucket_mb, part of its hash);
	// the buckets depend on the tensors' sizes alone, so ranks whose
	// gradients come from different engines send the same ones. Where the
	// plan is one bucket (a model under FirstBucketBytes) the step takes
	// the plain path.
	BucketBytes int
	// Trace, if set, is told each phase of every step as it ends: the
	// timeline of `--trace`.
	Trace Tracer

	// InnerSkip, after a Step with LocalSGD, says why this rank skipped
	// its inner step (ErrNonFinite), or is nil. The skip is this rank's
	// alone — its parameters did not move, the others' did — so Step does
	// not return it.
	InnerSkip error

	// Stats is what this replica has done, summed since it was made.
	Stats ReplicaStats
	// checkedCompute is Stats.Compute at the last CheckInSync; rankCompute
	// every rank's compute seconds between the last two.
	checkedCompute time.Duration
	rankCompute    []float64

	nparams int
	// flat holds every gradient (or, to broadcast, parameter) tensor end
	// to end, then the non-finite flag, then one leave flag per rank.
	flat []float32
	// views are the gradient tensors' places in flat: the optimizer reads
	// the averaged gradients there, which saves copying them back.
	views           [][]float32
	plan            [][2]int // bucketPlan's, for planFor and planOf
	planFor, planOf int
	backwardDone    time.Time // when an overlapped step's backward ended
	// undone is how many steps the last failed Step took back (a LocalSGD
	// round's, or 1); outerDone whether the last Step applied an outer
	// step; closeRound makes the next Step close a LocalSGD round (Run
	// sets it for an epoch's last step).
	undone     int
	outerDone  bool
	closeRound bool
	// partStep and partSteps are the step under way in Run's epoch part
	// and the part's steps (0 when Step is driven otherwise); epochEnd
	// says that the last Step closed the part's last outer round of a
	// LocalSGD with a Deadline while this rank was behind: its part of
	// the epoch ends there.
	partStep, partSteps int
	epochEnd            bool
	partMax             int // the last part's steps, for Level after it
	// outerChecked says that the last Step's outer round compared the
	// ranks' anchors itself (a LocalSGD with a Deadline).
	outerChecked bool

	// newcomer is whether the last Step's trailer said a newcomer waits.
	newcomer bool
	// inModel is whether this step's gradients were left in the model
	// (solo), not gathered into the ring's buffer.
	inModel bool
	// share is this rank's part of the next step's samples times the
	// world size: 1 when every rank has a full batch, less or more at an
	// epoch's uneven end, 0 for a rank with none. Its gradients are scaled
	// by it, so the ring's mean is the mean over the step's samples —
	// what one replica would compute on all of them. Run sets it for each
	// step; zero, outside Run, means 1.
	share float32
	// residual is error feedback's remainder from the last applied step;
	// pending the one this step leaves, kept only if it is applied.
	residual, pending []float32
}

// ReplicaStats is where a replica's steps spent their time and what they
// did, summed since it was made; Progress reports carry a copy.
type ReplicaStats struct {
	Steps   int // steps run, applied or skipped
	Skipped int // steps skipped for NaN or Inf gradients
	Reforms int // times the ring re-formed under it
	// Compute is forward and backward (on a device, for a ring of one, the
	// whole step: there is no allreduce); Wait the time in the allreduce
	// until the neighbour's first frame came (the other ranks still
	// computing); Ring the rest of the allreduce; Optimizer the update.
	// With gradient buckets (BucketBytes) the ring runs during backward:
	// Compute is then forward and backward with the ring beside it, Ring
	// only what is left of it after backward, and Wait is not told apart.
	Compute, Wait, Ring, Optimizer time.Duration
	// BytesSent is what this rank sent in its steps' allreduces (gradients,
	// the step's flags and slots, leave confirmations; failed attempts
	// too): measured, frame headers included, where the Collective counts
	// what it sends (ring.Ring's Stats); else estimated as 2(n−1)/n of the
	// buffer, what a ring allreduce sends.
	BytesSent int64
	// ForgedLeaves counts leave requests made in another rank's name: that
	// rank denied them, and every rank ignored them (see confirmLeaves).
	ForgedLeaves int
}

// LeaveError is what Step returns once a rank has asked to leave; the step
// it comes from was applied on every rank.
type LeaveError struct {
	Ranks []int // the ranks that asked
}

func (e *LeaveError) Error() string {
	return fmt.Sprintf("train: ranks %v asked to stop; every rank stops after this step", e.Ranks)
}

// OthersCarryOn reports whether, in a ring of size, enough ranks stay
// when these leave for the others to go on without them (at least
// minSize, and one): the rule every rank applies alike, the leavers to go
// and the others to re-form.
func (e *LeaveError) OthersCarryOn(size, minSize int) bool {
	return size-len(e.Ranks) >= max(minSize, 1)
}

// Unwrap makes a LeaveError an ErrStopped.
func (e *LeaveError) Unwrap() error { return ErrStopped }

// ErrLiar means ranks told the others what no honest replica could: a
// position too far ahead, state that does not match the hash they
// declared, parameters unlike everyone else's.
var ErrLiar = errors.New("train: ranks are not consistent with the others")

// LiarError names the ranks caught and says why. Run drops them: the
// others re-form the ring without them when enough remain.
type LiarError struct {
	Ranks []int
	Why   string
}

func (e *LiarError) Error() string {
	return fmt.Sprintf("train: ranks %v: %s", e.Ranks, e.Why)
}

// Unwrap makes a LiarError an ErrLiar.
func (e *LiarError) Unwrap() error { return ErrLiar }

// NewReplica wires a model, an optimizer and a collective.
func NewReplica(m Model, opt Optimizer, c Collective) *Replica {
	n := 0
	for _, p := range m.Params() {
		n += len(p)
	}
	return &Replica{Model: m, Opt: opt, Coll: c, nparams: n}
}

// Resident is a Model whose parameters live on a device, such as a GPU. It
// hands the replica its gradients end to end, in host memory it provides
// for a fast copy (page-locked), and checked for NaN and Inf on the device.
type Resident interface {
	Model
	// FlatBuffer returns n values of that host memory, valid until the
	// model is closed; the replica keeps its flat buffer there.
	FlatBuffer(n int) ([]float32, error)
	// ForwardBackwardFlat is ForwardBackward leaving the gradients end to
	// end in flat[:P] (P the values of all Params) instead of in Grads;
	// bad is the first tensor with a NaN or Inf, or -1.
	ForwardBackwardFlat(x []float32, y []int, n int, flat []float32) (loss float32, bad int, err error)
}

// DeviceOptimizer is an Optimizer that runs where a Resident model keeps
// its parameters, its own state kept there too.
type DeviceOptimizer interface {
	Optimizer
	// StepFlat applies the update from gradients end to end (the replica's
	// averaged flat buffer) unless one is NaN or Inf, which it checks where
	// it runs; finite says whether it applied them.
	StepFlat(grads []float32) (finite bool, err error)
	// StepAlone is a whole step for a ring of one, which has nothing to
	// average: forward, backward, the check for NaN and Inf, and the update
	// unless the check failed (then bad names the tensor, else it is -1),
	// the gradients never leaving the device.
	StepAlone(x []float32, y []int, n int) (loss float32, bad int, err error)
}

// buffer returns the flat buffer for the collective's size; it is made
// once per ring, not per step, in the model's memory if it is Resident.
func (r *Replica) buffer() ([]float32, error) {
	if want := r.nparams + stepTrailer(r.Coll.Size(), r.NormGuard > 0); len(r.flat) != want {
		if res, ok := r.Model.(Resident); ok {
			flat, err := res.FlatBuffer(want)
			if err != nil {
				return nil, err
			}
			r.flat = flat
		} else {
			r.flat = make([]float32, want)
		}
		r.views = r.views[:0]
		o := 0
		for _, p := range r.Model.Params() {
			r.views = append(r.views, r.flat[o:o+len(p):o+len(p)])
			o += len(p)
		}
	}
	return r.flat, nil
}

// SyncParams makes every replica start from rank 0's parameters.
func (r *Replica) SyncParams(ctx context.Context) error {
	flat, err := r.buffer()
	if err != nil {
		return err
	}
	params := flat[:r.nparams]
	gather(params, r.Model.Params())
	if err := r.Coll.Broadcast(ctx, params, 0); err != nil {
		return fmt.Errorf("train: broadcasting parameters: %w", err)
	}
	scatter(r.Model.Params(), params)
	return nil
}

// Tracer is told the phases of a replica's steps, for a timeline: name
// is "data", "forward", "backward" ("forward+backward" for a model that
// cannot tell them apart), "allreduce" (each bucket's, with buckets),
// "wait" (for the slowest rank, inside an allreduce) or "optimizer"; step
// is the replica's step count; bucket the bucket's index, or −1.
type Tracer interface {
	Span(name string, start, end time.Time, step, bucket int)
}

// ForwardTimer is a Model that can tell when the forward pass of its last
// ForwardBackward ended, so that a timeline shows forward and backward
// apart.
type ForwardTimer interface {
	ForwardEnd() time.Time
}

// traceCompute reports a forward and backward pass from t0 to t1.
func (r *Replica) traceCompute(t0, t1 time.Time) {
	if r.Trace == nil {
		return
	}
	if ft, ok := r.Model.(ForwardTimer); ok {
		if fe := ft.ForwardEnd(); !fe.Before(t0) && !fe.After(t1) {
			r.Trace.Span("forward", t0, fe, r.Steps, -1)
			r.Trace.Span("backward", fe, t1, r.Steps, -1)
			return
		}
	}
	r.Trace.Span("forward+backward", t0, t1, r.Steps, -1)
}

// Step trains on one local batch: forward and backward, gradients averaged
// over the ring, optimizer step. It returns the local loss.
//
// A NaN or Inf gradient on any rank would poison every replica, so each rank
// appends a flag to its gradients — 1 if any of its own is not finite — and
// the one allreduce that averages them also tells every rank whether any
// rank was bad. Nothing is applied then: every rank skips the step, and Step
// returns an error wrapping ErrNonFinite that says how many ranks were bad
// and, for this rank, which tensor. A rank that sends NaN or Inf with its
// flag at 0 is caught too: the average is checked before it is applied.
// Requests to leave ride in the same allreduce, one slot per rank.
//
// A Resident model checks its gradients on its device and copies them
// straight into the flat buffer; a DeviceOptimizer applies the average
// there. With both on a ring of one, the whole step stays on the device.
func (r *Replica) Step(ctx context.Context, x []float32, y []int, n int) (float32, error) {
	loss, talk, err := r.stepBegin(x, y, n)
	if !talk {
		return loss, err
	}
	if o, ok := r.Opt.(*LocalSGD); ok && (o.streaming() || o.Deadline > 0) {
		var err error
		if o.Deadline > 0 {
			loss, err = r.quorumStep(ctx, o, loss)
		} else {
			loss, err = r.streamStep(ctx, o, loss)
		}
		if errors.Is(err, ErrCollective) {
			r.undoStep(o)
		}
		return loss, err
	}
	t0 := time.Now()
	if dev, ok := r.Opt.(DeviceOptimizer); ok && r.Coll.Size() == 1 {
		loss, err := r.stepAlone(dev, x, y, n)
		r.Stats.Compute += time.Since(t0)
		if r.Trace != nil {
			r.Trace.Span("forward+backward", t0, time.Now(), r.Steps, -1)
		}
		if errors.Is(err, ErrNonFinite) {
			r.Stats.Skipped++
		}
		return loss, err
	}
	flat, err := r.buffer()
	if err != nil {
		return 0, err
	}
	if counter, ok := r.Coll.(byteCounter); ok {
		sent0 := counter.Stats().BytesSent
		defer func() { r.Stats.BytesSent += counter.Stats().BytesSent - sent0 }()
	} else if size := int64(r.Coll.Size()); size > 1 {
		// A ring allreduce sends 2(n−1)/n of the buffer's bytes.
		payload := int64(r.Wire.Size(r.nparams) + 4*(len(flat)-r.nparams))
		defer func() { r.Stats.BytesSent += 2 * (size - 1) * payload / size }()
	}
	local, _ := r.Opt.(*LocalSGD)
	says := stepSays{leave: r.leaving(), newcomer: r.Waiting != nil && r.Waiting()}
	loss, bad, err := r.average(ctx, x, y, n, flat, loss, &says, t0)
	if err != nil {
		if errors.Is(err, ErrCollective) {
			r.undoStep(local)
		}
		return 0, err
	}
	t2 := time.Now()
	defer func() {
		r.Stats.Optimizer += time.Since(t2)
		if r.Trace != nil {
			r.Trace.Span("optimizer", t2, time.Now(), r.Steps, -1)
		}
	}()
	tail := flat[r.nparams:]
	badRanks, newcomer, leaving := stepFlagsOf(tail, r.Coll.Size())
	r.newcomer = newcomer
	if leaving, err = r.leavers(ctx, leaving, says.leave); err != nil {
		r.undoStep(local)
		return 0, err
	}
	if err = r.apply(flat, bad, badRanks); Skipped(err) {
		r.Stats.Skipped++
	}
	if errors.Is(err, errDevice) {
		return loss, err
	}
	if leaving == nil {
		return loss, err
	}
	if err != nil {
		return loss, errors.Join(err, &LeaveError{Ranks: leaving})
	}
	return loss, &LeaveError{Ranks: leaving}
}

// stepBegin opens a step: dropout masks, counters, and with LocalSGD the
// inner step, which may be all there is to it. talk says whether the step
// goes on to the ring; if not, loss and err are the step's.
func (r *Replica) stepBegin(x []float32, y []int, n int) (loss float32, talk bool, err error) {
	if s, ok := r.Model.(MaskSeeder); ok {
		s.SeedMasks(uint64(r.Steps)<<20 ^ uint64(r.Coll.Rank()))
	}
	r.Steps++
	r.Stats.Steps++
	r.undone, r.outerDone, r.InnerSkip, r.newcomer, r.epochEnd, r.outerChecked = 1, false, nil, false, false, false
	local, ok := r.Opt.(*LocalSGD)
	if !ok {
		return 0, true, nil
	}
	t0 := time.Now()
	loss, err = r.innerStep(local, x, y, n)
	r.Stats.Compute += time.Since(t0)
	r.traceCompute(t0, time.Now())
	if err != nil && !Skipped(err) {
		r.Steps--
		r.Stats.Steps--
		return 0, false, err
	}
	r.InnerSkip = err // this rank's alone: the others go on, and so does it
	// Until the round ends there is no word with the others; then the
	// outer step's outcome, not the inner step's skip, is what this step
	// reports.
	if local.streaming() {
		return loss, local.dueExchange(r.closeRound), nil
	}
	if local.Deadline > 0 {
		return loss, true, nil // quorumStep decides
	}
	return loss, local.done >= local.Every || r.closeRound, nil
}

// average computes this rank's gradients (with LocalSGD, the round's
// delta; innerLoss is its loss) into flat with the step's trailer, and
// averages both over the ring, in buckets beside backward where there is
// a plan. bad is this rank's first non-finite tensor, or -1. A failed
// collective is an ErrCollective.
func (r *Replica) average(ctx context.Context, x []float32, y []int, n int, flat []float32, innerLoss float32, says *stepSays, t0 time.Time) (loss float32, bad int, err error) {
	narrow, _ := r.Coll.(NarrowAllreducer)
	if r.Wire != ring.F32 && narrow == nil {
		return 0, -1, fmt.Errorf("train: gradients to send as %v, but the collective (%T) sends float32 only", r.Wire, r.Coll)
	}
	local, isLocal := r.Opt.(*LocalSGD)
	if isLocal && local.Sparse != nil && r.Wire != ring.F32 {
		return 0, -1, fmt.Errorf("train: sparse pseudo-gradients are coded by LocalSGD; gradients to send as %v would code them twice", r.Wire)
	}
	if plan := r.bucketPlan(); plan != nil && !isLocal {
		// Buckets go round while backward computes the layers before them.
		loss, bad, err = r.bucketed(ctx, x, y, n, flat, plan, narrow, says)
		r.Stats.Ring += time.Since(r.backwardDone)
		r.Stats.Compute += r.backwardDone.Sub(t0)
		r.traceCompute(t0, r.backwardDone)
		return loss, bad, err
	}
	bad = -1
	r.inModel = false
	switch res, ok := r.Model.(Resident); {
	case isLocal:
		loss, bad = innerLoss, local.delta(flat[:r.nparams], r.Model.Params())
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
	if bad < 0 && !isLocal {
		r.scale(flat[:r.nparams])
	}
	if r.Wire == ring.I8 && bad < 0 {
		r.feedback(flat, 0, r.nparams)
	}
	if r.NormGuard > 0 && bad < 0 {
		says.norm = float32(norm2(flat[:r.nparams]))
	}
	says.nonFinite = bad >= 0
	// Asked during the computation (a pipeline stage hears it in the
	// step's frames): this step's trailer carries it.
	says.leave = says.leave || r.leaving()
	tail := flat[r.nparams:]
	says.put(tail, r.Coll.Rank(), r.Coll.Size())
	t1 := time.Now()
	r.Stats.Compute += t1.Sub(t0)
	if !isLocal {
		r.traceCompute(t0, t1)
	}
	if isLocal && local.Sparse != nil {
		err = r.gatherSparse(ctx, local, flat[:r.nparams], tail, 0, 1, bad)
	} else if r.Wire == ring.F32 {
		err = r.Coll.AllreduceMean(ctx, flat)
	} else if err = narrow.AllreduceMeanAs(ctx, flat[:r.nparams], r.Wire); err == nil {
		err = r.Coll.AllreduceMean(ctx, tail)
	}
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
		return loss, bad, fmt.Errorf("%w: averaging gradients: %w", ErrCollective, err)
	}
	return loss, bad, nil
}

// gatherSparse averages the pseudo-gradients of a LocalSGD round's
// fragments [from, to) — avg, the flat range they cover end to end — each
// rank's coded sparse (LocalSGD.Sparse), a part per fragment: the trailer
// tail in an allreduce, then every rank's payload gathered and decoded
// into avg in rank order, so that every rank adds up the same bits. A
// rank whose round is not finite sends nothing; its flag in the trailer
// makes every rank skip the round.
func (r *Replica) gatherSparse(ctx context.Context, o *LocalSGD, avg, tail []float32, from, to, bad int) error {
	parts, sizes := make([][]float32, 0, to-from), make([]int, 0, to-from)
	base, _ := o.fragment(from, r.nparams)
	for k := from; k < to; k++ {
		lo, hi := o.fragment(k, r.nparams)
		parts, sizes = append(parts, avg[lo-base:hi-base]), append(sizes, hi-lo)
	}
	var mine []byte
	if bad < 0 {
		for i, d := range parts {
			p, err := o.encode(from+i, d)
			if err != nil {
				return err
			}
			mine = sparse.AppendPart(mine, p)
		}
	}
	// The payloads' lengths ride with the trailer, one slot per rank: a
	// collective the fewer, which a slow rank on the ring makes dear.
	size := r.Coll.Size()
	withLens := make([]float32, len(tail)+size)
	copy(withLens, tail)
	withLens[len(tail)+r.Coll.Rank()] = float32(len(mine))
	if err := r.Coll.AllreduceMean(ctx, withLens); err != nil {
		return err
	}
	copy(tail, withLens)
	all, err := broadcastEach(ctx, r.Coll, mine, withLens[len(tail):], float64(size), o.Sparse.MaxParts(sizes))
	if err != nil {
		return err
	}
	clear(avg)
	w := 1 / float32(len(all))
	for k, p := range all {
		if len(p) == 0 {
			continue
		}
		if err := sparse.DecodeParts(parts, p, w); err != nil {
			return fmt.Errorf("rank %d's pseudo-gradient: %w", k, err)
		}
	}
	return nil
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

// leavers confirms the leave requests the trailer holds (confirmLeaves)
// and adds this rank's own if a member cancelled it on the way: it leaves
// anyway, and the others find it gone at the next step and re-form
// without it.
func (r *Replica) leavers(ctx context.Context, leaving []int, asked bool) ([]int, error) {
	if leaving != nil {
		var err error
		if leaving, err = r.confirmLeaves(ctx, leaving, asked); err != nil {
			return nil, fmt.Errorf("%w: confirming leave requests: %w", ErrCollective, err)
		}
	}
	if asked && !slices.Contains(leaving, r.Coll.Rank()) {
		leaving = append(leaving, r.Coll.Rank())
	}
	return leaving, nil
}

// skipped says why every rank skips the step before looking at the
// average: a rank flagged NaN or Inf, or the norm guard.
func (r *Replica) skipped(avg, tail []float32, bad, badRanks int) error {
	if badRanks > 0 {
		where := "its own are finite"
		if bad >= 0 {
			where = "its " + r.Model.ParamNames()[bad] + " gradient is not"
		}
		return fmt.Errorf("train: %d of %d ranks had NaN or Inf gradients (rank %d: %s); step skipped on all: %w",
			badRanks, r.Coll.Size(), r.Coll.Rank(), where, ErrNonFinite)
	}
	if r.NormGuard > 0 && r.Coll.Size() > 1 {
		return r.normGuard(avg, tail)
	}
	return nil
}

// solo reports whether this step's gradients stay where the model keeps
// them: on a ring of one, with float32 on the wire, no norm guard, and
// neither LocalSGD nor a model that computes into the buffer itself, the
// average is the rank's own gradients, and gathering them into the ring's
// buffer (tens of megabytes for the cnn) would only copy them. They are
// checked for NaN and Inf where they are, and applied from there.
func (r *Replica) solo() bool {
	if _, local := r.Opt.(*LocalSGD); local {
		return false
	}
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
	local, isLocal := r.Opt.(*LocalSGD)
	applied, err := false, r.skipped(avg, tail, bad, badRanks)
	switch dev, onDevice := r.Opt.(DeviceOptimizer); {
	case err != nil:
	case isLocal:
		if applied = finite(avg); applied {
			local.apply(r.Model.Params(), avg)
			r.outerDone = true
		}
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
	if isLocal && !applied { // the round is skipped on every rank
		local.back(r.Model.Params())
	}
	if err != nil {
		return err
	}
	if !applied {
		// Every rank flagged its own gradients finite, yet their average is
		// not: a rank sent NaN or Inf and hid it (or the sum overflowed).
		return fmt.Errorf("train: the averaged gradients hold a NaN or Inf though all %d ranks flagged theirs finite (a rank hid its own, or the sum overflowed); step skipped on all: %w",
			r.Coll.Size(), ErrNonFinite)
	}
	if r.Wire == ring.I8 {
		r.residual, r.pending = r.pending, r.residual
	}
	return nil
}

// innerStep is a LocalSGD step on this rank alone: forward, backward and
// the inner optimizer, opening a round at the parameters if none is open.
// A NaN or Inf gradient skips the inner step here only (ErrNonFinite).
func (r *Replica) innerStep(o *LocalSGD, x []float32, y []int, n int) (float32, error) {
	if !o.open {
		if err := o.validate(); err != nil {
			return 0, err
		}
		o.begin(r.Model.Params())
	}
	var loss float32
	bad := -1
	if n == 0 { // nothing to train on here this step (an epoch's uneven end)
		o.done++
		return 0, nil
	}
	if dev, ok := o.Inner.(DeviceOptimizer); ok {
		var err error
		if loss, bad, err = dev.StepAlone(x, y, n); err != nil {
			return 0, err
		}
	} else {
		var err error
		if loss, err = r.Model.ForwardBackward(x, y, n); err != nil {
			return 0, err
		}
		for k, g := range r.Model.Grads() {
			if !finite(g) {
				bad = k
				break
			}
		}
		if bad < 0 {
			o.Inner.Step(r.Model.Params(), r.Model.Grads())
		}
	}
	o.done++
	if bad >= 0 {
		r.Stats.Skipped++
		return loss, fmt.Errorf("train: rank %d skipped an inner step: its %s gradient holds a NaN or Inf: %w",
			r.Coll.Rank(), r.Model.ParamNames()[bad], ErrNonFinite)
	}
	return loss, nil
}

// undoStep takes back a step that failed in a collective, so that it runs
// again with the same dropout masks; with LocalSGD, the whole round: the
// rank returns to the anchor. r.undone says how many steps were undone.
func (r *Replica) undoStep(local *LocalSGD) {
	switch {
	case local != nil && local.open && local.streaming():
		// Every fragment goes back to its anchor; the steps since the
		// failed exchange began run again — their samples are in no
		// anchor — and what the others did since their fragments' last
		// outer steps is dropped, as at any ring change (Level).
		r.undone = local.done - local.began + 1
		local.back(r.Model.Params())
	case local != nil && local.open:
		r.undone = local.back(r.Model.Params())
	}
	r.Steps -= r.undone
	r.Stats.Steps -= r.undone
}

// feedback is error feedback's half of a step for the gradients
// flat[lo:hi], sent as one allreduce: it adds the last applied step's
// remainder to them, rounds them to the wire's values (as the ring's first
// hop would) and keeps what rounding took in r.pending.
func (r *Replica) feedback(flat []float32, lo, hi int) {
	if len(r.residual) != r.nparams {
		r.residual, r.pending = make([]float32, r.nparams), make([]float32, r.nparams)
	}
	grads, res, pend := flat[lo:hi], r.residual[lo:hi], r.pending[lo:hi]
	for i, e := range res {
		grads[i] += e
	}
	copy(pend, grads)
	r.Wire.Round(grads)
	for i, q := range grads {
		pend[i] -= q
	}
}

// leaveAnswer is a rank's answer in the round that confirms leave
// requests: a denial of its own request, which it did not make. Deny is a
// random number, so that a forger, who can add to any rank's row of the
// summed table but does not know it, cannot cancel the denial.
type leaveAnswer struct {
	Deny uint64 `json:"deny"`
}

// maxLeaveAnswerBytes bounds a leaveAnswer's encoding.
const maxLeaveAnswerBytes = 40

// confirmLeaves is the second round of a step whose leave slots are set.
// The slots are sums, so any member can set another rank's slot and make it
// stop; only the rank itself knows whether it asked. So every rank whose
// slot was set but did not ask sends a denial (leaveAnswer) in a gathered
// message. Every rank reads the same rows, so all drop the same denied
// ranks from the leavers — a row that does not decode counts as a denial
// too, as only tampering makes one — and count them in
// Stats.ForgedLeaves. The forger cannot be named: a sum does not say who
// added to it. A member can still deny a real request; its maker then
// leaves anyway, and the others re-form when it is gone.
func (r *Replica) confirmLeaves(ctx context.Context, leaving []int, asked bool) ([]int, error) {
	var mine *leaveAnswer
	if me := r.Coll.Rank(); slices.Contains(leaving, me) && !asked {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		mine = &leaveAnswer{Deny: binary.LittleEndian.Uint64(b[:]) | 1}
	}
	answers, bad, err := gatherMsgs(ctx, r.Coll, mine, maxLeaveAnswerBytes)
	if err != nil {
		return nil, err
	}
	var confirmed []int
	for _, k := range leaving {
		if answers[k] != nil || slices.Contains(bad, k) {
			r.Stats.ForgedLeaves++
			continue
		}
		confirmed = append(confirmed, k)
	}
	return confirmed, nil
}

// normGuard decides, from the averaged gradients and the declared norms in
// the averaged trailer — the same bits on every rank, so the same decision
// everywhere — whether the step must be skipped (see NormGuard).
func (r *Replica) normGuard(avg, tail []float32) error {
	size := r.Coll.Size()
	norms := normsOf(tail, size)
	sum := 0.0
	for k, v := range norms {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("train: rank %d declared a gradient norm of %g; step skipped on all: %w", k, v, ErrGradientNorm)
		}
		sum += v
	}
	sorted := slices.Clone(norms)
	slices.Sort(sorted)
	med := sorted[(size-1)/2]
	var far []int
	for k, v := range norms {
		if med > 0 && v > r.NormGuard*med {
			far = append(far, k)
		}
	}
	if far != nil {
		var got []string
		for _, k := range far {
			got = append(got, fmt.Sprintf("%.3g", norms[k]))
		}
		return fmt.Errorf("train: rank(s) %v sent gradients of norm %v, over %g × the median %.3g; step skipped on all: %w",
			far, got, r.NormGuard, med, ErrGradientNorm)
	}
	if n := norm2(avg); n > sum/float64(size)*guardSlack(r.Wire, size)+1e-30 {
		return fmt.Errorf("train: the averaged gradient's norm %.3g is over the mean %.3g of the norms the ranks declared — a rank declared less than it sent; step skipped on all: %w",
			n, sum/float64(size), ErrGradientNorm)
	}
	return nil
}

// guardSlack is how far over the mean of the declared norms rounding
// alone can take the averaged gradient's norm: each of the n−1 hops and
// the last narrowing round once. A float32 sum's rounding is far below
// 0.1%; bf16 and fp16 round each value by at most 2^-8 and 2^-11 of itself;
// int8 each value by half a step of its block's scale, which over a block
// of 256 is at most 1/16 of the block's norm.
func guardSlack(wire ring.Encoding, n int) float64 {
	per := 0.0
	switch wire {
	case ring.BF16:
		per = 1.0 / 256
	case ring.FP16:
		per = 1.0 / 2048
	case ring.I8:
		per = math.Sqrt(ring.I8Block) / 254
	}
	return 1.001 + float64(n)*per
}

// norm2 is the Euclidean norm of v, summed in float64.
func norm2(v []float32) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(v); i += 4 {
		a, b, c, d := float64(v[i]), float64(v[i+1]), float64(v[i+2]), float64(v[i+3])
		s0 += a * a
		s1 += b * b
		s2 += c * c
		s3 += d * d
	}
	for ; i < len(v); i++ {
		s0 += float64(v[i]) * float64(v[i])
	}
	return math.Sqrt(s0 + s1 + s2 + s3)
}

// leaving reports whether this rank has been asked to leave.
func (r *Replica) leaving() bool {
	select {
	case <-r.Leave:
		return true
	default:
		return false
	}
}

// stepAlone is Step for a ring of one with a DeviceOptimizer: the same
// outcomes (ErrNonFinite, LeaveError) without the flat buffer, which a ring
// of one would only average with itself.
func (r *Replica) stepAlone(dev DeviceOptimizer, x []float32, y []int, n int) (float32, error) {
	leave := r.leaving()
	r.newcomer = r.Waiting != nil && r.Waiting()
	loss, bad, err := dev.StepAlone(x, y, n)
	if err != nil {
		return 0, err
	}
	if bad >= 0 {
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

// Snapshot fills a checkpoint's parameters and optimizer state with
// copies of the replica's; base supplies the rest.
func (r *Replica) Snapshot(base Checkpoint) *Checkpoint {
	c := base
	c.Params = nil
	for _, p := range r.agreedParams() {
		c.Params = append(c.Params, slices.Clone(p))
	}
	name, step, state := r.Opt.State()
	c.Optimizer, c.OptStep, c.OptState = name, step, nil
	for _, t := range state {
		c.OptState = append(c.OptState, slices.Clone(t))
	}
	return &c
}

// Restore loads a checkpoint's parameters and optimizer state, refusing
// one of another model or optimizer.
func (r *Replica) Restore(c *Checkpoint) error {
	if err := c.LoadInto(r.Model); err != nil {
		return err
	}
	if name, _, _ := r.Opt.State(); name != c.Optimizer {
		return fmt.Errorf("train: checkpoint was made with %s, this run uses %s: %w", c.Optimizer, name, ErrCheckpoint)
	}
	return r.Opt.SetState(c.OptStep, c.OptState, r.Model.Params())
}

// agreedParams is what every rank holds alike: the parameters, or in a
// streaming LocalSGD round, whose ranks' parameters never coincide, the
// anchors of their fragments — what every rank applied.
func (r *Replica) agreedParams() [][]float32 {
	params := r.Model.Params()
	o, ok := r.Opt.(*LocalSGD)
	if !ok || !o.open || !o.streaming() && o.Deadline <= 0 {
		return params
	}
	out, off := make([][]float32, len(params)), 0
	for k, p := range params {
		out[k] = o.anchor[off : off+len(p) : off+len(p)]
		off += len(p)
	}
	return out
}

// ParamHash is the SHA-256 of the parameters' bytes, to compare replicas;
// in a streaming LocalSGD round, of their anchors (agreedParams).
func (r *Replica) ParamHash() [32]byte {
	h := sha256.New()
	for _, p := range r.agreedParams() {
		h.Write(f32Bytes(p))
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// inSync is what each rank says at CheckInSync: its parameters' hash and
// its compute seconds since the last check.
type inSync struct {
	Hash    string  `json:"hash"`
	Compute float64 `json:"compute"`
}

// maxInSyncBytes bounds an inSync's encoding.
const maxInSyncBytes = 128

// CheckInSync compares every rank's parameter hash through the collective.
// Ranks that differ from the most (the lowest rank's hash on a tie) are
// named; the error is a *LiarError, though a bug could cause it as well as
// a lie.
//
// Each rank's row also carries its compute time since the last check, so
// every rank learns, in the same allreduce, which ranks are slow
// (RankCompute, Stragglers).
func (r *Replica) CheckInSync(ctx context.Context) error {
	mine := &inSync{Hash: paramHash(r.ParamHash()), Compute: (r.Stats.Compute - r.checkedCompute).Seconds()}
	states, bad, err := gatherMsgs(ctx, r.Coll, mine, maxInSyncBytes)
	if err != nil {
		return fmt.Errorf("%w: comparing parameter hashes: %w", ErrCollective, err)
	}
	for k, s := range states {
		if s == nil || !validHash(s.Hash) {
			bad = append(bad, k)
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return &LiarError{Ranks: slices.Compact(bad), Why: "their parameter hashes are missing or malformed"}
	}
	r.checkedCompute = r.Stats.Compute
	r.rankCompute = r.rankCompute[:0]
	for _, s := range states {
		v := s.Compute
		if !(v >= 0 && v < 1e12) { // another rank's garbage: no figure
			v = 0
		}
		r.rankCompute = append(r.rankCompute, v)
	}
	all := make([]int, len(states))
	for k := range all {
		all[k] = k
	}
	odd, majority := oddOnes(all, func(k int) string { return states[k].Hash })
	switch {
	case len(odd) > 0 && majority:
		return &LiarError{Ranks: odd, Why: "replicas out of step: they hold other parameters than most ranks"}
	case len(odd) > 0:
		return fmt.Errorf("train: replicas out of step: ranks %v hold other parameters than rank 0, and no majority tells which are right", odd)
	}
	return nil
}

// RankCompute returns every rank's compute seconds (forward and backward)
// between the last two CheckInSync calls — an epoch, in Run — by rank.
func (r *Replica) RankCompute() []float64 { return slices.Clone(r.rankCompute) }

// Stragglers returns the ranks whose compute took more than 1.2 times the
// median of all ranks' (by RankCompute), slowest first: the ones the
// others wait for at every allreduce.
func (r *Replica) Stragglers() []int { return stragglers(r.rankCompute) }

func stragglers(times []float64) []int {
	if len(times) < 2 {
		return nil
	}
	sorted := slices.Clone(times)
	slices.Sort(sorted)
	median := sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		median = (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
	}
	var out []int
	for k, v := range times {
		if v > 1.2*median {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b int) int { return cmp.Compare(times[b], times[a]) })
	return out
}

// oddOnes returns the ranks whose key differs from the one most ranks
// hold (the lowest rank's, on a tie), in order, and whether that one is
// held by more than half of them — without which nobody can tell who is
// right.
func oddOnes[K comparable](ranks []int, key func(int) K) ([]int, bool) {
	count := map[K]int{}
	for _, k := range ranks {
		count[key(k)]++
	}
	var best K
	n := 0
	for _, k := range ranks {
		if c := count[key(k)]; c > n {
			best, n = key(k), c
		}
	}
	var odd []int
	for _, k := range ranks {
		if key(k) != best {
			odd = append(odd, k)
		}
	}
	return odd, 2*n > len(ranks)
}

// gatherFinite copies the tensors into flat end to end and returns the
// index of the first that holds a NaN or an Inf, or -1: one vector pass
// per tensor that does both (vec.CopyFinite).
func gatherFinite(flat []float32, ts [][]float32) int {
	bad := -1
	o := 0
	for i, t := range ts {
		if !vec.CopyFinite(flat[o:o+len(t)], t) && bad < 0 {
			bad = i
		}
		o += len(t)
	}
	return bad
}

// nonFinite returns the index of the first tensor that holds a NaN or an
// Inf, or -1.
func nonFinite(ts [][]float32) int {
	for i, t := range ts {
		if !vec.Finite(t) {
			return i
		}
	}
	return -1
}

// finite reports whether every value of v is finite.
func finite(v []float32) bool { return vec.Finite(v) }

func gather(flat []float32, ts [][]float32) {
	o := 0
	for _, t := range ts {
		o += copy(flat[o:], t)
	}
}

func scatter(ts [][]float32, flat []float32) {
	o := 0
	for _, t := range ts {
		o += copy(t, flat[o:])
	}
}
