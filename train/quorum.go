package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// deadlineRounds is LocalSGD whose rounds close by a deadline
// (LocalSGD.Deadline): a rank slow to compute is left out of a round
// rather than waited for, and what it did goes into the next one.
type deadlineRounds struct {
	o *LocalSGD
	// qx is the round under way; qround the rounds closed in the epoch
	// part; qpos the steps in it, where Run does not say; qat the
	// parameters when this rank posted early, and qdone its inner steps
	// then.
	qx           *quorumRound
	qround, qpos int
	qat          []float32
	qdone        int
	xbuf         []float32 // the round's buffer (quorumRound.buf)
	// after is the Deadline's timer: time.After, or a test's fake; now is
	// the clock steps are timed by (time.Now, or a test's fake).
	after func(time.Duration) <-chan time.Time
	now   func() time.Time
	// lastStep is when this rank's last step ended, and stepTime a
	// running mean of the time its steps take.
	lastStep time.Time
	stepTime time.Duration
}

// begin is the inner step; every step talks to the round (exchange
// decides whether it waits).
func (d *deadlineRounds) begin(r *Replica, x []float32, y []int, n int) (float32, bool, error) {
	loss, err := d.o.inner(r, x, y, n)
	if err != nil {
		return 0, false, err
	}
	return loss, true, nil
}

// undo takes the round back: this rank returns to the anchor.
func (d *deadlineRounds) undo(r *Replica) int {
	if d.o.open {
		return d.o.back(r.Model.Params())
	}
	return 1
}

func (d *deadlineRounds) agreed(params [][]float32) [][]float32 { return d.o.agreed(params) }
func (d *deadlineRounds) roundOpen() bool                       { return d.o.open }

// settle drops the round under way: a rank that was late or computed on
// holds steps no other rank has, and they are lost, as a streaming
// round's are.
func (d *deadlineRounds) settle(r *Replica) {
	if d.o.open || d.qx != nil {
		d.abandon()
		d.o.back(r.Model.Params())
	}
}

// maxAhead: a rank that was behind may be anywhere in the epoch part.
func (d *deadlineRounds) maxAhead(r *Replica) int { return max(d.o.Every, r.part.max, 1) }

func (d *deadlineRounds) state(opt Optimizer) (string, int, [][]float32) { return d.o.state(opt) }

// setState restores a state between rounds: Level has dropped a round
// under way first (settle).
func (d *deadlineRounds) setState(opt Optimizer, step int, tensors, params [][]float32) error {
	d.qx, d.qround, d.qpos = nil, 0, 0
	return d.o.setState(opt, step, tensors, params)
}

// ErrNoQuorum means an outer round with a deadline closed with fewer ranks
// in than the quorum (LocalSGD.Quorum): every rank skipped its outer step
// and carries its pseudo-gradient into the next round.
var ErrNoQuorum = errors.New("train: outer round below its quorum")

// incomingAwaiter is a Collective that can say when some rank has begun
// the next collective (ring.Ring: AwaitIncoming).
type incomingAwaiter interface {
	AwaitIncoming(ctx context.Context) error
}

// Where a round with a deadline stands on this rank.
const (
	roundOpen   = iota // this rank computes; its part is not decided
	roundPosted        // its pseudo-gradient is in
	roundLate          // the round goes on without it
)

