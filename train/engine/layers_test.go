package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	rg "github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
	"github.com/ringtrain/ringtrain/train/gemm"
)

// convSpec is a small net with every layer kind, three of them with
// parameters.
var convSpec = train.Spec{Input: []int{2, 6, 6}, Layers: []train.Layer{
	{Type: "conv2d", Out: 3, Kernel: 3, Pad: 1}, {Type: "relu"}, {Type: "maxpool2d", Kernel: 2},
	{Type: "conv2d", Out: 4, Kernel: 2}, {Type: "relu"},
	{Type: "flatten"}, {Type: "linear", Out: 4},
}}

// TestForwardBackwardLayers: the gradients handed over layer by layer are
// ForwardBackwardFlat's, bit for bit; each layer is handed over at its
// LayerBounds offset, last layer first, and its values are final when it
// is — backward does not write them again. Both ways: into Go memory,
// each copy waited for in turn, and into FlatBuffer's, the copies queued
// beside backward (on the Host device they copy when queued, so a copy
// queued before the layer's gradients were final fails here).
func TestForwardBackwardLayers(t *testing.T) {
	cfg := train.ModelConfig{Spec: convSpec, Batch: 3, Seed: 3}
	x, y := batchOf(rand.New(rand.NewPCG(1, 2)), 3, 72, 4)
	ref, err := New(Host{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	want := make([]float32, ref.nparams)
	wantLoss, bad, err := ref.ForwardBackwardFlat(x, y, 3, want)
	if err != nil || bad >= 0 {
		t.Fatalf("ForwardBackwardFlat: bad %d, %v", bad, err)
	}
	for _, pinned := range []bool{false, true} {
		t.Run(fmt.Sprintf("pinned=%v", pinned), func(t *testing.T) {
			net, err := New(Host{}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer net.Close()
			got := make([]float32, net.nparams)
			if pinned {
				if got, err = net.FlatBuffer(net.nparams); err != nil {
					t.Fatal(err)
				}
			}
			if net.pinned(got) != pinned {
				t.Fatalf("the flat buffer counts as pinned: %v; want %v", !pinned, pinned)
			}
			var los []int
			loss, err := net.ForwardBackwardLayers(x, y, 3, got, func(lo int) error {
				los = append(los, lo)
				if !slices.Equal(got[lo:], want[lo:]) {
					t.Errorf("handed over from %d: values differ from the whole pass's", lo)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if loss != wantLoss || !slices.Equal(got, want) {
				t.Errorf("loss %v and gradients differ from ForwardBackwardFlat's (loss %v)", loss, wantLoss)
			}
			if b := net.LayerBounds(); !slices.Equal(los, b) || len(b) != 3 || b[len(b)-1] != 0 {
				t.Errorf("handed over at %v; LayerBounds %v; want three, the same, ending at 0", los, b)
			}
			stop := errors.New("stop")
			calls := 0
			if _, err := net.ForwardBackwardLayers(x, y, 3, got, func(int) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
				t.Errorf("ready's error: %v after %d calls; want it returned after the first", err, calls)
			}
		})
	}
}

// gemmCounter is the Host device counting its GEMMs.
type gemmCounter struct {
	Host
	n      *int
	copies *[]int // the GEMMs done when each DownloadBeside was called
}

func (g gemmCounter) DownloadBeside(dst []float32, src Buf) (func() error, error) {
	*g.copies = append(*g.copies, *g.n)
	return g.Host.DownloadBeside(dst, src)
}

func (g gemmCounter) Gemm(transA, transB bool, m, n, k int, a, b Buf, beta float32, c Buf) error {
	*g.n++
	return g.Host.Gemm(transA, transB, m, n, k, a, b, beta, c)
}

// TestLayersHandedOverBeforeTheirInputsGradient: a layer's gradients go to
// the ring (or, into FlatBuffer's memory, are queued to copy beside the
// rest of backward) before the GEMM for its input's gradient, which the
// ring does not need (for the cnn's first linear layer, as large as the
// weights' own). convSpec forwards with 3 GEMMs; backward is a dW GEMM
// per layer with parameters and a dX GEMM for each but the first.
func TestLayersHandedOverBeforeTheirInputsGradient(t *testing.T) {
	for _, pinned := range []bool{false, true} {
		var gemms int
		var copies []int
		net, err := New(gemmCounter{n: &gemms, copies: &copies}, train.ModelConfig{Spec: convSpec, Batch: 3, Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		x, y := batchOf(rand.New(rand.NewPCG(1, 2)), 3, 72, 4)
		flat := make([]float32, net.nparams)
		if pinned {
			if flat, err = net.FlatBuffer(net.nparams); err != nil {
				t.Fatal(err)
			}
		}
		gemms = 0
		var at []int
		if _, err := net.ForwardBackwardLayers(x, y, 3, flat, func(int) error { at = append(at, gemms); return nil }); err != nil {
			t.Fatal(err)
		}
		want := []int{4, 6, 8}
		if pinned {
			at = copies // ready comes once backward is queued; the copies count
		}
		if !slices.Equal(at, want) || gemms != 8 {
			t.Errorf("pinned %v: handed over after GEMMs %v of %d; want %v of 8", pinned, at, gemms, want)
		}
		net.Close()
	}
}

// TestOverlappedEngineStep: replicas of the engine's net on the Host
// device, with buckets of one layer, train as they do without buckets (to
// float rounding: the ring adds each element in an order set by its
// segment) and end with the same bits on every rank; with buckets, each
// rank stages the averaged buckets back to its device as the ring
// finishes them (UploadBeside), unless clipping must change the average
// on the host first (a clip too large to bind: the same parameters).
func TestOverlappedEngineStep(t *testing.T) {
	const n, steps = 3, 4
	cfg := train.ModelConfig{Spec: convSpec, Batch: 3, Seed: 3}
	type setup struct {
		bucket int
		clip   float64
	}
	params := map[setup][][]float32{}
	for _, su := range []setup{{0, 0}, {4, 0}, {4, 1e9}} {
		params[su] = make([][]float32, n)
		staged := make([]int, n)
		err := onRing(n, func(i int, r *rg.Ring) error {
			net, err := New(stageCounter{n: &staged[i]}, cfg)
			if err != nil {
				return err
			}
			defer net.Close()
			opt, err := net.Optimizer(&train.SGD{LR: 0.1, Momentum: 0.9})
			if err != nil {
				return err
			}
			rep := train.NewReplica(net, opt, r)
			rep.BucketBytes, rep.ClipNorm = su.bucket, su.clip
			rng := rand.New(rand.NewPCG(7, uint64(i)))
			for range steps {
				x, y := batchOf(rng, 3, 72, 4)
				if _, err := rep.Step(context.Background(), x, y, 3); err != nil {
					return err
				}
			}
			params[su][i] = slices.Concat(net.Params()...)
			return nil
		})
		if err != nil {
			t.Fatalf("%+v: %v", su, err)
		}
		for i := 1; i < n; i++ {
			if !slices.Equal(params[su][i], params[su][0]) {
				t.Errorf("%+v: rank %d's parameters differ from rank 0's", su, i)
			}
		}
		for i, k := range staged {
			if want := su.bucket > 0 && su.clip == 0; (k > 0) != want {
				t.Errorf("%+v: rank %d staged %d buckets; want some: %v", su, i, k, want)
			}
		}
	}
	for j, want := range params[setup{0, 0}][0] {
		for _, su := range []setup{{4, 0}, {4, 1e9}} {
			if got := params[su][0][j]; math.Abs(float64(got-want)) > 1e-5*max(1, math.Abs(float64(want))) {
				t.Fatalf("parameter %d = %v with %+v, %v without buckets", j, got, su, want)
			}
		}
	}
}

// stageCounter is the Host device counting UploadBeside's calls.
type stageCounter struct {
	Host
	n *int
}

func (s stageCounter) UploadBeside(dst Buf, src []float32) error {
	*s.n++
	return s.Host.UploadBeside(dst, src)
}

// TestStageGrads: averaged gradients staged bucket by bucket, last
// tensors first, step the optimizer to the bits of the same average sent
// whole; a range that does not extend the staged part towards the front is
// left to the step, and a new pass forgets what was staged for the last.
func TestStageGrads(t *testing.T) {
	checkStageGrads(t, func() Ops { return Host{} }, train.ModelConfig{Spec: convSpec, Batch: 3, Seed: 3}, 72, 4)
}

// checkStageGrads is TestStageGrads on the Ops newOps makes, a fresh one
// for each net, for a model of cfg taking features and classes.
func checkStageGrads(t *testing.T, newOps func() Ops, cfg train.ModelConfig, features, classes int) {
	x, y := batchOf(rand.New(rand.NewPCG(1, 2)), cfg.Batch, features, classes)
	type stageFn func(net *Net, flat []float32)
	run := func(stage stageFn) []float32 {
		t.Helper()
		net, err := New(newOps(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer net.Close()
		opt, err := net.Optimizer(train.NewAdam(1e-2))
		if err != nil {
			t.Fatal(err)
		}
		flat, err := net.FlatBuffer(net.nparams)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, err := net.ForwardBackwardLayers(x, y, cfg.Batch, flat, func(int) error { return nil }); err != nil {
				t.Fatal(err)
			}
			for i := range flat {
				flat[i] *= 0.5 // the ring's average stands apart from the device's own
			}
			stage(net, flat)
			if ok, err := opt.StepFlat(flat); err != nil || !ok {
				t.Fatalf("StepFlat: %v, %v", ok, err)
			}
		}
		return slices.Concat(net.Params()...)
	}
	want := run(func(*Net, []float32) {})
	bounds := func(net *Net) []int { return append(net.LayerBounds(), 0) }
	for name, stage := range map[string]stageFn{
		"every layer": func(net *Net, flat []float32) {
			hi := net.nparams
			for _, lo := range bounds(net)[:3] {
				if err := net.StageGrads(flat, lo, hi); err != nil {
					t.Fatal(err)
				}
				hi = lo
			}
			if net.staged != net.nparams {
				t.Errorf("staged %d of %d", net.staged, net.nparams)
			}
		},
		"the last layer, then one out of turn": func(net *Net, flat []float32) {
			b := bounds(net)
			if err := net.StageGrads(flat, b[0], net.nparams); err != nil {
				t.Fatal(err)
			}
			if err := net.StageGrads(flat, b[2], b[1]); err != nil {
				t.Fatal(err)
			}
			if net.staged != net.nparams-b[0] {
				t.Errorf("staged %d; want the last layer's %d", net.staged, net.nparams-b[0])
			}
		},
		"then a new pass": func(net *Net, flat []float32) {
			if err := net.StageGrads(flat, bounds(net)[0], net.nparams); err != nil {
				t.Fatal(err)
			}
			stale := slices.Clone(flat)
			if _, err := net.ForwardBackwardLayers(x, y, cfg.Batch, flat, func(int) error { return nil }); err != nil {
				t.Fatal(err)
			}
			copy(flat, stale) // the same average, none of it staged
			if net.staged != 0 {
				t.Errorf("after a new pass, %d values count as staged", net.staged)
			}
		},
	} {
		if got := run(stage); !slices.Equal(got, want) {
			t.Errorf("%s: parameters differ from the average sent whole", name)
		}
	}
}

// TestBucketsMixEngines: the buckets depend on the tensors alone, so a
// rank whose gradients come from gorgonia (which hands nothing over until
// backward ends) sends the same buckets as the engine's ranks, and the
// ring does not find a mismatch.
func TestBucketsMixEngines(t *testing.T) {
	const n = 3
	cfg := train.ModelConfig{Spec: convSpec, Batch: 3, Seed: 3}
	err := onRing(n, func(i int, r *rg.Ring) error {
		var m train.Model
		var err error
		if i == 0 {
			m, err = train.NewModel(cfg)
		} else {
			m, err = New(Host{}, cfg)
		}
		if err != nil {
			return err
		}
		defer m.Close()
		rep := train.NewReplica(m, &train.SGD{LR: 0.1}, r)
		rep.BucketBytes = 4
		x, y := batchOf(rand.New(rand.NewPCG(7, uint64(i))), 3, 72, 4)
		for range 2 {
			if _, err := rep.Step(context.Background(), x, y, 3); err != nil {
				return fmt.Errorf("rank %d (%T): %w", i, m, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestHostWithBLAS: a Host given its own BLAS (train/gemm, on a thread
// budget) computes the gradients gonum's SGEMM does, to float rounding.
func TestHostWithBLAS(t *testing.T) {
	cfg := train.ModelConfig{Spec: convSpec, Batch: 3, Seed: 3}
	x, y := batchOf(rand.New(rand.NewPCG(1, 2)), 3, 72, 4)
	grads := make([][]float32, 2)
	for i, h := range []Host{{}, {BLAS: gemm.New(1)}} {
		net, err := New(h, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer net.Close()
		grads[i] = make([]float32, net.nparams)
		if _, _, err := net.ForwardBackwardFlat(x, y, 3, grads[i]); err != nil {
			t.Fatal(err)
		}
	}
	for j, want := range grads[0] {
		if got := grads[1][j]; math.Abs(float64(got-want)) > 1e-5*max(1, math.Abs(float64(want))) {
			t.Fatalf("gradient %d = %v with train/gemm, %v with gonum", j, got, want)
		}
	}
}

// TestLocalSGDOnTheEngine: DiLoCo over the engine's net and its device
// optimizer — inner steps whole on the device (StepAlone), the parameters
// brought to the host for the outer step and sent back — keeps the ranks
// in step, and the inner Adam restarts each round.
func TestLocalSGDOnTheEngine(t *testing.T) {
	const n, steps = 2, 6
	cfg := train.ModelConfig{Spec: convSpec, Batch: 3, Seed: 3}
	params := make([][]float32, n)
	err := onRing(n, func(i int, r *rg.Ring) error {
		net, err := New(Host{}, cfg)
		if err != nil {
			return err
		}
		defer net.Close()
		inner, err := net.Optimizer(train.NewAdam(0.01))
		if err != nil {
			return err
		}
		rep := train.NewLocalReplica(net, &train.LocalSGD{Inner: inner, Every: 3, LR: 0.7, Momentum: 0.9, Nesterov: true}, r)
		rng := rand.New(rand.NewPCG(7, uint64(i)))
		for range steps {
			x, y := batchOf(rng, 3, 72, 4)
			if _, err := rep.Step(context.Background(), x, y, 3); err != nil {
				return err
			}
		}
		if _, step, state := inner.State(); step != 0 || len(state) != 0 {
			return fmt.Errorf("rank %d: the inner Adam holds step %d and %d tensors after the round; want it restarted", i, step, len(state))
		}
		params[i] = slices.Concat(net.Params()...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(params[0], params[1]) {
		t.Error("the ranks' parameters differ after two rounds")
	}
}

// onRing runs f for every rank of an in-memory ring of n, each in its own
// goroutine with its Ring, and joins their errors.
func onRing(n int, f func(i int, r *rg.Ring) error) error {
	ts := rg.MemRing(n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r, err := rg.New(ts[i], rg.Config{Rank: i, Size: n, Generation: 1})
			if err != nil {
				errs[i] = err
				return
			}
			defer r.Close()
			errs[i] = f(i, r)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
