// Package elastic owns one peer's part of an elastic training job. It
// forms the ring through a Membership and trains with train.Run; training
// returns how it was interrupted and where, and the owner acts on that
// event — a peer lost, peers leaving, liars caught, a newcomer waiting —
// by re-forming or growing the ring, bringing the replicas level and
// training on: form → train → interrupted → (re-form | grow) → train. It
// also writes and resumes checkpoints and leaves the ring together with
// the others at the end — what Horovod's elastic mode and torchrun's
// rendezvous do, with no coordinator.
//
// # Events and what they cost
//
// Every event ends training at a step boundary, the same on every peer,
// and classify names it from what the collectives told every rank:
//
//   - lost (a collective failed: a peer died or stalled past the step
//     timeout): the survivors re-form and level — the one furthest on, at
//     most one step (a LocalSGD round), sends the others its state — and
//     the interrupted step runs again. Cost: the step, the re-formation
//     and the levelling.
//   - left (ranks asked to leave in the step's trailer, and enough stay):
//     the step was applied by all; the leavers drain their links and exit,
//     the others re-form without them and go on from the next step. Cost:
//     one small allreduce (the leave confirmation) and the re-formation.
//   - stopped (ranks asked to leave and too few would stay): every peer
//     stops after that step and writes its checkpoint.
//   - liars (a rank's claims or state cannot be an honest replica's):
//     re-formed without them, as for a loss.
//   - newcomer (rank 0 saw a verified standby and the ring is below
//     MaxWorldSize; a flag in the step's trailer): the ring grows at that
//     step boundary, the newcomers take the state from the ring's
//     donors — straight from each, where the Membership is a
//     train.DirectLinker — (hash-checked, each collective bounded by
//     AdmitTimeout) and the rest
//     of the epoch is shared out anew. A newcomer that vanishes or stalls
//     is dropped by the re-formation that follows, as a lost peer is.
//
// After MaxReforms re-formations in a row with no step completed between
// them, Run gives up with ErrReformBudget, naming the peer lost most often.
//
// # Pipeline jobs
//
// PipelineJob runs a job whose model is cut into stages (train/pipeline):
// one formation of all peers gives each its stage and replica, each
// stage's peers form a ring of their own (StageNet.StageRing) beside
// links to the stages before and after (StageNet.Boundary), and a stop on
// any peer stops all after the same step; then the peers asked to stop
// leave and the others go on from that step, if every stage keeps a peer,
// else the job ends there. Standbys are admitted the same way, at a step
// every peer stops after. A lost peer makes the survivors
// re-form and go back to the latest snapshot all of them hold; a peer its
// stage catches lying is dropped as in a replica job (its stage's peers
// re-form without it; the stages beside, which saw only their neighbour
// fail, find it gone); a stage left with no peer waits for a newcomer to
// take it from the stage's checkpoint. Both kinds share one
// classification of what ended a run (classify), one re-formation budget,
// one set of defaults and one checkpoint lookup, and are tested against
// one fake of the p2p layer. Every stage writes its own checkpoint and resumes from it;
// the first stage gathers the whole model at the end.
//
// # Usage
//
//	m := p2p.NewMembership(node, links, joinTimeout) // or any Membership
//	job := &elastic.Job{Members: m, Training: rc, WorldSize: 4, MinWorldSize: 3, StepTimeout: time.Minute, Out: os.Stdout}
//	sum, err := job.Run(ctx) // ctx's end: every peer stops after the same step
package elastic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
)

// Membership is what a job needs of the peers it trains with. Its methods
// are called from one goroutine. p2p.Membership has them.
type Membership interface {
	// Form joins the job's first ring and connects it; if the ring formed
	// without this peer, it waits as a standby until admitted to a grown
	// one, and says so with admitted.
	Form(ctx context.Context) (r *ring.Ring, admitted bool, err error)
	// Reform agrees with the members of the current ring, less those at
	// the ranks in gone, on the next generation, at least minSize strong,
	// and connects it. The caller has closed the current ring.
	Reform(ctx context.Context, minSize int, gone []int) (*ring.Ring, error)
	// Grow re-forms the current ring with the standbys in add, the same
	// list on every member; with admit (rank 0) this peer tells them first.
	// The caller has closed the current ring.
	Grow(ctx context.Context, add []string, admit bool, minSize int) (*ring.Ring, error)
	// Standbys are peers of the job outside the ring, waiting to be
	// admitted.
	Standbys() []string
	// Members are the current ring's members, in rank order.
	Members() []string
	// Distrust leaves peers caught lying out of every later ring and
	// admission, across their restarts.
	Distrust(peers []string)
	// Ended tells the standbys that the job has ended, so that they stop
	// waiting to be admitted; best effort, each within a bound.
	Ended(ctx context.Context)
}

