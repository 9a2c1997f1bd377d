package pipeline

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/ringtrain/ringtrain/train"
)

func TestConfigRefuses(t *testing.T) {
	spec := residualSpec() // 12 layers
	backward := residualSpec()
	backward.Layers[4].From = "c" // saved by no earlier layer
	backward.Layers[9].Save = "c"
	tests := []struct {
		name string
		cfg  Config
		spec train.Spec
		want string
	}{
		{"no stages", Config{Stages: 0, MicroBatches: 2}, spec, "stages 0"},
		{"more stages than layers", Config{Stages: 13, MicroBatches: 2}, spec, "stages 13 for a model of 12 layers"},
		{"no micro-batches", Config{Stages: 2, MicroBatches: 0}, spec, "micro_batches 0"},
		{"micro-batches past the batch", Config{Stages: 2, MicroBatches: 9}, spec, "micro_batches 9 for batches of 8"},
		{"unknown schedule", Config{Stages: 2, MicroBatches: 2, Schedule: "interleaved"}, spec, `schedule "interleaved"`},
		{"unknown boundary", Config{Stages: 2, MicroBatches: 2, Boundary: "int4"}, spec, `boundary "int4"`},
		{"too few cuts", Config{Stages: 3, MicroBatches: 2, Split: []int{4}}, spec, "3 stages need 2"},
		{"cut at 0", Config{Stages: 2, MicroBatches: 2, Split: []int{0}}, spec, "cut 0 leaves a stage without layers"},
		{"cut past the end", Config{Stages: 2, MicroBatches: 2, Split: []int{12}}, spec, "cut 12"},
		{"cuts not increasing", Config{Stages: 3, MicroBatches: 2, Split: []int{6, 6}}, spec, "cut 6"},
		{"dependency pointing forward", Config{Stages: 2, MicroBatches: 2}, backward, `from "c": no earlier layer saved that name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Check(tt.spec, 8)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrConfig) && !errors.Is(err, train.ErrSpec) {
				t.Errorf("%v; want ErrConfig or ErrSpec", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%v; want it to say %q", err, tt.want)
			}
		})
	}
	if err := (Config{Stages: 3, MicroBatches: 8, Split: []int{2, 8}}).Check(spec, 8); err != nil {
		t.Errorf("a good config: %v", err)
	}
}

func TestBalance(t *testing.T) {
	tests := []struct {
		costs  []float64
		stages int
		want   []int
	}{
		{[]float64{1, 1, 1, 1}, 2, []int{2}},
		{[]float64{1, 1, 1, 1}, 1, []int{}},
		{[]float64{1, 1, 1, 1}, 4, []int{1, 2, 3}},
		{[]float64{4, 1, 1, 1, 1}, 2, []int{1}},
		{[]float64{1, 1, 1, 1, 4}, 2, []int{4}},
		{[]float64{3, 0, 0, 3, 0, 0, 3}, 3, []int{1, 4}}, // of 3, 3, 3 splits, the earliest cuts
		{[]float64{5, 1, 1, 1, 1, 1, 5}, 3, []int{1, 6}},
		{[]float64{0.1, 9, 0.1, 0.1, 9, 0.1}, 2, []int{3}},
	}
	for _, tt := range tests {
		got, err := Balance(tt.costs, tt.stages)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("Balance(%v, %d) = %v; want %v", tt.costs, tt.stages, got, tt.want)
		}
	}
	if _, err := Balance([]float64{1, 2}, 3); !errors.Is(err, ErrConfig) {
		t.Errorf("3 stages of 2 layers: %v", err)
	}
}

// Measured costs split the residual MLP into stages that each get layers.
func TestMeasuredSplit(t *testing.T) {
	model := train.ModelConfig{Spec: residualSpec(), Batch: 8, Seed: 1}
	costs, err := MeasureCosts(model, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(costs) != 12 {
		t.Fatalf("%d costs for 12 layers", len(costs))
	}
	for i, c := range costs {
		if c <= 0 {
			t.Errorf("layer %d costs %v", i, c)
		}
	}
	split, err := Balance(costs, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := (Config{Stages: 3, MicroBatches: 2, Split: split}).Check(model.Spec, 8); err != nil {
		t.Errorf("split %v: %v", split, err)
	}
}

// A GPT's layers are measured too: its embedding takes bytes, and its
// last layer a label per position.
func TestMeasureCostsGPT(t *testing.T) {
	model := train.ModelConfig{Spec: train.GPTSpec(1, 16, 2, 8), Batch: 4, Seed: 1}
	costs, err := MeasureCosts(model, 2)
	if err != nil || len(costs) != len(model.Spec.Layers) {
		t.Fatalf("MeasureCosts: %v, %d costs; want one per layer", err, len(costs))
	}
	cuts, err := Balance(costs, 2)
	if err != nil || len(cuts) != 1 {
		t.Errorf("Balance: %v, %v", cuts, err)
	}
}
