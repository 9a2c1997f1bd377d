package train

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/ring"
)

// Audits. A rank's sketch in an every-step ring says what it sent, not
// that it computed it: a rank that flips its gradients, or sends another
// batch's, sends a sketch that fits what it sent, and its gradients'
// direction cannot tell it from an honest rank on a shard of its own.
// But every rank holds the step's parameters and can rebuild any rank's
// batch (the sampler and the split are shared): after the exchange, every
// rank, the audited one too, computes an audited rank's gradients on its
// batch, sketches them under the step's projection and compares them with
// the sketch it sent. All honest ranks compute the same gradients and
// reach the same verdict, with no accusation to send (a forwarder could
// drop one): a rank whose sketch is not its batch's gradients' is named,
// and the step, whose average holds what it sent, is skipped on all. (The
// audited rank computes alongside the others, at no cost in time, so that
// it too hears the verdict, as every rank hears the sketches'.)
//
// Whom to audit: one step in Sketch.AuditEvery, a draw from the averaged
// sketches — known to no rank before it sent its own — picks a rank (for
// half of its audits the one leaning most against the others). And each
// rank's lean, the running mean of its sketch's cosine against the sum of
// the others', step by step: a rank leaning below SuspectBelow is audited
// at once, as far as a budget of one audit in AuditEvery steps (two at
// most at a time) allows. Direction cannot name a rank — honest shards
// that differ point apart too — but an honest rank's audit only passes,
// and a flipped one leans against the others from its first step.
//
// Audits need the split in memory (a served one holds only this rank's
// share), float32 or bf16 gradients (int8's error feedback adds a
// remainder no other rank holds), a model computed on the host (a
// Resident one computes into the ring's buffer) and no dropout (its masks
// are the rank's own); elsewhere the step is not audited. Each audit
// costs every rank a forward and backward pass.

// ErrAudited means an audit found a rank's sketch is not its batch's
// gradients': the step's average holds what it sent, and every rank
// skips the step (the rank is named too).
var ErrAudited = errors.New("train: an audited rank did not send its batch's gradients")

// peerBatches gives rank's batch of the step being taken, as its own
// loader gives it, and the share its gradients are scaled by (prepare's):
// a batch of N 0 where the rank has no samples. data.ErrNotLocal where
// the split is not held here.
type peerBatches func(rank int) (b *data.Batch, share float32, err error)

// audits is a replica's scratch for its audits.
type audits struct {
	grads []float32
}

// auditTolerance is how far, relative to the two sketches' norms, a
// recomputed sketch may lie from the one sent: the same products summed
// in another order (other threads) round apart by ~1e-6.
const auditTolerance = 1e-3

// auditable reports whether this replica can recompute another rank's
// gradients at all.
func (r *Replica) auditable() bool {
	if r.Sketch == nil || r.Sketch.AuditEvery <= 0 || r.peers == nil || r.Wire == ring.I8 {
		return false
	}
	if _, ok := r.Model.(Resident); ok {
		return false
	}
	rl, ok := r.Model.(interface{ randomLayers() bool })
	return !ok || !rl.randomLayers()
}

// auditDraw is the step's draw: a hash of the averaged sketches (slots),
// the sketch of the averaged gradients (avg) and the step's count on the
// ring. An audit when it is 0 mod every; the rank audited is suspect (if
// ≥ 0; sketches.suspect) for half the audits, by one more bit of the
// hash, else the quotient mod size. The average's sketch is in it because
// the ring completes each part of the average at another rank at the same
// hop: the one that completes the sketches' part could try small changes
// to its own sketch (within the sum check's rounding) until the draw
// passes it by, but no rank knows the other parts' sums before its own
// share of them is sent, and the average's sketch takes every value of
// every part. (The check has made it already: the draw costs no pass.)
func auditDraw(avg []float64, slots []float32, steps int, every, size, suspect int) (audit bool, rank int) {
	h := uint64(steps) * 0x9e3779b97f4a7c15
	for i := 0; i+1 < len(slots); i += 2 {
		h = splitmix(h ^ (uint64(math.Float32bits(slots[i])) | uint64(math.Float32bits(slots[i+1]))<<32))
	}
	if len(slots)%2 == 1 {
		h = splitmix(h ^ uint64(math.Float32bits(slots[len(slots)-1])))
	}
	for _, x := range avg {
		h = splitmix(h ^ math.Float64bits(x))
	}
	v := splitmix(h)
	q := v / uint64(every)
	if suspect >= 0 && suspect < size && q&1 == 1 {
		return v%uint64(every) == 0, suspect
	}
	return v%uint64(every) == 0, int(q >> 1 % uint64(size))
}

