package train

import (
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkModelStep: one forward+backward and an SGD step of a built-in
// model at batch 64 on noise, the CPU engine's cost with nothing around it.
func BenchmarkModelStep(b *testing.B) {
	for _, name := range []string{"mlp", "cnn"} {
		b.Run(name, func(b *testing.B) {
			spec, err := BuiltinSpec(name, 1, 28, 28, 10)
			if err != nil {
				b.Fatal(err)
			}
			const batch = 64
			m, err := NewModel(ModelConfig{Spec: spec, Batch: batch, Seed: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			rng := rand.New(rand.NewPCG(1, 2))
			x := make([]float32, batch*784)
			y := make([]int, batch)
			for i := range x {
				x[i] = rng.Float32()
			}
			for i := range y {
				y[i] = rng.IntN(10)
			}
			opt := &SGD{LR: 0.01, Momentum: 0.9}
			var optTime time.Duration
			for b.Loop() {
				if _, err := m.ForwardBackward(x, y, batch); err != nil {
					b.Fatal(err)
				}
				t := time.Now()
				opt.Step(m.Params(), m.Grads())
				optTime += time.Since(t)
			}
			b.ReportMetric(float64(optTime.Microseconds())/float64(b.N), "µs-opt/op")
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "samples/s")
		})
	}
}
