package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
)

// residualSpec is a small MLP whose residuals cross stage boundaries:
// "a" is used by layers 4 and 10, "b" by layer 7.
func residualSpec() train.Spec {
	return train.Spec{Input: []int{12}, Layers: []train.Layer{
		{Type: "linear", Out: 16}, {Type: "relu", Save: "a"},
		{Type: "linear", Out: 16}, {Type: "tanh"}, {Type: "add", From: "a", Save: "b"},
		{Type: "linear", Out: 16}, {Type: "relu"}, {Type: "add", From: "b"},
		{Type: "linear", Out: 16}, {Type: "dropout", P: 0.25}, {Type: "add", From: "a"},
		{Type: "linear", Out: 5},
	}}
}

func batches(seed uint64, steps, batch, features, classes int) (xs [][]float32, ys [][]int) {
	r := rand.New(rand.NewPCG(seed, 7))
	for s := range steps {
		n := batch
		if s == steps-1 {
			n = batch*2/3 + 1 // a short last batch
		}
		x := make([]float32, n*features)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		y := make([]int, n)
		for i := range y {
			y[i] = r.IntN(classes)
		}
		xs, ys = append(xs, x), append(ys, y)
	}
	return xs, ys
}

type result struct {
	params [][]float32 // the whole model's, in order
	losses []float32   // per step, then the evaluation's
	logits []float32
}

// train runs a pipeline of cfg.Stages stages × replicas columns, in memory,
// over the same batches for every column's shard, and returns what column
// 0 ends with: its stages' parameters joined, and the losses.
func trainPipe(t *testing.T, cfg Config, replicas int, model train.ModelConfig) result {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	S := cfg.Stages
	pipes := make([][]*Pipe, S) // [stage][replica]
	reps := make([][]*train.Replica, S)
	for s := range S {
		pipes[s] = make([]*Pipe, replicas)
		reps[s] = make([]*train.Replica, replicas)
	}
	for r := range replicas {
		var prev Link
		for s := range S {
			var next, nextPrev Link
			if s < S-1 {
				next, nextPrev = MemLinks(64)
			}
			p, err := New(ctx, cfg, model, s, prev, next)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			p.SetGeneration(1)
			pipes[s][r] = p
			prev = nextPrev
		}
	}
	for s := range S {
		ts := ring.MemRing(replicas)
		for r := range replicas {
			rg, err := ring.New(ts[r], ring.Config{Rank: r, Size: replicas, Generation: 1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rg.Close() })
			reps[s][r] = train.NewReplica(pipes[s][r], &train.SGD{LR: 0.1, Momentum: 0.9}, rg)
		}
	}
	xs, ys := batches(11, 4, model.Batch, model.Spec.Input[0], 5)
	var res result
	all := func(f func(s, r int) error) {
		t.Helper()
		errs := make([]error, S*replicas)
		var wg sync.WaitGroup
		for s := range S {
			for r := range replicas {
				wg.Go(func() { errs[s*replicas+r] = f(s, r) })
			}
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
	for step := range xs {
		losses := make([]float32, S)
		all(func(s, r int) error {
			// Each column trains on its own shard: here, the batch
			// shifted by its replica index.
			x, y := xs[(step+r)%len(xs)], ys[(step+r)%len(ys)]
			if len(y) != len(ys[step]) {
				x, y = xs[step], ys[step]
			}
			l, err := reps[s][r].Step(ctx, x, y, len(y))
			if r == 0 {
				losses[s] = l
			}
			return err
		})
		for s := range S {
			if math.Float32bits(losses[s]) != math.Float32bits(losses[S-1]) {
				t.Fatalf("step %d: stage %d reports loss %v, the last stage %v", step, s, losses[s], losses[S-1])
			}
		}
		res.losses = append(res.losses, losses[0])
	}
	evalLoss := make([]float32, S)
	all(func(s, r int) error {
		l, err := pipes[s][r].Forward(xs[0], ys[0], len(ys[0]))
		if r == 0 {
			evalLoss[s] = l
		}
		return err
	})
	res.losses = append(res.losses, evalLoss[0])
	res.logits = append([]float32(nil), pipes[0][0].Logits()...)
	for s := range S {
		for _, p := range pipes[s][0].Params() {
			res.params = append(res.params, append([]float32(nil), p...))
		}
	}
	return res
}

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values; want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %v; want %v", what, i, got[i], want[i])
		}
	}
}

// A model split into stages trains to the bits the whole model reaches on
// one peer per column with the same micro-batches and gradient
// accumulation: with residuals crossing one boundary, two, or passing a
// stage by; with either schedule; with one replica per stage or two.
func TestSplitTrainsAsWhole(t *testing.T) {
	model := train.ModelConfig{Spec: residualSpec(), Batch: 8, Seed: 5}
	for _, replicas := range []int{1, 2} {
		for _, sched := range []Kind{OneFOneB, GPipe} {
			whole := trainPipe(t, Config{Stages: 1, MicroBatches: 4, Schedule: sched}, replicas, model)
			for _, split := range [][]int{{5}, {2, 8}, {5, 8}, {2, 5, 10}} {
				name := fmt.Sprintf("R=%d/%s/split=%v", replicas, sched, split)
				t.Run(name, func(t *testing.T) {
					got := trainPipe(t, Config{Stages: len(split) + 1, MicroBatches: 4, Schedule: sched, Split: split}, replicas, model)
					sameBits(t, "losses", got.losses, whole.losses)
					sameBits(t, "logits", got.logits, whole.logits)
					if len(got.params) != len(whole.params) {
						t.Fatalf("%d parameter tensors; want %d", len(got.params), len(whole.params))
					}
					for i := range got.params {
						sameBits(t, fmt.Sprintf("param %d", i), got.params[i], whole.params[i])
					}
				})
			}
		}
	}
}
