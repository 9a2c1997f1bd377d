package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
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

// textBatches are batches of random bytes, a language model's: T of
// them a sample and the T after, the last batch short.
func textBatches(seed uint64, steps, batch, T int) (xs [][]float32, ys [][]int) {
	r := rand.New(rand.NewPCG(seed, 7))
	for s := range steps {
		n := batch
		if s == steps-1 {
			n = batch*2/3 + 1
		}
		x, y := make([]float32, n*T), make([]int, n*T)
		for i := range x {
			x[i], y[i] = float32(r.IntN(256)), r.IntN(256)
		}
		xs, ys = append(xs, x), append(ys, y)
	}
	return xs, ys
}

// grid builds S stages × replicas columns of Pipes over in-memory links,
// and a Replica of each over its stage's in-memory ring.
func grid(t *testing.T, ctx context.Context, cfg Config, replicas int, model train.ModelConfig) ([][]*Pipe, [][]*train.Replica) {
	t.Helper()
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
			reps[s][r].Leave = pipes[s][r].Stopping()
		}
	}
	return pipes, reps
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
	pipes, reps := grid(t, ctx, cfg, replicas, model)
	xs, ys := batches(11, 4, model.Batch, model.Spec.RowValues(), 5)
	per := 1 // labels a sample
	if model.Spec.Layers[0].Type == train.LayerEmbedding {
		per = model.Spec.Input[0]
		xs, ys = textBatches(11, 4, model.Batch, per)
	}
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
			l, err := reps[s][r].Step(ctx, x, y, len(y)/per)
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
		l, err := pipes[s][r].Forward(xs[0], ys[0], len(ys[0])/per)
		if r == 0 {
			evalLoss[s] = l
		}
		return err
	})
	res.losses = append(res.losses, evalLoss[0])
	res.logits = append([]float32(nil), pipes[0][0].Logits()...)
	// Every stage reports what the last computed, exactly, whatever the
	// boundary's encoding.
	for s := range S {
		if math.Float32bits(evalLoss[s]) != math.Float32bits(evalLoss[S-1]) {
			t.Fatalf("stage %d's evaluation loss %v; the last stage's %v", s, evalLoss[s], evalLoss[S-1])
		}
		sameBits(t, fmt.Sprintf("stage %d's logits", s), pipes[s][0].Logits(), pipes[S-1][0].Logits())
	}
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

// A GPT cut between its blocks — and inside one, after its attention —
// trains to the bits the whole model reaches on one peer, the residual
// stream crossing every boundary.
func TestGPTSplitTrainsAsWhole(t *testing.T) {
	model := train.ModelConfig{Spec: train.GPTSpec(2, 16, 2, 8), Batch: 6, Seed: 5}
	for _, replicas := range []int{1, 2} {
		whole := trainPipe(t, Config{Stages: 1, MicroBatches: 3}, replicas, model)
		for _, split := range [][]int{{11}, {4}, {6, 16}} {
			t.Run(fmt.Sprintf("R=%d/split=%v", replicas, split), func(t *testing.T) {
				got := trainPipe(t, Config{Stages: len(split) + 1, MicroBatches: 3, Split: split}, replicas, model)
				sameBits(t, "losses", got.losses, whole.losses)
				sameBits(t, "logits", got.logits, whole.logits)
				for i := range got.params {
					sameBits(t, fmt.Sprintf("param %d", i), got.params[i], whole.params[i])
				}
			})
		}
	}
}

// A regression — one feature, linear layers with a residual, a sigmoid
// output and MSE (or BCE) against the float target at the end of each row
// — cut into three stages trains to the bits of the whole model: the last
// stage reads the targets from the rows, the first strips them.
func TestRegressionSplitTrainsAsWhole(t *testing.T) {
	for _, loss := range []train.Loss{train.MSE, train.BCE} {
		spec := train.Spec{Input: []int{1}, Loss: loss, Layers: []train.Layer{
			{Type: "linear", Out: 16}, {Type: "relu", Save: "h"},
			{Type: "linear", Out: 16}, {Type: "relu"}, {Type: "add", From: "h"},
			{Type: "linear", Out: 16}, {Type: "relu"},
			{Type: "linear", Out: 1}, {Type: "sigmoid"},
		}}
		model := train.ModelConfig{Spec: spec, Batch: 8, Seed: 5}
		whole := trainPipe(t, Config{Stages: 1, MicroBatches: 4}, 1, model)
		t.Run(string(loss), func(t *testing.T) {
			got := trainPipe(t, Config{Stages: 3, MicroBatches: 4, Split: []int{3, 6}}, 1, model)
			sameBits(t, "losses", got.losses, whole.losses)
			sameBits(t, "outputs", got.logits, whole.logits)
			for i := range got.params {
				sameBits(t, fmt.Sprintf("param %d", i), got.params[i], whole.params[i])
			}
		})
	}
}

