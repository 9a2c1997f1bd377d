package train

import (
	"math"
	"slices"
)

// The dense versions of the robust aggregate, its median, cosines and
// spread, one rank's update a slice, as they were before the columns:
// what the columns' versions must match bit for bit.

func refOthersCosines(xs [][]float32, sup []int) []float64 {
	n := len(xs)
	xa, xx, aa := make([]float64, n), make([]float64, n), make([]float64, n)
	idx, col := make([]int, n), make([]float32, n)
	m := n - 1
	at := func(j, k int) float32 { // the others' j-th smallest, without position k
		if j < k {
			return col[j]
		}
		return col[j+1]
	}
	if sup == nil {
		sup = make([]int, len(xs[0]))
		for j := range sup {
			sup[j] = j
		}
	}
	for _, j := range sup { // elsewhere every term is 0
		for i := range idx {
			idx[i] = i
		}
		for a := 1; a < n; a++ { // insertion sort: a few values
			for b := a; b > 0 && xs[idx[b]][j] < xs[idx[b-1]][j]; b-- {
				idx[b], idx[b-1] = idx[b-1], idx[b]
			}
		}
		for k, i := range idx {
			col[k] = xs[i][j]
		}
		for k, i := range idx {
			ref := at(m/2, k)
			if m%2 == 0 {
				ref = float32(float64(at(m/2-1, k))/2 + float64(at(m/2, k))/2)
			}
			v := float64(xs[i][j])
			xa[i] += v * float64(ref)
			xx[i] += v * v
			aa[i] += float64(ref) * float64(ref)
		}
	}
	cos := make([]float64, n)
	for i := range cos {
		if xx[i] > 0 && aa[i] > 0 {
			cos[i] = xa[i] / math.Sqrt(xx[i]*aa[i])
		}
	}
	return cos
}

func refSupport(xs [][]float32) []int {
	mark := make([]uint8, len(xs[0]))
	for _, x := range xs {
		for j, v := range x {
			u := math.Float32bits(v) << 1 // ±0 both 0
			mark[j] |= uint8((u | -u) >> 31)
		}
	}
	n := 0
	for _, m := range mark {
		n += int(m)
	}
	sup := make([]int, n+1)
	k := 0
	for j, m := range mark {
		sup[k] = j
		k += int(m)
	}
	return sup[:n]
}

func refMedian(dst []float32, xs [][]float32) {
	refMedianOn(dst, xs, nil)
}

func refMedianOn(dst []float32, xs [][]float32, sup []int) {
	n := len(xs)
	col := make([]float32, n)
	if sup != nil {
		clear(dst)
	}
	for k := range dst {
		j := k
		if sup != nil {
			if k >= len(sup) {
				return
			}
			j = sup[k]
		}
		for i, x := range xs {
			col[i] = x[j]
		}
		for a := 1; a < n; a++ { // insertion sort: a few values
			for b := a; b > 0 && col[b] < col[b-1]; b-- {
				col[b], col[b-1] = col[b-1], col[b]
			}
		}
		if n%2 == 1 {
			dst[j] = col[n/2]
		} else {
			dst[j] = float32(float64(col[n/2-1])/2 + float64(col[n/2])/2)
		}
	}
}

func refCenteredClip(dst []float32, xs [][]float32, sup []int, clip float64, iters int) []float64 {
	n := len(xs)
	scores := make([]float64, n)
	if n == 0 {
		clear(dst)
		return scores
	}
	// Where every x is 0 the median is 0 and stays so, and every term
	// below is 0: the loops run over sup alone, in order, which gives the
	// same bits (sparse payloads leave most coordinates there).
	refMedianOn(dst, xs, sup)
	dist := make([]float64, n)
	distances := func() {
		for i, x := range xs {
			var acc float64
			for _, j := range sup {
				d := float64(x[j]) - float64(dst[j])
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
	step := make([]float64, len(sup))
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
			for k, j := range sup {
				step[k] += float64(w * (float64(x[j]) - float64(dst[j])))
			}
		}
		for k, j := range sup {
			dst[j] = float32(float64(dst[j]) + step[k])
		}
	}
	return scores
}
func refSpread(xs [][]float32, clip float64) []float64 {
	med := make([]float32, len(xs[0]))
	refMedian(med, xs)
	dist := make([]float64, len(xs))
	for i, x := range xs {
		var acc float64
		for j, v := range x {
			d := float64(v) - float64(med[j])
			acc += d * d
		}
		dist[i] = math.Sqrt(acc)
	}
	sorted := slices.Clone(dist)
	slices.Sort(sorted)
	tau := clip * sorted[(len(xs)-1)/2]
	for i := range dist {
		if tau > 0 {
			dist[i] /= tau
		} else {
			dist[i] = 0
		}
	}
	return dist
}
