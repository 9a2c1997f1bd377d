package train

import (
	"math"
	bits64 "math/bits"
	"slices"
)

// columns is a round's updates from n ranks, coordinate by coordinate:
// at holds the coordinates some rank's update is not 0 at (or all of
// them), ascending; v holds, for column c, the n ranks' values there in
// rank order (v[c*n+i]); nz counts how many of them are other than +0.
// A coordinate's values side by side are what its median and the
// rank-by-rank sums below read, and sparse payloads leave most columns
// with one value: there the median is 0 without a sort.
type columns struct {
	n  int
	at []int
	v  []float32
	nz []uint16
	// bits and before are merge's scratch: the support as a bitset, and
	// the set bits before each word.
	bits   []uint64
	before []int32
}

// gather makes c the columns of the dense updates xs (each as long as
// the first) at the coordinates sup, or at every coordinate if sup is
// nil.
func (c *columns) gather(xs [][]float32, sup []int) *columns {
	n := len(xs)
	c.n, c.at, c.v, c.nz = n, c.at[:0], c.v[:0], c.nz[:0]
	if n == 0 {
		return c
	}
	add := func(j int) {
		var nz uint16
		for _, x := range xs {
			c.v = append(c.v, x[j])
			if math.Float32bits(x[j]) != 0 {
				nz++
			}
		}
		c.at, c.nz = append(c.at, j), append(c.nz, nz)
	}
	if sup == nil {
		for j := range xs[0] {
			add(j)
		}
		return c
	}
	for _, j := range sup {
		add(j)
	}
	return c
}

// merge makes c the columns of n sparse updates of size values, rank
// i's as its coordinates idx[i] (each below size, ascending) and their
// values val[i]: every coordinate some rank holds a value other than ±0
// at, the others' +0 there. That is the columns of the dense updates at
// their support, bit for bit. The coordinates are found in a bitset of
// size bits (a few KB, where most of a step's work stays), and a
// coordinate's column is the count of set bits before it.
func (c *columns) merge(size int, idx [][]int32, val [][]float32) *columns {
	n := len(idx)
	c.n, c.at = n, c.at[:0]
	words := (size + 63) / 64
	if cap(c.bits) < words {
		c.bits, c.before = make([]uint64, words), make([]int32, words)
	}
	bits, before := c.bits[:words], c.before[:words]
	clear(bits)
	for i, js := range idx {
		for e, j := range js {
			if val[i][e] != 0 {
				bits[j>>6] |= 1 << (j & 63)
			}
		}
	}
	for w, word := range bits {
		before[w] = int32(len(c.at))
		for ; word != 0; word &= word - 1 {
			c.at = append(c.at, w<<6+bits64.TrailingZeros64(word))
		}
	}
	cols := len(c.at)
	c.v, c.nz = slices.Grow(c.v[:0], cols*n)[:cols*n], slices.Grow(c.nz[:0], cols)[:cols]
	clear(c.v)
	clear(c.nz)
	for i, js := range idx {
		for e, j := range js {
			x := val[i][e]
			if x == 0 {
				continue
			}
			k := int(before[j>>6]) + bits64.OnesCount64(bits[j>>6]&(1<<(j&63)-1))
			c.v[k*n+i] = x
			c.nz[k]++
		}
	}
	return c
}

// median writes into m (one value a column) the coordinate-wise median:
// the middle value, or the mean of the middle two. Where more than half
// the values are +0 that is +0, without sorting. With dist, it writes
// there each rank's distance to the median too (sumSquares).
func (c *columns) median(m []float32, dist []float64) {
	n, vals := c.n, c.v
	col := make([]float32, n)
	var acc []float64
	if dist != nil {
		acc = dist[:n]
		clear(acc)
	}
	for k, nz := range c.nz {
		row := vals[k*n : k*n+n : k*n+n]
		var mk float32
		if 2*int(nz) >= n {
			copy(col, row)
			for a := 1; a < len(col); a++ { // insertion sort: a few values
				for b := a; b > 0 && col[b] < col[b-1]; b-- {
					col[b], col[b-1] = col[b-1], col[b]
				}
			}
			if n%2 == 1 {
				mk = col[n/2]
			} else {
				mk = float32(float64(col[n/2-1])/2 + float64(col[n/2])/2)
			}
		}
		m[k] = mk
		if acc != nil {
			sumSquares(acc, row, float64(mk))
		}
	}
	sqrtAll(acc)
}

// sumSquares adds to acc[i] the square of row[i] − ref, rounded before
// it is added: column by column, each rank's distance sums its terms in
// one order whatever the CPU.
func sumSquares(acc []float64, row []float32, ref float64) {
	acc = acc[:len(row)]
	for i, x := range row {
		d := float64(x) - ref
		acc[i] += float64(d * d)
	}
}

func sqrtAll(a []float64) {
	for i := range a {
		a[i] = math.Sqrt(a[i])
	}
}

// clipStep moves v (one value a column) one CenteredClip step:
// v ← v + Σ_i w_i (x_i − v), each product rounded before it is added, in
// rank order. With dist, it writes there each rank's distance to the new
// v too.
func (c *columns) clipStep(v []float32, w []float64, dist []float64) {
	n, vals := c.n, c.v
	w = w[:n]
	var acc []float64
	if dist != nil {
		acc = dist[:n]
		clear(acc)
	}
	for k, vk := range v {
		row := vals[k*n : k*n+n : k*n+n]
		ref := float64(vk)
		var step float64
		for i, x := range row {
			step += float64(w[i] * (float64(x) - ref))
		}
		v[k] = float32(ref + step)
		if acc != nil {
			sumSquares(acc, row, float64(v[k]))
		}
	}
	sqrtAll(acc)
}

// othersCosines is, for each rank, the cosine of its update against the
// coordinate-wise median of the others' alone (the median of all but
// it). One sort of each column's values gives every rank's: without the
// value at sorted position k, the others' middle is at most two
// positions over. Where more than half of every rank's others are +0,
// that median is +0 for all of them, without sorting.
func (c *columns) othersCosines() []float64 {
	n := c.n
	xa, xx, aa := make([]float64, n), make([]float64, n), make([]float64, n)
	idx, col := make([]int, n), make([]float32, n)
	m := n - 1
	at := func(j, k int) float32 { // the others' j-th smallest, without position k
		if j < k {
			return col[j]
		}
		return col[j+1]
	}
	for k := range c.nz {
		row := c.v[k*n : k*n+n : k*n+n]
		if 2*(n-int(c.nz[k])-1) > m {
			// Every term against a +0 median: only the rank's own
			// squares add anything but zeros' signs.
			for i, x := range row {
				xx[i] += float64(x) * float64(x)
			}
			continue
		}
		for i := range idx {
			idx[i] = i
		}
		for a := 1; a < n; a++ { // insertion sort: a few values
			for b := a; b > 0 && row[idx[b]] < row[idx[b-1]]; b-- {
				idx[b], idx[b-1] = idx[b-1], idx[b]
			}
		}
		for p, i := range idx {
			col[p] = row[i]
		}
		for p, i := range idx {
			ref := at(m/2, p)
			if m%2 == 0 {
				ref = float32(float64(at(m/2-1, p))/2 + float64(at(m/2, p))/2)
			}
			v := float64(row[i])
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
