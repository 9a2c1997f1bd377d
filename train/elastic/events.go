package elastic

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
)

// What a replica job and a pipeline job leave unset means the same for
// both.
const (
	defaultStepTimeout  = time.Minute
	defaultMaxReforms   = 5
	defaultAdmitTimeout = 10 * time.Second
	defaultPauseTimeout = 10 * time.Minute
)

// orDefault is v, or d where v is not above zero.
func orDefault[T int | time.Duration](v, d T) T {
	if v <= 0 {
		return d
	}
	return v
}

// event is what ended a stretch of training, as the owner acts on it.
type event int

const (
	finished event = iota // the run reached its last epoch
	lost                  // a peer was lost or stalled: re-form with the survivors; the step runs again
	left                  // others left after a step all applied: re-form without them
	leaving               // this peer leaves; the others carry on without it
	stopped               // every peer stops after the same step
	liars                 // ranks were caught lying: re-form without them
	newcomer              // a newcomer waits: grow the ring
	failed                // anything else: the job ends here for this peer
)

var eventNames = [...]string{"finished", "lost", "left", "leaving", "stopped", "liars", "newcomer", "failed"}

func (e event) String() string { return eventNames[e] }

// classify is the owner's decision, for a replica job and a pipeline job
// alike: what an error of training, or of changing the ring, means for the
// peer at rank in a ring of size, and the ranks it concerns. Every rank
// that sees the same error decides alike: the errors carry what the
// collectives told every rank. A liar is dropped: the others re-form
// without it, and the liar itself, named, ends (failed).
func classify(err error, rank, size, minSize int) (event, []int) {
	var leave *train.LeaveError
	var liar *train.LiarError
	switch {
	case err == nil:
		return finished, nil
	case errors.As(err, &leave):
		if !leave.OthersCarryOn(size, minSize) {
			return stopped, leave.Ranks
		}
		if slices.Contains(leave.Ranks, rank) {
			return leaving, leave.Ranks
		}
		return left, leave.Ranks
	case errors.As(err, &liar):
		if slices.Contains(liar.Ranks, rank) || size-len(liar.Ranks) < max(minSize, 1) {
			return failed, liar.Ranks
		}
		return liars, liar.Ranks
	case errors.Is(err, train.ErrNewcomer):
		return newcomer, nil
	case errors.Is(err, train.ErrCollective), errors.Is(err, ring.ErrPeerLost), errors.Is(err, ring.ErrClosed),
		errors.Is(err, context.DeadlineExceeded):
		// A peer, or a stage beside this one, failed or stalled.
		return lost, nil
	}
	return failed, nil
}

// budget is how many times in a row a job may re-form without a step
// completed between, and the peers lost meanwhile, to name the one that
// keeps failing.
type budget struct {
	max, streak int
	lost        map[string]int
}

func newBudget(max int) *budget { return &budget{max: max, lost: map[string]int{}} }

// completed says a step completed since the ring last changed.
func (b *budget) completed() {
	b.streak = 0
	clear(b.lost)
}

// spend takes a re-formation from the budget, or says it is spent: an
// ErrReformBudget naming the peer lost most often, with cause, the last
// re-formation's.
func (b *budget) spend(cause error) error {
	if b.streak >= b.max {
		return b.error(fmt.Errorf("%w: re-formed %d times in a row without completing a step; the last cause: %w",
			ErrReformBudget, b.streak, cause))
	}
	b.streak++
	return nil
}

// lose counts peer p lost in a re-formation.
func (b *budget) lose(p string) { b.lost[p]++ }

// error names the peer the job kept losing.
func (b *budget) error(err error) error {
	worst, n := "", 0
	for p, k := range b.lost {
		if k > n || k == n && p < worst {
			worst, n = p, k
		}
	}
	if worst == "" {
		return fmt.Errorf("%w (no peer was lost: the ring itself keeps failing)", err)
	}
	return fmt.Errorf("%w; the peer lost most often: %s (%d times)", err, worst, n)
}

// ErrReformBudget means the ring re-formed MaxReforms times in a row
// without completing a step.
var ErrReformBudget = errors.New("elastic: the ring keeps failing")

