package train

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train/sparse"
)

// LocalSGD is DiLoCo: each rank takes Every steps on its own with Inner
// (the job's optimizer), never talking to the others; then the ranks
// average their parameter changes since the last outer step (the
// "pseudo-gradient", anchor − θ) in one allreduce and every rank applies
// the same outer step to the anchor — SGD with momentum, Nesterov's if
// asked, which DiLoCo uses (arXiv 2311.08105). A round sends the
// parameters' bytes once where synchronous training sends them Every times.
//
// NewLocalReplica makes a replica that syncs so: its optimizer is Inner,
// and its Step takes inner steps and closes a round every Every steps
// (and at every epoch's end, when Run drives it). All
// that ranks must agree on lives in the outer step: its non-finite flags,
// leave requests, norm guard and compression are those of a synchronous
// step. Between rounds every rank holds the same bits — parameters, outer
// momentum, and an inner optimizer started afresh each round — so
// checkpoints, the parameter-hash check, admission and resuming work as
// in synchronous training; a checkpoint keeps the outer momentum as the
// optimizer's state (Replica.OptimizerState). (With Sparse each rank also keeps error feedback of its own,
// which its own checkpoint holds (Checkpoint.Feedback) and a re-formation
// leaves as it is; an admitted rank, which has none, starts without.) (DiLoCo's paper keeps each worker's own inner Adam state across
// rounds; that would need a checkpoint per rank and a way to hand a lost
// rank's to its successor, so here each round starts its inner optimizer
// afresh.)
//
// A failed allreduce at the outer step makes every rank that did not
// finish it go back to the anchor: the round is redone by the survivors,
// from the last outer step, on the round's share of the data.
type LocalSGD struct {
	Inner Optimizer
	// Every is the inner steps per round, H; 1 with a plain SGD inner and
	// an outer LR of 1 without momentum is synchronous SGD.
	Every int
	// Outer step: v ← μv + Δ; θ ← anchor − LR·(Δ + μv) with Nesterov,
	// anchor − LR·v without (torch.optim.SGD's two forms).
	LR, Momentum float32
	Nesterov     bool
	// Sparse, if set, sends each rank's pseudo-gradient as its top
	// entries in a few bits (train/sparse), gathered from every rank
	// rather than summed round the ring, with error feedback kept per
	// rank; nil sends it whole, in the ring's encoding.
	Sparse *sparse.Config
	// Robust, if set (with Sparse), aggregates the gathered
	// pseudo-gradients robustly instead of averaging them: a rank that
	// sends an outlier moves the round only by a clipped step.
	Robust *Robust
	// Fragments, if above 1, streams the outer sync (Streaming DiLoCo,
	// arXiv 2501.18512): the parameters, end to end, in this many equal
	// ranges, each with an outer step of its own every Every steps,
	// staggered — fragment k's at steps (k+1)·Every/Fragments of each
	// cycle — so that a round's bytes go out in Fragments pieces spread
	// over it rather than in one burst. A streaming round lasts the
	// epoch: at its end (Run's last step of an epoch) every fragment
	// goes at once and every rank holds the same bits again.
	Fragments int
	// Overlap is how many inner steps a fragment's exchange runs beside:
	// it goes out in the background, the inner steps go on, and its outer
	// step is applied Overlap steps later, keeping what those steps did
	// to the fragment (θ ← new anchor + their change). 0 waits for it.
	// Under Every/Fragments, so that one exchange is in flight at a time.
	Overlap int
	// Deadline, if above 0, lets a round close without a rank slow to
	// compute (a quorum round, DiLoCo's asynchronous variants): once a
	// rank has begun round k, a rank not yet at its step k·Every posts
	// the pseudo-gradient it has at its next step and computes on; if
	// that step is not done within Deadline, the round closes without it
	// and what it did goes into the next round. See Replica.quorumStep.
	// Not with Fragments or Overlap.
	Deadline time.Duration
	// Quorum is the fewest ranks a round with a Deadline closes with (the
	// job's min_world_size); a round with fewer in is skipped on every
	// rank (ErrNoQuorum), and each carries its pseudo-gradient on. 0 is 1.
	Quorum int

	velocity [][]float32 // the outer momentum, shaped like the parameters
	outer    int         // outer steps applied
	anchor   []float32   // the parameters at the last outer step, end to end
	open     bool        // a round is under way: anchor holds its start
	done     int         // inner steps taken in the open round
	// coders hold this rank's error feedback, one per fragment; encoded
	// says which wait for their last Encode to be committed by an outer
	// step.
	coders  []*sparse.Coder
	encoded []bool
	// outliers: Robust's count of the rounds each rank stood apart, and
	// of those it sent the same payload (bytes) again; sketched, by the
	// first fragment of the exchange, of those it sent the same
	// pseudo-gradient (its sketch) again.
	outliers outliers
	sketched map[int]*outliers
	// tab is the projection of the pseudo-gradients' sketches.
	tab sketchTable
	// tamper, if set, alters this rank's pseudo-gradient before it is
	// sent (attack): set only by tests and attacker builds.
	tamper func(d []float32, off int)
	// entries holds the ranks' decoded payloads for Robust, kept between
	// rounds: each rank's entries, and all of them in columns.
	entries struct {
		idx  [][]int32
		val  [][]float32
		cols columns
	}
}

