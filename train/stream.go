package train

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ringtrain/ringtrain/ring"
)

// exchange is one outer exchange of a streaming LocalSGD round: the
// pseudo-gradients of fragments [from, to), the flat range [lo, hi) of
// the parameters, averaged over the ring — in the background while inner
// steps go on, where the round overlaps them.
type exchange struct {
	from, to int
	lo, hi   int
	buf      []float32 // the pseudo-gradients, then the trailer; the averages after
	at       []float32 // the parameters' range when it began, with Overlap
	bad      int       // this rank's first non-finite tensor, or -1
	leave    bool      // this rank asked to leave in it

	done chan struct{} // closed when the exchange has ended, err and sent set
	err  error
	sent int64 // bytes this rank sent in it, where the collective counts them
}

// dueExchange says whether this streaming step talks to the ring: to end
// the exchange in flight, whose Overlap is up or whose round closes, or
// to begin a fragment's.
func (o *LocalSGD) dueExchange(closing bool) bool {
	if o.ending(closing) != nil {
		return true
	}
	_, ok := o.due(o.done)
	return ok || closing
}

// ending is the exchange in flight if this step ends it: its Overlap is
// up, or the round closes.
func (o *LocalSGD) ending(closing bool) *exchange {
	if x := o.inflight; x != nil && (closing || o.done-o.began >= o.Overlap) {
		return x
	}
	return nil
}

// streamStep is a streaming LocalSGD step's talk with the ring: it ends
// the exchange in flight if its time has come, then begins the fragment
// whose turn it is — every fragment at once if the round closes (Run's
// last step of an epoch), after which every rank holds the same bits. An
// exchange that overlaps inner steps runs in the background; one that
// does not is waited for here.
func (r *Replica) streamStep(ctx context.Context, o *LocalSGD, loss float32) (float32, error) {
	var skipped error
	if x := o.ending(r.closeRound); x != nil {
		if err := r.endExchange(ctx, o, x); Skipped(err) {
			skipped = err
		} else if err != nil {
			return loss, err
		}
	}
	from, to := 0, o.fragments()
	if !r.closeRound {
		k, ok := o.due(o.done)
		if !ok {
			return loss, skipped
		}
		from, to = k, k+1
	}
	x, err := r.beginExchange(o, from, to)
	if err != nil {
		return loss, err
	}
	if o.Overlap > 0 && !r.closeRound {
		o.inflight = x
		go r.runExchange(ctx, o, x)
		return loss, skipped
	}
	r.runExchange(ctx, o, x)
	err = r.endExchange(ctx, o, x)
	if r.closeRound && !errors.Is(err, ErrCollective) {
		// Every fragment has had its outer step, or every rank skipped
		// the same ones: back to the anchor, the same on every rank.
		o.back(r.Model.Params())
	}
	if err == nil {
		err = skipped
	}
	return loss, err
}

// beginExchange takes the pseudo-gradients of fragments [from, to) and
// the trailer of what this rank says.
func (r *Replica) beginExchange(o *LocalSGD, from, to int) (*exchange, error) {
	if r.Wire != ring.F32 {
		return nil, fmt.Errorf("train: a streaming outer sync sends float32 or, with Sparse, its own code; not %v", r.Wire)
	}
	lo, _ := o.fragment(from, r.nparams)
	_, hi := o.fragment(to-1, r.nparams)
	x := &exchange{from: from, to: to, lo: lo, hi: hi, bad: -1, done: make(chan struct{})}
	size := r.Coll.Size()
	// One exchange is in flight at a time: its buffers are the round's,
	// reused from one to the next.
	o.xbuf = grow(o.xbuf, hi-lo+stepTrailer(size, r.NormGuard > 0))
	x.buf = o.xbuf
	avg, tail := x.buf[:hi-lo], x.buf[hi-lo:]
	params := r.Model.Params()
	eachSpan(params, lo, hi, func(k, a, b, off int) {
		for i, v := range params[k][a:b] {
			avg[off-lo+i] = o.anchor[off+i] - v
		}
	})
	x.bad = firstNonFinite(params, avg, lo)
	if o.Overlap > 0 {
		o.xat = grow(o.xat, hi-lo)
		x.at = o.xat
		gatherRange(x.at, params, lo, hi)
	}
	x.leave = r.leaving()
	says := stepSays{leave: x.leave, newcomer: r.Waiting != nil && r.Waiting(), nonFinite: x.bad >= 0}
	if r.NormGuard > 0 && x.bad < 0 {
		says.norm = float32(norm2(avg))
	}
	says.put(tail, r.Coll.Rank(), size)
	o.began = o.done
	return x, nil
}

