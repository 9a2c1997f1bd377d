package train

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ringtrain/ringtrain/ring"
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
	return errors.Is(err, ErrNonFinite) || errors.Is(err, ErrGradientNorm) || errors.Is(err, ErrNoQuorum) || errors.Is(err, ErrTampered) || errors.Is(err, ErrAudited)
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
	// Direct, if set, opens streams between this rank and others of the
	// ring, outside it: a newcomer then takes its state straight from each
	// donor, where a ring would pass every byte through every member
	// (Level). Every rank of a ring must have it, or none.
	Direct DirectLinker
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
	// is bounded by the honest ranks' own norms. With audits (Sketch's
	// AuditEvery), a rank over the bound is audited at once instead: kept
	// where its gradients are its batch's (a shard unlike the others'),
	// named where they are not. Every rank must hold the same value (the
	// job config's grad_norm_guard, part of its hash).
	NormGuard float64
	// Sketch, if set, checks the gradients of a ring that syncs every
	// step (no Sync) with sketches in the step's trailer (see Sketch).
	// Every rank must hold the same value (the job config's
	// update_checks, part of its hash).
	Sketch *Sketch
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
	// ClipNorm, if above 0, scales the gradients the optimizer applies to
	// a global norm of at most ClipNorm (torch's clip_grad_norm_): the
	// averaged gradients, which every rank holds alike, so every rank
	// clips alike; with LocalSGD, each inner step's own.
	ClipNorm float64
	// Sync is how the steps keep the ranks together: nil averages the
	// gradients at every step; NewLocalReplica sets the LocalSGD mode its
	// settings call for.
	Sync Sync

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
	views [][]float32
	bk    buckets
	// part is where Run's epoch part stands; out what the last Step did.
	part epochPart
	out  stepOutcome
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
	// sk is Sketch's state.
	sk sketches
	// tamper, if set, alters this rank's gradients before they are sent
	// (attack): set only by tests and attacker builds.
	tamper func(g []float32, off int)
	// peers gives another rank's batch of the step being taken, for
	// Sketch's audits: Run sets it where the split is held here.
	peers peerBatches
	audit audits
}

// trailerLen is the step trailer's length in the flat buffer.
func (r *Replica) trailerLen() int { return stepTrailer(r.Coll.Size(), r.NormGuard > 0) }

// sketching reports whether this step's trailer carries sketches: with
// Sketch, on a ring that syncs every step and has others to check.
func (r *Replica) sketching() bool { return r.Sketch != nil && r.Sync == nil && r.Coll.Size() > 1 }

// sketchSlots is the values the sketches take after the trailer.
func (r *Replica) sketchSlots() int {
	if !r.sketching() {
		return 0
	}
	return r.Sketch.slots(r.Coll.Size())
}

// tailOf is the trailer part of the flat buffer flat, without the
// sketches after it.
func (r *Replica) tailOf(flat []float32) []float32 {
	return flat[r.nparams : r.nparams+r.trailerLen()]
}

// sketchBegin starts this step's sketch of this rank's gradients.
func (r *Replica) sketchBegin() {
	if r.sketching() {
		r.sk.reset(r.Sketch, r.Coll)
		clear(r.sk.own)
	}
}

// sketchPut writes this rank's sketch after the trailer in flat; a rank
// whose gradients are not finite sends none (the step is skipped).
func (r *Replica) sketchPut(flat []float32, bad int) {
	if !r.sketching() {
		return
	}
	if bad >= 0 {
		clear(r.sk.own)
	}
	r.sk.put(flat[r.nparams+r.trailerLen():], r.Coll.Rank())
}

// buckets is the gradient buckets' plan (bucketPlan's) and when an
// overlapped step's backward ended.
type buckets struct {
	plan            [][2]int // for planFor bytes a bucket and planOf values
	planFor, planOf int
	backwardDone    time.Time
}

// epochPart is where Run's epoch part stands, for the Sync: step is the
// step under way and steps the part's (0 when Step is driven otherwise);
// max is the last part's steps, for Level after it; closing makes the
// step close a LocalSGD round (the part's last).
type epochPart struct {
	step, steps, max int
	closing          bool
}

// stepOutcome is what the last Step did, beyond its error: how many steps
// it took back after a failed collective (a LocalSGD round's, or 1);
// whether it applied an outer step, and whether that compared the ranks'
// anchors itself (a round with a Deadline); whether it closed the part's
// last outer round while this rank was behind, which ends its part of the
// epoch there; whether its trailer said a newcomer waits; the ranks its
// applied round named for their outlying updates (Robust.NameAfter).
type stepOutcome struct {
	undone                  int
	outerDone, outerChecked bool
	epochEnd                bool
	newcomer                bool
	named                   *LiarError
	far                     []int // the ranks the norm guard found over its bound
	// own and avg are what the step's passes over this rank's gradients
	// and over the average found beside their sketches.
	own, avg scanned
}

