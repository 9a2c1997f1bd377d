package train

import (
	"context"
	"fmt"
	"slices"
)

// Resume brings every rank to the most advanced checkpoint that the
// ranks agree on, so a job whose peers all died carries on where it was,
// even where the machine that wrote the checkpoint is no longer rank 0.
// Each rank passes the checkpoint it found and has already Restored into
// r, or nil (a peer without a checkpoint_dir takes part all the same: the
// ranks agree whether and where to resume, none decides alone). A claim is
// not taken on its word: one more than one step ahead of the median of
// the claims offered (the lower one for an even count) is refused and its
// ranks named in Resumed.Refused — a stale checkpoint, behind the others,
// is no lie and is simply not taken. The rank with the most steps among
// the rest (the lowest such rank on a tie) sends its parameters,
// optimizer state and position; the others load them. Ranks whose
// checkpoints are at the same step must hold the same parameters: the odd
// ones are named (*LiarError). Every rank must call it.
func (r *Replica) Resume(ctx context.Context, c *Checkpoint) (Resumed, error) {
	if c == nil {
		return r.adopt(ctx, false, Position{}, resumeAhead, true)
	}
	return r.adopt(ctx, true, Position{Epochs: c.Epoch, Steps: c.Step, Skip: c.Skip}, resumeAhead, true)
}

// Resumed is what Resume agreed on, the same on every rank.
type Resumed struct {
	Position       // where to start: the zero Position when nothing was taken
	From     int   // the rank whose state every rank took, or -1
	Offered  []int // the ranks that offered a checkpoint
	Refused  []int // the ranks whose claims were too far ahead of the others'
	Median   int   // the median step claimed
}

// resumeAhead is how far a checkpoint may claim to be ahead of the median
// claim: peers that trained together write their checkpoints at the same
// steps, so honest claims of the latest ones agree.
const resumeAhead = 1

// claim is what a rank offers when the ranks adopt the most advanced
// state: its position and its parameters' hash.
type claim struct {
	Epochs int    `json:"epochs"`
	Steps  int    `json:"steps"`
	Skip   int    `json:"skip"`
	Hash   string `json:"hash"`
}

// maxClaimBytes bounds a claim's encoding.
const maxClaimBytes = 128

// valid reports whether a claim could come from an honest rank.
func (c *claim) valid() bool {
	return c.Epochs >= 0 && c.Steps >= 0 && c.Skip >= 0 && validHash(c.Hash)
}

// maxShapeBytes bounds an optShape's encoding.
const maxShapeBytes = 64

// optShape is the shape of the optimizer state the chosen rank sends: its
// step count and how many tensors.
type optShape struct {
	Step    int `json:"step"`
	Tensors int `json:"tensors"`
}

// adoptLatest makes every rank take the parameters, optimizer state and
// position of the rank that offers the most steps (the lowest such rank on
// a tie), among those that offer any (has). It returns that position and
// rank, or the zero Position and -1 when none offers.
//
// It trusts no claim on its own. A claim more than maxAhead steps from the
// median claim — a survivor of a failed step is at most one step on from
// the others, and at an epoch's end all are level — is a lie; so is, among
// the ranks at the chosen step, a parameter hash unlike most of theirs; so
// is state that does not match the hash its sender declared. Liars are
// named in a *LiarError, the same on every rank, and nothing is adopted.
func (r *Replica) adoptLatest(ctx context.Context, has bool, mine Position, maxAhead int) (Position, int, error) {
	a, err := r.adopt(ctx, has, mine, maxAhead, false)
	return a.Position, a.From, err
}

