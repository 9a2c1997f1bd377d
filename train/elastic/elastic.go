// Package elastic runs one peer's part of an elastic training job: it forms
// the ring through a Membership, trains with train.Run, re-forms the ring
// when peers are lost, leave or are caught lying, admits standbys between
// epochs, writes and resumes checkpoints, and leaves the ring together with
// the others at the end — what Horovod's elastic mode and torchrun's
// rendezvous do, with no coordinator.
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
	"os"
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
}

// Job is one peer's part of an elastic job. Fill it, then call Run once.
type Job struct {
	// Members forms and re-forms the ring.
	Members Membership
	// Training is the training run; Job sets its Replica's collective and its
	// Reform, Grow, Save, Stop, Start, Joined and MinSize.
	Training train.RunConfig
	// WorldSize is how many peers the ring should hold; standbys are
	// admitted while it holds fewer. MinWorldSize is how few may carry on
	// after peers are lost or leave; zero means WorldSize.
	WorldSize, MinWorldSize int
	// StepTimeout bounds every collective, so that a peer that stalls
	// fails the step instead of hanging it. Zero means a minute.
	StepTimeout time.Duration
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

	rg   *ring.Ring
	lost map[string]int // peers lost in re-formations since a step last completed
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
// checkpoint the peers agree on), trains, and leaves the ring together with the
// others. When ctx ends and enough others stay (MinWorldSize), this peer
// leaves after its next step, the others carry on, and Run returns an
// error wrapping ErrLeft; otherwise every peer stops after the same step,
// each with a Checkpoint path writes its checkpoint, and Run returns an
// error wrapping train.ErrStopped.
func (j *Job) Run(ctx context.Context) (train.Summary, error) {
	if j.MinWorldSize <= 0 {
		j.MinWorldSize = j.WorldSize
	}
	if j.StepTimeout <= 0 {
		j.StepTimeout = time.Minute
	}
	j.lost = map[string]int{}
	// This peer's own checkpoint is read before it joins anyone: one that
	// does not fit the job, or of a finished run, is this machine's to
	// mend, and should not take the ring down after it formed.
	found, err := j.ownCheckpoint()
	if err != nil {
		return train.Summary{}, err
	}
	rg, admitted, err := j.Members.Form(ctx)
	if err != nil {
		return train.Summary{}, fmt.Errorf("join: %w", err)
	}
	j.rg = rg
	defer func() { j.rg.Close() }() // j.rg changes when the ring re-forms
	j.say("ring formed: rank %d of %d, generation %d", rg.Rank(), rg.Size(), rg.Generation())
	rc := j.Training
	rc.Replica.Coll = j.stepped(nil)
	rc.MinSize = j.MinWorldSize
	rc.Reform = j.reform
	rc.Grow = j.grow
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
	if admitted {
		start, err := rc.Replica.Admitted(ctx, rc.Replica.Coll)
		if err != nil {
			return train.Summary{}, err
		}
		rc.Start, rc.Joined = start, true
		j.Log().Info().Int("world_size", rg.Size()).Uint64("generation", rg.Generation()).Int("epochs_done", start.Epochs).
			Int("steps_done", start.Steps).Msg("admitted to the ring; caught up with its parameters and optimizer state")
	} else if rc.Start, err = j.resume(ctx, rc.Replica, found); err != nil {
		return train.Summary{}, err
	}
	// The collectives keep their own context, bounded by the step
	// timeout, so that the last step is not torn in half; ctx's end
	// reaches the others through the step (train.Replica.Leave).
	rc.Stop = ctx.Done()
	j.Log().Info().Int("world_size", rg.Size()).Uint64("generation", rg.Generation()).Msg("training")
	sum, err := train.Run(context.WithoutCancel(ctx), rc)
	var leave *train.LeaveError
	if errors.As(err, &leave) && j.othersStay(leave) {
		return sum, j.leaveAlone(ctx, sum, rc.Save)
	}
	if err == nil || errors.Is(err, train.ErrStopped) {
		j.leaveTogether()
	}
	if errors.Is(err, train.ErrReformBudget) {
		return sum, j.budgetError(err)
	}
	if !errors.Is(err, train.ErrStopped) {
		return sum, err
	}
	var askedBy []int
	if leave != nil {
		askedBy = leave.Ranks
	}
	j.Log().Warn().Ints("asked_by_ranks", askedBy).Int("epochs_done", sum.Epochs).Int("steps_done", sum.Steps).
		Msg("interrupted: every peer stopped after the same step and left the ring")
	if rc.Save != nil {
		if serr := rc.Save(sum.Position); serr != nil {
			return sum, serr
		}
	}
	if ctx.Err() == nil {
		return sum, fmt.Errorf("stopped after %d steps because rank(s) %v were interrupted: %w", sum.Steps, askedBy, err)
	}
	return sum, fmt.Errorf("interrupted after %d steps: %w", sum.Steps, ctx.Err())
}

// ErrLeft is what Run returns to a peer that left the job while the others
// carry on without it (Ctrl-C with enough peers left): a leave, not a
// failure.
var ErrLeft = errors.New("elastic: this peer left the job; the others carry on")

// othersStay reports whether this peer is among the ranks that asked to
// leave and enough others stay to carry on without them — what they do
// (train.RunConfig.Reform), by the same rule, on their side.
func (j *Job) othersStay(leave *train.LeaveError) bool {
	return slices.Contains(leave.Ranks, j.rg.Rank()) && leave.OthersCarryOn(j.rg.Size(), j.MinWorldSize)
}

// leaveAlone ends this peer's part when it left and the others go on: its
// ring links are drained, not dropped — the step that told the others was
// its last, and its last frames must reach them whole (ring.Ring.Leave) —
// then its checkpoint is written, and Run says it left (ErrLeft).
func (j *Job) leaveAlone(ctx context.Context, sum train.Summary, save func(train.Position) error) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), j.StepTimeout)
	defer cancel()
	if err := j.rg.Leave(dctx); err != nil {
		j.Log().Debug().Err(err).Msg("a neighbour did not close its link before the step timeout; this peer's part was done")
	}
	j.Log().Info().Int("epochs_done", sum.Epochs).Int("steps_done", sum.Steps).Int("world_size", j.rg.Size()).
		Msg("left the job: the others carry on without this peer")
	if save != nil {
		if err := save(sum.Position); err != nil {
			return err
		}
	}
	return fmt.Errorf("left after %d steps: %w", sum.Steps, ErrLeft)
}

