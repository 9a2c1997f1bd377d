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
