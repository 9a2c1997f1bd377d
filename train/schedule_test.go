package train

import (
	"math"
	"testing"
)

func TestSchedule(t *testing.T) {
	tests := []struct {
		s    Schedule
		want []float32
	}{
		{Schedule{Base: 0.1}, []float32{0.1, 0.1, 0.1}},
		{Schedule{Kind: "step", Base: 0.1, StepSize: 2, Gamma: 0.5}, []float32{0.1, 0.1, 0.05, 0.05, 0.025}},
		{Schedule{Kind: "cosine", Base: 0.1, Epochs: 4}, []float32{0.1, 0.0853553, 0.05, 0.0146447}},
	}
	for _, tt := range tests {
		for e, want := range tt.want {
			if got := tt.s.LR(e); math.Abs(float64(got-want)) > 1e-6 {
				t.Errorf("%+v.LR(%d) = %v; want %v", tt.s, e, got, want)
			}
		}
	}
	for _, bad := range []Schedule{{Kind: "exp"}, {Kind: "step", StepSize: 0, Gamma: 0.5}} {
		if bad.Validate() == nil {
			t.Errorf("%+v.Validate() = nil; want an error", bad)
		}
	}
}

// A language model's schedule: a linear warm-up over steps, then a cosine
// over the steps that remain, down to MinLR; without TotalSteps, the
// epoch's rate after the warm-up.
func TestStepSchedule(t *testing.T) {
	s := Schedule{Kind: "cosine", Base: 1e-3, MinLR: 1e-4, WarmupSteps: 10, TotalSteps: 110}
	for _, tt := range []struct {
		step int
		want float64
	}{{0, 1e-4}, {4, 5e-4}, {9, 1e-3}, {10, 1e-3}, {60, 5.5e-4}, {110, 1e-4}, {500, 1e-4}} {
		if got := s.StepLR(tt.step, 0); math.Abs(float64(got)-tt.want) > 1e-9 {
			t.Errorf("StepLR(%d) = %v; want %v", tt.step, got, tt.want)
		}
	}
	warm := Schedule{Kind: "step", Base: 0.1, StepSize: 1, Gamma: 0.5, WarmupSteps: 4}
	if got := warm.StepLR(7, 2); got != 0.025 || !warm.PerStep() || (Schedule{Base: 1}).PerStep() {
		t.Errorf("after the warm-up, epoch 2's rate %v, per step %v; want 0.025, true", got, warm.PerStep())
	}
	if (Schedule{WarmupSteps: -1}).Validate() == nil {
		t.Error("a negative warm-up was taken")
	}
}