// quorumRound is one outer round of a LocalSGD with a Deadline, as this
// rank sees it. Its exchange runs in a goroutine of its own (watch) from
// the round's first step on: it begins when this rank's pseudo-gradient
// is posted, or, once another rank has begun the round, when the deadline
// passes without it — then this rank sends zeros and an "in" flag of 0.
// mu orders that decision against the main goroutine's post.
type quorumRound struct {
	k       int  // the round's number in the epoch part, from 1
	closing bool // the part's last round: every rank is in, none late
	// buf is the pseudo-gradient, the step's trailer, two hash slots per
	// rank (hashSlots) and this rank's "in" flag, averaged over the ring.
	buf     []float32
	hash    [2]float32  // the anchor's hash as it goes in this rank's slots
	arrived atomic.Bool // another rank began the round while this one computed
	overdue atomic.Bool // the round's deadline has passed on this rank
	// eta is how long this rank expects to take to reach its step in
	// the round (nanoseconds), from its steps so far.
	eta atomic.Int64

	mu    sync.Mutex
	state int
	early bool // posted before its step: this rank computes on (LocalSGD.qat)
	bad   int  // this rank's first non-finite tensor, or -1
	leave bool // this rank asked to leave in it

	posted chan struct{} // closed by post
	quit   chan struct{} // closed to drop the round (abandonExchange)
	done   chan struct{} // closed when the exchange has ended, err and sent set
	err    error
	sent   int64
	named  *LiarError // see gatherSparse
}

// stateOf is where the round stands.
func (x *quorumRound) stateOf() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.state
}

// quorum is the fewest ranks a round closes with.
func (d *deadlineRounds) quorum() int { return max(d.o.Quorum, 1) }

// clock is the time steps are timed by: a test's fake where one is set.
func (d *deadlineRounds) clock() time.Time {
	if d.now != nil {
		return d.now()
	}
	return time.Now()
}

// timeStep folds the step that ended now into the running mean of this
// rank's step time, unless skip: the time since the last one holds more
// than a step (a wait for a round, what came before an epoch part).
func (d *deadlineRounds) timeStep(skip bool) {
	now := d.clock()
	if !d.lastStep.IsZero() && !skip {
		t := now.Sub(d.lastStep)
		if d.stepTime == 0 {
			d.stepTime = t
		} else {
			d.stepTime += (t - d.stepTime) / 4
		}
	}
	d.lastStep = now
}

// timer is the deadline's clock: a test's fake where one is set.
func (d *deadlineRounds) timer(t time.Duration) <-chan time.Time {
	if d.after != nil {
		return d.after(t)
	}
	return time.After(t)
}

// exchange is a step's talk with the ring in LocalSGD with a Deadline.
// Round k of an epoch part is this rank's to close at the part's step
// k·Every (the part's last step for its last round): there it posts its
// pseudo-gradient and waits for the round's outcome. Once another rank
// has begun the round, a rank not yet there has the Deadline to reach it;
// past that it is overdue — at once, if by its own step time it cannot
// reach it within the Deadline — and posts what it has at its next step.
// If that step is not done within another Deadline, it is late: the round
// closes without it. Either way it waits for the round's exchange before
// it computes on, takes the round's outer step and keeps all it did since
// it was last in, which goes into the next round. So no rank waits more
// than twice the Deadline for another. The last round of a part has every
// rank in: one overdue there posts at its next step however long that
// takes, and skips the rest of its part of the epoch (epochEnd), so that
// every rank ends the epoch with the same bits.
func (d *deadlineRounds) exchange(ctx context.Context, r *Replica, _ []float32, _ []int, _ int, loss float32) (float32, error) {
	o := d.o
	pos := r.part.step
	if r.part.steps == 0 { // driven step by step, not by Run: one long part
		d.qpos++
		pos = d.qpos
	} else if pos == 1 {
		d.qround = 0
	}
	due := (d.qround + 1) * o.Every
	closing := r.part.steps > 0 && due >= r.part.steps
	if closing {
		due = r.part.steps
	}
	x := d.qx
	if x == nil {
		x = d.openQuorum(ctx, r, closing)
	}
	d.timeStep(pos == 1) // the part's first step carries what came before it
	x.eta.Store(int64(time.Duration(max(due-pos, 0)) * d.stepTime))
	if x.stateOf() == roundOpen {
		switch {
		case pos >= due:
			d.postQuorum(r, x, false)
		case x.overdue.Load():
			d.postQuorum(r, x, !closing)
		default:
			return loss, nil
		}
	}
	// Once its part is decided — posted, early or not, or late — a rank
	// waits for the round's exchange before it computes on: the others
	// wait for what it forwards, and a rank short of CPU (the one that is
	// behind) would otherwise forward each hop in what its compute leaves.
	// What it does after goes into the next round.
	err := d.endQuorum(ctx, r, x, pos)
	d.timeStep(true)
	return loss, err
}

