package train

import (
	"context"
	"errors"
	"testing"
	"time"
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
