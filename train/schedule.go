package train

import (
	"fmt"
	"math"
)

// Schedule sets the learning rate per epoch, as torch's StepLR and
// CosineAnnealingLR do when stepped once an epoch.
type Schedule struct {
	// Kind is "" or "constant", "step" (multiply by Gamma every StepSize
	// epochs) or "cosine" (from the base rate down to MinLR over Epochs).
	Kind     string
	Base     float32
	Epochs   int
	StepSize int
	Gamma    float32
	MinLR    float32
}

// Validate says what is wrong with a schedule.
func (s Schedule) Validate() error {
	switch s.Kind {
	case "", "constant", "cosine":
		return nil
	case "step":
		if s.StepSize < 1 || s.Gamma <= 0 {
			return fmt.Errorf("train: step schedule with step_size %d and gamma %v; want step_size ≥ 1 and gamma > 0", s.StepSize, s.Gamma)
		}
		return nil
	}
	return fmt.Errorf("train: schedule %q is unknown; want constant, step or cosine", s.Kind)
}

// LR is the rate for an epoch (from 0).
func (s Schedule) LR(epoch int) float32 {
	switch s.Kind {
	case "step":
		return s.Base * float32(math.Pow(float64(s.Gamma), float64(epoch/s.StepSize)))
	case "cosine":
		if s.Epochs <= 1 {
			return s.Base
		}
		c := (1 + math.Cos(math.Pi*float64(epoch)/float64(s.Epochs))) / 2
		return s.MinLR + (s.Base-s.MinLR)*float32(c)
	}
	return s.Base
}