// openQuorum begins the round's exchange goroutine.
func (d *deadlineRounds) openQuorum(ctx context.Context, r *Replica, closing bool) *quorumRound {
	size := r.Coll.Size()
	d.xbuf = grow(d.xbuf, r.nparams+stepTrailer(size, false)+2*size+1)
	x := &quorumRound{k: d.qround + 1, closing: closing, buf: d.xbuf, bad: -1, hash: hashSlots(r.ParamHash()),
		posted: make(chan struct{}), quit: make(chan struct{}), done: make(chan struct{})}
	d.qx = x
	go d.watchQuorum(ctx, r, x)
	return x
}

// postQuorum puts this rank's pseudo-gradient and trailer in the round,
// unless it has gone on without it. early keeps the parameters as they
// are, so that the steps after this one are told apart at the round's end.
func (d *deadlineRounds) postQuorum(r *Replica, x *quorumRound, early bool) {
	o := d.o
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.state != roundOpen {
		return
	}
	n, params := r.nparams, r.Model.Params()
	x.bad = o.delta(x.buf[:n], params)
	x.leave = r.leaving()
	r.putQuorum(x, stepSays{leave: x.leave, newcomer: r.Waiting != nil && r.Waiting(), nonFinite: x.bad >= 0}, 1)
	if early {
		d.qat = grow(d.qat, n)
		gather(d.qat, params)
		d.qdone = o.done
	}
	x.state, x.early = roundPosted, early
	close(x.posted)
}

// late puts zeros and an "in" flag of 0 in the round for this rank, unless
// it has posted. Its leave request still rides.
func (r *Replica) late(x *quorumRound) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.state != roundOpen {
		return
	}
	clear(x.buf[:r.nparams])
	x.leave = r.leaving()
	r.putQuorum(x, stepSays{leave: x.leave}, 0)
	x.state = roundLate
}

// putQuorum writes this rank's trailer after the pseudo-gradient: what
// it says, the hash of its anchor, and whether it is in.
func (r *Replica) putQuorum(x *quorumRound, says stepSays, in float32) {
	rank, size := r.Coll.Rank(), r.Coll.Size()
	tail := x.buf[r.nparams:]
	t := stepTrailer(size, false)
	says.put(tail[:t], rank, size)
	slots := tail[t : t+2*size]
	clear(slots)
	slots[2*rank], slots[2*rank+1] = x.hash[0], x.hash[1]
	tail[len(tail)-1] = in
}

// hashSlots is the first 32 bits of a parameter hash as a rank's two hash
// slots: 16 bits each, plus 1, so that an empty slot reads 0. Each rank
// writes only its own, so an averaged slot times the size is the value
// again, exactly.
func hashSlots(h [32]byte) [2]float32 {
	return [2]float32{float32(uint32(h[0])<<8|uint32(h[1])) + 1, float32(uint32(h[2])<<8|uint32(h[3])) + 1}
}

