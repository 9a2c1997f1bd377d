package train

import (
	"crypto/sha256"
	"fmt"
	"math"
	"slices"
	"strings"
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
	// NameAfter, if above 0, names a rank whose pseudo-gradient was an
	// outlier in this many applied rounds in a row (a LiarError: Run drops
	// it, as any liar). An outlier is farther from the coordinate-wise
	// median than NameAbove × τ — scaled, noise — or points against the
	// coordinate-wise median of the others' (a negative cosine: flipped). Every rank scores
	// the same gathered payloads in the same order, so all name the same
	// rank at the same round. The count starts afresh when the ring
	// changes, and nobody is named from rounds of fewer than 3 payloads
	// or where half of them are outliers.
	NameAfter int
	// NameAbove is the distance, in units of τ, past which a
	// pseudo-gradient is an outlier; 0 is 3.
	NameAbove float64
}

// Validate says what is wrong with the settings.
func (c *Robust) Validate() error {
	if !(c.Clip > 0 && c.Clip <= 1e3) || c.Iters < 1 || c.Iters > 100 {
		return fmt.Errorf("train: robust aggregation with clip %v and %d iterations; want clip in (0, 1000] and 1 to 100 iterations", c.Clip, c.Iters)
	}
	if c.NameAfter < 0 || c.NameAfter > 1000 || !(c.NameAbove >= 0 && c.NameAbove <= 1e6) {
		return fmt.Errorf("train: robust naming after %d rounds above %v τ; want 0 to 1000 rounds (0: never) and a distance in [0, 1e6] (0: 3)", c.NameAfter, c.NameAbove)
	}
	return nil
}

// nameAbove is NameAbove with its default.
func (c *Robust) nameAbove() float64 {
	if c.NameAbove == 0 {
		return 3
	}
	return c.NameAbove
}

// outliers is the count, per rank, of the applied rounds in a row whose
// pseudo-gradient was an outlier, for the ring it was counted on.
type outliers struct {
	ring   Collective
	streak []int
}

// score judges one round's gathered payloads, ranks' payloads in rank
// order (empty: not in the round; xs holds the others', in order), and
// the ranks' distances over τ: it counts each rank's streak and returns a
// LiarError naming those whose streak reached NameAfter, or nil. A rank's
// direction is judged against the coordinate-wise median of the others'
// alone: against the aggregate, which holds a share of its own, a flipped
// pseudo-gradient can still point forward when honest ones agree only
// loosely (non-IID shards).
func (c *Robust) score(o *outliers, ring Collective, payloads [][]byte, xs [][]float32, scores []float64, outer int) *LiarError {
	if c.NameAfter <= 0 {
		return nil
	}
	if o.ring != ring || len(o.streak) != len(payloads) {
		o.ring, o.streak = ring, make([]int, len(payloads))
	}
	if len(xs) < 3 {
		return nil
	}
	cos := make([]float64, len(xs))
	others, ref := make([][]float32, 0, len(xs)-1), make([]float32, len(xs[0]))
	for i, x := range xs {
		others = append(append(others[:0], xs[:i]...), xs[i+1:]...)
		coordMedian(ref, others)
		var xa, xx, aa float64
		for j, v := range x {
			xa += float64(v) * float64(ref[j])
			xx += float64(v) * float64(v)
			aa += float64(ref[j]) * float64(ref[j])
		}
		if xx > 0 && aa > 0 {
			cos[i] = xa / math.Sqrt(xx*aa)
		}
	}
	out := make([]bool, len(xs))
	nOut := 0
	for i := range xs {
		out[i] = scores[i] > c.nameAbove() || cos[i] < 0
		if out[i] {
			nOut++
		}
	}
	if 2*nOut >= len(xs) {
		// Half or more stand apart: the round tells nothing of who lies.
		clear(o.streak)
		return nil
	}
	var named []int
	var why []string
	i := 0
	for k, p := range payloads {
		if len(p) == 0 {
			continue // not in this round: its streak waits
		}
		if !out[i] {
			o.streak[k] = 0
		} else if o.streak[k]++; o.streak[k] >= c.NameAfter {
			sum := sha256.Sum256(p)
			named = append(named, k)
			why = append(why, fmt.Sprintf("rank %d: distance %.3g τ, cosine %.3f against the others' median, payload sha256 %x", k, scores[i], cos[i], sum[:8]))
			o.streak[k] = 0
		}
		i++
	}
	if named == nil {
		return nil
	}
	return &LiarError{Ranks: named, Why: fmt.Sprintf("their pseudo-gradients stood apart from the others' in %d rounds in a row, the last outer round %d (%s; an outlier is past %v τ from the median or points against the others')",
		c.NameAfter, outer+1, strings.Join(why, "; "), c.nameAbove())}
}

// coordMedian writes into dst the coordinate-wise median of xs (at least
// one, each as long as dst): the middle value, or the mean of the middle
// two.
func coordMedian(dst []float32, xs [][]float32) {
	n := len(xs)
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
	coordMedian(dst, xs)
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
