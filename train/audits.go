package train

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/ring"
)

// Audits. A rank's sketch in an every-step ring says what it sent, not
// that it computed it: a rank that flips its gradients, or sends another
// batch's, sends a sketch that fits what it sent, and its gradients'
// direction cannot tell it from an honest rank on a shard of its own.
// But every rank holds the step's parameters and can rebuild any rank's
// batch (the sampler and the split are shared): after the exchange, one
// step in Sketch.AuditEvery, a draw from the averaged sketches — known to
// no rank before it sent its own — picks a rank (for half the audits the
// one whose sketches pointed most against the others' in the last
// window, where one did: direction cannot name a rank, but it can say
// whom to audit, since an honest rank's audit passes), and every rank, that one
// too, computes that rank's gradients on its batch, sketches them under
// the step's projection and compares them with the sketch it sent. All
// honest ranks compute the same gradients and reach the same verdict,
// with no accusation to send (a forwarder could drop one): a rank whose
// sketch is not its batch's gradients' is named, and the step, whose
// average holds what it sent, is skipped on all. (The audited rank
// computes alongside the others, at no cost in time, so that it too
// hears the verdict, as every rank hears the sketches'.)
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

// audits is a replica's scratch for its audits, and how many it ran.
type audits struct {
	grads []float32
	ran   int
}

// drawSamples is how many of the averaged gradients the draw hashes.
const drawSamples = 4096

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
// every few of the averaged gradients (avg) and the step's count on the
// ring. An audit when it is 0 mod every; the rank audited is suspect (if
// ≥ 0) for half the audits, by one more bit of the hash, else the
// quotient mod size. The gradients are in it because the ring completes
// each part of the average at another rank at the same hop: the one that
// completes the sketches' part could try small changes to its own sketch
// (within the sum check's rounding) until the draw passes it by, but no
// rank knows the other parts' sums before its own share of them is sent.
func auditDraw(avg, slots []float32, steps int, every, size, suspect int) (audit bool, rank int) {
	h := fnv.New64a()
	h.Write(f32Bytes(slots))
	stride := max(1, len(avg)/drawSamples)
	var buf [4 * drawSamples]byte
	b := buf[:0]
	for i := 0; i < len(avg) && len(b) < len(buf); i += stride {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(avg[i]))
	}
	h.Write(b)
	v := splitmix(h.Sum64() ^ uint64(steps)*0x9e3779b97f4a7c15)
	q := v / uint64(every)
	if suspect >= 0 && suspect < size && q&1 == 1 {
		return v%uint64(every) == 0, suspect
	}
	return v%uint64(every) == 0, int(q >> 1 % uint64(size))
}

// auditStep runs the step's audit, if it draws one: seed is the
// projection the step's sketches were made under, avg the averaged
// gradients and slots the averaged sketches. It names the audited rank where its sketch is not its batch's
// gradients'; a failure to recompute is an error.
func (r *Replica) auditStep(avg, slots []float32, seed uint64) (*LiarError, error) {
	if !r.auditable() {
		return nil, nil
	}
	size, k := r.Coll.Size(), r.Sketch.dims()
	audit, t := auditDraw(avg, slots, r.sk.steps, r.Sketch.AuditEvery, size, r.sk.suspect)
	if !audit {
		return nil, nil
	}
	sent := make([]float64, k)
	var zero = true
	for j, v := range slots[t*k : (t+1)*k] {
		sent[j], zero = float64(v)*float64(size), zero && v == 0
	}
	if zero {
		return nil, nil // no samples there, or gradients it flagged not finite
	}
	b, share, err := r.peers(t)
	if errors.Is(err, data.ErrNotLocal) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("train: auditing rank %d: %w", t, err)
	}
	if b.N == 0 {
		return r.auditVerdict(t, sent, make([]float64, k), "it had no samples, yet sent a sketch")
	}
	if _, err := r.Model.ForwardBackward(b.X, b.Y, b.N); err != nil {
		return nil, fmt.Errorf("train: auditing rank %d: %w", t, err)
	}
	if len(r.audit.grads) != r.nparams {
		r.audit.grads = make([]float32, r.nparams)
	}
	g := r.audit.grads
	if gatherFinite(g, r.Model.Grads()) >= 0 {
		return r.auditVerdict(t, sent, nil, "its batch's gradients hold a NaN or Inf, yet it flagged them finite")
	}
	if share != 0 && share != 1 {
		for i := range g {
			g[i] *= share
		}
	}
	got := make([]float64, k)
	sketchAdd(got, g, 0, seed, r.sk.tab.cover(seed, k, (r.nparams+63)/64))
	r.audit.ran++
	return r.auditVerdict(t, sent, got, "")
}

// auditVerdict compares rank t's sketch as sent with the sketch of its
// batch's gradients (got; nil, or why, where there is nothing to compare):
// a LiarError where they differ past auditTolerance.
func (r *Replica) auditVerdict(t int, sent, got []float64, why string) (*LiarError, error) {
	var diff, ns, ng float64
	if got != nil {
		for j := range sent {
			d := sent[j] - got[j]
			diff, ns, ng = diff+d*d, ns+sent[j]*sent[j], ng+got[j]*got[j]
		}
		if math.Sqrt(diff) <= auditTolerance*(math.Sqrt(ns)+math.Sqrt(ng)) {
			return nil, nil
		}
	}
	if why == "" {
		why = fmt.Sprintf("the sketch it sent is %.3g from its batch's gradients' as every other rank recomputed them (norms %.3g sent, %.3g recomputed)",
			math.Sqrt(diff), math.Sqrt(ns), math.Sqrt(ng))
	}
	return &LiarError{Ranks: []int{t}, Why: fmt.Sprintf("audited at step %d of this ring: %s; the step is skipped on all", r.sk.steps, why)}, nil
}
