package train

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// Specs that use every layer type, on shapes small enough for finite
// differences, with the step h of each. ReLU and max-pool have kinks that a
// large step upstream of them can cross, which spoils the difference
// quotient (not the gradient), so their spec takes a smaller step.
var gradSpecs = []struct {
	Spec
	h        float64
	batch, n int // n < batch: the padded rows must add nothing
}{
	{MLPSpec(12, []int{16, 8}, 5), 1e-2, 4, 3},
	{Spec{Input: []int{2, 6, 6}, Layers: []Layer{
		{Type: "conv2d", Out: 3, Kernel: 3, Pad: 1}, {Type: "tanh", Save: "a"},
		{Type: "conv2d", Out: 3, Kernel: 3, Pad: 1}, {Type: "add", From: "a"}, {Type: "flatten"},
		{Type: "linear", Out: 5}, {Type: "sigmoid"}, {Type: "linear", Out: 4},
	}}, 1e-2, 3, 3},
	{Spec{Input: []int{2, 6, 6}, Layers: []Layer{
		{Type: "conv2d", Out: 3, Kernel: 3, Pad: 1}, {Type: "relu"}, {Type: "maxpool2d", Kernel: 2},
		{Type: "flatten"}, {Type: "linear", Out: 4},
	}}, 1e-3, 3, 3},
}

// TestEveryLayerGradient checks the gradient of every parameter tensor
// against central finite differences.
func TestEveryLayerGradient(t *testing.T) {
	for _, tt := range gradSpecs {
		t.Run(tt.String(), func(t *testing.T) { checkGradients(t, tt.Spec, tt.h, tt.batch, tt.n) })
	}
}

func checkGradients(t *testing.T, spec Spec, h float64, batch, n int) {
	m := newMLP(t, ModelConfig{Spec: spec, Batch: batch, Seed: 2})
	shapes, err := spec.Shapes()
	if err != nil {
		t.Fatal(err)
	}
	inputs := 1
	for _, d := range spec.Input {
		inputs *= d
	}
	rng := rand.New(rand.NewPCG(5, 5))
	x, y := randomBatch(rng, n, inputs, shapes[len(shapes)-1][0])
	if _, err := m.ForwardBackward(x, y, n); err != nil {
		t.Fatal(err)
	}
	var grads [][]float32
	for _, g := range m.Grads() {
		grads = append(grads, append([]float32(nil), g...))
	}
	loss := func() float64 {
		l, err := m.ForwardBackward(x, y, n)
		if err != nil {
			t.Fatal(err)
		}
		return float64(l)
	}
	for ti, p := range m.Params() {
		for j := range p {
			old := p[j]
			p[j] = old + float32(h)
			up := loss()
			p[j] = old - float32(h)
			down := loss()
			p[j] = old
			fd := (up - down) / (2 * h)
			if got := float64(grads[ti][j]); math.Abs(got-fd) > 2e-3+1e-2*math.Abs(fd) {
				t.Errorf("%s[%d]: gradient %g; finite difference %g", m.ParamNames()[ti], j, got, fd)
			}
		}
	}
}

func TestSpecErrorsNameTheLayer(t *testing.T) {
	tests := []struct {
		name  string
		spec  Spec
		words string
	}{
		{"linear on images", Spec{Input: []int{1, 4, 4}, Layers: []Layer{{Type: "linear", Out: 3}}}, "layer 0 (linear): input [1 4 4] is not flat"},
		{"conv on flat", Spec{Input: []int{16}, Layers: []Layer{{Type: "conv2d", Out: 3, Kernel: 3}}}, "layer 0 (conv2d): input [16] is not C×H×W"},
		{"kernel too big", Spec{Input: []int{1, 4, 4}, Layers: []Layer{{Type: "conv2d", Out: 3, Kernel: 7}}}, "does not fit"},
		{"add unknown", Spec{Input: []int{4}, Layers: []Layer{{Type: "linear", Out: 4}, {Type: "add", From: "x"}}}, `layer 1 (add): from "x"`},
		{"add mismatch", Spec{Input: []int{4}, Layers: []Layer{{Type: "linear", Out: 4, Save: "a"}, {Type: "linear", Out: 3}, {Type: "add", From: "a"}}}, "of shape [4] to shape [3]"},
		{"unknown type", Spec{Input: []int{4}, Layers: []Layer{{Type: "lstm"}}}, "layer 0 (lstm): unknown type"},
		{"ends in images", Spec{Input: []int{1, 4, 4}, Layers: []Layer{{Type: "relu"}}}, "flat vector"},
	}
	for _, tt := range tests {
		_, err := NewModel(ModelConfig{Spec: tt.spec, Batch: 2})
		if !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), tt.words) {
			t.Errorf("%s: NewModel = %v; want ErrSpec saying %q", tt.name, err, tt.words)
		}
	}
	if _, err := BuiltinSpec("resnet", 1, 28, 28, 10); !errors.Is(err, ErrSpec) {
		t.Errorf("BuiltinSpec(resnet) = %v; want ErrSpec", err)
	}
}

// TestCNNLearns: the built-in cnn's loss falls over a few steps on the real
// subset, and a small conv net learns it well above chance in a short run.
func TestCNNLearns(t *testing.T) {
	ctx := context.Background()
	spec, err := BuiltinSpec("cnn", 1, 28, 28, 10)
	if err != nil {
		t.Fatal(err)
	}
	cnn := NewReplica(newMLP(t, ModelConfig{Spec: spec, Batch: 16, Seed: 1}), &SGD{LR: 0.01, Momentum: 0.9}, solo(t))
	e, err := loader(t, "train", 16, true).Epoch(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var first, last float32
	for i := range 12 {
		b, err := e.Next()
		if err != nil {
			t.Fatal(err)
		}
		loss, err := cnn.Step(ctx, b.X, b.Y, b.N)
		if err != nil {
			t.Fatal(err)
		}
		if i < 3 {
			first += loss / 3
		}
		if i >= 9 {
			last += loss / 3
		}
	}
	e.Close()
	if !(last < first*0.9) {
		t.Errorf("cnn loss over the first 3 steps %.3f, last 3 %.3f; want it falling", first, last)
	}

	small := Spec{Input: []int{1, 28, 28}, Layers: []Layer{
		{Type: "conv2d", Out: 8, Kernel: 3, Pad: 1}, {Type: "relu"}, {Type: "maxpool2d", Kernel: 4},
		{Type: "flatten"}, {Type: "linear", Out: 10},
	}}
	m := newMLP(t, ModelConfig{Spec: small, Batch: 32, Seed: 1})
	s, err := Run(ctx, RunConfig{Replica: NewReplica(m, &SGD{LR: 0.05, Momentum: 0.9}, solo(t)),
		Train: loader(t, "train", 32, true), Test: loader(t, "test", 32, false), Epochs: 1, Classes: 10})
	if err != nil {
		t.Fatal(err)
	}
	if s.TestAccuracy < 0.6 {
		t.Errorf("small conv net: test accuracy %.3f after one epoch; want ≥ 0.6", s.TestAccuracy)
	}
}