// checkAnchors compares the ranks' hash slots from an averaged trailer: at
// each round every rank says what its anchor — the last round's outcome —
// hashes to, so a round checks the one before it without a collective of
// its own, which would wait for a rank that is behind. The ranks whose
// hash differs from most are named, as by CheckInSync; a slot that holds
// no hash is a lie too.
func checkAnchors(slots []float32, size int) error {
	keys := make([]uint32, size)
	var bad []int
	for k := range size {
		hi, lo := float64(slots[2*k])*float64(size), float64(slots[2*k+1])*float64(size)
		rh, rl := math.Round(hi), math.Round(lo)
		if !(math.Abs(hi-rh) < 0.25 && math.Abs(lo-rl) < 0.25 && rh >= 1 && rh <= 1<<16 && rl >= 1 && rl <= 1<<16) {
			bad = append(bad, k)
			continue
		}
		keys[k] = uint32(rh-1)<<16 | uint32(rl-1)
	}
	if len(bad) > 0 {
		return &LiarError{Ranks: bad, Why: "their anchor hashes in the outer round are missing or malformed"}
	}
	all := make([]int, size)
	for k := range all {
		all[k] = k
	}
	odd, majority := oddOnes(all, func(k int) uint32 { return keys[k] })
	switch {
	case len(odd) > 0 && majority:
		return &LiarError{Ranks: odd, Why: "replicas out of step: their anchors differ from most ranks'"}
	case len(odd) > 0:
		return fmt.Errorf("train: replicas out of step: ranks %v hold other anchors than rank 0, and no majority tells which are right", odd)
	}
	return nil
}

// errDropped is a round's exchange dropped before it ran.
var errDropped = errors.New("train: the outer round was dropped")

// watchQuorum runs round x's exchange once this rank's part is decided:
// posted, or late once another rank has begun the round and the deadline
// has passed.
func (d *deadlineRounds) watchQuorum(ctx context.Context, r *Replica, x *quorumRound) {
	o := d.o
	defer close(x.done)
	var arrived chan error
	if aw, ok := r.Coll.(incomingAwaiter); ok && r.Coll.Size() > 1 {
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		arrived = make(chan error, 1)
		go func() { arrived <- aw.AwaitIncoming(actx) }()
	}
	var deadline <-chan time.Time
	for x.stateOf() == roundOpen {
		select {
		case <-x.posted:
		case err := <-arrived:
			arrived = nil
			if err != nil {
				// The ring failed: the exchange below fails with it.
				r.late(x)
				break
			}
			x.arrived.Store(true)
			if time.Duration(x.eta.Load()) > o.Deadline {
				// By its own step time it cannot reach its step within
				// the Deadline: overdue now, it posts what it has at its
				// next step, rather than after a Deadline of waiting.
				x.overdue.Store(true)
				if x.closing {
					break // every rank is in the part's last round
				}
			}
			deadline = d.timer(o.Deadline)
		case <-deadline:
			switch {
			case !x.overdue.Load():
				// Posts what it has at its next step, if that comes
				// within another Deadline.
				x.overdue.Store(true)
				deadline = d.timer(o.Deadline)
				if x.closing {
					deadline = nil // every rank is in the part's last round
				}
			default:
				r.late(x)
			}
		case <-x.quit:
			r.late(x)
			x.err = errDropped
			return
		case <-ctx.Done():
			r.late(x)
			x.err = ctx.Err()
			return
		}
	}
	x.sent, x.err = r.countSent(len(x.buf), func() error {
		if o.Sparse == nil {
			return r.Coll.AllreduceMean(ctx, x.buf)
		}
		n, bad := r.nparams, x.bad
		if x.state == roundLate {
			bad = 0 // sends no payload
		}
		var err error
		x.named, err = o.gatherSparse(ctx, r, x.buf[:n], x.buf[n:], 0, 1, bad)
		return err
	})
}

