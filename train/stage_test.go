package train

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// residualSpec is a small MLP whose residuals can be cut across stages.
func residualSpec() Spec {
	return Spec{Input: []int{12}, Layers: []Layer{
		{Type: "linear", Out: 16}, {Type: "relu", Save: "a"},
		{Type: "linear", Out: 16}, {Type: "tanh"}, {Type: "add", From: "a", Save: "b"},
		{Type: "linear", Out: 16}, {Type: "relu"}, {Type: "add", From: "b"},
		{Type: "linear", Out: 16}, {Type: "sigmoid"}, {Type: "add", From: "a"},
		{Type: "linear", Out: 5},
	}}
}

// A whole model as one stage computes what NewModel's does, bit for bit.
func TestWholeStageIsTheModel(t *testing.T) {
	cfg := ModelConfig{Spec: residualSpec(), Batch: 8, Seed: 3}
	m, err := NewModel(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := NewStage(StageConfig{Model: cfg, Lo: 0, Hi: len(cfg.Spec.Layers)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, rows := range []int{8, 5} {
		x, y := randomBatch(rand.New(rand.NewPCG(uint64(rows), 1)), rows, 12, 5)
		want, err := m.ForwardBackward(x, y, rows)
		if err != nil {
			t.Fatal(err)
		}
		s.ZeroGrads()
		if err := s.SetLossScale(1 / float32(rows)); err != nil {
			t.Fatal(err)
		}
		_, got, err := s.Backward(0, [][]float32{x}, Labels{Class: y}, rows, nil)
		if err != nil {
			t.Fatal(err)
		}
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Errorf("rows %d: loss %v; the model's %v", rows, got, want)
		}
		for i, g := range m.Grads() {
			for j := range g {
				if math.Float32bits(g[j]) != math.Float32bits(s.Grads()[i][j]) {
					t.Fatalf("rows %d: %s[%d] = %v; the model's %v", rows, s.ParamNames()[i], j, s.Grads()[i][j], g[j])
				}
			}
		}
	}
}

func TestStageCarries(t *testing.T) {
	spec := residualSpec()
	tests := []struct {
		lo   int
		want []string
	}{
		{1, []string{""}},
		{2, []string{"", "a"}},
		{5, []string{"", "a", "b"}},
		{8, []string{"", "a"}},
		{11, []string{""}},
	}
	for _, tt := range tests {
		c, err := StageCarries(spec, tt.lo)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, x := range c {
			got = append(got, x.Name)
		}
		if len(got) != len(tt.want) {
			t.Errorf("before layer %d: %q; want %q", tt.lo, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("before layer %d: %q; want %q", tt.lo, got, tt.want)
			}
		}
	}
}

// A stage's checkpoint holds its layers' parameters alone, says so, and
// is no model to predict with.
func TestStageCheckpoint(t *testing.T) {
	cfg := ModelConfig{Spec: residualSpec(), Batch: 4, Seed: 1}
	s, err := NewStage(StageConfig{Model: cfg, Lo: 5, Hi: 9})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	path := t.TempDir() + "/s.ckpt"
	c := &Checkpoint{Model: cfg, Layers: &[2]int{5, 9}, Params: s.Params()}
	if err := c.Save(path); err != nil {
		t.Fatal(err)
	}
	got, err := LoadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Params) != 4 || !errors.Is(got.Whole(), ErrStageCheckpoint) {
		t.Errorf("%d tensors, Whole %v; want 4 and ErrStageCheckpoint", len(got.Params), got.Whole())
	}
	c.Layers = &[2]int{5, 12} // more layers than the file holds
	if err := c.Save(path); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCheckpoint(path); !errors.Is(err, ErrCheckpoint) {
		t.Errorf("a stage checkpoint of the wrong layers: %v; want ErrCheckpoint", err)
	}
	c.Layers = &[2]int{9, 5}
	if err := c.Save(path); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCheckpoint(path); !errors.Is(err, ErrCheckpoint) {
		t.Errorf("a stage of layers [9, 5): %v; want ErrCheckpoint", err)
	}
}
