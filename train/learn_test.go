package train

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/ring"
)

func loader(t *testing.T, split string, batch int, shuffle bool) *data.Loader {
	t.Helper()
	cfg, err := data.LoadConfig("../testdata/data-config.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := cfg.Load(split)
	if err != nil {
		t.Fatal(err)
	}
	return &data.Loader{Split: s, BatchSize: batch, Seed: 1,
		Sampler: data.Sampler{N: s.Len(), World: 1, Seed: 1, Shuffle: shuffle}}
}

// TestMLPLearnsTestdata: a short run on the real Fashion-MNIST subset ends
// well above chance (0.1); a broken gradient or a broken step would not.
func TestMLPLearnsTestdata(t *testing.T) {
	const batch = 32
	ctx := context.Background()
	m := newMLP(t, mlpCfg(784, []int{64}, 10, batch, 1))
	one, err := ring.New(nil, ring.Config{Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	rep := NewReplica(m, &SGD{LR: 0.05, Momentum: 0.9}, one)
	train := loader(t, "train", batch, true)
	for epoch := range 2 {
		e, err := train.Epoch(ctx, epoch)
		if err != nil {
			t.Fatal(err)
		}
		err = e.Each(func(b *data.Batch) error {
			_, err := rep.Step(ctx, b.X, b.Y, b.N)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		e.Close()
	}
	test, err := loader(t, "test", batch, false).Epoch(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer test.Close()
	r, err := Evaluate(m, test, 10)
	if err != nil {
		t.Fatal(err)
	}
	if r.Samples != 500 || r.Accuracy < 0.65 {
		t.Errorf("after 2 epochs on 2000 images: accuracy %.3f on %d test images (loss %.3f); want ≥ 0.65 on 500", r.Accuracy, r.Samples, r.Loss)
	}
	t.Logf("test accuracy %.3f, loss %.3f, per class %.2f", r.Accuracy, r.Loss, r.PerClass)
}

// TestRunOnRing: three replicas on an in-memory ring, each on its share,
// end with the same parameters and learn; each scores a third of the test
// set, and every rank's result is that of the whole set scored in one place.
func TestRunOnRing(t *testing.T) {
	const world, batch = 3, 16
	rings := memRings(t, world)
	sums := make([]Summary, world)
	var whole Result
	var progress [world]int
	err := onAll(world, func(i int) error {
		m, err := NewModel(mlpCfg(784, []int{64}, 10, batch, uint64(i)))
		if err != nil {
			return err
		}
		defer m.Close()
		tr := loader(t, "train", batch, true)
		tr.Sampler.World, tr.Sampler.Rank = world, i
		te := loader(t, "test", batch, false)
		te.Sampler.World, te.Sampler.Rank, te.Sampler.Exact = world, i, true
		sums[i], err = Run(context.Background(), RunConfig{
			Replica: NewReplica(m, &SGD{LR: 0.05, Momentum: 0.9}, rings[i]),
			Train:   tr, Test: te, Epochs: 2, Classes: 10,
			Progress: func(Progress) { progress[i]++ }, ProgressEvery: 10,
		})
		if err != nil || i != 0 {
			return err
		}
		e, err := loader(t, "test", batch, false).Epoch(context.Background(), 0)
		if err != nil {
			return err
		}
		defer e.Close()
		whole, err = Evaluate(m, e, 10)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range sums {
		if s.ParamHash != sums[0].ParamHash || s.Epochs != 2 || progress[i] == 0 {
			t.Errorf("rank %d: %+v after %d progress reports; want rank 0's hash %s", i, s, progress[i], sums[0].ParamHash)
		}
	}
	if sums[0].TestAccuracy < 0.6 {
		t.Errorf("test accuracy %.3f; want ≥ 0.6", sums[0].TestAccuracy)
	}
	for i, s := range sums {
		if s.TestSamples != whole.Samples || s.TestAccuracy != whole.Accuracy || !slices.Equal(s.PerClass, whole.PerClass) || math.Abs(s.TestLoss-whole.Loss) > 1e-5*whole.Loss {
			t.Errorf("rank %d: sharded evaluation of %d samples gives accuracy %v, loss %v, per class %v; the whole set of %d in one place %v, %v, %v",
				i, s.TestSamples, s.TestAccuracy, s.TestLoss, s.PerClass, whole.Samples, whole.Accuracy, whole.Loss, whole.PerClass)
		}
	}
	t.Logf("accuracy %.3f, %.0f samples/s per rank", sums[0].TestAccuracy, sums[0].SamplesPerSec)
}

// TestRunStopsBetweenSteps: closing Stop ends the run after one more step,
// and says where.
func TestRunStopsBetweenSteps(t *testing.T) {
	m := newMLP(t, mlpCfg(784, []int{16}, 10, 16, 1))
	stop := make(chan struct{})
	s, err := Run(context.Background(), RunConfig{
		Replica: NewReplica(m, &SGD{LR: 0.05}, solo(t)), Train: loader(t, "train", 16, true), Epochs: 3, Classes: 10,
		Stop: stop, ProgressEvery: 10,
		Progress: func(p Progress) {
			if p.Epoch == 1 && p.Step == 20 {
				close(stop)
			}
		},
	})
	want := loader(t, "train", 16, true).Batches() + 21
	if !errors.Is(err, ErrStopped) || s.Epochs != 1 || s.Steps != want {
		t.Errorf("Run stopped in epoch 1 after step 20: %v, %d epochs and %d steps done; want ErrStopped, 1 and %d", err, s.Epochs, s.Steps, want)
	}
}

// TestOneRankStopsAll: a stop on one rank of three ends the run on every
// rank after the same step, with the same parameters, and each learns who
// asked — where a rank that stopped alone would leave the others stuck in
// the next allreduce.
func TestOneRankStopsAll(t *testing.T) {
	const world, batch = 3, 16
	rings := memRings(t, world)
	stop := make(chan struct{})
	sums := make([]Summary, world)
	errs := make([]error, world)
	hashes := make([][32]byte, world)
	onAll(world, func(i int) error {
		rep := NewReplica(newMLP(t, mlpCfg(784, []int{16}, 10, batch, 1)), &SGD{LR: 0.05}, rings[i])
		tr := loader(t, "train", batch, true)
		tr.Sampler.World, tr.Sampler.Rank = world, i
		cfg := RunConfig{Replica: rep, Train: tr, Epochs: 2, Classes: 10, ProgressEvery: 5}
		if i == 1 {
			cfg.Stop = stop
			cfg.Progress = func(p Progress) {
				if p.Step == 15 {
					close(stop)
				}
			}
		}
		sums[i], errs[i] = Run(context.Background(), cfg)
		hashes[i] = rep.ParamHash()
		return nil
	})
	for i := range world {
		var leave *LeaveError
		if !errors.As(errs[i], &leave) || len(leave.Ranks) != 1 || leave.Ranks[0] != 1 {
			t.Errorf("rank %d: Run = %v; want a LeaveError naming rank 1", i, errs[i])
		}
		if sums[i].Epochs != 0 || sums[i].Steps != 16 {
			t.Errorf("rank %d stopped after %d epochs and %d steps; want 0 and 16", i, sums[i].Epochs, sums[i].Steps)
		}
		if hashes[i] != hashes[0] {
			t.Errorf("rank %d ends with other parameters than rank 0", i)
		}
	}
}