// Job is one peer's part of an elastic job. Fill it, then call Run once.
type Job struct {
	// Members forms and re-forms the ring.
	Members Membership
	// Training is the training run; Job sets its Replica's collective and
	// Waiting, and its Save, Stop, Start and InSync.
	Training train.RunConfig
	// WorldSize is how many peers the first ring holds. MinWorldSize is
	// how few may carry on after peers are lost or leave; zero means
	// WorldSize. MaxWorldSize is how many the ring may grow to as
	// newcomers are admitted (Elastic Horovod's max_np); zero means
	// WorldSize.
	WorldSize, MinWorldSize, MaxWorldSize int
	// StepTimeout bounds every collective, so that a peer that stalls
	// fails the step instead of hanging it. Zero means a minute.
	StepTimeout time.Duration
	// AdmitTimeout bounds each collective that brings newcomers up to
	// date, so that one that stalls mid-admission is dropped within it and
	// the ring trains on. Zero means 10 s.
	AdmitTimeout time.Duration
	// MaxReforms is how many times in a row the ring may re-form without
	// a step completing in between before Run stops with
	// ErrReformBudget: a peer that fails every ring it is in would
	// otherwise keep the job re-forming for ever. Zero means 5.
	MaxReforms int
	// Checkpoint, if set, is where this peer writes its checkpoint (filled
	// from CheckpointBase) after every epoch, every Run.SaveEvery steps and
	// when stopped; a checkpoint found there at the start is offered to
	// the others when they agree where to resume (train.Replica.Resume).
	// Peers may differ in having one.
	Checkpoint     string
	CheckpointBase train.Checkpoint
	// Logger hears of formation, re-formation, admission, checkpoints and
	// the end; each line carries the peer's rank at the time.
	Logger zerolog.Logger
	// Out, if set, gets one line per ring formed ("ring formed: rank 0 of
	// 3, generation 1", "ring re-formed: …", "ring grew: …").
	Out io.Writer
	// Dropped, if set, hears of the peers dropped for lying (a desync
	// named), before the ring re-forms without them.
	Dropped func(peers []string, why string)

	rg      *ring.Ring
	budget  *budget
	noShows noShows
}

// noShows are standbys that were admitted and did not come: each is not
// admitted again until its wait is over, which doubles with each miss
// from a second to half a minute — each try costs the ring the wait for
// it in the re-formation.
type noShows map[string]noShow

type noShow struct {
	until time.Time
	wait  time.Duration
}

// missed notes that standby id did not come at now.
func (n noShows) missed(id string, now time.Time) {
	w := min(max(2*n[id].wait, time.Second), 30*time.Second)
	n[id] = noShow{until: now.Add(w), wait: w}
}

// admitted notes, after a growth that tried to admit add, which came (in
// members) and which did not, at now.
func (n noShows) admitted(add, members []string, now time.Time) {
	for _, id := range add {
		if slices.Contains(members, id) {
			delete(n, id)
		} else {
			n.missed(id, now)
		}
	}
}

// admittable are the standbys, up to room of them, but for those
// admitted before that did not come, while they wait out their miss.
func (n noShows) admittable(standbys []string, room int, now time.Time) []string {
	if room <= 0 {
		return nil
	}
	s := slices.DeleteFunc(standbys, func(id string) bool { return !n.ready(id, now) })
	return s[:min(room, len(s))]
}

// ready says whether standby id may be admitted at now.
func (n noShows) ready(id string, now time.Time) bool {
	return !now.Before(n[id].until)
}

