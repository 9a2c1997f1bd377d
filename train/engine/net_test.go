package engine

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ringtrain/ringtrain/train"
)

func batchOf(rng *rand.Rand, n, features, classes int) ([]float32, []int) {
	x := make([]float32, n*features)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	y := make([]int, n)
	for i := range y {
		y[i] = rng.IntN(classes)
	}
	return x, y
}

// pair builds cfg's model twice: the CPU model (gorgonia) and the engine
// on Host; both are closed when the test ends.
func pair(t *testing.T, cfg train.ModelConfig) (train.Model, *Net) {
	t.Helper()
	ref, err := train.NewModel(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ref.Close() })
	net, err := New(Host{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { net.Close() })
	return ref, net
}

// TestNetMatchesGorgonia: on the same parameters and batch, the engine on
// Host gives the gorgonia model's loss, logits and every gradient — for an
// mlp, a small conv net with a short batch, the built-in cnn, an mlp with
// residual adds (one add's output saved for the next), and GPTs
// (embedding, layernorm, attention, GELU, residual adds), full and short.
func TestNetMatchesGorgonia(t *testing.T) {
	cnn, err := train.BuiltinSpec("cnn", 1, 28, 28, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name     string
		spec     train.Spec
		batch, n int
	}{
		{"mlp", train.MLPSpec(12, []int{16, 8}, 5), 4, 3},
		{"conv", train.Spec{Input: []int{2, 6, 6}, Layers: []train.Layer{
			{Type: "conv2d", Out: 3, Kernel: 3, Pad: 1}, {Type: "relu"}, {Type: "maxpool2d", Kernel: 2},
			{Type: "conv2d", Out: 4, Kernel: 2}, {Type: "relu"},
			{Type: "flatten"}, {Type: "linear", Out: 4},
		}}, 3, 2},
		{"cnn", cnn, 2, 2},
		{"residual mlp", train.Spec{Input: []int{12}, Layers: []train.Layer{
			{Type: "linear", Out: 16, Save: "h"}, {Type: "relu"}, {Type: "linear", Out: 16},
			{Type: "add", From: "h", Save: "h2"}, {Type: "relu"}, {Type: "linear", Out: 16}, {Type: "add", From: "h2"},
			{Type: "linear", Out: 5},
		}}, 4, 3},
		{"gpt, 1 block, 1 head", train.GPTSpec(1, 8, 1, 4), 2, 2},
		{"gpt, 2 blocks, 2 heads", train.GPTSpec(2, 16, 2, 8), 3, 3},
		{"gpt, short batch", train.GPTSpec(2, 16, 4, 8), 3, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := train.ModelConfig{Spec: tt.spec, Batch: tt.batch, Seed: 3}
			ref, net := pair(t, cfg)
			if !slices.Equal(net.ParamNames(), ref.ParamNames()) {
				t.Fatalf("tensors %v; gorgonia's %v", net.ParamNames(), ref.ParamNames())
			}
			for i, p := range ref.Params() {
				if !slices.Equal(net.Params()[i], p) {
					t.Fatalf("%s starts unlike gorgonia's", net.ParamNames()[i])
				}
			}
			shapes, _ := tt.spec.Shapes()
			out := shapes[len(shapes)-1]
			classes := out[len(out)-1]
			rng := rand.New(rand.NewPCG(1, 2))
			var x []float32
			var y []int
			if tt.spec.Layers[0].Type == train.LayerEmbedding {
				x, y = tokensOf(rng, tt.n, tt.spec.Input[0], classes)
			} else {
				x, y = batchOf(rng, tt.n, len(net.xPin)/tt.batch, classes)
			}
			got := lossNearGorgonia(t, net, ref, x, y, tt.n)
			for i, v := range ref.Logits()[:len(y)*classes] {
				if g := net.Logits()[i]; math.Abs(float64(g-v)) > 1e-4*(1+math.Abs(float64(v))) {
					t.Fatalf("logit %d: %v; gorgonia %v", i, g, v)
				}
			}
			gradsNearGorgonia(t, net, ref)
			fwd, err := net.Forward(x, y, tt.n)
			if err != nil || fwd != got {
				t.Errorf("Forward = %v, %v; want ForwardBackward's loss %v", fwd, err, got)
			}
		})
	}
}

// lossNearGorgonia runs a forward and backward pass of both on the batch
// and returns net's loss, failing t unless it is ref's within 1e-5.
func lossNearGorgonia(t *testing.T, net *Net, ref train.Model, x []float32, y []int, n int) float32 {
	t.Helper()
	want, err := ref.ForwardBackward(x, y, n)
	if err != nil {
		t.Fatal(err)
	}
	got, err := net.ForwardBackward(x, y, n)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(float64(got-want)) > 1e-5*math.Abs(float64(want)) {
		t.Errorf("loss %v; gorgonia %v", got, want)
	}
	return got
}

// gradsNearGorgonia fails t unless net's gradients are ref's within
// float32 summation order, none of ref's all zeros.
func gradsNearGorgonia(t *testing.T, net *Net, ref train.Model) {
	t.Helper()
	for ti, ref := range ref.Grads() {
		top := 0.0
		for _, v := range ref {
			top = max(top, math.Abs(float64(v)))
		}
		if top == 0 {
			t.Fatalf("%s: gorgonia's gradient is all zeros", net.ParamNames()[ti])
		}
		for j, v := range ref {
			if g := net.Grads()[ti][j]; math.Abs(float64(g-v)) > max(1e-5+1e-3*math.Abs(float64(v)), 1e-4*top) {
				t.Fatalf("%s[%d]: gradient %v; gorgonia %v (largest %v)", net.ParamNames()[ti], j, g, v, top)
			}
		}
	}
}

func TestNetRefuses(t *testing.T) {
	spec := train.Spec{Input: []int{4}, Layers: []train.Layer{{Type: "linear", Out: 4}, {Type: "tanh"}, {Type: "linear", Out: 2}}}
	if _, err := New(Host{}, train.ModelConfig{Spec: spec, Batch: 2}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("tanh: New = %v; want ErrUnsupported", err)
	}
	mse := train.Spec{Input: []int{4}, Loss: train.MSE, Layers: []train.Layer{{Type: "linear", Out: 4}, {Type: "relu"}, {Type: "linear", Out: 1}}}
	if _, err := New(Host{}, train.ModelConfig{Spec: mse, Batch: 2}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("mse: New = %v; want ErrUnsupported", err)
	}
	net, err := New(Host{}, train.ModelConfig{Spec: train.MLPSpec(4, nil, 3), Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		x []float32
		y []int
		n int
	}{
		{make([]float32, 12), []int{0, 1, 2}, 3}, // more than the batch
		{make([]float32, 7), []int{0, 1}, 2},     // wrong size
		{make([]float32, 8), []int{0, 3}, 2},     // label out of range
	} {
		if _, err := net.ForwardBackward(tc.x, tc.y, tc.n); err == nil {
			t.Errorf("ForwardBackward(%d values, labels %v, n=%d) = nil error", len(tc.x), tc.y, tc.n)
		}
	}
}

func TestConvAlgos(t *testing.T) {
	for _, tc := range []struct {
		in      string
		anyAlgo bool
		bad     bool
	}{{"", false, false}, {"exact", false, false}, {"any", true, false}, {"fastest", false, true}, {"ANY", false, true}} {
		got, err := ConvAlgos(tc.in)
		if (err != nil) != tc.bad || got != tc.anyAlgo {
			t.Errorf("ConvAlgos(%q) = %v, %v; want %v, bad %v", tc.in, got, err, tc.anyAlgo, tc.bad)
		}
	}
}