// NewLocalReplica wires a model, LocalSGD and a collective: the replica's
// optimizer is o.Inner, and its Sync the mode o's settings call for.
func NewLocalReplica(m Model, o *LocalSGD, c Collective) *Replica {
	r := NewReplica(m, o.Inner, c)
	r.Sync = o.sync()
	return r
}

// sync is the mode o's settings call for: the one place it is chosen.
func (o *LocalSGD) sync() Sync {
	switch {
	case o.Deadline > 0:
		return &deadlineRounds{o: o}
	case o.Fragments > 1 || o.Overlap > 0:
		return &streamed{o: o}
	}
	return rounds{o: o}
}

// state is the outer momentum and the outer steps taken; the name says
// the inner optimizer too. Between rounds that is all the state there is.
func (o *LocalSGD) state(inner Optimizer) (string, int, [][]float32) {
	name, _, _ := inner.State()
	return "diloco+" + name, o.outer, o.velocity
}

// setState restores the outer momentum and ends any open round: what is
// restored is a state between rounds.
func (o *LocalSGD) setState(inner Optimizer, step int, tensors, params [][]float32) error {
	o.open, o.done, o.outer = false, 0, step
	// The error feedback committed so far stays: it is this rank's own,
	// what its past rounds left out, whoever the state came from (Level).
	// What an open round coded and no outer step committed goes.
	clear(o.encoded)
	o.velocity = nil
	if len(tensors) > 0 {
		v, err := restore(tensors, params)
		if err != nil {
			return err
		}
		o.velocity = v
	}
	return inner.SetState(0, nil, params)
}

// Check says what is wrong with the settings, for a replica whose
// gradients travel as wire and which guards gradient norms by normGuard
// (Replica.Wire and NormGuard): the one statement of what the modes take.
// A replica checks them as a round opens; a job's config, before anything
// runs.
func (o *LocalSGD) Check(wire ring.Encoding, normGuard float64) error {
	if err := o.validate(); err != nil {
		return err
	}
	switch streaming := o.Fragments > 1 || o.Overlap > 0; {
	case o.Sparse != nil && wire != ring.F32:
		return fmt.Errorf("train: sparse pseudo-gradients are coded by LocalSGD; gradients to send as %v would code them twice", wire)
	case streaming && wire != ring.F32:
		return fmt.Errorf("train: a streaming outer sync (fragments, overlap) sends float32 or, with sparse, its own code; not %v", wire)
	case o.Deadline > 0 && wire != ring.F32:
		return fmt.Errorf("train: outer rounds with a deadline send float32 or, with sparse, its own code; not %v", wire)
	case o.Deadline > 0 && normGuard > 0:
		return fmt.Errorf("train: outer rounds with a deadline do not take the gradient norm guard: a late rank's zeros would move the median norm")
	}
	return nil
}

// validate says what is wrong with the settings themselves.
func (o *LocalSGD) validate() error {
	switch {
	case o.Inner == nil:
		return fmt.Errorf("train: local SGD without an inner optimizer")
	case o.Every < 1:
		return fmt.Errorf("train: local SGD every %d steps; want 1 or more", o.Every)
	case !(o.LR > 0) || !(o.Momentum >= 0 && o.Momentum < 1):
		return fmt.Errorf("train: outer lr %v, momentum %v; want lr > 0 and momentum in [0, 1)", o.LR, o.Momentum)
	case o.Robust != nil && o.Sparse == nil:
		return fmt.Errorf("train: robust aggregation takes every rank's pseudo-gradient apart, which only sparse rounds gather")
	case o.Sparse != nil:
		if err := o.Sparse.Validate(); err != nil {
			return err
		}
		if o.Robust != nil {
			return o.Robust.Validate()
		}
	}
	if err := CheckStreaming(o.Every, o.Fragments, o.Overlap); err != nil {
		return fmt.Errorf("train: local SGD: %w", err)
	}
	return CheckDeadline(o.Deadline, o.Quorum, o.Fragments > 1 || o.Overlap > 0)
}

