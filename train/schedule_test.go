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
