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
	// WarmupSteps, if above 0, makes the rate rise linearly from Base/W to
	// Base over the first W steps, and TotalSteps, if above 0 with a
	// cosine Kind, makes the cosine run over steps (from the warm-up's
	// end to TotalSteps) rather than epochs: a language model's schedule.
	// Either makes the rate change every step (PerStep).
	WarmupSteps, TotalSteps int
}

// PerStep reports whether the rate changes every step (StepLR), not
// every epoch.
func (s Schedule) PerStep() bool { return s.WarmupSteps > 0 || s.TotalSteps > 0 }

// StepLR is the rate for a step (from 0) of a per-step schedule, given
// the epoch it is in: the warm-up, then the epoch's rate (LR) or, with
// TotalSteps and a cosine Kind, the cosine over steps down to MinLR.
func (s Schedule) StepLR(step, epoch int) float32 {
	if step < s.WarmupSteps {
		return s.Base * float32(step+1) / float32(s.WarmupSteps)
	}
	if s.Kind != "cosine" || s.TotalSteps <= s.WarmupSteps {
		return s.LR(epoch)
	}
	done := min(float64(step-s.WarmupSteps)/float64(s.TotalSteps-s.WarmupSteps), 1)
	c := (1 + math.Cos(math.Pi*done)) / 2
	return s.MinLR + (s.Base-s.MinLR)*float32(c)
}

// Validate says what is wrong with a schedule.
func (s Schedule) Validate() error {
	if s.WarmupSteps < 0 || s.TotalSteps < 0 {
		return fmt.Errorf("train: schedule with %d warm-up steps over %d; want neither below 0", s.WarmupSteps, s.TotalSteps)
	}
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