// CheckDeadline says what is wrong with outer rounds closing by deadline
// with a quorum of quorum ranks, streaming or not (LocalSGD's Deadline and
// Quorum).
func CheckDeadline(deadline time.Duration, quorum int, streaming bool) error {
	switch {
	case deadline < 0 || quorum < 0:
		return fmt.Errorf("train: local SGD with a deadline of %v and a quorum of %d; want neither below 0", deadline, quorum)
	case deadline > 0 && streaming:
		return fmt.Errorf("train: local SGD: a deadline with fragments or overlap; a round with a deadline is the whole model, and a rank behind computes on beside it already")
	}
	return nil
}

// CheckStreaming says what is wrong with a streaming outer sync of
// fragments every steps, each exchange overlapping overlap inner steps
// (LocalSGD's Every, Fragments and Overlap; 0 and 0 do not stream).
func CheckStreaming(every, fragments, overlap int) error {
	switch {
	case fragments < 0 || overlap < 0:
		return fmt.Errorf("%d fragments, overlapping %d steps; want neither below 0", fragments, overlap)
	case fragments > every:
		return fmt.Errorf("%d fragments with an outer step every %d steps; want no more fragments than steps", fragments, every)
	case (fragments > 1 || overlap > 0) && overlap >= every/max(fragments, 1):
		return fmt.Errorf("a fragment's exchange overlapping %d steps, with one beginning every %d; want fewer, so that one is in flight at a time",
			overlap, every/max(fragments, 1))
	}
	return nil
}

// fragments is how many fragments the parameters are in: 1 unless
// streaming.
func (o *LocalSGD) fragments() int { return max(o.Fragments, 1) }

// fragment is fragment k's range of the n parameters, end to end.
func (o *LocalSGD) fragment(k, n int) (lo, hi int) {
	f := o.fragments()
	return k * n / f, (k + 1) * n / f
}

// due is the fragment whose exchange begins after done inner steps of a
// streaming round: fragment k at (k+1)·Every/Fragments steps into each
// cycle of Every.
func (o *LocalSGD) due(done int) (k int, ok bool) {
	if done <= 0 {
		return 0, false
	}
	s, f := done%o.Every, o.fragments()
	if s == 0 {
		s = o.Every
	}
	for k := range f {
		if (k+1)*o.Every/f == s {
			return k, true
		}
	}
	return 0, false
}

// encode codes fragment k's pseudo-gradient d with this rank's error
// feedback for it; the feedback it leaves is kept only if the fragment's
// outer step is taken.
func (o *LocalSGD) encode(k int, d []float32) ([]byte, error) {
	if len(o.coders) != o.fragments() {
		o.coders, o.encoded = make([]*sparse.Coder, o.fragments()), make([]bool, o.fragments())
	}
	if o.coders[k] == nil {
		c, err := sparse.NewCoder(*o.Sparse, len(d))
		if err != nil {
			return nil, err
		}
		o.coders[k] = c
	}
	p, err := o.coders[k].Encode(d)
	o.encoded[k] = err == nil
	return p, err
}

// feedback is this rank's committed error feedback, a tensor per
// fragment, empty for one not coded yet; nil without Sparse or before
// any round.
func (o *LocalSGD) feedback() [][]float32 {
	if o.Sparse == nil || o.coders == nil {
		return nil
	}
	out := make([][]float32, len(o.coders))
	for k, c := range o.coders {
		if c != nil {
			out[k] = c.Residual()
		}
	}
	return out
}

