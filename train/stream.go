package train

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// streamed is LocalSGD streamed (Streaming DiLoCo): the parameters in
// LocalSGD.Fragments fragments, each with an outer exchange of its own
// every Every steps, staggered, and with Overlap each exchange in the
// background beside the inner steps that follow it. A round lasts the
// epoch part.
type streamed struct {
	o *LocalSGD
	// inflight is the exchange under way, if any; began is o.done when
	// the last exchange began.
	inflight *exchange
	began    int
	// xbuf and xat are the exchange's scratch (exchange.buf and .at).
	xbuf, xat []float32
}

// begin is the inner step; the ring is talked to when an exchange ends
// or begins (dueExchange).
func (s *streamed) begin(r *Replica, x []float32, y []int, n int) (float32, bool, error) {
	loss, err := s.o.inner(r, x, y, n)
	if err != nil {
		return 0, false, err
	}
	return loss, s.dueExchange(r.part.closing), nil
}

// undo takes back a failed exchange: every fragment goes back to its
// anchor; the steps since the failed exchange began run again — their
// samples are in no anchor — and what the others did since their
// fragments' last outer steps is dropped, as at any ring change (Level).
func (s *streamed) undo(r *Replica) int {
	if !s.o.open {
		return 1
	}
	n := s.o.done - s.began + 1
	s.o.back(r.Model.Params())
	return n
}

// agreed is the fragments' anchors while a round is open: the ranks'
// parameters never coincide in it.
func (s *streamed) agreed(params [][]float32) [][]float32 { return s.o.agreed(params) }

// roundOpen: what every rank holds alike — the anchors — is a checkpoint
// between the round's exchanges, and only the steps since the exchange
// in flight began can be taken back.
func (s *streamed) roundOpen() bool { return s.inflight != nil }

// settle drops the exchange in flight and puts every fragment back at its
// anchor, the inner optimizer afresh. What the inner steps did since each
// fragment's last outer step is lost: the price of a ring change there.
func (s *streamed) settle(r *Replica) {
	if s.o.open {
		s.abandon()
		s.o.back(r.Model.Params())
	}
}

func (s *streamed) maxAhead(*Replica) int                          { return max(s.o.Every, 1) }
func (s *streamed) state(opt Optimizer) (string, int, [][]float32) { return s.o.state(opt) }
func (s *streamed) setState(opt Optimizer, step int, tensors, params [][]float32) error {
	return s.o.setState(opt, step, tensors, params)
}

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
	// named: see gatherSparse.
	named *LiarError
}

// dueExchange says whether this streaming step talks to the ring: to end
// the exchange in flight, whose Overlap is up or whose round closes, or
// to begin a fragment's.
func (s *streamed) dueExchange(closing bool) bool {
	o := s.o
	if s.ending(closing) != nil {
		return true
	}
	_, ok := o.due(o.done)
	return ok || closing
}

// ending is the exchange in flight if this step ends it: its Overlap is
// up, or the round closes.
func (s *streamed) ending(closing bool) *exchange {
	o := s.o
	if x := s.inflight; x != nil && (closing || o.done-s.began >= o.Overlap) {
		return x
	}
	return nil
}

