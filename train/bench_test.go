package train

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/train/sparse"
)

// timedModel measures the time spent in ForwardBackward.
type timedModel struct {
	Model
	fb time.Duration
}

func (m *timedModel) ForwardBackward(x []float32, y []int, n int) (float32, error) {
	start := time.Now()
	l, err := m.Model.ForwardBackward(x, y, n)
	m.fb += time.Since(start)
	return l, err
}

// BenchmarkStepOverhead: the share of a training step spent outside forward
// and backward (gather, allreduce, scatter, optimizer) for the cnn at batch
// 64 on a 2-rank in-memory ring, on the real testdata subset.
func BenchmarkStepOverhead(b *testing.B) {
	const world, batch, steps = 2, 64, 4
	spec, err := BuiltinSpec("cnn", 1, 28, 28, 10)
	if err != nil {
		b.Fatal(err)
	}
	t := &testing.T{}
	rings := memRings(t, world)
	ctx := context.Background()
	models := make([]*timedModel, world)
	reps := make([]*Replica, world)
	for i := range world {
		m, err := NewModel(ModelConfig{Spec: spec, Batch: batch, Seed: 1})
		if err != nil {
			b.Fatal(err)
		}
		defer m.Close()
		models[i] = &timedModel{Model: m}
		reps[i] = NewReplica(models[i], &SGD{LR: 0.01, Momentum: 0.9}, rings[i])
	}
	l := loader(t, "train", batch, true)
	// Summed over every step of every iteration, so one step's wait for
	// the other replica does not decide the figure.
	var total, fb time.Duration
	n := 0
	b.ResetTimer()
	for b.Loop() {
		for _, m := range models {
			m.fb = 0
		}
		err := onAll(world, func(i int) error {
			tr := *l
			tr.Sampler.World, tr.Sampler.Rank = world, i
			e, err := tr.Epoch(ctx, 0)
			if err != nil {
				return err
			}
			defer e.Close()
			for range steps {
				bt, err := e.Next()
				if err != nil {
					return err
				}
				start := time.Now()
				if _, err := reps[i].Step(ctx, bt.X, bt.Y, bt.N); err != nil && !errors.Is(err, ErrNonFinite) {
					return err
				}
				if i == 0 {
					total += time.Since(start)
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		fb += models[0].fb
		n += steps
	}
	b.ReportMetric(float64(total-fb)/float64(total)*100, "%outside_fwd_bwd")
	b.ReportMetric(float64(total.Milliseconds())/float64(n), "ms/step")
}

// BenchmarkUpdateChecks: what the every-step checks cost a step of the
// mlp (784-256-128-10, batch 32, Adam) on a 4-rank in-memory ring — the
// norm guard alone, the sketches alone (no audits), and both with audits
// one step in 128 as the byzantine bench runs them — as the speed of
// each against the same ring without them (interleaved). All four ranks
// share the process's cores, as the bench's processes share the
// machine's.
func BenchmarkUpdateChecks(b *testing.B) {
	const n, batch = 4, 32
	xs, ys := mlpBatches(n, batch)
	cur := make([]int, n) // the batch each rank is at, for the audits
	setups := []struct {
		name string
		set  func(*Replica)
	}{
		{"off", func(*Replica) {}},
		{"guard", func(r *Replica) { r.NormGuard = 5 }},
		{"sketch", func(r *Replica) { r.Sketch = &Sketch{SuspectBelow: -1} }},
		{"all", func(r *Replica) { r.Sketch, r.NormGuard = &Sketch{AuditEvery: 128}, 5 }},
	}
	sets := make([][]*Replica, len(setups))
	for k, s := range setups {
		sets[k] = mlpRing(b, n, batch, func(i int, m Model, ring Collective) *Replica {
			rep := NewReplica(m, NewAdam(0.001), ring)
			s.set(rep)
			rep.peers = func(rank int) (*data.Batch, float32, error) {
				return &data.Batch{X: xs[rank][cur[i]], Y: ys[rank][cur[i]], N: batch}, 0, nil
			}
			return rep
		})
	}
	took := interleave(b, sets, xs, ys, batch, cur)
	for k, s := range setups[1:] {
		b.ReportMetric(float64(took[0])/float64(took[k+1]), s.name+"/off")
	}
	b.ReportMetric(float64(sets[3][0].Stats.Audits), "audits")
}

// BenchmarkRobustRounds: what robust aggregation costs sparse DiLoCo
// rounds (8 steps, top 5% in 4 bits, Adam inside) of the mlp on a 4-rank
// in-memory ring, naming on: the speed of rounds with it against rounds
// without (interleaved), as BenchmarkUpdateChecks does the every-step
// checks. In memory a round costs its ranks less than over TLS and
// sockets, so the aggregate's share, and this ratio's distance from 1,
// are larger here than between processes.
func BenchmarkRobustRounds(b *testing.B) {
	const n, batch = 4, 32
	xs, ys := mlpBatches(n, batch)
	sets := make([][]*Replica, 2)
	for k := range sets {
		sets[k] = mlpRing(b, n, batch, func(_ int, m Model, ring Collective) *Replica {
			o := &LocalSGD{Inner: NewAdam(0.001), Every: 8, LR: 0.7, Momentum: 0.9, Nesterov: true, Sparse: &sparse.Config{Fraction: 0.05, Bits: 4}}
			if k == 1 {
				o.Robust = &Robust{Clip: 2, Iters: 3, NameAfter: 3}
			}
			return NewLocalReplica(m, o, ring)
		})
	}
	took := interleave(b, sets, xs, ys, batch, make([]int, n))
	b.ReportMetric(float64(took[0])/float64(took[1]), "robust/off")
}

// benchPool is how many batches each rank of the interleaved benchmarks
// cycles through.
const benchPool = 64

// mlpBatches is benchPool batches of batch samples for each of n ranks:
// 784 features, 10 classes, one teacher.
func mlpBatches(n, batch int) ([][][]float32, [][][]int) {
	xs, ys := make([][][]float32, n), make([][][]int, n)
	for r := range n {
		for s := range benchPool {
			x, y := teacherBatch(rand.New(rand.NewPCG(5, uint64(r*1000+s))), 0, batch, 784, 10)
			xs[r], ys[r] = append(xs[r], x), append(ys[r], y)
		}
	}
	return xs, ys
}

// mlpRing is n replicas of the mlp (784-256-128-10) on an in-memory ring,
// each made by replica from its rank, model and ring.
func mlpRing(b *testing.B, n, batch int, replica func(i int, m Model, ring Collective) *Replica) []*Replica {
	rings := memRings(&testing.T{}, n)
	reps := make([]*Replica, n)
	for i := range n {
		m, err := NewModel(mlpCfg(784, []int{256, 128}, 10, batch, 1))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { m.Close() })
		reps[i] = replica(i, m, rings[i])
	}
	return reps
}

// interleave steps each set of replicas 16 steps a rank in turn until b
// is done, and returns each set's time: drift in the machine's speed falls
// on all alike. cur[i] is the batch rank i is at, set before its step.
func interleave(b *testing.B, sets [][]*Replica, xs [][][]float32, ys [][][]int, batch int, cur []int) []time.Duration {
	const block = 16
	took := make([]time.Duration, len(sets))
	for b.Loop() {
		for k, reps := range sets {
			start := time.Now()
			if err := onAll(len(reps), func(i int) error {
				for range block {
					cur[i] = reps[i].Steps % benchPool
					if _, err := reps[i].Step(context.Background(), xs[i][cur[i]], ys[i][cur[i]], batch); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			took[k] += time.Since(start)
		}
	}
	return took
}
