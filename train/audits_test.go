package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/ring"
)

// otherBatch computes its gradients on another batch than the one it was
// given (a rank that sends work it did not do on its share).
type otherBatch struct {
	Model
	rng *rand.Rand
}

func (m otherBatch) ForwardBackward(x []float32, y []int, n int) (float32, error) {
	x2, y2 := teacherBatch(m.rng, 0, n, len(x)/n, 3)
	return m.Model.ForwardBackward(x2, y2, n)
}

// Every rank recomputes the audited rank's gradients on its batch: a rank
// that flips its gradients, scales them by a little or computes on another
// batch is named by every honest rank at the same step, with one verdict,
// and that step is skipped; honest ranks on shards that differ (each its
// own teacher's labels) are never named, whatever the wire, and the
// audits ran. With int8 gradients, or no batches to rebuild, nothing is
// audited.
func TestAuditsNameWhatWasNotComputed(t *testing.T) {
	const n, features, classes, batch, steps = 4, 12, 3, 16, 40
	cfg := mlpCfg(features, []int{16}, classes, batch, 1)
	batchOf := func(rank, step int) ([]float32, []int) {
		return teacherBatch(rand.New(rand.NewPCG(5, uint64(rank*1000+step))), rank, batch, features, classes)
	}
	type outcome struct {
		named   *LiarError
		namedAt int
		skipped int
		audits  int
		params  []float32
	}
	run := func(wire ring.Encoding, bucket int, liar func(Model) Model, local bool) [n]outcome {
		rings := memRings(t, n)
		var out [n]outcome
		if err := onAll(n, func(i int) error {
			m := newMLP(t, cfg)
			if liar != nil && i == n-1 {
				m = liar(m)
			}
			rep := NewReplica(m, NewAdam(0.01), rings[i])
			rep.Sketch, rep.Wire, rep.BucketBytes = &Sketch{AuditEvery: 2}, wire, bucket
			step := 0
			rep.peers = func(rank int) (*data.Batch, float32, error) {
				if !local {
					return nil, 0, data.ErrNotLocal
				}
				x, y := batchOf(rank, step)
				return &data.Batch{X: x, Y: y, N: batch}, 0, nil
			}
			for ; step < steps; step++ {
				x, y := batchOf(i, step)
				_, err := rep.Step(context.Background(), x, y, batch)
				if err != nil && !Skipped(err) {
					return err
				}
				if rep.out.named != nil && out[i].named == nil {
					if !errors.Is(err, ErrAudited) {
						return fmt.Errorf("step %d named %v with %v; want the step skipped as ErrAudited", step+1, rep.out.named, err)
					}
					// Run drops it here; this loop goes on to check the
					// honest runs' bits, so count only this step's skip.
					out[i].named, out[i].namedAt, out[i].skipped = rep.out.named, step+1, rep.Stats.Skipped
				}
			}
			if out[i].named == nil {
				out[i].skipped = rep.Stats.Skipped
			}
			out[i].audits, out[i].params = rep.Stats.Audits, slices.Concat(rep.Model.Params()...)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, tc := range []struct {
		wire   ring.Encoding
		bucket int
		local  bool
		audits bool
	}{{ring.F32, 0, true, true}, {ring.BF16, 0, true, true}, {ring.F32, 256, true, true}, {ring.I8, 0, true, false}, {ring.F32, 0, false, false}} {
		out := run(tc.wire, tc.bucket, nil, tc.local)
		for i, o := range out {
			if o.named != nil || o.skipped != 0 || !slices.Equal(o.params, out[0].params) || (o.audits > 0) != tc.audits {
				t.Errorf("honest, %v, buckets of %d, batches held %v: rank %d named %v, skipped %d, %d audits (want any: %v), same bits %v",
					tc.wire, tc.bucket, tc.local, i, o.named, o.skipped, o.audits, tc.audits, slices.Equal(o.params, out[0].params))
			}
		}
	}
	for name, liar := range map[string]func(Model) Model{
		"flips":         func(m Model) Model { return scaledGrads{m, -1} },
		"scales by 1%":  func(m Model) Model { return scaledGrads{m, 1.01} },
		"another batch": func(m Model) Model { return otherBatch{m, rand.New(rand.NewPCG(7, 7))} },
	} {
		out := run(ring.F32, 0, liar, true)
		for i, o := range out[:n-1] {
			if o.named == nil || !slices.Equal(o.named.Ranks, []int{n - 1}) || o.namedAt != out[0].namedAt || o.named.Why != out[0].named.Why ||
				!strings.Contains(o.named.Why, "recomputed") || o.skipped != 1 {
				t.Errorf("rank %d %s: rank %d named %v at step %d, skipped %d; want rank %d named, as rank 0 at step %d, one step skipped",
					n-1, name, i, o.named, o.namedAt, o.skipped, n-1, out[0].namedAt)
			}
		}
		if !slices.Equal(out[1].params, out[0].params) || !slices.Equal(out[2].params, out[0].params) {
			t.Errorf("rank %d %s: the honest ranks' parameters differ", n-1, name)
		}
	}
}

// auditRun is how each rank of runAudited ended: at which step it named
// a rank (0: never; it stops there), its skips, its audits, its
// parameters.
type auditRun struct {
	namedAt, skipped, audits []int
	params                   [][]float32
}

// runAudited runs n ranks for at most steps steps of batchOf's batches,
// the last rank altering what it sends by attack (attack's kinds; "" for
// none), each set up by setup; every rank can rebuild every rank's batch.
func runAudited(t *testing.T, n, steps, batch int, cfg ModelConfig, batchOf func(rank, step int) ([]float32, []int), kind string, setup func(*Replica)) auditRun {
	t.Helper()
	rings := memRings(t, n)
	out := auditRun{make([]int, n), make([]int, n), make([]int, n), make([][]float32, n)}
	if err := onAll(n, func(i int) error {
		rep := NewReplica(newMLP(t, cfg), NewAdam(0.01), rings[i])
		if kind != "" && i == n-1 {
			// As the attacker build: what it sends is altered, its model
			// is not, so it names itself too and all stop.
			var err error
			if rep.tamper, err = attack(kind, 1); err != nil {
				return err
			}
		}
		setup(rep)
		step := 0
		rep.peers = func(rank int) (*data.Batch, float32, error) {
			x, y := batchOf(rank, step)
			return &data.Batch{X: x, Y: y, N: batch}, 0, nil
		}
		for ; step < steps && out.namedAt[i] == 0; step++ {
			x, y := batchOf(i, step)
			if _, err := rep.Step(context.Background(), x, y, batch); err != nil && !Skipped(err) {
				return err
			}
			if rep.out.named != nil {
				out.namedAt[i] = step + 1
			}
		}
		out.skipped[i], out.audits[i], out.params[i] = rep.Stats.Skipped, rep.Stats.Audits, slices.Concat(rep.Model.Params()...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// A rank that flips its gradients leans against the others from its
// first step: it is audited and named there, where the draw (one step in
// 2^20) would not reach it; with suspects off (SuspectBelow −1) it is not
// named in those steps. One that sends its first gradients again is
// audited at its first repeat. Honest ranks that see one teacher's data
// lean with each other: nobody is audited.
func TestFlipIsAuditedAtOnce(t *testing.T) {
	const n, features, classes, batch, steps = 4, 12, 3, 16, 12
	cfg := mlpCfg(features, []int{16}, classes, batch, 1)
	batchOf := func(rank, step int) ([]float32, []int) {
		return teacherBatch(rand.New(rand.NewPCG(5, uint64(rank*1000+step))), 0, batch, features, classes)
	}
	for _, tc := range []struct {
		kind    string
		below   float64
		namedAt int // 0: never
		audits  int
	}{{"", 0, 0, 0}, {"flip", 0, 1, 1}, {"flip", -1, 0, 0}, {"replay", -1, 2, 1}} {
		out := runAudited(t, n, steps, batch, cfg, batchOf, tc.kind, func(rep *Replica) {
			rep.Sketch = &Sketch{AuditEvery: 1 << 20, SuspectBelow: tc.below}
		})
		for i := range n {
			if out.namedAt[i] != tc.namedAt || out.audits[i] != tc.audits {
				t.Errorf("attack %q, suspects below %v: rank %d named it at step %d after %d audits; want %d (0: never), %d",
					tc.kind, tc.below, i, out.namedAt[i], out.audits[i], tc.namedAt, tc.audits)
			}
		}
	}
}

// The norm guard's far ranks are audited at once: one whose large
// gradients are its batch's (its features 30 times the others') is
// vouched for once a window and trains on, never skipped or named —
// where without audits the guard skips its steps and names it; one that
// scales what it sends by 100, or sends noise, is named at its first step.
func TestGuardAuditsFarRanks(t *testing.T) {
	const n, features, classes, batch, steps = 4, 12, 3, 16, 40
	cfg := mlpCfg(features, []int{16}, classes, batch, 1)
	batchOf := func(rank, step int) ([]float32, []int) {
		x, y := teacherBatch(rand.New(rand.NewPCG(5, uint64(rank*1000+step))), 0, batch, features, classes)
		if rank == n-1 {
			scaleBy(x, 30)
		}
		return x, y
	}
	for _, tc := range []struct {
		every   int
		kind    string // the last rank's attack
		namedAt int    // 0: never
		skipped int
		audits  int
	}{{1 << 20, "", 0, 0, 3}, {0, "", 3, 3, 0}, {1 << 20, "scale", 1, 1, 1}, {1 << 20, "noise", 1, 1, 1}} {
		out := runAudited(t, n, steps, batch, cfg, batchOf, tc.kind, func(rep *Replica) {
			rep.Sketch, rep.NormGuard = &Sketch{AuditEvery: tc.every, SuspectBelow: -1, NameAfter: 3}, 5
		})
		for i := range n {
			if out.namedAt[i] != tc.namedAt || out.skipped[i] != tc.skipped || out.audits[i] != tc.audits || !slices.Equal(out.params[i], out.params[0]) {
				t.Errorf("audits every %d, attack %q: rank %d named it at step %d, skipped %d, %d audits, same bits %v; want step %d (0: never), %d, %d, same bits",
					tc.every, tc.kind, i, out.namedAt[i], out.skipped[i], out.audits[i], slices.Equal(out.params[i], out.params[0]), tc.namedAt, tc.skipped, tc.audits)
			}
		}
	}
}

// One step in every is audited, every rank drawn, the suspect for about
// half of them; the draw is a function of what every rank holds.
func TestAuditDraw(t *testing.T) {
	slots, avg := []float32{1, 2, 3}, make([]float64, 32)
	for i := range avg {
		avg[i] = float64(i)
	}
	a0, r0 := auditDraw(avg, slots, 5, 1, 1<<20, -1)
	avg[31] = math.Nextafter(avg[31], 0)
	if a1, r1 := auditDraw(avg, slots, 5, 1, 1<<20, -1); a1 != a0 || r1 == r0 {
		t.Error("the draw does not depend on the average's sketch")
	}
	for _, suspect := range []int{-1, 2} {
		hits, ranks := 0, map[int]int{}
		for s := range 8000 {
			audit, r := auditDraw(avg, slots, s, 8, 4, suspect)
			if audit {
				hits++
				ranks[r]++
			}
			if a2, r2 := auditDraw(avg, slots, s, 8, 4, suspect); a2 != audit || r2 != r {
				t.Fatal("the draw is not a function of its inputs")
			}
		}
		want := map[int]float64{0: 0.25, 1: 0.25, 2: 0.25, 3: 0.25}
		if suspect >= 0 {
			want = map[int]float64{0: 0.125, 1: 0.125, 2: 0.625, 3: 0.125}
		}
		if hits < 850 || hits > 1150 {
			t.Errorf("suspect %d: %d audits in 8000 steps at one in 8; want ~1000", suspect, hits)
		}
		for r, f := range want {
			if got := float64(ranks[r]) / float64(hits); math.Abs(got-f) > 0.06 {
				t.Errorf("suspect %d: rank %d drawn in %.3f of the audits; want ~%.3f", suspect, r, got, f)
			}
		}
	}
}

// In Run, each rank's batch is rebuilt from the shared sampler and split
// (Loader.Fill), at every step of the epoch, its uneven end too — where a
// rank has one sample or none and the shares differ: audited at every
// step, honest ranks are never named and end on one set of bits, while a
// rank that flips its gradients is named.
func TestAuditsInRun(t *testing.T) {
	const world = 3
	for _, tc := range []struct {
		batch int
		liar  bool
	}{{222, false}, {8, false}, {222, true}} {
		rings := memRings(t, world)
		reps := make([]*Replica, world)
		errs := make([]error, world)
		_ = onAll(world, func(i int) error {
			reps[i] = NewReplica(newMLP(t, mlpCfg(784, []int{16}, 10, tc.batch, uint64(1+i))), &SGD{LR: 0.1}, rings[i])
			if tc.liar && i == world-1 {
				// As the attacker build: what it sends is flipped, its
				// model is not, so its own audit names it too.
				reps[i].tamper = func(g []float32, _ int) { scaleBy(g, -1) }
			}
			reps[i].Sketch = &Sketch{AuditEvery: 1}
			_, errs[i] = Run(context.Background(), RunConfig{Replica: reps[i], Train: loader(t, "train", tc.batch, true), Epochs: 1, Classes: 10})
			return nil
		})
		for i, err := range errs {
			var liar *LiarError
			switch {
			case tc.liar && (!errors.As(err, &liar) || !slices.Equal(liar.Ranks, []int{world - 1})):
				t.Errorf("batch %d, rank %d flips: rank %d ended with %v; want it named", tc.batch, world-1, i, err)
			case !tc.liar && (err != nil || reps[i].Stats.Audits == 0 || !slices.Equal(slices.Concat(reps[i].Model.Params()...), slices.Concat(reps[0].Model.Params()...))):
				t.Errorf("batch %d, honest: rank %d ended with %v after %d audits; want none named, every step audited, one set of bits", tc.batch, i, err, reps[i].Stats.Audits)
			}
		}
	}
}

// Suspects lean against the others step by step: a flipped rank is
// audited at the ring's first step (two of them both, the budget's
// burst), then at the budget's pace while it leans so; ranks that point
// with the others, a rank with no samples, and rings where fewer than 3
// had samples suspect no one. The draw's suspect is the rank leaning
// most against the others, where one leans against them at all.
func TestSuspectsLeanAgainstTheOthers(t *testing.T) {
	const k, steps, every = 16, 64, 16
	for _, tc := range []struct {
		size   int
		flips  []int
		empty  []int // ranks with no samples
		first  []int // suspects at step 1
		audits int   // suspects' audits in steps, none reset
	}{
		{5, nil, nil, nil, 0},
		{5, []int{1}, nil, []int{1}, suspectBurst + (steps-1)/every},
		{8, []int{3, 6}, nil, []int{3, 6}, suspectBurst + (steps-1)/every},
		{5, []int{2}, []int{4}, []int{2}, suspectBurst + (steps-1)/every},
		{4, []int{0}, []int{1, 2}, nil, 0},
	} {
		c := &Sketch{Dims: k, AuditEvery: every}
		var s sketches
		s.reset(c, memRings(t, tc.size)[0])
		rng := rand.New(rand.NewPCG(3, 3))
		common := make([]float32, k)
		for j := range common {
			common[j] = float32(rng.NormFloat64())
		}
		var first []int
		audits := 0
		for step := range steps {
			slots := make([]float32, tc.size*k)
			for r := range tc.size {
				if slices.Contains(tc.empty, r) {
					continue
				}
				f := float32(1)
				if slices.Contains(tc.flips, r) {
					f = -1
				}
				for j := range k {
					slots[r*k+j] = f * (common[j] + 0.5*float32(rng.NormFloat64()))
				}
			}
			s.leanOn(slots, k)
			got := s.suspects(c)
			if step == 0 {
				first = slices.Sorted(slices.Values(got))
			}
			audits += len(got)
		}
		if sus := s.suspect(); !slices.Equal(first, tc.first) || audits != tc.audits || (tc.first == nil) != (sus < 0) || sus >= 0 && !slices.Contains(tc.flips, sus) {
			t.Errorf("%d ranks, %v flipped, %v empty: suspects %v at the first step, %d audits in %d steps, the draw's suspect %d; want %v, %d and a rank flipped if any is suspected",
				tc.size, tc.flips, tc.empty, first, audits, steps, sus, tc.first, tc.audits)
		}
	}
}