// endQuorum waits for round x and takes its outer step with the average
// of the pseudo-gradients that were in — every rank the same — or says
// why every rank skips it. A rank that posted and waited returns to the
// new anchor; one that was late or computed on keeps what it did since,
// on top of the new anchor. A failed exchange is an ErrCollective; the
// caller takes the round back.
func (d *deadlineRounds) endQuorum(ctx context.Context, r *Replica, x *quorumRound, pos int) error {
	o := d.o
	r.awaitExchange(x.done, &x.sent)
	d.qx = nil
	d.qround++
	if x.err != nil {
		return fmt.Errorf("%w: averaging the pseudo-gradients of outer round %d: %w", ErrCollective, x.k, x.err)
	}
	size, n := r.Coll.Size(), r.nparams
	t := stepTrailer(size, false)
	avg, tail, slots := x.buf[:n], x.buf[n:n+t], x.buf[n+t:n+t+2*size]
	in := int(math.Round(float64(x.buf[len(x.buf)-1]) * float64(size)))
	if err := checkAnchors(slots, size); err != nil {
		return err
	}
	r.out.outerChecked = true
	badRanks, newcomer, leaving := stepFlagsOf(tail, size)
	r.out.newcomer = r.out.newcomer || newcomer
	leaving, err := r.leavers(ctx, leaving, x.leave)
	if err != nil {
		return err
	}
	if err = d.outcome(r, x, avg, tail, badRanks, in); err == nil {
		d.take(r, x, avg)
		r.out.named = x.named
	} else if errors.Is(err, ErrNoQuorum) && !x.closing {
		clear(o.encoded) // nothing was taken: every rank carries on
	} else {
		o.back(r.Model.Params()) // skipped on every rank, as a synchronous round is
	}
	if Skipped(err) {
		r.Stats.Skipped++
	}
	if x.closing && pos < r.part.steps {
		r.out.epochEnd = true
	}
	return withLeavers(err, leaving)
}

// outcome says why every rank skips round x, or nil: a rank's NaN or
// Inf, fewer ranks in than the quorum, or an average that is not finite.
// The average of the in ranks' pseudo-gradients is avg scaled by the
// ranks over those in.
func (d *deadlineRounds) outcome(r *Replica, x *quorumRound, avg, tail []float32, badRanks, in int) error {
	size := r.Coll.Size()
	switch {
	case badRanks > 0:
		return r.skipped(avg, tail, x.bad, badRanks)
	case in < d.quorum():
		return fmt.Errorf("train: outer round %d closed with %d of %d ranks in, under the quorum of %d; skipped on all, each carries its pseudo-gradient on: %w",
			x.k, in, size, d.quorum(), ErrNoQuorum)
	}
	if in < size {
		f := float32(size) / float32(in)
		for i := range avg {
			avg[i] *= f
		}
	}
	if !finite(avg) {
		return fmt.Errorf("train: the averaged pseudo-gradients of outer round %d hold a NaN or Inf though all %d ranks in flagged theirs finite (a rank hid its own, or the sum overflowed); skipped on all: %w",
			x.k, in, ErrNonFinite)
	}
	return nil
}

// take takes round x's outer step with avg. A rank that posted and
// waited returns to the new anchor; what one that was late or computed
// on did since it posted (or, late, since it was last in) goes on top of
// the new anchor, into the next round.
func (d *deadlineRounds) take(r *Replica, x *quorumRound, avg []float32) {
	o, params, n := d.o, r.Model.Params(), r.nparams
	mine := x.state == roundPosted
	r.out.outerDone = true
	if mine && !x.early {
		o.outerStep(params, 0, n, avg)
		o.outer++
		o.commit(0, 1)
		o.back(params)
		return
	}
	from := o.anchor
	if mine {
		from = d.qat
	}
	eachSpan(params, 0, n, func(k, a, b, off int) {
		p := params[k][a:b]
		for i := range p {
			p[i] -= from[off+i]
		}
	})
	o.outerStep(params, 0, n, avg)
	o.outer++
	if mine {
		o.commit(0, 1)
		o.done -= d.qdone
	}
	eachSpan(params, 0, n, func(k, a, b, off int) {
		p := params[k][a:b]
		for i := range p {
			p[i] += o.anchor[off+i]
		}
	})
}

// abandon drops the round under way, if any: its goroutine stops
// waiting, the exchange if it ran is waited for, and nothing is applied.
func (d *deadlineRounds) abandon() {
	if x := d.qx; x != nil {
		close(x.quit)
		<-x.done
		d.qx = nil
	}
}
