package train

import (
	"fmt"
	"math"
	"slices"
)

// Robust is how a LocalSGD round with sparse pseudo-gradients aggregates
// them instead of the mean: CenteredClip (Karimireddy, He and Jaggi,
// "Learning from History for Byzantine Robust Optimization", 2021; what
// hivemind averages with), which a rank whose pseudo-gradient is far from
// the others' — scaled, flipped, noise — moves only by a clipped step.
// Every rank gathers every rank's payload (sparse rounds do) and computes
// it in the same order with the same rounding, so all take the same bits.
type Robust struct {
	// Clip is τ as a multiple of the median distance of the ranks'
	// pseudo-gradients to their coordinate-wise median: a rank farther
	// than that is clipped to it. 2 leaves the honest spread of
	// non-IID shards alone.
	Clip float64
	// Iters is how many CenteredClip steps are taken from the median.
	Iters int
}

// Validate says what is wrong with the settings.
func (c *Robust) Validate() error {
	if !(c.Clip > 0 && c.Clip <= 1e3) || c.Iters < 1 || c.Iters > 100 {
		return fmt.Errorf("train: robust aggregation with clip %v and %d iterations; want clip in (0, 1000] and 1 to 100 iterations", c.Clip, c.Iters)
	}
	return nil
}

// centeredClip writes into dst the CenteredClip aggregate of xs, every
// one as long as dst: from v the coordinate-wise median, iters times
// v ← v + (1/n) Σ (x_i − v)·min(1, τ/‖x_i − v‖), τ = clip × the median of
// the ‖x_i − v‖ at the start. It returns each x_i's distance to the
// start over τ: above 1, it was clipped. Every sum runs in one order and
// every product is rounded before it is added, so the bits do not depend
// on the CPU.
func centeredClip(dst []float32, xs [][]float32, clip float64, iters int) []float64 {
	n := len(xs)
	scores := make([]float64, n)
	if n == 0 {
		clear(dst)
		return scores
	}
	col := make([]float32, n)
	for j := range dst {
		for i, x := range xs {
			col[i] = x[j]
		}
		slices.Sort(col)
		if n%2 == 1 {
			dst[j] = col[n/2]
		} else {
			dst[j] = float32(float64(col[n/2-1])/2 + float64(col[n/2])/2)
		}
	}
	dist := make([]float64, n)
	distances := func() {
		for i, x := range xs {
			var acc float64
			for j, v := range x {
				d := float64(v) - float64(dst[j])
				acc += float64(d * d)
			}
			dist[i] = math.Sqrt(acc)
		}
	}
	distances()
	sorted := slices.Clone(dist)
	slices.Sort(sorted)
	tau := clip * sorted[(n-1)/2]
	for i := range scores {
		if tau > 0 {
			scores[i] = dist[i] / tau
		}
	}
	if tau == 0 {
		return scores // at least half the ranks agree exactly: the median is it
	}
	step := make([]float64, len(dst))
	for it := range iters {
		if it > 0 {
			distances()
		}
		clear(step)
		for i, x := range xs {
			w := 1.0
			if dist[i] > tau {
				w = tau / dist[i]
			}
			w /= float64(n)
			for j, v := range x {
				step[j] += float64(w * (float64(v) - float64(dst[j])))
			}
		}
		for j := range dst {
			dst[j] = float32(float64(dst[j]) + step[j])
		}
	}
	return scores
}