// ownCheckpoint loads the checkpoint at path, if there is one, and
// restores rep from it: a replica job's, or a pipeline stage's. One of a
// run that has finished, or one that does not fit, is an error that says
// what to do: nothing is overwritten.
func ownCheckpoint(path string, epochs int, rep *train.Replica) (*train.Checkpoint, error) {
	if path == "" {
		return nil, nil
	}
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
	if err := rep.Restore(c); err != nil {
		return nil, fmt.Errorf("checkpoint %s does not fit this job: %w (move it away to start afresh)", path, err)
	}
	return c, nil
}

// change makes the ring the event calls for — re-formed without the peers
// lost, leaving or lying, or grown with newcomers — and brings the
// replicas level at `at`, returning the position they agree on. A failure
// on the way is an event too: a peer lost while the ring re-forms or
// levels makes it re-form again, up to MaxReforms in a row; a newcomer
// that cannot be reached is dropped the same way.
func (j *Job) change(ctx context.Context, ev event, ranks []int, at train.Position, cause error) (train.Position, error) {
	for {
		var err error
		if ev != newcomer {
			if err := j.budget.spend(cause); err != nil {
				return at, err
			}
			err = j.reform(ctx, ev, ranks, at, cause)
		} else {
			var grown bool
			if grown, err = j.grow(ctx, at); err == nil && !grown {
				return at, nil
			}
		}
		pos := at
		if err == nil {
			pos, err = j.Training.Replica.Level(ctx, at, ev != newcomer)
		}
		if s, ok := j.Training.Replica.Coll.(steppedRing); ok && ev == newcomer {
			s.timeout = j.StepTimeout // the admission's own bound is over
			j.Training.Replica.Coll = s
		}
		if err == nil {
			return pos, nil
		}
		if ev, ranks = classify(err, j.rg.Rank(), j.rg.Size(), j.MinWorldSize); ev != lost && ev != liars {
			return at, fmt.Errorf("train: after the ring changed: %w", err)
		}
		cause = err
	}
}