// Rank is this peer's rank in the current ring.
func (j *Job) Rank() int { return j.rg.Rank() }

// Log is the job's logger with the current rank.
func (j *Job) Log() *zerolog.Logger {
	l := j.Logger.With().Int("rank", j.rg.Rank()).Logger()
	return &l
}

func (j *Job) say(format string, args ...any) {
	if j.Out != nil {
		fmt.Fprintf(j.Out, format+"\n", args...)
	}
}

// Run forms the ring, brings the replica to its starting state (rank 0's
// parameters, the ring's state on admission, or the most advanced
// checkpoint the peers agree on), and trains until the job ends. Training
// stops whenever the ring must change (train.Interrupted); Run then acts
// on the event (classify) — re-forms the ring without the peers lost,
// leaving or lying, or grows it with a newcomer — brings the replicas
// level, and trains on from there. When ctx ends and enough others stay
// (MinWorldSize), this peer leaves after its next step, the others carry
// on, and Run returns an error wrapping ErrLeft; otherwise every peer stops
// after the same step, each with a Checkpoint path writes its checkpoint,
// and Run returns an error wrapping train.ErrStopped. At the end every
// peer leaves the ring together with the others.
func (j *Job) Run(ctx context.Context) (train.Summary, error) {
	j.defaults()
	// This peer's own checkpoint is read before it joins anyone: one that
	// does not fit the job, or of a finished run, is this machine's to
	// mend, and should not take the ring down after it formed.
	found, err := ownCheckpoint(j.Checkpoint, j.Training.Epochs, j.Training.Replica)
	if err != nil {
		return train.Summary{}, err
	}
	rg, admitted, err := j.Members.Form(ctx)
	if err != nil {
		return train.Summary{}, fmt.Errorf("join: %w", err)
	}
	j.rg = rg
	defer func() { j.rg.Close() }() // j.rg changes when the ring does
	j.say("ring formed: rank %d of %d, generation %d", rg.Rank(), rg.Size(), rg.Generation())
	rc := j.runConfig(ctx)
	if rc.Start, err = j.begin(ctx, rc.Replica, admitted, found); err != nil {
		return train.Summary{}, err
	}
	rc.InSync = admitted
	// The collectives keep their own context, bounded by the step
	// timeout, so that the last step is not torn in half; ctx's end
	// reaches the others through the step (train.Replica.Leave).
	wctx := context.WithoutCancel(ctx)
	var total train.Summary
	for {
		j.Log().Info().Int("world_size", j.rg.Size()).Uint64("generation", j.rg.Generation()).Int("epochs_done", rc.Start.Epochs).
			Int("steps_done", rc.Start.Steps).Msg("training")
		sum, err := train.Run(wctx, rc)
		total = total.Then(sum)
		ev, ranks := classify(err, j.rg.Rank(), j.rg.Size(), j.MinWorldSize)
		switch ev {
		case finished:
			j.leaveTogether()
			j.Members.Ended(ctx)
			return total, nil
		case leaving:
			return total, j.leaveAlone(ctx, total, rc.Save)
		case stopped:
			return total, j.stop(ctx, total, ranks, rc.Save)
		case failed:
			return total, err
		}
		var in *train.Interrupted
		if !errors.As(err, &in) { // no position to carry on from
			return total, err
		}
		if in.At.Steps > rc.Start.Steps { // a step completed since the ring last changed
			j.budget.completed()
		}
		if rc.Start, err = j.change(wctx, ev, ranks, in.At, err); err != nil {
			return total, err
		}
		in.Unapplied.Report(rc.Start, rc)
		rc.InSync = true
	}
}

func (j *Job) defaults() {
	j.MinWorldSize = orDefault(j.MinWorldSize, j.WorldSize)
	j.MaxWorldSize = orDefault(j.MaxWorldSize, j.WorldSize)
	j.StepTimeout = orDefault(j.StepTimeout, defaultStepTimeout)
	j.MaxReforms = orDefault(j.MaxReforms, defaultMaxReforms)
	j.AdmitTimeout = orDefault(j.AdmitTimeout, defaultAdmitTimeout)
	j.budget = newBudget(j.MaxReforms)
	j.noShows = noShows{}
}

