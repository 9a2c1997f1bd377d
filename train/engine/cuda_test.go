//go:build ringtrain_cuda

package engine

// These tests need an NVIDIA GPU: gorgonia.org/cu ends the process at
// start-up without one. Build them with `make cuda-test` (a test binary to
// carry to a GPU host) and run it there.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ringtrain/ringtrain/train"
)

func newCUDAOrSkip(t testing.TB) *CUDA {
	t.Helper()
	c, err := NewCUDA(0, CUDAOptions{})
	if err != nil {
		t.Fatalf("NewCUDA: %v", err)
	}
	t.Logf("%s, %s, %s", c.Name(), c.BLAS(), c.DNN())
	return c
}

// onBoth uploads the inputs to the GPU and runs op there and on Host; it
// returns both results of output index out.
func onBoth(t *testing.T, c *CUDA, ins [][]float32, outs []int, op func(o Ops, b []Buf) error) (host, gpu [][]float32) {
	t.Helper()
	hb := make([]Buf, len(ins))
	gb := make([]Buf, len(ins))
	for i, v := range ins {
		hv := append([]float32(nil), v...)
		hb[i] = hostBuf(hv)
		b, err := c.Alloc(len(v))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Upload(b, v); err != nil {
			t.Fatal(err)
		}
		gb[i] = b
	}
	if err := op(Host{}, hb); err != nil {
		t.Fatal(err)
	}
	if err := op(c, gb); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
	for _, k := range outs {
		g := make([]float32, len(ins[k]))
		if err := c.Download(g, gb[k]); err != nil {
			t.Fatal(err)
		}
		host, gpu = append(host, f32(hb[k])), append(gpu, g)
	}
	return host, gpu
}

func maxRel(a, b []float32) float64 {
	worst := 0.0
	for i := range a {
		d := math.Abs(float64(a[i]-b[i])) / (1e-3 + math.Abs(float64(a[i])))
		if d > worst || math.IsNaN(d) {
			worst = d
		}
	}
	return worst
}

