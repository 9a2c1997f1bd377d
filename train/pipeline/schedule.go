package pipeline

import (
	"errors"
	"fmt"
)

// A Kind names a schedule of micro-batches.
type Kind string

// Schedules.
const (
	// OneFOneB runs, after S−s−1 warm-up forwards, one forward then one
	// backward, and the remaining backwards last (PipeDream-Flush): the
	// same bubble as GPipe, with at most S−s micro-batches in flight on
	// stage s.
	OneFOneB Kind = "1f1b"
	// GPipe runs every forward, then every backward: M micro-batches in
	// flight on every stage but the last, which computes each micro-batch
	// as it arrives.
	GPipe Kind = "gpipe"
)

// ErrConfig means a pipeline configuration cannot be run; the message
// says why.
var ErrConfig = errors.New("pipeline: bad configuration")

// Op is one step of a stage's schedule: micro-batch MB forward, or
// backward.
type Op struct {
	Backward bool
	MB       int
}

func (o Op) String() string {
	if o.Backward {
		return fmt.Sprintf("B%d", o.MB)
	}
	return fmt.Sprintf("F%d", o.MB)
}

// Schedule returns stage s's order of forwards and backwards for m
// micro-batches over stages stages. Every schedule runs the forwards in
// micro-batch order and the backwards in micro-batch order, so the
// gradients add up in the same order whatever the schedule.
func Schedule(kind Kind, stages, s, m int) ([]Op, error) {
	if stages < 1 || s < 0 || s >= stages || m < 1 {
		return nil, fmt.Errorf("stage %d of %d, %d micro-batches: %w", s, stages, m, ErrConfig)
	}
	ops := make([]Op, 0, 2*m)
	switch {
	case kind == GPipe && s == stages-1 && stages > 1:
		// The last stage runs a micro-batch's forward inside its
		// backward (there is nothing to hold for later), so it takes
		// each as it arrives: waiting for all M first would leave it idle
		// while the stages before it run their forwards.
		for i := range m {
			ops = append(ops, Op{MB: i}, Op{Backward: true, MB: i})
		}
	case kind == GPipe:
		for i := range m {
			ops = append(ops, Op{MB: i})
		}
		for i := range m {
			ops = append(ops, Op{Backward: true, MB: i})
		}
	case kind == OneFOneB:
		warm := min(stages-s-1, m)
		f, b := 0, 0
		for ; f < warm; f++ {
			ops = append(ops, Op{MB: f})
		}
		for ; f < m; f, b = f+1, b+1 {
			ops = append(ops, Op{MB: f}, Op{Backward: true, MB: b})
		}
		for ; b < m; b++ {
			ops = append(ops, Op{Backward: true, MB: b})
		}
	default:
		return nil, fmt.Errorf("schedule %q; want %q or %q: %w", kind, OneFOneB, GPipe, ErrConfig)
	}
	return ops, nil
}

// InFlight is the most micro-batches a schedule holds at once: forwarded
// and not yet backward.
func InFlight(ops []Op) int {
	n, peak := 0, 0
	for _, o := range ops {
		if o.Backward {
			n--
		} else {
			n++
		}
		peak = max(peak, n)
	}
	return peak
}