// runConfig is Training with this job's ring, newcomer check, checkpoint
// writer and stop.
func (j *Job) runConfig(ctx context.Context) train.RunConfig {
	rc := j.Training
	rc.Replica.Coll = j.stepped(nil)
	rc.Replica.Waiting = j.waiting
	if d, ok := j.Members.(train.DirectLinker); ok {
		rc.Replica.Direct = d // a newcomer's state straight from each donor
	}
	if rc.OnSkip == nil {
		rc.OnSkip = func(err error) {
			j.Log().Warn().Str("why", err.Error()).Msg("step skipped on every rank")
		}
	}
	if j.Checkpoint != "" {
		// Every peer with a checkpoint_dir writes its own, at the same
		// steps: so the latest checkpoints the peers hold agree, and a
		// claim far ahead of them can be told for what it is (Resume).
		rc.Save = func(p train.Position) error { return j.save(rc.Replica, p) }
	}
	rc.Stop = ctx.Done()
	return rc
}

// begin is where this peer starts: the ring's state if it was admitted to
// a ring under way, else the checkpoint the peers agree on, or afresh.
func (j *Job) begin(ctx context.Context, rep *train.Replica, admitted bool, found *train.Checkpoint) (train.Position, error) {
	if !admitted {
		return j.resume(ctx, rep, found)
	}
	t0 := time.Now()
	start, err := rep.Admitted(ctx)
	if err != nil {
		return start, err
	}
	j.Log().Info().Int("world_size", j.rg.Size()).Uint64("generation", j.rg.Generation()).Int("epochs_done", start.Epochs).
		Int("steps_done", start.Steps).Int("samples_into_epoch", start.Skip).Int64("state_bytes", stateBytes(rep)).
		Dur("took", time.Since(t0)).Msg("admitted to the ring; caught up with its parameters, optimizer state and position")
	return start, nil
}

// waiting is the replica's Waiting: rank 0 alone says whether a newcomer
// waits that the ring has room for, so that one peer's view decides.
func (j *Job) waiting() bool {
	return j.rg.Rank() == 0 && len(j.admittable()) > 0
}

// admittable are the standbys this peer would admit now, up to
// MaxWorldSize.
func (j *Job) admittable() []string {
	return j.noShows.admittable(j.Members.Standbys(), j.MaxWorldSize-j.rg.Size(), time.Now())
}

// ErrLeft is what Run returns to a peer that left the job while the others
// carry on without it (Ctrl-C with enough peers left): a leave, not a
// failure.
var ErrLeft = errors.New("elastic: this peer left the job; the others carry on")

// pick is the entries of xs at ranks (peer names, say).
func pick[T any](xs []T, ranks []int) []T {
	var out []T
	for _, k := range ranks {
		if k >= 0 && k < len(xs) {
			out = append(out, xs[k])
		}
	}
	return out
}

// maxPeerID bounds a peer ID's text on the wire (an Ed25519 one is 52
// characters).
const maxPeerID = 128

// resume agrees with the others whether and where to carry on: from the
// most advanced checkpoint the peers offer that is not far ahead of the
// others' (train.Replica.Resume), or afresh. Every peer takes part,
// whether or not it has a checkpoint of its own, so peers whose settings
// differ still agree; where they differ, the log says so.
func (j *Job) resume(ctx context.Context, rep *train.Replica, found *train.Checkpoint) (train.Position, error) {
	res, err := rep.Resume(ctx, found)
	if err != nil {
		return train.Position{}, err
	}
	members := j.Members.Members()
	names := func(ranks []int) []string { return pick(members, ranks) }
	if len(res.Refused) > 0 {
		j.Log().Warn().Ints("ranks", res.Refused).Strs("peers", names(res.Refused)).Int("median_step", res.Median).
			Msg("checkpoints claimed more than one step ahead of the median of those offered: not taken (move the stale ones away to resume from these)")
	}
	if res.From < 0 {
		return train.Position{}, nil
	}
	if len(res.Offered) < rep.Coll.Size() {
		var without []int
		for k := range rep.Coll.Size() {
			if !slices.Contains(res.Offered, k) {
				without = append(without, k)
			}
		}
		j.Log().Info().Ints("ranks_without", without).Strs("peers_without", names(without)).
			Msg("some peers have no checkpoint (checkpoint_dir is each machine's own); they take the one resumed from")
	}
	j.Log().Info().Int("from_rank", res.From).Int("epochs_done", res.Epochs).Int("steps_done", res.Steps).
		Int("samples_into_epoch", res.Skip).Msg("resuming from a checkpoint")
	return res.Position, nil
}