// auditStep runs the step's audits, if it has any — the ranks over the
// norm guard's bound that no audit vouched for, those whose sketch is the
// step before's again, its suspects' (sketches.suspects) and the draw's:
// seed is the projection the step's sketches were made under, avg the
// averaged gradients' sketch, tail the averaged trailer and slots the
// averaged sketches. It names the audited ranks whose sketch is not their batch's
// gradients'; a failure to recompute is an error. A rank that passes
// leans as no other rank for its next steps' suspicion, and one over the
// guard's bound is vouched for (the guard keeps its gradients). The
// first two are outside the suspects' budget: an honest rank never
// repeats, and one that declares a norm far over its gradients' costs
// one audit a window at most.
func (r *Replica) auditStep(avg []float64, tail, slots []float32, seed uint64) (*LiarError, error) {
	if !r.auditable() {
		return nil, nil
	}
	var far []int
	var norms []float64
	if r.NormGuard > 0 {
		norms = normsOf(tail, r.Coll.Size())
		far, _ = r.farRanks(norms)
	}
	ts := slices.Clone(far)
	for k, n := range r.sk.apart.same {
		// Its sketch again, bit for bit: no honest rank's gradients come
		// back so (the repeat is named on its own after NameAfter).
		if n > 0 && !slices.Contains(ts, k) {
			ts = append(ts, k)
		}
	}
	for _, t := range r.sk.suspects(r.Sketch) {
		if !slices.Contains(ts, t) {
			ts = append(ts, t)
		}
	}
	if audit, t := auditDraw(avg, slots, r.sk.steps, r.Sketch.AuditEvery, r.Coll.Size(), r.sk.suspect()); audit && !slices.Contains(ts, t) {
		ts = append(ts, t)
	}
	var named []int
	var whys []string
	for _, t := range ts {
		passed, why, err := r.auditRank(t, slots, seed)
		if err != nil {
			return nil, err
		}
		if why != "" {
			named, whys = append(named, t), append(whys, fmt.Sprintf("rank %d: %s", t, why))
			continue
		}
		if passed {
			r.sk.lean[t] = 0
			if slices.Contains(far, t) {
				r.sk.vouch(r.Sketch, t, norms[t])
			}
		}
	}
	if named == nil {
		return nil, nil
	}
	return &LiarError{Ranks: named, Why: fmt.Sprintf("audited at step %d of this ring: %s; the step is skipped on all", r.sk.steps, strings.Join(whys, "; "))}, nil
}

// auditRank recomputes rank t's gradients on its batch: passed where
// they are what its sketch (in slots) says, why where they are not;
// neither where there is nothing to compare (no samples, no batch here).
func (r *Replica) auditRank(t int, slots []float32, seed uint64) (passed bool, why string, err error) {
	size, k := r.Coll.Size(), r.Sketch.dims()
	sent := make([]float64, k)
	var zero = true
	for j, v := range slots[t*k : (t+1)*k] {
		sent[j], zero = float64(v)*float64(size), zero && v == 0
	}
	if zero {
		return false, "", nil // no samples there, or gradients it flagged not finite
	}
	b, share, err := r.peers(t)
	if errors.Is(err, data.ErrNotLocal) {
		return false, "", nil
	}
	if err != nil {
		return false, "", fmt.Errorf("train: auditing rank %d: %w", t, err)
	}
	if b.N == 0 {
		return false, auditVerdict(sent, make([]float64, k), "it had no samples, yet sent a sketch"), nil
	}
	if _, err := r.Model.ForwardBackward(b.X, b.Y, b.N); err != nil {
		return false, "", fmt.Errorf("train: auditing rank %d: %w", t, err)
	}
	if len(r.audit.grads) != r.nparams {
		r.audit.grads = make([]float32, r.nparams)
	}
	g := r.audit.grads
	if gatherFinite(g, r.Model.Grads()) >= 0 {
		return false, auditVerdict(sent, nil, "its batch's gradients hold a NaN or Inf, yet it flagged them finite"), nil
	}
	if share != 0 && share != 1 {
		for i := range g {
			g[i] *= share
		}
	}
	got := make([]float64, k)
	sketchAdd(got, g, 0, seed, &r.sk.tab)
	r.Stats.Audits++
	why = auditVerdict(sent, got, "")
	return why == "", why, nil
}