// setFeedback restores what feedback returned for a model of nparams
// values, each tensor checked against its fragment's size.
func (o *LocalSGD) setFeedback(fb [][]float32, nparams int) error {
	if o.Sparse == nil {
		return fmt.Errorf("train: error feedback for a job without sparse rounds: %w", ErrCheckpoint)
	}
	if len(fb) != o.fragments() {
		return fmt.Errorf("train: error feedback of %d fragments for %d: %w", len(fb), o.fragments(), ErrCheckpoint)
	}
	o.coders, o.encoded = make([]*sparse.Coder, len(fb)), make([]bool, len(fb))
	for k, t := range fb {
		if len(t) == 0 {
			continue
		}
		lo, hi := o.fragment(k, nparams)
		if len(t) != hi-lo {
			return fmt.Errorf("train: error feedback of %d values for fragment %d of %d: %w", len(t), k, hi-lo, ErrCheckpoint)
		}
		c, err := sparse.NewCoder(*o.Sparse, hi-lo)
		if err != nil {
			return err
		}
		if err := c.SetResidual(t); err != nil {
			return err
		}
		o.coders[k] = c
	}
	return nil
}

// commit keeps the error feedback of fragments [from, to): their outer
// step was taken.
func (o *LocalSGD) commit(from, to int) {
	for k := from; k < to && k < len(o.encoded); k++ {
		if o.encoded[k] {
			o.coders[k].Commit()
			o.encoded[k] = false
		}
	}
}

// begin opens a round at the parameters as they are.
func (o *LocalSGD) begin(params [][]float32) {
	o.anchor = o.anchor[:0]
	for _, p := range params {
		o.anchor = append(o.anchor, p...)
	}
	o.open, o.done = true, 0
}

// delta writes the round's pseudo-gradient, anchor − θ, into dst and
// returns the first tensor that holds a NaN or Inf, or -1.
func (o *LocalSGD) delta(dst []float32, params [][]float32) int {
	bad, off := -1, 0
	for k, p := range params {
		for i, v := range p {
			d := o.anchor[off+i] - v
			dst[off+i] = d
			if bad < 0 && (math.IsNaN(float64(d)) || math.IsInf(float64(d), 0)) {
				bad = k
			}
		}
		off += len(p)
	}
	if o.tamper != nil {
		o.tamper(dst[:off], 0)
	}
	return bad
}

// apply takes the outer step with the averaged pseudo-gradient avg and
// closes the round: every rank's parameters become the new anchor.
func (o *LocalSGD) apply(params [][]float32, avg []float32) {
	o.outerStep(params, 0, len(o.anchor), avg)
	o.outer++
	o.commit(0, o.fragments())
	o.back(params)
}

// outerStep moves the anchor's range [lo, hi) by the outer step for its
// averaged pseudo-gradient avg (hi − lo values).
func (o *LocalSGD) outerStep(params [][]float32, lo, hi int, avg []float32) {
	if o.Momentum != 0 && o.velocity == nil {
		o.velocity = zerosLike(params)
	}
	eachSpan(params, lo, hi, func(k, a, b, off int) {
		for i := a; i < b; i++ {
			d := avg[off+i-a-lo]
			upd := d
			if o.Momentum != 0 {
				v := o.Momentum*o.velocity[k][i] + d
				o.velocity[k][i] = v
				if o.Nesterov {
					upd = d + o.Momentum*v
				} else {
					upd = v
				}
			}
			o.anchor[off+i-a] -= o.LR * upd
		}
	})
}

// eachSpan calls f with each tensor's part of the flat range [lo, hi) of
// ts end to end: tensor k's entries [a, b), the first at flat index off.
func eachSpan(ts [][]float32, lo, hi int, f func(k, a, b, off int)) {
	start := 0
	for k, t := range ts {
		end := start + len(t)
		if a, b := max(lo, start), min(hi, end); a < b {
			f(k, a-start, b-start, a)
		}
		if end >= hi {
			return
		}
		start = end
	}
}

// back closes the round without an outer step: every rank returns to the
// anchor, and the inner optimizer starts afresh. It returns the inner
// steps the round had taken.
func (o *LocalSGD) back(params [][]float32) int {
	off := 0
	for _, p := range params {
		copy(p, o.anchor[off:off+len(p)])
		off += len(p)
	}
	done := o.done
	o.open, o.done = false, 0
	clear(o.encoded)
	o.Inner.SetState(0, nil, params) // empty state: always accepted
	return done
}

