package train

import (
	"fmt"
	"math"
	"slices"

	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train/vec"
)

// normGuard decides, from the averaged gradients and the declared norms in
// the averaged trailer — the same bits on every rank, so the same decision
// everywhere — whether the step must be skipped (see NormGuard).
func (r *Replica) normGuard(avg, tail []float32) error {
	size := r.Coll.Size()
	norms := normsOf(tail, size)
	sum := 0.0
	for k, v := range norms {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("train: rank %d declared a gradient norm of %g; step skipped on all: %w", k, v, ErrGradientNorm)
		}
		sum += v
	}
	far, med := r.farRanks(norms)
	r.out.far = far
	if far != nil {
		var got []string
		for _, k := range far {
			got = append(got, fmt.Sprintf("%.3g", norms[k]))
		}
		return fmt.Errorf("train: rank(s) %v sent gradients of norm %v, over %g × the median %.3g; step skipped on all: %w",
			far, got, r.NormGuard, med, ErrGradientNorm)
	}
	if n := r.avgNorm(avg); n > sum/float64(size)*guardSlack(r.Wire, size)+1e-30 {
		return fmt.Errorf("train: the averaged gradient's norm %.3g is over the mean %.3g of the norms the ranks declared — a rank declared less than it sent; step skipped on all: %w",
			n, sum/float64(size), ErrGradientNorm)
	}
	return nil
}

// farRanks are the ranks whose declared norms are over NormGuard times
// their median (returned too), less those an audit vouched for at about
// that norm in this window (sketches.vouches): their gradients are their
// batches', whatever their size next to the others' (shards that differ).
func (r *Replica) farRanks(norms []float64) (far []int, med float64) {
	sorted := slices.Clone(norms)
	slices.Sort(sorted)
	med = sorted[(len(norms)-1)/2]
	for k, v := range norms {
		if med > 0 && v > r.NormGuard*med && !(r.sketching() && r.sk.vouches(r.Sketch, k, v, r.NormGuard)) {
			far = append(far, k)
		}
	}
	return far, med
}

// guardSlack is how far over the mean of the declared norms rounding
// alone can take the averaged gradient's norm: each of the n−1 hops and
// the last narrowing round once. A float32 sum's rounding is far below
// 0.1%; bf16 and fp16 round each value by at most 2^-8 and 2^-11 of itself;
// int8 each value by half a step of its block's scale, which over a block
// of 256 is at most 1/16 of the block's norm.
func guardSlack(wire ring.Encoding, n int) float64 {
	per := 0.0
	switch wire {
	case ring.BF16:
		per = 1.0 / 256
	case ring.FP16:
		per = 1.0 / 2048
	case ring.I8:
		per = math.Sqrt(ring.I8Block) / 254
	}
	return 1.001 + float64(n)*per
}

// norm2 is the Euclidean norm of v: its squares summed in vec.SumSquares'
// order (vectors where the CPU has them, the same bits everywhere), or,
// where that sum leaves float32's range — over it, or so small that
// squares may have rounded to zero — in float64: a norm past 1.8e19 or
// under 1e-10 is still one a clip or a guard can use.
func norm2(v []float32) float64 {
	if s := vec.SumSquares(v); s >= 1e-20 && s <= math.MaxFloat32 {
		return math.Sqrt(float64(s))
	}
	return norm2Wide(v)
}

// norm2Wide is norm2 summed in float64, in one order.
func norm2Wide(v []float32) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(v); i += 4 {
		a, b, c, d := float64(v[i]), float64(v[i+1]), float64(v[i+2]), float64(v[i+3])
		s0 += a * a
		s1 += b * b
		s2 += c * c
		s3 += d * d
	}
	for ; i < len(v); i++ {
		s0 += float64(v[i]) * float64(v[i])
	}
	return math.Sqrt(s0 + s1 + s2 + s3)
}
