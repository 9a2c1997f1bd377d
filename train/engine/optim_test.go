package engine

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ringtrain/ringtrain/train"
)

func smallConv() train.Spec {
	return train.Spec{Input: []int{1, 6, 6}, Layers: []train.Layer{
		{Type: "conv2d", Out: 3, Kernel: 3, Pad: 1}, {Type: "relu"}, {Type: "maxpool2d", Kernel: 2},
		{Type: "flatten"}, {Type: "linear", Out: 5}, {Type: "relu"}, {Type: "linear", Out: 4},
	}}
}

func newOpt(name string) train.Optimizer {
	if name == "adam" {
		a := train.NewAdam(0.01)
		a.WeightDecay = 0.01
		return a
	}
	return &train.SGD{LR: 0.05, Momentum: 0.9, WeightDecay: 1e-3}
}

// ring is a Collective for tests: size 1, or size n of identical replicas
// (whose mean is what each holds, so it leaves buffers as they are); with
// poison, the average comes back with a NaN in it, as from a rank that
// hid one.
type ring struct {
	size   int
	poison bool
}

func (r ring) AllreduceMean(_ context.Context, buf []float32) error {
	if r.poison {
		buf[1] = float32(math.NaN())
	}
	return nil
}
func (ring) AllreduceSum(context.Context, []float32) error   { return nil }
func (ring) Broadcast(context.Context, []float32, int) error { return nil }
func (ring) Rank() int                                       { return 0 }
func (r ring) Size() int                                     { return r.size }

func equalParams(a, b [][]float32) bool { return slices.EqualFunc(a, b, slices.Equal[[]float32]) }

func stepN(t *testing.T, r *train.Replica, xs [][]float32, ys [][]int, ns []int) {
	t.Helper()
	for s := range xs {
		if _, err := r.Step(context.Background(), xs[s], ys[s], ns[s]); err != nil {
			t.Fatalf("step %d: %v", s, err)
		}
	}
}

// TestDeviceOptimizerMatchesHost: the same net trained by the host
// optimizer on host gradients, by the device optimizer through the flat
// buffer (a ring of two), and by whole steps on the device (a ring of one,
// with and without replay) ends with the same bits in every parameter and
// in the optimizer's state — short batches, a checkpoint-style State and a
// learning-rate change on the way.
func TestDeviceOptimizerMatchesHost(t *testing.T) {
	for _, name := range []string{"sgd", "adam"} {
		t.Run(name, func(t *testing.T) {
			cfg := train.ModelConfig{Spec: smallConv(), Batch: 4, Seed: 5}
			rng := rand.New(rand.NewPCG(7, 7))
			var xs [][]float32
			var ys [][]int
			ns := []int{4, 4, 3, 4, 4, 2, 4}
			for _, n := range ns {
				x, y := batchOf(rng, n, 36, 4)
				xs, ys = append(xs, x), append(ys, y)
			}
			type run struct {
				name   string
				size   int
				device bool
				graph  bool
			}
			var want [][]float32
			var wantState [][]float32
			for _, rc := range []run{{"host", 2, false, false}, {"flat", 2, true, false}, {"flat replay", 2, true, true}, {"alone", 1, true, false}, {"replay", 1, true, true}} {
				net, err := New(Host{}, cfg)
				if err != nil {
					t.Fatal(err)
				}
				opt := newOpt(name)
				if rc.device {
					o, err := net.Optimizer(opt)
					if err != nil {
						t.Fatal(err)
					}
					net.Graph = rc.graph
					opt = o
				}
				r := train.NewReplica(net, opt, ring{size: rc.size})
				stepN(t, r, xs[:4], ys[:4], ns[:4])
				_, _, _ = opt.State() // as a checkpoint would, mid-run
				opt.SetLR(0.02)
				stepN(t, r, xs[4:], ys[4:], ns[4:])
				_, _, state := opt.State()
				got := net.Params()
				if want == nil {
					want, wantState = clone(got), clone(state)
				} else {
					if !equalParams(got, want) {
						t.Errorf("%s: parameters differ from the host optimizer's", rc.name)
					}
					if !equalParams(state, wantState) {
						t.Errorf("%s: optimizer state differs from the host optimizer's", rc.name)
					}
				}
				net.Close()
			}
		})
	}
}