// auditVerdict compares a rank's sketch as sent with the sketch of its
// batch's gradients (got; nil, or why, where there is nothing to
// compare): why they differ past auditTolerance, or "".
func auditVerdict(sent, got []float64, why string) string {
	var diff, ns, ng float64
	if got != nil {
		for j := range sent {
			d := sent[j] - got[j]
			diff, ns, ng = diff+d*d, ns+sent[j]*sent[j], ng+got[j]*got[j]
		}
		if math.Sqrt(diff) <= auditTolerance*(math.Sqrt(ns)+math.Sqrt(ng)) {
			return ""
		}
	}
	if why == "" {
		why = fmt.Sprintf("the sketch it sent is %.3g from its batch's gradients' as every other rank recomputed them (norms %.3g sent, %.3g recomputed)",
			math.Sqrt(diff), math.Sqrt(ns), math.Sqrt(ng))
	}
	return why
}

// suspectBurst is the most suspects' audits the budget holds: a ring
// that forms with two ranks that flip audits both at its first step.
const suspectBurst = 2

// leanWeight is a step's share in a rank's lean: a flipped rank's
// cosine is below the others' at most steps, an honest one's at some,
// and two steps' mean parts them where one step cannot.
const leanWeight = 0.5

// leanOn takes the step's sketches (slots, as averaged, k values a rank)
// into each rank's lean: its cosine against the sum of the others'. A
// rank with no samples keeps its lean; where fewer than 3 had samples,
// every rank does (of two, each points as far from the other).
func (s *sketches) leanOn(slots []float32, k int) {
	sum := make([]float64, k)
	var in []int
	for r := range s.lean {
		x := slots[r*k : (r+1)*k]
		if !nonzero(x) {
			continue
		}
		in = append(in, r)
		for j, v := range x {
			sum[j] += float64(v)
		}
	}
	if len(in) < 3 {
		return
	}
	for _, r := range in {
		var d, a, b float64
		for j, v := range slots[r*k : (r+1)*k] {
			x, o := float64(v), sum[j]-float64(v)
			d, a, b = d+x*o, a+x*x, b+o*o
		}
		var cos float64
		if a > 0 && b > 0 {
			cos = d / math.Sqrt(a*b)
		}
		if math.IsNaN(s.lean[r]) {
			s.lean[r] = cos
		} else {
			s.lean[r] += leanWeight * (cos - s.lean[r])
		}
	}
}

// suspects are the ranks to audit this step for their lean: below
// SuspectBelow, the lowest first, as many as the budget holds. It grows
// by 1/AuditEvery a step, to suspectBurst: honest ranks on shards that
// differ lean against the others too, and cost no more than the draw.
func (s *sketches) suspects(c *Sketch) []int {
	s.budget = min(suspectBurst, s.budget+1/float64(c.AuditEvery))
	var out []int
	for r, l := range s.lean {
		if l < c.suspectBelow() {
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, func(a, b int) int { return cmp.Compare(s.lean[a], s.lean[b]) })
	out = out[:min(len(out), int(s.budget))]
	s.budget -= float64(len(out))
	return out
}

// vouch notes that rank k's gradients, of norm norm, passed an audit:
// the norm guard keeps them this window while they stay within its
// factor of that norm (vouches). A rank on a shard unlike the others' is
// over the guard's bound step after step, and auditing it once a window
// rather than skipping its steps keeps it training; one that scales its
// gradients past the factor is over the bound again, and audited.
func (s *sketches) vouch(c *Sketch, k int, norm float64) {
	s.vouched[k], s.vouchedIn[k] = norm, s.steps/c.window()
}

// vouches reports whether an audit this window vouched for rank k's
// gradients at a norm within factor of norm.
func (s *sketches) vouches(c *Sketch, k int, norm, factor float64) bool {
	return k < len(s.vouched) && s.vouched[k] > 0 && s.vouchedIn[k] == s.steps/c.window() && norm <= factor*s.vouched[k]
}

// suspect is the rank leaning most against the others, where one leans
// against them at all (below 0), or −1: the draw's audits go to it for
// half of theirs. Direction names no one (honest shards that differ
// point apart too), but an audit of an honest rank only passes.
func (s *sketches) suspect() int {
	low := -1
	for r, l := range s.lean {
		if l < 0 && (low < 0 || l < s.lean[low]) {
			low = r
		}
	}
	return low
}