// runExchange averages x over the ring and closes x.done. It is the only
// user of the collective while it runs.
func (r *Replica) runExchange(ctx context.Context, o *LocalSGD, x *exchange) {
	defer close(x.done)
	x.sent, x.err = r.countSent(len(x.buf), func() error {
		avg, tail := x.buf[:x.hi-x.lo], x.buf[x.hi-x.lo:]
		if o.Sparse != nil {
			return r.gatherSparse(ctx, o, avg, tail, x.from, x.to, x.bad)
		}
		return r.Coll.AllreduceMean(ctx, x.buf)
	})
}

// countSent runs an exchange of n values and returns the bytes this rank
// sent in it — the collective's count where it keeps one, else a ring
// allreduce's 2(size−1)/size of the values — and the exchange's error.
func (r *Replica) countSent(n int, run func() error) (int64, error) {
	counter, counts := r.Coll.(byteCounter)
	var sent0 int64
	if counts {
		sent0 = counter.Stats().BytesSent
	}
	err := run()
	switch size := int64(r.Coll.Size()); {
	case counts:
		return counter.Stats().BytesSent - sent0, err
	case size > 1:
		return 2 * (size - 1) * int64(4*n) / size, err
	}
	return 0, err
}

// endExchange waits for x and takes its outer step on every fragment it
// carried, or says why every rank skips them (the same reasons as a
// synchronous step's; the fragments go back to their anchors). What the
// trailer says — leave requests, a newcomer — counts as after any step.
// A failed exchange is an ErrCollective; the caller takes the step back.
func (r *Replica) endExchange(ctx context.Context, o *LocalSGD, x *exchange) error {
	r.awaitExchange(x.done, &x.sent)
	o.inflight = nil
	if x.err != nil {
		return fmt.Errorf("%w: averaging the pseudo-gradients of fragments %d to %d of %d: %w", ErrCollective, x.from+1, x.to, o.fragments(), x.err)
	}
	avg, tail := x.buf[:x.hi-x.lo], x.buf[x.hi-x.lo:]
	badRanks, newcomer, leaving := stepFlagsOf(tail, r.Coll.Size())
	r.newcomer = r.newcomer || newcomer
	leaving, err := r.leavers(ctx, leaving, x.leave)
	if err != nil {
		return err
	}
	params := r.Model.Params()
	err = r.skipped(avg, tail, x.bad, badRanks)
	if err == nil && !finite(avg) {
		err = fmt.Errorf("train: the averaged pseudo-gradients of fragments %d to %d hold a NaN or Inf though all %d ranks flagged theirs finite (a rank hid its own, or the sum overflowed); skipped on all: %w",
			x.from+1, x.to, r.Coll.Size(), ErrNonFinite)
	}
	if err == nil {
		o.outerStep(params, x.lo, x.hi, avg)
		o.outer++
		o.commit(x.from, x.to)
		r.outerDone = x.to == o.fragments()
	}
	if Skipped(err) {
		r.Stats.Skipped++
	}
	// Each fragment starts its next window at its anchor, plus what the
	// inner steps since the exchange began did to it.
	eachSpan(params, x.lo, x.hi, func(k, a, b, off int) {
		p := params[k][a:b]
		for i := range p {
			v := o.anchor[off+i]
			if x.at != nil && err == nil {
				v += p[i] - x.at[off-x.lo+i]
			}
			p[i] = v
		}
	})
	return withLeavers(err, leaving)
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

// awaitExchange waits for an exchange in the background to be done and
// counts the wait as time on the ring, and the bytes it sent.
func (r *Replica) awaitExchange(done <-chan struct{}, sent *int64) {
	t0 := time.Now()
	<-done
	waited := time.Since(t0)
	r.Stats.Ring += waited
	r.Stats.BytesSent += *sent
	if r.Trace != nil {
		r.Trace.Span("allreduce", t0, t0.Add(waited), r.Steps, -1)
	}
}

// abandonExchange waits for the exchange in flight, if any, and drops it:
// its round is brought level (Level) before it goes on.
func (o *LocalSGD) abandonExchange() {
	if x := o.inflight; x != nil {
		<-x.done
		o.inflight = nil
	}
}

// firstNonFinite is the first tensor of params whose part of the flat
// range starting at lo holds a NaN or Inf in d, or -1.
func firstNonFinite(params [][]float32, d []float32, lo int) int {
	bad := -1
	eachSpan(params, lo, lo+len(d), func(k, a, b, off int) {
		if bad < 0 && !finite(d[off-lo:off-lo+b-a]) {
			bad = k
		}
	})
	return bad
}

// gatherRange copies the flat range [lo, hi) of ts end to end into dst.
func gatherRange(dst []float32, ts [][]float32, lo, hi int) {
	eachSpan(ts, lo, hi, func(k, a, b, off int) { copy(dst[off-lo:], ts[k][a:b]) })
}

// grow is buf with length n, its array reused where it is long enough.
func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}