// adamNet is a Host net of cfg with Adam (lr 0.01) bound to it, closed
// when the test ends.
func adamNet(t *testing.T, cfg train.ModelConfig) (*Net, *Optimizer) {
	t.Helper()
	net, err := New(Host{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { net.Close() })
	o, err := net.Optimizer(train.NewAdam(0.01))
	if err != nil {
		t.Fatal(err)
	}
	return net, o
}

func clone(ts [][]float32) [][]float32 {
	out := make([][]float32, len(ts))
	for i, t := range ts {
		out[i] = slices.Clone(t)
	}
	return out
}

// TestParamsWrittenOnTheHostReachTheDevice: values a caller writes into
// Params (a broadcast, a resume) are what the next step trains from, and
// state set with SetState is what the device optimizer continues from.
func TestParamsWrittenOnTheHostReachTheDevice(t *testing.T) {
	cfg := train.ModelConfig{Spec: smallConv(), Batch: 4, Seed: 5}
	other := cfg
	other.Seed = 6
	x, y := batchOf(rand.New(rand.NewPCG(8, 8)), 4, 36, 4)
	src, so := adamNet(t, cfg)
	if _, _, err := so.StepAlone(x, y, 4); err != nil {
		t.Fatal(err)
	}
	params := clone(src.Params())
	_, step, state := so.State()
	state = clone(state)
	// Two more steps, from src's state after one: on a net of the same seed
	// and on one of another seed overwritten with src's, as resume does.
	cont := func(c train.ModelConfig) [][]float32 {
		net, o := adamNet(t, c)
		for i, p := range net.Params() {
			copy(p, params[i])
		}
		if err := o.SetState(step, state, net.Params()); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, bad, err := o.StepAlone(x, y, 4); err != nil || bad >= 0 {
				t.Fatalf("StepAlone: bad %d, %v", bad, err)
			}
		}
		return clone(net.Params())
	}
	for range 2 {
		if _, _, err := so.StepAlone(x, y, 4); err != nil {
			t.Fatal(err)
		}
	}
	want := src.Params()
	if !equalParams(cont(cfg), want) || !equalParams(cont(other), want) {
		t.Error("parameters and state written on the host did not reach the device")
	}
}

// TestStepAloneSkipsNonFinite: a batch whose gradients overflow names the
// tensor and leaves parameters and Adam's step count as they were.
func TestStepAloneSkipsNonFinite(t *testing.T) {
	net, o := adamNet(t, train.ModelConfig{Spec: smallConv(), Batch: 2, Seed: 5})
	before := clone(net.Params())
	x := make([]float32, 72)
	x[0] = float32(math.Inf(1))
	_, bad, err := o.StepAlone(x, []int{0, 1}, 2)
	if err != nil || bad < 0 {
		t.Fatalf("StepAlone on an Inf = bad %d, %v; want a tensor named", bad, err)
	}
	if !equalParams(net.Params(), before) {
		t.Error("parameters changed on a skipped step")
	}
	if _, step, _ := o.State(); step != 0 {
		t.Errorf("Adam step count %d after a skipped step; want 0", step)
	}
	r := train.NewReplica(net, o, ring{size: 1})
	if _, err := r.Step(context.Background(), x, []int{0, 1}, 2); !errors.Is(err, train.ErrNonFinite) || !strings.Contains(err.Error(), "0.conv2d") {
		t.Errorf("Replica.Step on an Inf = %v; want ErrNonFinite naming a tensor", err)
	}
}

