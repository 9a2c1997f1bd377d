package train

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
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
	{Spec{Input: []int{12}, Layers: []Layer{
		{Type: "linear", Out: 16}, {Type: "tanh"}, {Type: "dropout", P: 0.4}, {Type: "linear", Out: 5},
	}}, 1e-2, 4, 3},
	// Float targets after each row's features; for BCE, probabilities.
	{Spec{Input: []int{3}, Loss: MSE, Layers: []Layer{
		{Type: "linear", Out: 8}, {Type: "tanh", Save: "a"}, {Type: "linear", Out: 8}, {Type: "add", From: "a"},
		{Type: "linear", Out: 2},
	}}, 1e-2, 4, 3},
	{Spec{Input: []int{3}, Loss: BCE, Layers: []Layer{
		{Type: "linear", Out: 8}, {Type: "tanh"}, {Type: "linear", Out: 2}, {Type: "sigmoid"},
	}}, 1e-2, 4, 3},
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
	rng := rand.New(rand.NewPCG(5, 5))
	x, y := randomBatch(rng, n, spec.RowValues(), shapes[len(shapes)-1][0])
	// Dropout's masks are part of the function being differentiated:
	// every evaluation below draws the same ones.
	seed := func() {
		if s, ok := m.(MaskSeeder); ok {
			s.SeedMasks(7)
		}
	}
	seed()
	if _, err := m.ForwardBackward(x, y, n); err != nil {
		t.Fatal(err)
	}
	var grads [][]float32
	for _, g := range m.Grads() {
		grads = append(grads, append([]float32(nil), g...))
	}
	loss := func() float64 {
		seed()
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
		{"dropout without p", Spec{Input: []int{4}, Layers: []Layer{{Type: "dropout"}, {Type: "linear", Out: 3}}}, "layer 0 (dropout): p 0; want the share"},
		{"dropout of all", Spec{Input: []int{4}, Layers: []Layer{{Type: "linear", Out: 3}, {Type: "dropout", P: 1}}}, "layer 1 (dropout): p 1;"},
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

// TestForwardOnly: Forward gives ForwardBackward's loss and logits, leaves
// the gradients alone, and runs without dropout — the same as the network
// with its dropout layers taken out.
func TestForwardOnly(t *testing.T) {
	plain := MLPSpec(12, []int{16}, 5)
	dropped := plain
	dropped.Layers = []Layer{plain.Layers[0], plain.Layers[1], {Type: "dropout", P: 0.5}, plain.Layers[2]}
	rng := rand.New(rand.NewPCG(3, 3))
	x, y := randomBatch(rng, 3, 12, 5)

	m := newMLP(t, ModelConfig{Spec: plain, Batch: 4, Seed: 2})
	fbLoss, err := m.ForwardBackward(x, y, 3)
	if err != nil {
		t.Fatal(err)
	}
	fbLogits := slices.Clone(m.Logits())
	var grads [][]float32
	for _, g := range m.Grads() {
		grads = append(grads, slices.Clone(g))
	}
	// Another batch through Forward must not touch the gradients.
	x2, y2 := randomBatch(rng, 4, 12, 5)
	if _, err := m.Forward(x2, y2, 4); err != nil {
		t.Fatal(err)
	}
	for i, g := range m.Grads() {
		if !slices.Equal(g, grads[i]) {
			t.Fatalf("Forward changed the gradient of %s", m.ParamNames()[i])
		}
	}
	fLoss, err := m.Forward(x, y, 3)
	if err != nil {
		t.Fatal(err)
	}
	if fLoss != fbLoss || !slices.Equal(m.Logits(), fbLogits) {
		t.Errorf("Forward: loss %v, logits %v; ForwardBackward: %v, %v", fLoss, m.Logits(), fbLoss, fbLogits)
	}

	d := newMLP(t, ModelConfig{Spec: dropped, Batch: 4, Seed: 2})
	if _, err := d.ForwardBackward(x, y, 3); err != nil { // leaves a random mask behind
		t.Fatal(err)
	}
	dLoss, err := d.Forward(x, y, 3)
	if err != nil {
		t.Fatal(err)
	}
	if dLoss != fLoss {
		t.Errorf("Forward with dropout: loss %v; without the layer: %v", dLoss, fLoss)
	}
}

// TestDropoutMasks: a training mask zeroes about p of the values and scales
// the rest by 1/(1−p); the same seed draws the same mask, another seed
// another one.
func TestDropoutMasks(t *testing.T) {
	spec := Spec{Input: []int{64}, Layers: []Layer{{Type: "linear", Out: 1024}, {Type: "relu"}, {Type: "dropout", P: 0.25}, {Type: "linear", Out: 10}}}
	m := newMLP(t, ModelConfig{Spec: spec, Batch: 64, Seed: 1})
	gm := m.(*graphModel)
	rng := rand.New(rand.NewPCG(1, 1))
	x, y := randomBatch(rng, 64, 64, 10)
	draw := func(seed uint64) ([]float32, float32) {
		gm.SeedMasks(seed)
		l, err := m.ForwardBackward(x, y, 64)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Clone(gm.drops[0].mask), l
	}
	mask, loss := draw(1)
	zeros := 0
	for _, v := range mask {
		switch v {
		case 0:
			zeros++
		case 1 / 0.75:
		default:
			t.Fatalf("mask value %v; want 0 or %v", v, 1/0.75)
		}
	}
	if share := float64(zeros) / float64(len(mask)); math.Abs(share-0.25) > 0.01 {
		t.Errorf("%.4f of the mask dropped; want 0.25", share)
	}
	if again, l := draw(1); !slices.Equal(again, mask) || l != loss {
		t.Error("the same seed drew another mask")
	}
	if other, l := draw(2); slices.Equal(other, mask) || l == loss {
		t.Error("another seed drew the same mask")
	}
}

// TestSpecBounds: dimensions that would make a model too big to allocate
// — from a job config or a checkpoint's header — are refused before any
// allocation, naming the limit; NewModel returns the error, no panic.
func TestSpecBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  ModelConfig
	}{
		{"a huge linear", ModelConfig{Batch: 1, Spec: MLPSpec(784, []int{1 << 27}, 10)}},
		{"a huge input", ModelConfig{Batch: 1, Spec: Spec{Input: []int{1 << 20, 1 << 20, 1}, Layers: []Layer{{Type: "flatten"}, {Type: "linear", Out: 2}}}}},
		{"a huge pad", ModelConfig{Batch: 1, Spec: Spec{Input: []int{1, 8, 8}, Layers: []Layer{{Type: "conv2d", Out: 2, Kernel: 3, Pad: 1 << 40}, {Type: "flatten"}, {Type: "linear", Out: 2}}}}},
		{"a huge conv output", ModelConfig{Batch: 1, Spec: Spec{Input: []int{1, 8, 8}, Layers: []Layer{{Type: "conv2d", Out: 1 << 30, Kernel: 3}, {Type: "flatten"}, {Type: "linear", Out: 2}}}}},
		{"too many parameters", ModelConfig{Batch: 1, Spec: MLPSpec(1<<14, []int{1 << 14, 1 << 14, 1 << 14, 1 << 14, 1 << 14}, 10)}},
		{"a huge batch", ModelConfig{Batch: 1 << 30, Spec: MLPSpec(784, []int{16}, 10)}},
	} {
		_, err := tc.cfg.Shapes()
		if !errors.Is(err, ErrSpec) {
			t.Errorf("%s: Shapes = %v; want ErrSpec", tc.name, err)
			continue
		}
		if _, err := NewModel(tc.cfg); err == nil {
			t.Errorf("%s: NewModel built it", tc.name)
		}
	}
	sizes, err := MLPSpec(784, []int{256, 128}, 10).ParamSizes()
	if want := []int{784 * 256, 256, 256 * 128, 128, 1280, 10}; err != nil || !slices.Equal(sizes, want) {
		t.Errorf("ParamSizes = %v, %v; want %v", sizes, err, want)
	}
}