func (j *Job) save(rep *train.Replica, p train.Position) error {
	base := j.CheckpointBase
	base.Epoch, base.Step, base.Skip, base.WorldSize = p.Epochs, p.Steps, p.Skip, j.rg.Size()
	if err := rep.Snapshot(base).Save(j.Checkpoint); err != nil {
		return fmt.Errorf("writing checkpoint: %w", err)
	}
	j.Log().Info().Str("path", j.Checkpoint).Int("epochs_done", p.Epochs).Int("steps_done", p.Steps).Msg("checkpoint written")
	return nil
}

// leaveTogether holds a peer in the ring until every peer has finished the
// last collective. A peer that exited straight after its part of it could
// take the others' last frames down with it: its kernel answers the frames
// still arriving (acknowledgements of what it sent last) with a TCP reset,
// and a reset throws away what the neighbour had received but not yet read
// (seen: a 3-peer run whose rank 0 lost its last evaluation frame). After a
// barrier every peer has read the data that mattered; only the barrier's own
// last frames can still be lost that way, and that is no failure: this
// peer's results are complete either way. So it is logged at debug level —
// a warning at the end of every successful run (seen in the demo) read as
// a problem where there was none.
func (j *Job) leaveTogether() {
	ctx, cancel := context.WithTimeout(context.Background(), j.StepTimeout)
	defer cancel()
	if err := j.rg.Barrier(ctx); err != nil {
		j.Log().Debug().Err(err).Msg("a peer left before confirming the end of the job; this peer's results are complete")
	}
}

// stepped is the current ring with the step timeout on every collective;
// first, if set, runs after the first AllreduceMean that succeeds.
func (j *Job) stepped(first *onceHook) steppedRing {
	return steppedRing{Ring: j.rg, timeout: j.StepTimeout, first: first}
}

// steppedRing gives every collective the step timeout, so a neighbour that
// stalls fails the step instead of hanging it.
type steppedRing struct {
	*ring.Ring
	timeout time.Duration
	first   *onceHook // if set, runs after the first AllreduceMean that succeeds
}

// onceHook runs f once.
type onceHook struct {
	once sync.Once
	f    func()
}

func (s steppedRing) AllreduceMean(ctx context.Context, buf []float32) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	err := s.Ring.AllreduceMean(ctx, buf)
	if err == nil && s.first != nil {
		s.first.once.Do(s.first.f)
	}
	return err
}

// AllreduceMeanAs is the narrowed gradients' part of a step; the step's
// float32 trailer follows in an AllreduceMean.
func (s steppedRing) AllreduceMeanAs(ctx context.Context, buf []float32, enc ring.Encoding) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.Ring.AllreduceMeanAs(ctx, buf, enc)
}

func (s steppedRing) AllreduceSum(ctx context.Context, buf []float32) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.Ring.AllreduceSum(ctx, buf)
}

// Allgather is a sparse round's exchange (train.Allgatherer).
func (s steppedRing) Allgather(ctx context.Context, buf []float32, counts []int) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.Ring.Allgather(ctx, buf, counts)
}

func (s steppedRing) Broadcast(ctx context.Context, buf []float32, root int) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.Ring.Broadcast(ctx, buf, root)
}

// stateBytes is what a newcomer takes on admission: the parameters and
// the optimizer's state.
func stateBytes(rep *train.Replica) int64 {
	_, _, state := rep.OptimizerState()
	var n int64
	for _, ts := range [][][]float32{rep.Model.Params(), state} {
		for _, t := range ts {
			n += 4 * int64(len(t))
		}
	}
	return n
}