// TestCUDAKernelsMatchTheirTwins: every kernel gives its Go twin's bits
// (softmax within expf's rounding, GEMM within float32 summation order).
func TestCUDAKernelsMatchTheirTwins(t *testing.T) {
	c := newCUDAOrSkip(t)
	defer c.Close()
	rng := rand.New(rand.NewPCG(11, 11))
	g := NewConv(3, 9, 7, 3, 1)
	const B = 5
	P := g.ColCols()
	pool := NewPool(B*3, 9, 7, 2)
	labels := make([]float32, 6)
	for i := range labels {
		labels[i] = float32(rng.IntN(4))
	}
	hyperSGD := []float32{0.05, 0.9, 1e-3}
	hyperAdam := []float32{0.01 / 0.1, float32(math.Sqrt(0.001)), 0.01, 0.9, 0.999, 1e-8}
	n := 1000
	absv := func(v []float32) []float32 {
		for i := range v {
			v[i] = float32(math.Abs(float64(v[i])))
		}
		return v
	}
	// The GPT's kernels draw from a stream of their own, so the older
	// cases' inputs (and the GEMMs' rounding against their tolerance) stay
	// as they were.
	gr := rand.New(rand.NewPCG(12, 12))
	toks := make([]float32, 12)
	for i := range toks {
		toks[i] = float32(gr.IntN(11))
	}
	// 600 rows span three of token_rows' chunks; token 3 in most.
	longToks := make([]float32, 600)
	for i := range longToks {
		longToks[i] = float32(gr.IntN(10))
		if gr.IntN(2) == 0 {
			longToks[i] = 3
		}
	}
	stats := make([]float32, 24)
	for r := range 12 {
		stats[2*r], stats[2*r+1] = float32(gr.NormFloat64()), 0.5+float32(gr.Float64())
	}
	for _, tc := range []struct {
		name  string
		ins   [][]float32
		outs  []int
		op    func(o Ops, b []Buf) error
		exact bool
	}{
		{"im2col_batch", [][]float32{randn(rng, B*g.C*g.H*g.W), make([]float32, g.ColRows()*B*P)}, []int{1},
			func(o Ops, b []Buf) error { return o.Im2colBatch(b[0], b[1], g, B) }, true},
		{"col2im_batch", [][]float32{randn(rng, g.ColRows()*B*P), make([]float32, B*g.C*g.H*g.W)}, []int{1},
			func(o Ops, b []Buf) error { return o.Col2imBatch(b[0], b[1], g, B) }, true},
		{"unbatch_bias", [][]float32{randn(rng, B*4*P), randn(rng, 4), make([]float32, B*4*P)}, []int{2},
			func(o Ops, b []Buf) error { return o.UnbatchBias(b[0], b[1], b[2], B, 4, P) }, true},
		{"rebatch", [][]float32{randn(rng, B*4*P), make([]float32, B*4*P)}, []int{1},
			func(o Ops, b []Buf) error { return o.Rebatch(b[0], b[1], B, 4, P) }, true},
		{"bias_add", [][]float32{randn(rng, B*4*P), randn(rng, 4)}, []int{0},
			func(o Ops, b []Buf) error { return o.BiasAdd(b[0], b[1], B, 4, P) }, true},
		{"bias_grad", [][]float32{randn(rng, B*4*P), make([]float32, 4)}, []int{1},
			func(o Ops, b []Buf) error { return o.BiasGrad(b[0], b[1], B, 4, P) }, true},
		{"bias_grad rows", [][]float32{randn(rng, 64*1024), make([]float32, 1024)}, []int{1},
			func(o Ops, b []Buf) error { return o.BiasGrad(b[0], b[1], 64, 1024, 1) }, true},
		{"bias_grad parts", [][]float32{randn(rng, 96*4*784), make([]float32, 4)}, []int{1},
			func(o Ops, b []Buf) error { return o.BiasGrad(b[0], b[1], 96, 4, 784) }, true},
		{"bias_grad row parts", [][]float32{randn(rng, 300*70), make([]float32, 70)}, []int{1},
			func(o Ops, b []Buf) error { return o.BiasGrad(b[0], b[1], 300, 70, 1) }, true},
		{"relu", [][]float32{randn(rng, n), make([]float32, n)}, []int{1},
			func(o Ops, b []Buf) error { return o.Relu(b[0], b[1]) }, true},
		{"relu_backward", [][]float32{randn(rng, n), randn(rng, n), make([]float32, n)}, []int{2},
			func(o Ops, b []Buf) error { return o.ReluBackward(b[0], b[1], b[2]) }, true},
		{"max_pool", [][]float32{randn(rng, B*3*9*7), make([]float32, B*3*4*3)}, []int{1},
			func(o Ops, b []Buf) error { return o.MaxPool(b[0], b[1], pool) }, true},
		{"max_pool_backward", [][]float32{randn(rng, B*3*9*7), randn(rng, B*3*4*3), make([]float32, B*3*9*7)}, []int{2},
			func(o Ops, b []Buf) error { return o.MaxPoolBackward(b[0], b[1], b[2], pool) }, true},
		{"softmax_xent", [][]float32{randn(rng, 6*4), labels, make([]float32, 6*4), make([]float32, 6)}, []int{2, 3},
			func(o Ops, b []Buf) error { return o.SoftmaxXent(b[0], b[1], b[2], b[3], 6, 5, 4) }, false},
		{"nonfinite", [][]float32{append(randn(rng, n), float32(math.NaN())), {0}}, []int{1},
			func(o Ops, b []Buf) error { return o.NonFinite(b[0], b[1]) }, true},
		{"sgd", [][]float32{randn(rng, n), randn(rng, n), randn(rng, n), hyperSGD, {0}}, []int{0, 2},
			func(o Ops, b []Buf) error { return o.SGD(b[0], b[1], b[2], b[3], b[4]) }, true},
		{"sgd skipped", [][]float32{randn(rng, n), randn(rng, n), randn(rng, n), hyperSGD, {1}}, []int{0, 2},
			func(o Ops, b []Buf) error { return o.SGD(b[0], b[1], b[2], b[3], b[4]) }, true},
		{"adam", [][]float32{randn(rng, n), randn(rng, n), randn(rng, n), absv(randn(rng, n)), hyperAdam, {0}}, []int{0, 2, 3},
			func(o Ops, b []Buf) error { return o.Adam(b[0], b[1], b[2], b[3], b[4], b[5]) }, true},
		{"gemm", [][]float32{randn(rng, 37*53), randn(rng, 53*29), randn(rng, 37*29)}, []int{2},
			func(o Ops, b []Buf) error { return o.Gemm(false, false, 37, 29, 53, b[0], b[1], 0, b[2]) }, false},
		{"gemm tt beta", [][]float32{randn(rng, 53*37), randn(rng, 29*53), randn(rng, 37*29)}, []int{2},
			func(o Ops, b []Buf) error { return o.Gemm(true, true, 37, 29, 53, b[0], b[1], 1, b[2]) }, false},
		{"embed", [][]float32{toks, randn(gr, 11*6), randn(gr, 4*6), make([]float32, 12*6)}, []int{3},
			func(o Ops, b []Buf) error { return o.Embed(b[0], b[1], b[2], b[3], 12, 4, 6) }, true},
		{"embed_grad", [][]float32{toks, randn(gr, 12*6), make([]float32, 11*6), make([]float32, 4*6)}, []int{2, 3},
			func(o Ops, b []Buf) error { return o.EmbedGrad(b[0], b[1], b[2], b[3], 12, 4, 6) }, true},
		{"embed_grad 600 rows", [][]float32{longToks, randn(gr, 600*6), make([]float32, 11*6), make([]float32, 4*6)}, []int{2, 3},
			func(o Ops, b []Buf) error { return o.EmbedGrad(b[0], b[1], b[2], b[3], 600, 4, 6) }, true},
		{"layer_norm", [][]float32{randn(gr, 12*20), randn(gr, 20), randn(gr, 20), make([]float32, 12*20), make([]float32, 24)}, []int{3, 4},
			func(o Ops, b []Buf) error { return o.LayerNorm(b[0], b[1], b[2], b[3], b[4], 12, 20) }, true},
		{"layer_norm 300 wide", [][]float32{randn(gr, 5*300), randn(gr, 300), randn(gr, 300), make([]float32, 5*300), make([]float32, 10)}, []int{3, 4},
			func(o Ops, b []Buf) error { return o.LayerNorm(b[0], b[1], b[2], b[3], b[4], 5, 300) }, true},
		{"layer_norm_backward", [][]float32{randn(gr, 12*20), randn(gr, 20), stats, randn(gr, 12*20), make([]float32, 12*20)}, []int{4},
			func(o Ops, b []Buf) error { return o.LayerNormBackward(b[0], b[1], b[2], b[3], b[4], 12, 20) }, true},
		{"normalized_product", [][]float32{randn(gr, 12*20), stats, randn(gr, 12*20), make([]float32, 12*20)}, []int{3},
			func(o Ops, b []Buf) error { return o.NormalizedProduct(b[0], b[1], b[2], b[3], 12, 20) }, true},
		{"gelu", [][]float32{randn(gr, n), make([]float32, n)}, []int{1},
			func(o Ops, b []Buf) error { return o.GELU(b[0], b[1]) }, false},
		{"gelu_backward", [][]float32{randn(gr, n), randn(gr, n), make([]float32, n)}, []int{2},
			func(o Ops, b []Buf) error { return o.GELUBackward(b[0], b[1], b[2]) }, false},
		{"causal_softmax", [][]float32{randn(gr, 3*8*8)}, []int{0},
			func(o Ops, b []Buf) error { return o.CausalSoftmax(b[0], 3*8, 8) }, false},
		{"causal_softmax 70 long", [][]float32{randn(gr, 2*70*70)}, []int{0},
			func(o Ops, b []Buf) error { return o.CausalSoftmax(b[0], 2*70, 70) }, false},
		{"causal_softmax_backward 70 long", [][]float32{absv(randn(gr, 2*70*70)), randn(gr, 2*70*70)}, []int{1},
			func(o Ops, b []Buf) error { return o.CausalSoftmaxBackward(b[0], b[1], 2*70, 70) }, true},
		{"causal_softmax_backward", [][]float32{absv(randn(gr, 3*8*8)), randn(gr, 3*8*8)}, []int{1},
			func(o Ops, b []Buf) error { return o.CausalSoftmaxBackward(b[0], b[1], 3*8, 8) }, true},
		{"add", [][]float32{randn(gr, n), randn(gr, n), make([]float32, n)}, []int{2},
			func(o Ops, b []Buf) error { return o.Add(b[0], b[1], b[2]) }, true},
		{"accumulate", [][]float32{randn(gr, n), randn(gr, n)}, []int{0},
			func(o Ops, b []Buf) error { return o.Accumulate(b[0], b[1]) }, true},
		{"scale", [][]float32{randn(gr, n), {0, 0, 0, 0, 0, 0, 0.97, 0}, {0}}, []int{0},
			func(o Ops, b []Buf) error { return o.Scale(b[0], b[1], hyperKeep, b[2]) }, true},
		{"scale skipped", [][]float32{randn(gr, n), {0, 0, 0, 0, 0, 0, 0.97, 0}, {1}}, []int{0},
			func(o Ops, b []Buf) error { return o.Scale(b[0], b[1], hyperKeep, b[2]) }, true},
		{"gemm_strided", [][]float32{randn(gr, 3*8*24), randn(gr, 3*8*24), make([]float32, 3*2*8*8)}, []int{2},
			func(o Ops, b []Buf) error {
				at := func(x Buf, off int) Buf { return o.Slice(x, off, x.Len()-off) }
				return o.GemmStrided(false, true, 8, 8, 4, 0.5, at(b[0], 4), 24, 8*24, at(b[1], 12), 24, 8*24, 0, at(b[2], 64), 8, 2*64, 3)
			}, false},
	} {
		host, gpu := onBoth(t, c, tc.ins, tc.outs, tc.op)
		for k := range host {
			if tc.exact {
				for i := range host[k] {
					if math.Float32bits(host[k][i]) != math.Float32bits(gpu[k][i]) {
						t.Errorf("%s: output %d [%d]: GPU %v, Go twin %v", tc.name, k, i, gpu[k][i], host[k][i])
						break
					}
				}
			} else if d := maxRel(host[k], gpu[k]); d > 1e-4 {
				t.Errorf("%s: output %d differs by %.2e (relative)", tc.name, k, d)
			}
		}
	}
}