// reform is train's RunConfig.Reform: the survivors of a failed step, or
// the peers staying when others leave or are caught lying, agree on the
// next generation and carry on from the interrupted step.
func (j *Job) reform(ctx context.Context, cause error, at train.Position) (train.Collective, error) {
	began := time.Now()
	old := j.Members.Members()
	log := j.Log()
	j.rg.Close()
	var gone []int
	var leave *train.LeaveError
	var liar *train.LiarError
	switch {
	case errors.As(cause, &leave):
		gone = leave.Ranks
		log.Info().Ints("leaving_ranks", gone).Int("epoch", at.Epochs+1).Int("steps_done", at.Steps).Int("world_size", len(old)).
			Msg("peers are leaving; re-forming the ring without them")
	case errors.As(cause, &liar):
		gone = liar.Ranks
		var names []string
		for _, r := range gone {
			names = append(names, old[r])
		}
		log.Error().Strs("dropped", names).Str("why", liar.Why).Int("epoch", at.Epochs+1).Int("steps_done", at.Steps).
			Msg("peers told the others what no honest replica could; re-forming the ring without them")
	default:
		log.Warn().Str("cause", cause.Error()).Int("epoch", at.Epochs+1).Int("steps_done", at.Steps).Int("world_size", len(old)).
			Msg("a peer was lost during this step; re-forming the ring with the survivors")
	}
	rg, err := j.Members.Reform(ctx, j.MinWorldSize, gone)
	if err != nil {
		return nil, err
	}
	j.rg = rg
	now := j.Members.Members()
	var lost, left []string
	for k, p := range old {
		switch {
		case slices.Contains(now, p):
		case leave != nil && slices.Contains(leave.Ranks, k):
			left = append(left, p)
		default:
			lost = append(lost, p)
			j.lost[p]++
		}
	}
	took := time.Since(began).Round(time.Millisecond).String()
	if len(lost) == 0 && leave != nil {
		// The step that told the others was applied by all: nothing runs
		// again.
		j.Log().Info().Strs("left", left).Int("world_size", rg.Size()).Uint64("generation", rg.Generation()).
			Str("took", took).Msg("ring re-formed without the peers that left; carrying on")
		j.say("ring re-formed: rank %d of %d, generation %d, %d peer(s) left", rg.Rank(), rg.Size(), rg.Generation(), len(left))
	} else {
		j.Log().Warn().Strs("lost", lost).Strs("left", left).Int("world_size", rg.Size()).Uint64("generation", rg.Generation()).
			Str("took", took).Msg("ring re-formed without the lost peers; running the step again")
		j.say("ring re-formed: rank %d of %d, generation %d, %d peer(s) lost", rg.Rank(), rg.Size(), rg.Generation(), len(lost))
	}
	// The moment the new ring has averaged its first gradients is the end
	// of the outage; its wall-clock time is for bench-elastic.
	return j.stepped(&onceHook{f: func() {
		j.Log().Info().Uint64("generation", rg.Generation()).Str("since_the_step_failed", time.Since(began).Round(time.Millisecond).String()).
			Int64("unix_ms", time.Now().UnixMilli()).Msg("first step of the new generation done")
	}}), nil
}