// stop ends a run every peer stopped after the same step: the checkpoint
// is written, and the error says who asked.
func (j *Job) stop(ctx context.Context, sum train.Summary, askedBy []int, save func(train.Position) error) error {
	j.leaveTogether()
	j.Log().Warn().Ints("asked_by_ranks", askedBy).Int("epochs_done", sum.Epochs).Int("steps_done", sum.Steps).
		Msg("interrupted: every peer stopped after the same step and left the ring")
	if save != nil {
		if err := save(sum.Position); err != nil {
			return err
		}
	}
	if ctx.Err() == nil {
		return fmt.Errorf("stopped after %d steps because rank(s) %v were interrupted: %w", sum.Steps, askedBy, train.ErrStopped)
	}
	return fmt.Errorf("interrupted after %d steps: %w", sum.Steps, ctx.Err())
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

// reform closes the current ring and agrees with the survivors of a
// failed step, or the peers staying when others leave or are caught
// lying, on the next generation.
func (j *Job) reform(ctx context.Context, ev event, ranks []int, at train.Position, cause error) error {
	began := time.Now()
	old := j.Members.Members()
	log := j.Log()
	j.rg.Close()
	var gone []int
	switch ev {
	case left:
		gone = ranks
		log.Info().Ints("leaving_ranks", gone).Int("epoch", at.Epochs+1).Int("steps_done", at.Steps).Int("world_size", len(old)).
			Msg("peers are leaving; re-forming the ring without them")
	case liars:
		gone = ranks
		var why string
		var liar *train.LiarError
		if errors.As(cause, &liar) {
			why = liar.Why
		}
		log.Error().Strs("dropped", pick(old, gone)).Str("why", why).Int("epoch", at.Epochs+1).Int("steps_done", at.Steps).
			Msg("peers told the others what no honest replica could; re-forming the ring without them")
		j.Members.Distrust(pick(old, gone))
		if j.Dropped != nil {
			j.Dropped(pick(old, gone), why)
		}
	default:
		log.Warn().Str("cause", cause.Error()).Int("epoch", at.Epochs+1).Int("steps_done", at.Steps).Int("world_size", len(old)).
			Msg("a peer was lost; re-forming the ring with the survivors")
	}
	rg, err := j.Members.Reform(ctx, j.MinWorldSize, gone)
	if err != nil {
		return err
	}
	j.rg = rg
	now := j.Members.Members()
	var lostNow, leftNow []string
	for k, p := range old {
		switch {
		case slices.Contains(now, p):
		case ev == left && slices.Contains(ranks, k):
			leftNow = append(leftNow, p)
		default:
			lostNow = append(lostNow, p)
			j.budget.lose(p)
		}
	}
	took := time.Since(began).Round(time.Millisecond).String()
	if len(lostNow) == 0 && ev == left {
		// The step that told the others was applied by all: nothing runs
		// again.
		j.Log().Info().Strs("left", leftNow).Int("world_size", rg.Size()).Uint64("generation", rg.Generation()).
			Str("took", took).Msg("ring re-formed without the peers that left; carrying on")
		j.say("ring re-formed: rank %d of %d, generation %d, %d peer(s) left", rg.Rank(), rg.Size(), rg.Generation(), len(leftNow))
	} else {
		j.Log().Warn().Strs("lost", lostNow).Strs("left", leftNow).Int("world_size", rg.Size()).Uint64("generation", rg.Generation()).
			Str("took", took).Msg("ring re-formed without the lost peers; running the step again")
		j.say("ring re-formed: rank %d of %d, generation %d, %d peer(s) lost", rg.Rank(), rg.Size(), rg.Generation(), len(lostNow))
	}
	j.Training.Replica.Coll = j.stepped(j.firstStep(began))
	return nil
}

// firstStep logs the moment the new ring has averaged its first gradients:
// the end of the outage, in wall-clock time for bench-elastic.
func (j *Job) firstStep(began time.Time) *onceHook {
	return &onceHook{f: func() {
		j.Log().Info().Uint64("generation", j.rg.Generation()).Str("since_the_ring_changed", time.Since(began).Round(time.Millisecond).String()).
			Int64("unix_ms", time.Now().UnixMilli()).Msg("first step of the new generation done")
	}}
}

// grow admits newcomers at a step boundary: rank 0 names the standbys it
// admits (up to MaxWorldSize) to the others through the ring, tells them,
// and all re-form with them; they catch up from the ring (Level and
// train.Replica.Admitted) and the rest of the epoch is shared out among
// the grown ring. It reports whether the ring grew. A newcomer that cannot
// be reached fails the growth as a lost peer would (train.ErrCollective):
// the members re-form without it.
func (j *Job) grow(ctx context.Context, at train.Position) (bool, error) {
	var add []string
	if j.rg.Rank() == 0 {
		add = j.admittable()
	}
	add, err := train.BroadcastStrings(ctx, j.stepped(nil), 0, add, max(j.MaxWorldSize-j.rg.Size(), 0), maxPeerID)
	if err != nil || len(add) == 0 {
		return false, err
	}
	began := time.Now()
	admit := j.rg.Rank() == 0
	j.rg.Close()
	rg, err := j.Members.Grow(ctx, add, admit, j.MinWorldSize)
	if err != nil {
		return false, fmt.Errorf("%w: admitting %v: %w", train.ErrCollective, add, err)
	}
	grew := rg.Size() > j.rg.Size()
	j.rg = rg
	j.noShows.admitted(add, j.Members.Members(), time.Now())
	coll := j.stepped(j.firstStep(began))
	coll.timeout = j.AdmitTimeout // until the newcomers are level (change)
	j.Training.Replica.Coll = coll
	if !grew {
		// The newcomers vanished before the ring could take them: it
		// re-formed without them, and trains on as it was.
		j.Log().Warn().Strs("newcomers", add).Int("world_size", rg.Size()).Uint64("generation", rg.Generation()).
			Msg("newcomers were gone before they could be admitted; carrying on without them")
		return true, nil
	}
	j.Log().Info().Strs("admitted", add).Int("world_size", rg.Size()).Uint64("generation", rg.Generation()).Int("epoch", at.Epochs+1).
		Int("steps_done", at.Steps).Str("took", time.Since(began).Round(time.Millisecond).String()).Msg("ring grew: admitted newcomers")
	j.say("ring grew: rank %d of %d, generation %d", rg.Rank(), rg.Size(), rg.Generation())
	return true, nil
}