// gatherSparse averages the pseudo-gradients of a LocalSGD round's
// fragments [from, to) — avg, the flat range they cover end to end — each
// rank's coded sparse (LocalSGD.Sparse), a part per fragment: the trailer
// tail in an allreduce, then every rank's payload gathered and decoded
// into avg in rank order, so that every rank adds up the same bits. A
// rank whose round is not finite sends nothing; its flag in the trailer
// makes every rank skip the round. With Robust it also returns the ranks
// to name once the round is applied (Robust.NameAfter), or nil.
func (o *LocalSGD) gatherSparse(ctx context.Context, r *Replica, avg, tail []float32, from, to, bad int) (*LiarError, error) {
	parts, sizes := make([][]float32, 0, to-from), make([]int, 0, to-from)
	base, _ := o.fragment(from, r.nparams)
	for k := from; k < to; k++ {
		lo, hi := o.fragment(k, r.nparams)
		parts, sizes = append(parts, avg[lo-base:hi-base]), append(sizes, hi-lo)
	}
	var mine []byte
	if bad < 0 {
		for i, d := range parts {
			p, err := o.encode(from+i, d)
			if err != nil {
				return nil, err
			}
			mine = sparse.AppendPart(mine, p)
		}
	}
	// The payloads' lengths ride with the trailer, one slot per rank: a
	// collective the fewer, which a slow rank on the ring makes dear; and
	// with Robust naming, each rank's sketch of its pseudo-gradient.
	size, k := r.Coll.Size(), o.sketchDims()
	withLens := make([]float32, len(tail)+size+k*size)
	copy(withLens, tail)
	withLens[len(tail)+r.Coll.Rank()] = float32(len(mine))
	if k > 0 && bad < 0 {
		o.sketch(withLens[len(tail)+size+r.Coll.Rank()*k:][:k], parts, from, r.nparams)
	}
	if err := r.Coll.AllreduceMean(ctx, withLens); err != nil {
		return nil, err
	}
	copy(tail, withLens)
	sketches := withLens[len(tail)+size:]
	all, err := broadcastEach(ctx, r.Coll, mine, withLens[len(tail):len(tail)+size], float64(size), o.Sparse.MaxParts(sizes))
	if err != nil {
		return nil, err
	}
	clear(avg)
	if o.Robust != nil {
		return o.robust(r.Coll, avg, parts, all, sketches, from)
	}
	w := 1 / float32(len(all))
	for k, p := range all {
		if len(p) == 0 {
			continue
		}
		if err := sparse.DecodeParts(parts, p, w); err != nil {
			return nil, &LiarError{Ranks: []int{k}, Why: fmt.Sprintf("the pseudo-gradient it sent does not decode: %v", err)}
		}
	}
	return nil, nil
}

// robust writes into avg, whose fragments are parts, the Robust
// aggregate of the ranks' payloads that are not empty, times their share
// of all ranks — what the mean of every rank's would be had the others
// sent the aggregate — so that a round whose late ranks sent nothing
// scales it as it scales the mean; and scores the payloads
// (Robust.score) on ring.
func (o *LocalSGD) robust(ring Collective, avg []float32, parts [][]float32, all [][]byte, sketches []float32, from int) (*LiarError, error) {
	sizes := make([]int, len(parts))
	for i, d := range parts {
		sizes[i] = len(d)
	}
	n := 0
	for k, p := range all {
		if len(p) == 0 {
			continue
		}
		if len(o.entries.idx) <= n {
			o.entries.idx, o.entries.val = append(o.entries.idx, nil), append(o.entries.val, nil)
		}
		idx, val, err := sparse.AppendEntries(o.entries.idx[n][:0], o.entries.val[n][:0], sizes, p)
		if err != nil {
			return nil, &LiarError{Ranks: []int{k}, Why: fmt.Sprintf("the pseudo-gradient it sent does not decode: %v", err)}
		}
		o.entries.idx[n], o.entries.val[n] = idx, val
		n++
	}
	cols := o.entries.cols.merge(len(avg), o.entries.idx[:n], o.entries.val[:n])
	var cos []float64
	if o.Robust.NameAfter > 0 {
		cos = make([]float64, n)
	}
	scores := centeredClip(avg, cols, o.Robust.Clip, o.Robust.Iters, cos)
	named := o.Robust.score(o.repeats(ring, all, sketches, from), &o.outliers, ring, all, scores, cos, o.outer)
	if share := float32(n) / float32(len(all)); share != 1 {
		for j := range avg {
			avg[j] *= share
		}
	}
	return named, nil
}

// roundSketchDims is the values in a pseudo-gradient's sketch (Robust
// naming): a replay's sketch is the same bits again, an honest one's
// another, whatever the count.
const roundSketchDims = 32

// sketchDims is the values in each rank's sketch of its pseudo-gradient
// in a round: roundSketchDims with Robust naming, else 0 (none is sent).
func (o *LocalSGD) sketchDims() int {
	if o.Robust == nil || o.Robust.NameAfter <= 0 {
		return 0
	}
	return roundSketchDims
}