// exchange is a streaming LocalSGD step's talk with the ring: it ends
// the exchange in flight if its time has come, then begins the fragment
// whose turn it is — every fragment at once if the round closes (Run's
// last step of an epoch), after which every rank holds the same bits. An
// exchange that overlaps inner steps runs in the background; one that
// does not is waited for here.
func (s *streamed) exchange(ctx context.Context, r *Replica, _ []float32, _ []int, _ int, loss float32) (float32, error) {
	o := s.o
	var skipped error
	if x := s.ending(r.part.closing); x != nil {
		if err := s.endExchange(ctx, r, x); Skipped(err) {
			skipped = err
		} else if err != nil {
			return loss, err
		}
	}
	from, to := 0, o.fragments()
	if !r.part.closing {
		k, ok := o.due(o.done)
		if !ok {
			return loss, skipped
		}
		from, to = k, k+1
	}
	x, err := s.beginExchange(r, from, to)
	if err != nil {
		return loss, err
	}
	if o.Overlap > 0 && !r.part.closing {
		s.inflight = x
		go s.runExchange(ctx, r, x)
		return loss, skipped
	}
	s.runExchange(ctx, r, x)
	err = s.endExchange(ctx, r, x)
	if r.part.closing && !errors.Is(err, ErrCollective) {
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
func (s *streamed) beginExchange(r *Replica, from, to int) (*exchange, error) {
	o := s.o
	lo, _ := o.fragment(from, r.nparams)
	_, hi := o.fragment(to-1, r.nparams)
	x := &exchange{from: from, to: to, lo: lo, hi: hi, bad: -1, done: make(chan struct{})}
	size := r.Coll.Size()
	// One exchange is in flight at a time: its buffers are the round's,
	// reused from one to the next.
	s.xbuf = grow(s.xbuf, hi-lo+stepTrailer(size, r.NormGuard > 0))
	x.buf = s.xbuf
	avg, tail := x.buf[:hi-lo], x.buf[hi-lo:]
	params := r.Model.Params()
	eachSpan(params, lo, hi, func(k, a, b, off int) {
		for i, v := range params[k][a:b] {
			avg[off-lo+i] = o.anchor[off+i] - v
		}
	})
	x.bad = firstNonFinite(params, avg, lo)
	if o.Overlap > 0 {
		s.xat = grow(s.xat, hi-lo)
		x.at = s.xat
		gatherRange(x.at, params, lo, hi)
	}
	x.leave = r.leaving()
	says := stepSays{leave: x.leave, newcomer: r.Waiting != nil && r.Waiting(), nonFinite: x.bad >= 0}
	if r.NormGuard > 0 && x.bad < 0 {
		says.norm = float32(norm2(avg))
	}
	says.put(tail, r.Coll.Rank(), size)
	s.began = o.done
	return x, nil
}

// runExchange averages x over the ring and closes x.done. It is the only
// user of the collective while it runs.
func (s *streamed) runExchange(ctx context.Context, r *Replica, x *exchange) {
	o := s.o
	defer close(x.done)
	x.sent, x.err = r.countSent(len(x.buf), func() error {
		avg, tail := x.buf[:x.hi-x.lo], x.buf[x.hi-x.lo:]
		if o.Sparse != nil {
			var err error
			x.named, err = o.gatherSparse(ctx, r, avg, tail, x.from, x.to, x.bad)
			return err
		}
		return r.Coll.AllreduceMean(ctx, x.buf)
	})
}

// endExchange waits for x and takes its outer step on every fragment it
// carried, or says why every rank skips them (the same reasons as a
// synchronous step's; the fragments go back to their anchors). What the
// trailer says — leave requests, a newcomer — counts as after any step.
// A failed exchange is an ErrCollective; the caller takes the step back.
func (s *streamed) endExchange(ctx context.Context, r *Replica, x *exchange) error {
	o := s.o
	r.awaitExchange(x.done, &x.sent)
	s.inflight = nil
	if x.err != nil {
		return fmt.Errorf("%w: averaging the pseudo-gradients of fragments %d to %d of %d: %w", ErrCollective, x.from+1, x.to, o.fragments(), x.err)
	}
	avg, tail := x.buf[:x.hi-x.lo], x.buf[x.hi-x.lo:]
	badRanks, newcomer, leaving := stepFlagsOf(tail, r.Coll.Size())
	r.out.newcomer = r.out.newcomer || newcomer
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
		r.out.outerDone = x.to == o.fragments()
		r.out.named = x.named
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

// abandon waits for the exchange in flight, if any, and drops it:
// its round is brought level (Level) before it goes on.
func (s *streamed) abandon() {
	if x := s.inflight; x != nil {
		<-x.done
		s.inflight = nil
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