// grow is train's RunConfig.Grow: after an epoch, rank 0 lets standbys in
// (peers that arrived late, or replacements for lost ones) while the ring
// is below the world size; it names them to the others through the ring,
// tells them, and all re-form with them; they catch up from the ring.
func (j *Job) grow(ctx context.Context, at train.Position) (train.Collective, error) {
	members := j.Members.Members()
	var pick []string
	if j.rg.Rank() == 0 {
		for _, p := range j.Members.Standbys() {
			if len(members)+len(pick) < j.WorldSize {
				pick = append(pick, p)
			}
		}
	}
	pick, err := train.BroadcastStrings(ctx, j.stepped(nil), 0, pick, max(j.WorldSize-len(members), 0), maxPeerID)
	if err != nil || len(pick) == 0 {
		return nil, err
	}
	began := time.Now()
	admit := j.rg.Rank() == 0
	j.rg.Close()
	rg, err := j.Members.Grow(ctx, pick, admit, j.MinWorldSize)
	if err != nil {
		return nil, err
	}
	j.rg = rg
	j.Log().Info().Int("admitted", len(pick)).Int("world_size", rg.Size()).Uint64("generation", rg.Generation()).Int("epochs_done", at.Epochs).
		Str("took", time.Since(began).Round(time.Millisecond).String()).Msg("ring grew: admitted standbys")
	j.say("ring grew: rank %d of %d, generation %d", rg.Rank(), rg.Size(), rg.Generation())
	return j.stepped(nil), nil
}

// maxPeerID bounds a peer ID's text on the wire (an Ed25519 one is 52
// characters).
const maxPeerID = 128

// budgetError names the peer the job kept losing.
func (j *Job) budgetError(err error) error {
	worst, n := "", 0
	for p, k := range j.lost {
		if k > n || k == n && p < worst {
			worst, n = p, k
		}
	}
	if worst == "" {
		return fmt.Errorf("%w (no peer was lost: the ring itself keeps failing)", err)
	}
	return fmt.Errorf("%w; the peer lost most often: %s (%d times)", err, worst, n)
}

// ownCheckpoint loads and restores this peer's checkpoint, if it has a
// Checkpoint path and one is there.
func (j *Job) ownCheckpoint() (*train.Checkpoint, error) {
	if j.Checkpoint == "" {
		return nil, nil
	}
	found, err := findCheckpoint(j.Checkpoint, j.Training.Epochs)
	if err == nil && found != nil {
		if err = j.Training.Replica.Restore(found); err != nil {
			err = fmt.Errorf("checkpoint %s does not fit this job: %w (move it away to start afresh)", j.Checkpoint, err)
		}
	}
	return found, err
}

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
	names := func(ranks []int) []string {
		var out []string
		for _, k := range ranks {
			if k >= 0 && k < len(members) {
				out = append(out, members[k])
			}
		}
		return out
	}
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

// findCheckpoint loads the checkpoint at path, if there is one. One of a
// run that has finished, or one that does not fit this job, is an error
// that says what to do: nothing is overwritten.
func findCheckpoint(path string, epochs int) (*train.Checkpoint, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	c, err := train.LoadCheckpoint(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w (move it away to start afresh)", path, err)
	}
	if c.Epoch >= epochs {
		return nil, fmt.Errorf("checkpoint %s is of a finished run (%d of %d epochs); move it away to start afresh, or raise epochs to train on", path, c.Epoch, epochs)
	}
	return c, nil
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
func (j *Job) stepped(first *onceHook) train.Collective {
	return steppedRing{Ring: j.rg, timeout: j.StepTimeout, first: first, done: func() { clear(j.lost) }}
}

// steppedRing gives every collective the step timeout, so a neighbour that
// stalls fails the step instead of hanging it.
type steppedRing struct {
	*ring.Ring
	timeout time.Duration
	first   *onceHook // if set, runs after the first AllreduceMean that succeeds
	done    func()    // after every AllreduceMean that succeeds: a step completed
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
	if err == nil {
		s.done()
		if s.first != nil {
			s.first.once.Do(s.first.f)
		}
	}
	return err
}

// AllreduceMeanAs is the narrowed gradients' part of a step; the step's
// float32 trailer follows in an AllreduceMean, which marks it done.
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

func (s steppedRing) Broadcast(ctx context.Context, buf []float32, root int) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.Ring.Broadcast(ctx, buf, root)
}