// trainCNN runs steps of the cnn at batch 8 with Adam on ops and returns
// the parameters, the losses and the optimizer state.
func trainCNN(t *testing.T, ops Ops, size int, graph bool) ([][]float32, []float32) {
	t.Helper()
	cnn, err := train.BuiltinSpec("cnn", 1, 28, 28, 10)
	if err != nil {
		t.Fatal(err)
	}
	net, err := New(ops, train.ModelConfig{Spec: cnn, Batch: 8, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer net.Close()
	if size == 1 && graph {
		t.Log(net.Device())
	}
	o, err := net.Optimizer(train.NewAdam(1e-3))
	if err != nil {
		t.Fatal(err)
	}
	net.Graph = graph
	r := train.NewReplica(net, o, ring{size: size})
	rng := rand.New(rand.NewPCG(3, 3))
	var losses []float32
	for s, n := range []int{8, 8, 8, 5, 8, 8} {
		x, y := batchOf(rng, n, 784, 10)
		loss, err := r.Step(context.Background(), x, y, n)
		if err != nil {
			t.Fatalf("step %d: %v", s, err)
		}
		losses = append(losses, loss)
	}
	return clone(net.Params()), losses
}

// TestCUDALayersHandedOverBeside: on the GPU, ForwardBackwardLayers into
// FlatBuffer's memory (each layer's copy on the copies' stream, ordered
// after its gradients by an event) hands over ForwardBackwardFlat's bits
// for the same batch, each layer final when ready is called; a fresh
// batch each round, so a copy that ran before its gradients were
// computed would hand over the last round's; and Close, after a captured
// pass, says nothing went wrong.
func TestCUDALayersHandedOverBeside(t *testing.T) {
	c := newCUDAOrSkip(t)
	cnn, err := train.BuiltinSpec("cnn", 1, 28, 28, 10)
	if err != nil {
		t.Fatal(err)
	}
	net, err := New(c, train.ModelConfig{Spec: cnn, Batch: 64, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	flat, err := net.FlatBuffer(net.nparams)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]float32, net.nparams)
	rng := rand.New(rand.NewPCG(5, 5))
	for round := range 8 {
		x, y := batchOf(rng, 64, 784, 10)
		if _, bad, err := net.ForwardBackwardFlat(x, y, 64, want); err != nil || bad >= 0 {
			t.Fatalf("round %d: ForwardBackwardFlat: bad %d, %v", round, bad, err)
		}
		var los []int
		_, err := net.ForwardBackwardLayers(x, y, 64, flat, func(lo int) error {
			los = append(los, lo)
			if !slices.Equal(flat[lo:], want[lo:]) {
				t.Errorf("round %d: handed over from %d: values differ from the whole pass's", round, lo)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if !slices.Equal(los, net.LayerBounds()) {
			t.Errorf("round %d: handed over at %v; want %v", round, los, net.LayerBounds())
		}
	}
	// Close frees the graph, its events and the copies' stream in turn.
	if err := net.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestCUDAStageGrads is TestStageGrads on the GPU (the staged parts on
// the copies' stream, the rest sent by the optimizer step), for the mlp:
// linear layers alone, so that the two nets compared compute the same
// bits (cuDNN might time different algorithms fastest on each).
func TestCUDAStageGrads(t *testing.T) {
	mlp, err := train.BuiltinSpec("mlp", 1, 28, 28, 10)
	if err != nil {
		t.Fatal(err)
	}
	checkStageGrads(t, func() Ops { return newCUDAOrSkip(t) }, train.ModelConfig{Spec: mlp, Batch: 64, Seed: 3}, 784, 10)
}

// TestCUDATrainingIsDeterministicAndMatchesHost: the cnn (Adam), with its
// convolutions by cuDNN and by im2col and cuBLAS, and a 2-block GPT (embedding, layernorm, attention by strided batched
// products, GELU, residual adds; AdamW) trained on the GPU give the same
// bits whether each step is replayed from a graph or run call by call, on
// a ring of one or through the flat buffer, and run after run; and they
// stay within float32 noise of the Host engine.
func TestCUDATrainingIsDeterministicAndMatchesHost(t *testing.T) {
	for _, m := range []struct {
		name  string
		train func(*testing.T, Ops, int, bool) ([][]float32, []float32)
		cuDNN string
	}{{"cnn", trainCNN, ""}, {"cnn, im2col", trainCNN, "off"}, {"gpt", trainGPT, ""}} {
		t.Run(m.name, func(t *testing.T) {
			t.Setenv("RINGTRAIN_CUDNN", m.cuDNN)
			deterministicAndNearHost(t, m.train)
		})
	}
}

func deterministicAndNearHost(t *testing.T, trainOn func(*testing.T, Ops, int, bool) ([][]float32, []float32)) {
	run := func(size int, graph bool) ([][]float32, []float32) {
		c := newCUDAOrSkip(t)
		return trainOn(t, c, size, graph)
	}
	ref, refLoss := run(1, true)
	for _, tc := range []struct {
		name  string
		size  int
		graph bool
	}{{"again", 1, true}, {"no graph", 1, false}, {"flat buffer", 2, false}, {"flat buffer replayed", 2, true}} {
		got, loss := run(tc.size, tc.graph)
		if !equalParams(got, ref) {
			t.Errorf("%s: parameters differ from the graph-replayed run's", tc.name)
		}
		for i := range loss {
			if loss[i] != refLoss[i] {
				t.Errorf("%s: loss %d = %v; want %v", tc.name, i, loss[i], refLoss[i])
			}
		}
	}
	// Against Host, float32 noise: Adam divides each gradient by its own
	// size, so where a gradient is near 0 the noise can flip an update's
	// sign — up to 2·lr per step, 6 steps here — while the losses agree.
	host, hostLoss := trainOn(t, Host{}, 1, true)
	for i := range host {
		worst := 0.0
		for j := range host[i] {
			worst = max(worst, math.Abs(float64(host[i][j]-ref[i][j])))
		}
		if worst > 12e-3 {
			t.Errorf("tensor %d: GPU and Host differ by up to %.2e", i, worst)
		}
	}
	for i := range hostLoss {
		if d := math.Abs(float64(hostLoss[i]-refLoss[i])) / math.Abs(float64(hostLoss[i])); d > 1e-4 {
			t.Errorf("loss %d: GPU %v, Host %v", i, refLoss[i], hostLoss[i])
		}
	}
	t.Logf("losses: GPU %v, Host %v", refLoss, hostLoss)
}

// TestCUDAConvolvesLikeIm2col: cuDNN's three directions, planned for the
// cnn's two convolutions (batch 8), a padded 3×3 and an unpadded 2×2 one,
// give the definition's values (the tests' directHost, itself checked
// against im2col) within float32 summation order, and the same bits run
// after run.
func TestCUDAConvolvesLikeIm2col(t *testing.T) {
	c := newCUDAOrSkip(t)
	defer c.Close()
	if !c.dnn.ok {
		t.Skip(c.DNN())
	}
	t.Log(c.DNN())
	rng := rand.New(rand.NewPCG(12, 12))
	rnd := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	type shape struct {
		g          Conv
		out, batch int
		filter     string // RINGTRAIN_CUDNN_FILTER: the weights' gradient by cuDNN, by im2col and a GEMM, or the faster
	}
	var shapes []shape
	for _, f := range []string{"cudnn", "gemm", ""} {
		for _, s := range []shape{{NewConv(1, 28, 28, 5, 2), 32, 8, f}, {NewConv(32, 14, 14, 5, 2), 64, 8, f}, {NewConv(3, 9, 7, 3, 1), 4, 5, f}, {NewConv(2, 5, 5, 2, 0), 3, 3, f}} {
			shapes = append(shapes, s)
		}
	}
	for _, tc := range shapes {
		g := tc.g
		t.Setenv("RINGTRAIN_CUDNN_FILTER", tc.filter)
		nx, nw, ny := tc.batch*g.C*g.H*g.W, tc.out*g.ColRows(), tc.batch*tc.out*g.ColCols()
		x, w, dy := rnd(nx), rnd(nw), rnd(ny)
		d := &directHost{}
		hp, _ := d.ConvPlan(g, tc.out, tc.batch)
		want := [][]float32{make([]float32, ny), make([]float32, nx), make([]float32, nw)}
		if err := errors.Join(d.ConvForward(hp, hostBuf(x), hostBuf(w), hostBuf(want[0])),
			d.ConvBackwardData(hp, hostBuf(w), hostBuf(dy), hostBuf(want[1])),
			d.ConvBackwardFilter(hp, hostBuf(x), hostBuf(dy), hostBuf(want[2]))); err != nil {
			t.Fatal(err)
		}
		p, err := c.ConvPlan(g, tc.out, tc.batch)
		if err != nil {
			t.Fatal(err)
		}
		if byGEMM := c.dnn.gemm[p].batch > 0; tc.filter != "" && byGEMM != (tc.filter == "gemm") {
			t.Fatalf("%+v: filter %q, yet by GEMM %v", g, tc.filter, byGEMM)
		}
		run := func() [][]float32 {
			bufs := make([]Buf, 6)
			for i, v := range [][]float32{x, w, dy, want[0], want[1], want[2]} {
				if bufs[i], err = c.Alloc(len(v)); err != nil {
					t.Fatal(err)
				}
				if i < 3 {
					if err := c.Upload(bufs[i], v); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := errors.Join(c.ConvForward(p, bufs[0], bufs[1], bufs[3]), c.ConvBackwardData(p, bufs[1], bufs[2], bufs[4]),
				c.ConvBackwardFilter(p, bufs[0], bufs[2], bufs[5]), c.Sync()); err != nil {
				t.Fatal(err)
			}
			got := make([][]float32, 3)
			for i := range got {
				got[i] = make([]float32, len(want[i]))
				if err := c.Download(got[i], bufs[3+i]); err != nil {
					t.Fatal(err)
				}
			}
			return got
		}
		got, again := run(), run()
		for i, what := range convDirections {
			if d := maxOfMax(want[i], got[i]); d > 1e-4 {
				t.Errorf("%+v, %d out, batch %d, filter %q: %s differs by %.2e of its largest value", g, tc.out, tc.batch, tc.filter, what, d)
			}
			if !slices.Equal(got[i], again[i]) {
				t.Errorf("%+v, filter %q: %s: another run, other bits", g, tc.filter, what)
			}
		}
	}
}

// maxOfMax is the largest difference of a and b over a's largest value.
func maxOfMax(a, b []float32) float64 {
	top, worst := 0.0, 0.0
	for i := range a {
		top = max(top, math.Abs(float64(a[i])))
		d := math.Abs(float64(a[i] - b[i]))
		if math.IsNaN(d) {
			return math.Inf(1)
		}
		worst = max(worst, d)
	}
	return worst / top
}

// TestCUDAOutOfMemory: a batch that cannot fit says so, with the sizes:
// a GPT of context 4096 at batch 1024, whose attention keeps 2^36
// probabilities (256 GiB), while each layer's output stays inside the
// spec's bound on values.
func TestCUDAOutOfMemory(t *testing.T) {
	c := newCUDAOrSkip(t)
	_, err := New(c, train.ModelConfig{Spec: train.GPTSpec(1, 128, 4, 4096), Batch: 1024, Seed: 1})
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("New of a GPT needing 256 GiB = %v; want ErrOutOfMemory", err)
	}
	t.Log(err)
}

// BenchmarkCUDAGPTOps times each of the GPT's device calls at
// torch_gpt.py's shape (batch 32, context 128, dim 128, 4 heads): where a
// step's time goes.
func BenchmarkCUDAGPTOps(tb *testing.B) {
	c := newCUDAOrSkip(tb)
	defer c.Close()
	// torch_gpt.py's default shape, and the larger one.
	for _, sh := range []struct {
		name          string
		B, T, C, H, V int
	}{{"L4d128T128B32", 32, 128, 128, 4, 256}, {"L6d384T256B64", 64, 256, 384, 6, 256}} {
		tb.Run(sh.name, func(tb *testing.B) { benchGPTOps(tb, c, sh.B, sh.T, sh.C, sh.H, sh.V) })
	}
}

func benchGPTOps(tb *testing.B, c *CUDA, B, T, C, H, V int) {
	t := tb
	R, d := B*T, C/H
	rng := rand.New(rand.NewPCG(1, 1))
	up := func(v []float32) Buf {
		b, err := c.Alloc(len(v))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Upload(b, v); err != nil {
			t.Fatal(err)
		}
		return b
	}
	toks := make([]float32, R)
	for i := range toks {
		toks[i] = float32(rng.IntN(V))
	}
	tok, x, y, dy, dx := up(toks), up(randn(rng, R*4*C)), up(randn(rng, R*4*C)), up(randn(rng, R*4*C)), up(randn(rng, R*4*C))
	g, b, stats := up(randn(rng, 4*C)), up(randn(rng, 4*C)), up(randn(rng, 2*R))
	table, pos := up(randn(rng, V*C)), up(randn(rng, T*C))
	probs, dprobs := up(randn(rng, B*H*T*T)), up(randn(rng, B*H*T*T))
	qkv := up(randn(rng, R*3*C))
	w, labels := up(randn(rng, 4*C*4*C)), up(toks)
	p, m, v, hyper, skip := up(randn(rng, 900000)), up(randn(rng, 900000)), up(randn(rng, 900000)), up([]float32{1e-3, 1, 0, 0.9, 0.95, 1e-8, 1, 0}), up([]float32{0})
	at := func(b Buf, off int) Buf { return c.Slice(b, off, b.Len()-off) }
	sl := func(b Buf, n int) Buf { return c.Slice(b, 0, n) }
	for _, op := range []struct {
		name string
		f    func() error
	}{
		{"embed", func() error { return c.Embed(tok, table, pos, sl(y, R*C), R, T, C) }},
		{"embed_grad", func() error { return c.EmbedGrad(tok, sl(dy, R*C), sl(x, V*C), sl(dx, T*C), R, T, C) }},
		{"layer_norm", func() error { return c.LayerNorm(sl(x, R*C), sl(g, C), sl(b, C), sl(y, R*C), stats, R, C) }},
		{"layer_norm_backward", func() error { return c.LayerNormBackward(sl(x, R*C), sl(g, C), stats, sl(dy, R*C), sl(dx, R*C), R, C) }},
		{"normalized_product", func() error { return c.NormalizedProduct(sl(x, R*C), stats, sl(dy, R*C), sl(y, R*C), R, C) }},
		{"gelu 4C", func() error { return c.GELU(x, y) }},
		{"gelu_backward 4C", func() error { return c.GELUBackward(x, dy, dx) }},
		{"causal_softmax", func() error { return c.CausalSoftmax(probs, B*H*T, T) }},
		{"causal_softmax_backward", func() error { return c.CausalSoftmaxBackward(probs, dprobs, B*H*T, T) }},
		{"scores, one head", func() error {
			return c.GemmStrided(false, true, T, T, d, 0.1, qkv, 3*C, T*3*C, at(qkv, C), 3*C, T*3*C, 0, probs, T, H*T*T, B)
		}},
		{"linear C→3C", func() error { return c.Gemm(false, false, R, 3*C, C, sl(x, R*C), sl(w, C*3*C), 0, sl(y, R*3*C)) }},
		{"linear weight grad C→4C", func() error { return c.Gemm(true, false, C, 4*C, R, sl(x, R*C), dy, 0, sl(w, C*4*C)) }},
		{"bias_add 4C", func() error { return c.BiasAdd(y, sl(b, 4*C), R, 4*C, 1) }},
		{"bias_grad 4C", func() error { return c.BiasGrad(dy, sl(b, 4*C), R, 4*C, 1) }},
		{"add", func() error { return c.Add(sl(x, R*C), sl(y, R*C), sl(dx, R*C)) }},
		{"softmax_xent", func() error { return c.SoftmaxXent(sl(x, R*V), labels, sl(dx, R*V), sl(y, R), R, R, V) }},
		{"adam 0.9M", func() error { return c.Adam(p, m, v, at(v, 0), hyper, skip) }},
	} {
		tb.Run(op.name, func(b *testing.B) {
			// The calls are queued: the time is theirs only with the wait
			// for the last inside the timed part.
			for range b.N {
				if err := op.f(); err != nil {
					b.Fatalf("%s: %v", op.name, err)
				}
			}
			if err := c.Sync(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkCUDACNNLayers times each layer's calls of the cnn at batch 256
// — its forward, its parameters' gradients, its input's gradient — and a
// whole step (ForwardBackward, the batch in and the loss out): where a
// step's time goes, with cuDNN's convolutions or, under
// RINGTRAIN_CUDNN=off, im2col's.
// BenchmarkCUDACNNLayers times each call of a step of the cnn at batch
// 256, and the step; BenchmarkCUDAGPTLayers the large GPT's (6 × 384,
// context 256, batch 64) in FP32 and in TF32.
func BenchmarkCUDACNNLayers(tb *testing.B) {
	cnn, err := train.BuiltinSpec("cnn", 1, 28, 28, 10)
	if err != nil {
		tb.Fatal(err)
	}
	x, y := batchOf(rand.New(rand.NewPCG(1, 1)), 256, 784, 10)
	benchLayers(tb, newCUDAOrSkip(tb), cnn, 256, x, y)
}

func BenchmarkCUDAGPTLayers(tb *testing.B) {
	const B, T = 64, 256
	rng := rand.New(rand.NewPCG(1, 1))
	x, y := make([]float32, B*T), make([]int, B*T)
	for i := range x {
		x[i], y[i] = float32(rng.IntN(256)), rng.IntN(256)
	}
	for _, tf32 := range []bool{false, true} {
		tb.Run(map[bool]string{false: "fp32", true: "tf32"}[tf32], func(tb *testing.B) {
			c, err := NewCUDA(0, CUDAOptions{TF32: tf32})
			if err != nil {
				tb.Fatalf("NewCUDA: %v", err)
			}
			benchLayers(tb, c, train.GPTSpec(6, 384, 6, T), B, x, y)
		})
	}
}

// benchLayers times each layer's forward and backward calls of spec's
// net on c, then whole forward-backward steps; it closes c.
func benchLayers(tb *testing.B, c *CUDA, spec train.Spec, batch int, x []float32, y []int) {
	net, err := New(c, train.ModelConfig{Spec: spec, Batch: batch, Seed: 1})
	if err != nil {
		c.Close()
		tb.Fatal(err)
	}
	defer net.Close()
	if _, err := net.ForwardBackward(x, y, batch); err != nil {
		tb.Fatal(err)
	}
	timed := func(name string, f func() error) {
		tb.Run(name, func(b *testing.B) {
			for range b.N {
				if err := f(); err != nil {
					b.Fatal(err)
				}
			}
			// The calls are queued: the wait for the last is inside the time.
			if err := c.Sync(); err != nil {
				b.Fatal(err)
			}
		})
	}
	for i, ly := range net.layers {
		timed(fmt.Sprintf("%d %s forward", i, ly.kind), func() error { return net.forwardLayer(i) })
		timed(fmt.Sprintf("%d %s params", i, ly.kind), func() error { return net.backwardParams(i) })
		timed(fmt.Sprintf("%d %s input", i, ly.kind), func() error { return net.backwardInput(i) })
	}
	timed("step", func() error { _, err := net.ForwardBackward(x, y, batch); return err })
}
