package train

import (
	"context"
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
				if _, err := rep.Step(context.Background(), x, y, batch); err != nil && !Skipped(err) {
					return err
				}
				if rep.out.named != nil && out[i].named == nil {
					// Run drops it here; this loop goes on to check the
					// honest runs' bits, so count only this step's skip.
					out[i].named, out[i].namedAt, out[i].skipped = rep.out.named, step+1, rep.Stats.Skipped
				}
			}
			if out[i].named == nil {
				out[i].skipped = rep.Stats.Skipped
			}
			out[i].audits, out[i].params = rep.audit.ran, slices.Concat(rep.Model.Params()...)
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

func TestAuditDraw(t *testing.T) {
	slots := []float32{1, 2, 3}
	hits, ranks := 0, map[int]int{}
	for s := range 4000 {
		audit, r := auditDraw(slots, s, 8, 4)
		if audit {
			hits++
			ranks[r]++
		}
		if a2, r2 := auditDraw(slots, s, 8, 4); a2 != audit || r2 != r {
			t.Fatal("the draw is not a function of its inputs")
		}
	}
	if hits < 400 || hits > 600 || len(ranks) != 4 {
		t.Errorf("%d audits in 4000 steps at one in 8 (want ~500), over ranks %v", hits, ranks)
	}
}