// adopt is adoptLatest; with refuse, a claim more than maxAhead steps
// ahead of the median is left out rather than named a lie, and one behind
// is allowed: checkpoints found on disk may be stale, and an honest peer
// can hold one ahead of stale ones.
func (r *Replica) adopt(ctx context.Context, has bool, mine Position, maxAhead int, refuse bool) (Resumed, error) {
	out := Resumed{From: -1}
	size := r.Coll.Size()
	var mineClaim *claim
	if has {
		mineClaim = &claim{Epochs: mine.Epochs, Steps: mine.Steps, Skip: mine.Skip, Hash: paramHash(r.ParamHash())}
	}
	claims, bad, err := gatherMsgs(ctx, r.Coll, mineClaim, maxClaimBytes)
	if err != nil {
		return out, fmt.Errorf("%w: comparing states: %w", ErrCollective, err)
	}
	var offers []int
	pos := make([]Position, size)
	for k, c := range claims {
		switch {
		case c == nil:
		case !c.valid():
			bad = append(bad, k)
		default:
			pos[k] = Position{Epochs: c.Epochs, Steps: c.Steps, Skip: c.Skip}
			offers = append(offers, k)
		}
	}
	slices.Sort(bad)
	if len(bad) > 0 {
		return out, &LiarError{Ranks: bad, Why: "they offer state with a malformed position"}
	}
	out.Offered = slices.Clone(offers)
	if len(offers) == 0 {
		return out, nil
	}
	steps := make([]int, len(offers))
	for i, k := range offers {
		steps[i] = pos[k].Steps
	}
	slices.Sort(steps)
	median := steps[(len(steps)-1)/2]
	out.Median = median
	var far []int
	for _, k := range offers {
		if d := pos[k].Steps - median; d > maxAhead || !refuse && -d > maxAhead {
			far = append(far, k)
		}
	}
	switch {
	case len(far) > 0 && refuse:
		out.Refused = far
		offers = slices.DeleteFunc(offers, func(k int) bool { return slices.Contains(far, k) })
	case len(far) > 0:
		return out, &LiarError{Ranks: far, Why: fmt.Sprintf("they claim to be more than %d step(s) from the others (median step %d)", maxAhead, median)}
	}
	top := furthest(offers, pos)
	best := pos[top[0]].Steps
	hashOf := func(k int) string { return claims[k].Hash }
	if odd, majority := oddOnes(top, hashOf); len(odd) > 0 {
		if !majority {
			return out, fmt.Errorf("train: ranks %v are all at step %d with other parameters, and no majority tells which are right", top, best)
		}
		return out, &LiarError{Ranks: odd, Why: fmt.Sprintf("at step %d they hold other parameters than most ranks at that step", best)}
	}
	// Every rank at the top holds the state: all of them send it.
	root := top[0]
	out.From = root
	got := pos[root]
	if err := r.takeFrom(ctx, top, claims[root].Hash, has); err != nil {
		return out, err
	}
	out.Position = got
	return out, nil
}

// furthest are the ranks of offers (not empty) furthest on, in rank
// order: the most steps, and of those the most epochs — a peer lost in
// the allreduces that score an epoch's end leaves some ranks past that
// end and others, at the same step, before it.
func furthest(offers []int, pos []Position) []int {
	best, bestEpochs := -1, -1
	for _, k := range offers {
		if pos[k].Steps > best || pos[k].Steps == best && pos[k].Epochs > bestEpochs {
			best, bestEpochs = pos[k].Steps, pos[k].Epochs
		}
	}
	var top []int
	for _, k := range offers {
		if pos[k].Steps == best && pos[k].Epochs == bestEpochs {
			top = append(top, k)
		}
	}
	return top
}