// pipes of StreamLinks over in-memory byte pipes train as MemLinks do.
func TestStreamLinks(t *testing.T) {
	model := train.ModelConfig{Spec: residualSpec(), Batch: 8, Seed: 5}
	cfg := Config{Stages: 3, MicroBatches: 4, Split: []int{2, 8}}
	ctx := context.Background()
	pair := func() (*StreamLink, *StreamLink) {
		ar, aw := io.Pipe()
		br, bw := io.Pipe()
		return NewStreamLink(rwc{aw, br}, 16), NewStreamLink(rwc{bw, ar}, 16)
	}
	a1, b1 := pair()
	a2, b2 := pair()
	links := [][2]*StreamLink{{nil, a1}, {b1, a2}, {b2, nil}}
	xs, ys := batches(3, 2, 8, 12, 5)
	errs := make(chan error, 3)
	losses := make([]float32, 3)
	for s := range 3 {
		var prev, next Link
		if l := links[s][0]; l != nil {
			prev = l
		}
		if l := links[s][1]; l != nil {
			next = l
		}
		p, err := New(ctx, cfg, model, s, prev, next)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		go func() {
			var err error
			losses[s], err = p.ForwardBackward(xs[0], ys[0], 8)
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if losses[0] != losses[2] || losses[0] == 0 {
		t.Errorf("losses %v", losses)
	}
	for _, l := range []*StreamLink{a1, b1, a2, b2} {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	}
	// A link closed under a waiting Recv ends it.
	a, b := pair()
	b.Close()
	if _, err := a.Recv(ctx, Expect{Kind: Activations}); err == nil {
		t.Error("Recv on a link whose other end closed returned no error")
	}
	a.Close()
}

// A stop asked of one peer of a column stops every stage of every column
// after the same step: its frames tell its column, and each stage's ring
// hears of it from that column's peer in the step's trailer.
func TestStopReachesEveryStage(t *testing.T) {
	model := train.ModelConfig{Spec: residualSpec(), Batch: 8, Seed: 5}
	for _, asker := range [][2]int{{0, 0}, {1, 1}, {2, 0}} { // stage, replica
		t.Run(fmt.Sprint(asker), func(t *testing.T) {
			ctx := context.Background()
			const S, R = 3, 2
			stop := make(chan struct{})
			pipes, reps := grid(t, ctx, Config{Stages: S, MicroBatches: 4, Split: []int{2, 8}}, R, model)
			pipes[asker[0]][asker[1]].SetStop(stop)
			xs, ys := batches(3, 4, 8, 12, 5)
			for step := range 4 {
				switch step {
				case 2:
					close(stop)
				case 3:
					// A new stop channel clears the stop: the column
					// trains on (a pipeline job's next generation).
					for s := range S {
						for r := range R {
							pipes[s][r].SetStop(make(chan struct{}))
							reps[s][r].Leave = pipes[s][r].Stopping()
						}
					}
				}
				errs := make([]error, S*R)
				var wg sync.WaitGroup
				for s := range S {
					for r := range R {
						wg.Go(func() { _, errs[s*R+r] = reps[s][r].Step(ctx, xs[step], ys[step], len(ys[step])) })
					}
				}
				wg.Wait()
				for i, err := range errs {
					var leave *train.LeaveError
					switch {
					case step != 2 && err != nil:
						t.Fatalf("step %d, stage %d replica %d: %v", step, i/R, i%R, err)
					case step == 2 && (!errors.As(err, &leave) || fmt.Sprint(leave.Ranks) != fmt.Sprint([]int{asker[1]})):
						t.Errorf("step %d, stage %d replica %d: %v; want a leave request from replica %d", step, i/R, i%R, err, asker[1])
					}
				}
			}
		})
	}
}

// rwc is a stream each way as one.
type rwc struct {
	w *io.PipeWriter
	r *io.PipeReader
}

func (c rwc) Read(b []byte) (int, error)  { return c.r.Read(b) }
func (c rwc) Write(b []byte) (int, error) { return c.w.Write(b) }
func (c rwc) Close() error                { c.w.Close(); return c.r.Close() }

// Gather gives the first stage the whole model's parameters, in order.
func TestGather(t *testing.T) {
	model := train.ModelConfig{Spec: residualSpec(), Batch: 8, Seed: 5}
	cfg := Config{Stages: 3, MicroBatches: 2, Split: []int{2, 8}}
	pipes, _ := grid(t, context.Background(), cfg, 1, model)
	got := make([][][]float32, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for s := range 3 {
		wg.Go(func() { got[s], errs[s] = pipes[s][0].Gather() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	want, err := train.InitParams(model)
	if err != nil {
		t.Fatal(err)
	}
	if len(got[0]) != len(want) || got[1] != nil || got[2] != nil {
		t.Fatalf("stage 0 got %d tensors, want %d; the others %d and %d, want none", len(got[0]), len(want), len(got[1]), len(got[2]))
	}
	for i := range want {
		sameBits(t, want[i].Name, got[0][i], want[i].Data)
	}
}

// bf16 boundaries train close to float32 ones, and every stage still
// reports the last stage's results exactly.
func TestBF16Boundary(t *testing.T) {
	model := train.ModelConfig{Spec: residualSpec(), Batch: 8, Seed: 5}
	exact := trainPipe(t, Config{Stages: 3, MicroBatches: 4, Split: []int{2, 8}}, 2, model)
	narrow := trainPipe(t, Config{Stages: 3, MicroBatches: 4, Split: []int{2, 8}, Boundary: "bf16"}, 2, model)
	differ := false
	for i := range exact.params {
		for j := range exact.params[i] {
			d := math.Abs(float64(exact.params[i][j] - narrow.params[i][j]))
			differ = differ || d > 0
			if d > 1e-2 {
				t.Fatalf("param %d[%d]: %v with bf16, %v with float32", i, j, narrow.params[i][j], exact.params[i][j])
			}
		}
	}
	if !differ {
		t.Error("bf16 boundaries changed nothing: were they narrowed?")
	}
}