// scanned is the sum of a vector's squares from the pass that sketched
// it (sketchScan), where that pass ran.
type scanned struct {
	done    bool
	squares float64
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
	// Audits counts the ranks' gradients this rank recomputed to check
	// their sketches (Sketch.AuditEvery).
	Audits int
}

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
	if want := r.nparams + r.trailerLen() + r.sketchSlots(); len(r.flat) != want {
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
// over the ring, optimizer step — or, with a Sync, what its mode makes of
// the step. It returns the local loss.
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
// A step that fails in a collective (ErrCollective) is taken back — a
// LocalSGD round, all of it — so that it runs again with the same dropout
// masks.
func (r *Replica) Step(ctx context.Context, x []float32, y []int, n int) (float32, error) {
	s := r.sync()
	r.openStep()
	loss, talk, err := s.begin(r, x, y, n)
	if !talk {
		return loss, err
	}
	loss, err = s.exchange(ctx, r, x, y, n, loss)
	if errors.Is(err, ErrCollective) {
		r.out.undone = s.undo(r)
		r.Steps -= r.out.undone
		r.Stats.Steps -= r.out.undone
	}
	return loss, err
}

// sync is the replica's Sync, or every step's.
func (r *Replica) sync() Sync {
	if r.Sync == nil {
		return everyStep{}
	}
	return r.Sync
}

// openStep opens a step: dropout masks, counters, the last step's outcome
// forgotten.
func (r *Replica) openStep() {
	if s, ok := r.Model.(MaskSeeder); ok {
		s.SeedMasks(uint64(r.Steps)<<20 ^ uint64(r.Coll.Rank()))
	}
	r.Steps++
	r.Stats.Steps++
	r.out, r.InnerSkip = stepOutcome{undone: 1}, nil
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

// Snapshot fills a checkpoint's parameters and optimizer state with
// copies of the replica's; base supplies the rest.
func (r *Replica) Snapshot(base Checkpoint) *Checkpoint {
	c := base
	c.Params = nil
	for _, p := range r.agreedParams() {
		c.Params = append(c.Params, slices.Clone(p))
	}
	name, step, state := r.OptimizerState()
	c.Optimizer, c.OptStep, c.OptState = name, step, nil
	for _, t := range state {
		c.OptState = append(c.OptState, slices.Clone(t))
	}
	c.Feedback = nil
	if o := r.local(); o != nil {
		for _, t := range o.feedback() {
			c.Feedback = append(c.Feedback, slices.Clone(t))
		}
	}
	return &c
}

// local is the replica's LocalSGD, nil if it syncs every step.
func (r *Replica) local() *LocalSGD {
	switch s := r.sync().(type) {
	case rounds:
		return s.o
	case *streamed:
		return s.o
	case *deadlineRounds:
		return s.o
	}
	return nil
}

// Restore loads a checkpoint's parameters and optimizer state, refusing
// one of another model or optimizer.
func (r *Replica) Restore(c *Checkpoint) error {
	if err := c.LoadInto(r.Model); err != nil {
		return err
	}
	if name, _, _ := r.OptimizerState(); name != c.Optimizer {
		return fmt.Errorf("train: checkpoint was made with %s, this run uses %s: %w", c.Optimizer, name, ErrCheckpoint)
	}
	if err := r.setOptimizerState(c.OptStep, c.OptState); err != nil {
		return err
	}
	if len(c.Feedback) == 0 {
		return nil
	}
	o := r.local()
	if o == nil {
		return fmt.Errorf("train: checkpoint holds error feedback, and this run syncs every step: %w", ErrCheckpoint)
	}
	return o.setFeedback(c.Feedback, r.nparams)
}

// OptimizerState is what a checkpoint keeps of the optimizer: its name,
// step and state tensors — with a Sync that keeps state of its own (the
// outer momentum of LocalSGD), the Sync's, named for both.
func (r *Replica) OptimizerState() (name string, step int, tensors [][]float32) {
	return r.sync().state(r.Opt)
}

// setOptimizerState restores what OptimizerState returned.
func (r *Replica) setOptimizerState(step int, tensors [][]float32) error {
	return r.sync().setState(r.Opt, step, tensors, r.Model.Params())
}

// agreedParams is what every rank holds alike: the parameters, or where
// the Sync's ranks' parameters never coincide mid-round, the anchors.
func (r *Replica) agreedParams() [][]float32 { return r.sync().agreed(r.Model.Params()) }

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
