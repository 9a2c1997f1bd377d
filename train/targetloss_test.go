package train

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ringtrain/ringtrain/data"
)

// TestTargetLossValues checks MSE and BCE against the formulas, from the
// model's own outputs, on a short batch whose padding must add nothing:
// the mean over the n real rows and the K outputs, as torch's MSELoss and
// BCELoss give.
func TestTargetLossValues(t *testing.T) {
	for _, loss := range []Loss{MSE, BCE} {
		t.Run(string(loss), func(t *testing.T) {
			spec := Spec{Input: []int{2}, Loss: loss, Layers: []Layer{
				{Type: "linear", Out: 6}, {Type: "tanh"}, {Type: "linear", Out: 3}, {Type: "sigmoid"},
			}}
			const n, k, w = 5, 3, 5 // samples, targets, row values
			m := newMLP(t, ModelConfig{Spec: spec, Batch: 8, Seed: 3})
			rng := rand.New(rand.NewPCG(1, 2))
			x := make([]float32, n*w)
			for i := range x {
				x[i] = rng.Float32()
			}
			got, err := m.ForwardBackward(x, make([]int, n), n)
			if err != nil {
				t.Fatal(err)
			}
			out := m.Logits()
			var want float64
			for r := range n {
				for j := range k {
					p, y := float64(out[r*k+j]), float64(x[r*w+2+j])
					if loss == MSE {
						want += (p - y) * (p - y)
					} else {
						want -= y*math.Log(p) + (1-y)*math.Log(1-p)
					}
				}
			}
			want /= n * k
			if math.Abs(float64(got)-want) > 1e-6*want {
				t.Errorf("loss %v; the formula gives %v", got, want)
			}
		})
	}
}

// TestBCEHoldsItsLogs: an output of exactly 0 or 1 against the other
// target costs 100 a value, as torch's BCELoss, not infinity or NaN, and
// its gradient is finite.
func TestBCEHoldsItsLogs(t *testing.T) {
	scale, live := float32(1), 1
	k := targetLoss{loss: BCE, k: 2, scale: &scale, live: &live}
	p, y := []float32{0, 1}, []float32{1, 0}
	out := make([]float32, 1)
	if err := k.forward(out, [][]float32{p, y}); err != nil {
		t.Fatal(err)
	}
	if out[0] != 100 {
		t.Errorf("loss %v; want 100", out[0])
	}
	d := make([]float32, 2)
	if err := k.backward([][]float32{d, nil}, []float32{1}, [][]float32{p, y}, out); err != nil {
		t.Fatal(err)
	}
	for _, g := range d {
		if math.IsNaN(float64(g)) || math.IsInf(float64(g), 0) {
			t.Errorf("gradient %v; want finite values", d)
		}
	}
}

// TestTargetLossSpecErrors: a loss that is not known, or float targets
// on outputs that are not one flat row, is refused when the spec is read.
func TestTargetLossSpecErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		spec Spec
		want string
	}{
		{"unknown", Spec{Input: []int{2}, Loss: "hinge", Layers: []Layer{{Type: "linear", Out: 2}}}, `loss "hinge"`},
		{"images", Spec{Input: []int{1, 4, 4}, Loss: MSE, Layers: []Layer{{Type: "flatten"}, {Type: "linear", Out: 1}}}, "want [features]"},
		{"positions", Spec{Input: []int{8}, Loss: BCE, Layers: []Layer{{Type: "embedding", Out: 4, Vocab: 256}, {Type: "linear", Out: 1}}}, "flat vector of outputs"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.spec.Shapes()
			if !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v; want ErrSpec saying %q", err, tt.want)
			}
		})
	}
	// One output is enough for a regression, where a classifier needs two.
	one := Spec{Input: []int{1}, Loss: MSE, Layers: []Layer{{Type: "linear", Out: 1}}}
	if _, err := one.Shapes(); err != nil {
		t.Errorf("one output with mse: %v", err)
	}
	if got := one.RowValues(); got != 2 {
		t.Errorf("RowValues %d; want 2 (a feature, a target)", got)
	}
}

// TestEvaluateTargets: evaluation over a table scores the mean loss per
// sample, and, for BCE, the share of samples whose every output is on its
// target's side of ½. With every weight 0 the output is ½ (taken as 1):
// the loss is ln 2 and the accuracy the share of targets of 1.
func TestEvaluateTargets(t *testing.T) {
	spec := Spec{Input: []int{2}, Loss: BCE, Layers: []Layer{{Type: "linear", Out: 1}, {Type: "sigmoid"}}}
	m := newMLP(t, ModelConfig{Spec: spec, Batch: 2, Seed: 1})
	for _, p := range m.Params() {
		clear(p)
	}
	tb := &data.Table{Source: "t", Columns: []string{"a", "b", "y"}, Features: 2, Targets: 1,
		Rows: []float32{1, 2, 1, 3, 4, 0, 5, 6, 1, 7, 8, 1, 9, 0, 0}}
	s := &data.Split{Dataset: &data.Dataset{Source: "t"}, Pipeline: &data.Pipeline{}, C: 2, H: 1, W: 1, Table: tb}
	l := &data.Loader{Split: s, Sampler: data.Sampler{N: s.Len(), World: 1, Exact: true}, BatchSize: 2}
	e, err := l.Epoch(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	r, err := Evaluate(m, e, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Samples != 5 || r.Accuracy != 0.6 || math.Abs(r.Loss-math.Ln2) > 1e-6 {
		t.Errorf("%d samples, accuracy %v, loss %v; want 5, 0.6, ln 2", r.Samples, r.Accuracy, r.Loss)
	}
}
