package train

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"slices"
)

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

// leaving reports whether this rank has been asked to leave.
func (r *Replica) leaving() bool {
	select {
	case <-r.Leave:
		return true
	default:
		return false
	}
}
