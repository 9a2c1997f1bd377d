package train

import (
	"cmp"
	"crypto/sha256"
	"fmt"
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
	// changes, and nobody is named from rounds of fewer than 4 payloads
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
func (c *Robust) nameAbove() float64 { return cmp.Or(c.NameAbove, 3) }

// outliers is the count, per rank, of the rounds in a row in which its
// update stood apart from the others', for the ring it was counted on:
// robust DiLoCo rounds' pseudo-gradients, every-step rings' sketches.
type outliers struct {
	ring   Collective
	streak []int
	// last is what each rank sent in the exchange before (its bytes, or
	// their hash), and same the exchanges in a row it sent that again.
	last []string
	same []int
}

// on starts the counts again for ring, a ring of size ranks, if they are
// another ring's.
func (o *outliers) on(ring Collective, size int) {
	if o.ring != ring || len(o.streak) != size {
		o.ring, o.streak, o.last, o.same = ring, make([]int, size), make([]string, size), make([]int, size)
	}
}

// repeated counts, for each rank, the exchanges in a row in which it sent
// what it sent the exchange before, bit for bit (keys[k]: rank k's update
// or its hash; "" for none, which ends a run), and returns those whose
// run reached after (above 0) — an honest rank's update changes with its
// batch and parameters at every step, so the same one again is a replay.
// Nobody is named when half or more would be.
func (o *outliers) repeated(ring Collective, keys []string, after int) []int {
	o.on(ring, len(keys))
	var named []int
	for k, key := range keys {
		if key == "" || key != o.last[k] {
			o.same[k] = 0
		} else if o.same[k]++; after > 0 && o.same[k] >= after {
			named = append(named, k)
		}
		o.last[k] = key
	}
	if 2*len(named) >= len(keys) {
		return nil
	}
	return named
}

// judgedFrom is the fewest updates a round (or a sketches' window) is
// judged from. Of three, two alike make the third far whatever it holds,
// and the other two's median is their mean, against which an honest
// update late in a run points away (cosine ≤ 0) three rounds in a row
// often enough to name an honest peer in a long job.
const judgedFrom = 4

// judged is one rank's update in a round: its distance to the
// coordinate-wise median over τ and its cosine against the others'
// median.
type judged struct {
	rank      int
	dist, cos float64
}

// count scores one round on ring of size ranks: dist are the distances
// over τ of the updates of the ranks in (in rank order, ranks[i] being
// dist[i]'s), cos their cosines against the others' median
// (othersCos). A rank stands apart past above τ, or, with against,
// pointing against the coordinate-wise median of the others' alone —
// against an aggregate that holds a share of its own, a flipped update
// can still point forward when honest ones agree only loosely (non-IID
// shards). Honest updates of a step or a few disagree too often for
// direction to count there.
// It returns the ranks whose streak reached after, with what was judged
// of them, and starts their count again. Nobody is judged from fewer than
// judgedFrom updates, or when half or more stand apart (the round tells
// nothing of who lies); a rank not in the round keeps its streak.
func (o *outliers) count(ring Collective, size int, ranks []int, dist, cos []float64, above float64, against bool, after int) []judged {
	o.on(ring, size)
	n := len(dist)
	if n < judgedFrom {
		return nil
	}
	out := make([]bool, n)
	nOut := 0
	for i := range n {
		out[i] = dist[i] > above || against && cos[i] < 0
		if out[i] {
			nOut++
		}
	}
	if 2*nOut >= n {
		clear(o.streak)
		return nil
	}
	var named []judged
	for i, k := range ranks {
		if !out[i] {
			o.streak[k] = 0
		} else if o.streak[k]++; o.streak[k] >= after {
			named = append(named, judged{k, dist[i], cos[i]})
			o.streak[k] = 0
		}
	}
	return named
}

// score judges one robust round's gathered payloads, in rank order
// (empty: not in the round), with the distances over τ and the cosines
// against the others' median of the others, in order, and returns a
// LiarError naming those that sent the same pseudo-gradient again
// (replayed: by its sketch, LocalSGD.repeats; or its payload's bytes)
// or stood apart NameAfter rounds in a row (outliers.count), or nil.
func (c *Robust) score(replayed []int, o *outliers, ring Collective, payloads [][]byte, scores, cos []float64, outer int) *LiarError {
	if c.NameAfter <= 0 {
		return nil
	}
	var ranks []int
	keys := make([]string, len(payloads))
	for k, p := range payloads {
		if len(p) > 0 {
			// The bytes themselves, not a hash of them: a copy of a
			// payload costs less than its SHA-256.
			ranks = append(ranks, k)
			keys[k] = string(p)
		}
	}
	again := o.repeated(ring, keys, c.NameAfter)
	for _, k := range replayed {
		if !slices.Contains(again, k) {
			again = append(again, k)
		}
	}
	slices.Sort(again)
	if again != nil {
		return &LiarError{Ranks: again, Why: fmt.Sprintf("they sent the same pseudo-gradient, bit for bit, %d rounds in a row, the last outer round %d (a replay: an honest rank's changes with every round's steps)",
			c.NameAfter+1, outer+1)}
	}
	named := o.count(ring, len(payloads), ranks, scores, cos, c.nameAbove(), true, c.NameAfter)
	if named == nil {
		return nil
	}
	ks, why := make([]int, len(named)), make([]string, len(named))
	for i, j := range named {
		sum := sha256.Sum256(payloads[j.rank])
		ks[i] = j.rank
		why[i] = fmt.Sprintf("rank %d: distance %.3g τ, cosine %.3f against the others' median, payload sha256 %x", j.rank, j.dist, j.cos, sum[:8])
	}
	return &LiarError{Ranks: ks, Why: fmt.Sprintf("their pseudo-gradients stood apart from the others' in %d rounds in a row, the last outer round %d (%s; an outlier is past %v τ from the median or points against the others')",
		c.NameAfter, outer+1, strings.Join(why, "; "), c.nameAbove())}
}

// centeredClip writes into dst the CenteredClip aggregate of the
// columns' updates (dst as long as the dense updates): from v the
// coordinate-wise median, iters times
// v ← v + (1/n) Σ (x_i − v)·min(1, τ/‖x_i − v‖), τ = clip × the median of
// the ‖x_i − v‖ at the start. It returns each x_i's distance to the
// start over τ: above 1, it was clipped. Where no rank has a value every
// x, the median and the aggregate are +0; a rank's lone coordinates are
// stepped as one multiple of its values (columns). Every sum runs in one
// order and every product is rounded before it is added, so the bits do
// not depend on the CPU. With cos, it writes there each rank's cosine
// against the median of the others' (othersCos), from the median's
// pass.
func centeredClip(dst []float32, c *columns, clip float64, iters int, cos []float64) []float64 {
	n := c.n
	clear(dst)
	if n == 0 {
		return nil
	}
	v, alpha := make([]float32, len(c.at)), make([]float64, n)
	defer func() {
		for k, j := range c.at {
			dst[j] = v[k]
		}
		for i, at := range c.aloneAt {
			if alpha[i] == 0 {
				continue // +0, as the median there
			}
			for e, j := range at {
				dst[j] = float32(alpha[i] * float64(c.alone[i][e]))
			}
		}
	}()
	dist := make([]float64, n)
	c.median(v, dist, cos)
	scores, tau := overTau(dist, clip)
	if tau == 0 {
		return scores // at least half the ranks agree exactly: the median is it
	}
	w := make([]float64, n)
	for it := range iters {
		for i := range w {
			w[i] = 1.0
			if dist[i] > tau {
				w[i] = tau / dist[i]
			}
			w[i] /= float64(n)
		}
		next := dist
		if it == iters-1 {
			next = nil // no step follows to weigh
		}
		c.clipStep(v, alpha, w, next)
	}
	return scores
}

// overTau is each distance over τ, clip times their median (0 where τ
// is 0), and τ.
func overTau(dist []float64, clip float64) ([]float64, float64) {
	sorted := slices.Clone(dist)
	slices.Sort(sorted)
	tau := clip * sorted[(len(dist)-1)/2]
	out := make([]float64, len(dist))
	for i, d := range dist {
		if tau > 0 {
			out[i] = d / tau
		}
	}
	return out, tau
}