// sketch writes into dst the sketch of the pseudo-gradient's fragments
// parts, the first fragment from, of a model of nparams values, under one
// projection for every round: the coder's error feedback makes every
// round's payload another even for the same pseudo-gradient sent again
// (a replay), but its sketch is the same bits again.
func (o *LocalSGD) sketch(dst []float32, parts [][]float32, from, nparams int) {
	const seed = 0x5ce7c4d1
	sk := make([]float64, len(dst))
	for i, d := range parts {
		lo, _ := o.fragment(from+i, nparams)
		sketchAdd(sk, d, lo, seed, &o.tab)
	}
	for j, v := range sk {
		dst[j] = float32(v)
	}
}

// repeats names the ranks that sent the same pseudo-gradient of the
// fragments from on Robust's NameAfter rounds in a row — its sketch,
// where sketches (k a rank, as averaged) came, bit for bit; or none. A
// sketch of zeros (nothing sent) is none.
func (o *LocalSGD) repeats(ring Collective, all [][]byte, sketches []float32, from int) []int {
	if len(sketches) == 0 || o.Robust.NameAfter <= 0 {
		return nil
	}
	keys := sketchKeys(sketches, len(sketches)/len(all))
	for r, p := range all {
		if len(p) == 0 {
			keys[r] = "" // no payload: in no round, whatever its sketch
		}
	}
	if o.sketched[from] == nil {
		if o.sketched == nil {
			o.sketched = map[int]*outliers{}
		}
		o.sketched[from] = new(outliers)
	}
	return o.sketched[from].repeated(ring, keys, o.Robust.NameAfter)
}

// inner is a LocalSGD step's part on this rank alone (innerStep), timed
// as compute. A NaN or Inf gradient skips it here only: the skip is kept
// in r.InnerSkip, and the step goes on. Any other error is the step's,
// which is then not counted.
func (o *LocalSGD) inner(r *Replica, x []float32, y []int, n int) (float32, error) {
	t0 := time.Now()
	loss, err := o.innerStep(r, x, y, n)
	r.Stats.Compute += time.Since(t0)
	r.traceCompute(t0, time.Now())
	if err != nil && !Skipped(err) {
		r.Steps--
		r.Stats.Steps--
		return 0, err
	}
	r.InnerSkip = err // this rank's alone: the others go on, and so does it
	return loss, nil
}

// innerStep is a LocalSGD step on this rank alone: forward, backward and
// the inner optimizer (the replica's), opening a round at the parameters
// if none is open. A NaN or Inf gradient skips the inner step here only
// (ErrNonFinite).
func (o *LocalSGD) innerStep(r *Replica, x []float32, y []int, n int) (float32, error) {
	if !o.open {
		if err := o.Check(r.Wire, r.NormGuard); err != nil {
			return 0, err
		}
		o.begin(r.Model.Params())
	}
	var loss float32
	bad := -1
	if n == 0 { // nothing to train on here this step (an epoch's uneven end)
		o.done++
		return 0, nil
	}
	if dev, ok := r.Opt.(DeviceOptimizer); ok && r.ClipNorm <= 0 {
		var err error
		if loss, bad, err = dev.StepAlone(x, y, n); err != nil {
			return 0, err
		}
	} else {
		var err error
		if loss, err = r.Model.ForwardBackward(x, y, n); err != nil {
			return 0, err
		}
		if bad = nonFinite(r.Model.Grads()); bad < 0 {
			if r.ClipNorm > 0 {
				clipNorm(r.Model.Grads(), r.ClipNorm)
			}
			r.Opt.Step(r.Model.Params(), r.Model.Grads())
		}
	}
	o.done++
	if bad >= 0 {
		r.Stats.Skipped++
		return loss, fmt.Errorf("train: rank %d skipped an inner step: its %s gradient holds a NaN or Inf: %w",
			r.Coll.Rank(), r.Model.ParamNames()[bad], ErrNonFinite)
	}
	return loss, nil
}

// agreed is params, or while a round is open, the anchors: in a streaming
// round or one with a Deadline, what every rank applied.
func (o *LocalSGD) agreed(params [][]float32) [][]float32 {
	if !o.open {
		return params
	}
	out, off := make([][]float32, len(params)), 0
	for k, p := range params {
		out[k] = o.anchor[off : off+len(p) : off+len(p)]
		off += len(p)
	}
	return out
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
