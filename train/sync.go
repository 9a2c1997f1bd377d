package train

import (
	"context"
	"errors"
)

// Sync is how a replica's steps keep the ranks together: what a step does
// on this rank alone, whether and how it then talks to the ring, and what
// it takes back when the ring fails. A Replica without one averages its
// gradients at every step (everyStep); NewLocalReplica picks the LocalSGD
// mode its settings call for, once, when the replica is made — outer
// rounds (rounds), streamed fragments (streamed) or rounds closed by a
// deadline (deadlineRounds), a file each. Replica.Step is the same for
// all: begin, exchange, and undo where a collective failed. A new mode is
// a file with its type and a case in LocalSGD.sync.
//
// Its methods are the package's own: the modes are the ones here.
type Sync interface {
	// begin is the step's part on this rank alone (a LocalSGD inner
	// step); talk says whether the step goes on to the ring. If not, loss
	// and err are the step's.
	begin(r *Replica, x []float32, y []int, n int) (loss float32, talk bool, err error)
	// exchange is the step's talk with the ring and what it applies;
	// loss is begin's.
	exchange(ctx context.Context, r *Replica, x []float32, y []int, n int, loss float32) (float32, error)
	// undo takes back a step that failed in a collective and returns how
	// many steps that was: 1, or the LocalSGD round's since its anchor.
	undo(r *Replica) int
	// agreed is what every rank holds alike of params: they themselves,
	// or mid-round, where the ranks' parameters differ, the anchors.
	agreed(params [][]float32) [][]float32
	// roundOpen reports whether a round is under way whose state is no
	// checkpoint.
	roundOpen() bool
	// settle brings the replica to what every rank holds alike before
	// Level: what only this rank holds of a round under way is dropped.
	settle(r *Replica)
	// abandon waits for any exchange this mode runs in the background,
	// and drops it, when a run stops in the middle of a round.
	abandon()
	// maxAhead is how many steps a survivor of a failed step may be ahead
	// of the others.
	maxAhead(r *Replica) int
	// state and setState are what a checkpoint keeps of the optimizer opt
	// and the Sync together.
	state(opt Optimizer) (string, int, [][]float32)
	setState(opt Optimizer, step int, tensors, params [][]float32) error
}

// withLeavers is a round's outcome err with the leave requests it
// carried, if any: a *LeaveError, joined to err where there is one.
func withLeavers(err error, leaving []int) error {
	switch {
	case leaving == nil:
		return err
	case err != nil:
		return errors.Join(err, &LeaveError{Ranks: leaving})
	}
	return &LeaveError{Ranks: leaving}
}