// TestHiddenNaNIsCaughtOnTheDevice: an average that holds a NaN though
// every rank flagged its own finite is refused by the device optimizer's
// own check: ErrNonFinite, and nothing applied.
func TestHiddenNaNIsCaughtOnTheDevice(t *testing.T) {
	net, o := adamNet(t, train.ModelConfig{Spec: smallConv(), Batch: 2, Seed: 5})
	before := clone(net.Params())
	x, y := batchOf(rand.New(rand.NewPCG(9, 9)), 2, 36, 4)
	r := train.NewReplica(net, o, ring{size: 2, poison: true})
	if _, err := r.Step(context.Background(), x, y, 2); !errors.Is(err, train.ErrNonFinite) || !strings.Contains(err.Error(), "averaged") {
		t.Fatalf("Step with a poisoned average = %v; want ErrNonFinite for the average", err)
	}
	if !equalParams(net.Params(), before) {
		t.Error("parameters changed on a refused step")
	}
	if _, step, _ := o.State(); step != 0 {
		t.Errorf("Adam step count %d after a refused step; want 0", step)
	}
}

// smallOps is Host with only so much memory.
type smallOps struct {
	Host
	left int
}

func (s *smallOps) Alloc(n int) (Buf, error) {
	if n > s.left {
		return nil, errors.New("out of memory (fake)")
	}
	s.left -= n
	return s.Host.Alloc(n)
}

func (s *smallOps) Free() (int64, int64) { return 4 * int64(s.left), 1 << 20 }

// TestOutOfMemoryNamesTheSizes: a batch too large for the device fails in
// New, saying how much it needed and had, not in a step.
func TestOutOfMemoryNamesTheSizes(t *testing.T) {
	_, err := New(&smallOps{left: 1 << 16}, train.ModelConfig{Spec: smallConv(), Batch: 4096, Seed: 1})
	if !errors.Is(err, ErrOutOfMemory) || !strings.Contains(err.Error(), "batch 4096") || !strings.Contains(err.Error(), "MiB free") {
		t.Errorf("New with a batch too large = %v; want ErrOutOfMemory with the sizes", err)
	}
	net, err := New(&smallOps{left: 1 << 16}, train.ModelConfig{Spec: smallConv(), Batch: 4, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	net.ops.(*smallOps).left = 0
	if _, err := net.Optimizer(train.NewAdam(0.01)); !errors.Is(err, ErrOutOfMemory) {
		t.Errorf("Optimizer without room for its state = %v; want ErrOutOfMemory", err)
	}
}

// TestResumeIsExact: a replica restored from a checkpoint taken mid-run
// (parameters and Adam's state, through train.Replica's Snapshot and
// Restore) continues with the bits the uninterrupted run has — on a ring of
// one and through the flat buffer.
func TestResumeIsExact(t *testing.T) {
	for _, size := range []int{1, 2} {
		cfg := train.ModelConfig{Spec: smallConv(), Batch: 4, Seed: 5}
		rng := rand.New(rand.NewPCG(10, 10))
		var xs [][]float32
		var ys [][]int
		ns := []int{4, 4, 3, 4, 4, 4}
		for _, n := range ns {
			x, y := batchOf(rng, n, 36, 4)
			xs, ys = append(xs, x), append(ys, y)
		}
		net, o := adamNet(t, cfg)
		r := train.NewReplica(net, o, ring{size: size})
		stepN(t, r, xs[:3], ys[:3], ns[:3])
		ckpt := r.Snapshot(train.Checkpoint{})
		stepN(t, r, xs[3:], ys[3:], ns[3:])

		other := cfg
		other.Seed = 9
		net2, o2 := adamNet(t, other)
		r2 := train.NewReplica(net2, o2, ring{size: size})
		stepN(t, r2, xs[:1], ys[:1], ns[:1]) // state of its own, to be overwritten
		if err := r2.Restore(ckpt); err != nil {
			t.Fatal(err)
		}
		stepN(t, r2, xs[3:], ys[3:], ns[3:])
		if !equalParams(net2.Params(), net.Params()) {
			t.Errorf("ring of %d: the resumed run's parameters differ from the uninterrupted run's", size)
		}
	}
}