// takeFrom gives every rank the parameters and optimizer state of the
// donors top (rank order; the first, root, says the optimizer's shape),
// which declared the parameters' hash; a rank with state of its own (has)
// keeps a copy of its parameters, not to lose them on a lie.
func (r *Replica) takeFrom(ctx context.Context, top []int, hash string, has bool) error {
	rank := r.Coll.Rank()
	root, donor := top[0], slices.Contains(top, rank)
	// The optimizer's step count and shape.
	var shape *optShape
	if rank == root {
		_, optStep, state := r.OptimizerState()
		shape = &optShape{Step: optStep, Tensors: len(state)}
	}
	shape, err := broadcastMsg(ctx, r.Coll, root, shape, maxShapeBytes)
	if err != nil {
		return fmt.Errorf("sending the optimizer's shape: %w", err)
	}
	optStep, nState := shape.Step, shape.Tensors
	params := r.Model.Params()
	// What another rank sends is checked before anything is made from it:
	// an optimizer keeps at most two tensors per parameter (Adam).
	if optStep < 0 || nState < 0 || nState > 2*len(params) || nState%max(len(params), 1) != 0 {
		return &LiarError{Ranks: []int{root}, Why: fmt.Sprintf("it sends %d optimizer state tensors (step %d) for %d parameter tensors", nState, optStep, len(params))}
	}
	direct, err := r.openDirect(ctx, top)
	if err != nil {
		return err
	}
	defer direct.close()
	// Parameters, then every state tensor (each shaped like a parameter).
	// A rank with state of its own keeps a copy, not to lose it on a lie.
	var keep [][]float32
	if !donor && has {
		for _, p := range params {
			keep = append(keep, slices.Clone(p))
		}
	}
	checked, err := r.takeState(ctx, top, params, direct)
	if err != nil {
		if !donor {
			putBack(params, keep)
		}
		return fmt.Errorf("sending the parameters: %w", err)
	}
	// Parts checked against the donors' agreed hashes are the parameters
	// the donors declared: hashing them all again would only cost time.
	if !checked && paramHash(r.ParamHash()) != hash {
		// Put this rank's own parameters back: they are not to be lost on
		// a lie.
		putBack(params, keep)
		return &LiarError{Ranks: []int{root}, Why: "the parameters it sent do not match the hash it declared"}
	}
	var state [][]float32
	if donor {
		_, _, state = r.OptimizerState()
		if len(state) != nState {
			return fmt.Errorf("train: this rank holds %d optimizer state tensors, rank %d %d, at the same step with the same parameters", len(state), root, nState)
		}
	} else {
		for i := range nState {
			state = append(state, make([]float32, len(params[i%len(params)])))
		}
	}
	if _, err := r.takeState(ctx, top, state, direct); err != nil {
		return fmt.Errorf("sending the optimizer state: %w", err)
	}
	if !donor {
		if err := r.setOptimizerState(optStep, state); err != nil {
			return err
		}
	}
	return nil
}

// Level brings the replicas of a changed ring to one state after an
// interruption at: every rank takes the parameters, optimizer state and
// position of the one furthest on, then they check that they agree. A
// peer lost in the middle of an allreduce can leave it done on some ranks
// — those that had every frame they needed before it went — and failed on
// others; the ones that finished have applied the step. So after a loss
// (lost) a survivor may be one step ahead (with LocalSGD a round: those
// that finished its outer step are at its end, the others went back to
// its start), or at the same step but past the epoch's end, whose scoring
// allreduces the others failed in (they skip that end); a claim further is
// a lie. After a growth every old member is at the same step. Liars are
// named in a *LiarError; a failed collective is an ErrCollective: the ring
// must change again.
func (r *Replica) Level(ctx context.Context, at Position, lost bool) (Position, error) {
	r.sync().settle(r)
	ahead := 0
	if lost {
		ahead = r.sync().maxAhead(r)
	}
	pos, from, err := r.adoptLatest(ctx, true, at, ahead)
	if err == nil && !nextTo(at, pos) {
		return at, &LiarError{Ranks: []int{from}, Why: fmt.Sprintf("after the ring changed it claims epoch %d at step %d, and this rank is in epoch %d at step %d",
			pos.Epochs+1, pos.Steps, at.Epochs+1, at.Steps)}
	}
	if err == nil {
		err = r.CheckInSync(ctx)
	}
	if err != nil {
		return at, err
	}
	return pos, nil
}

// putBack copies keep back into params, when kept (a rank that took
// another's state and must not lose its own on a lie).
func putBack(params, keep [][]float32) {
	for i := range keep {
		copy(params[i], keep[i])
	}
}

// nextTo says whether a replica at a may take the state of one at b, the
// furthest on after a loss: in the same epoch, or at the start of the
// next — past the epoch's end, which a replica still before it then skips
// (its score was logged by those past it; the parameters are the same).
func nextTo(a, b Position) bool {
	return b.Epochs == a.Epochs || b.Epochs == a.Epochs+1 && b.Skip == 0
}

// Admitted brings a replica admitted mid-run up to date through its new
// ring, which the old members Level at the same time: it takes the state
// and position of the most advanced rank. Run it, then Run from the
// position with InSync.
func (r *Replica) Admitted(ctx context.Context) (Position, error) {
	pos, _, err := r.adoptLatest(ctx, false, Position{}, 0)
	if err != nil {
		return Position{}, fmt.Errorf("train: catching up on admission: %w", err)
	}
	if err := r.CheckInSync(ctx); err != nil {
		return Position{}, fmt.Errorf("train: after admission: %w", err)
	}
	return pos, nil
}
