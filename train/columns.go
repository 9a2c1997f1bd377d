package train

import (
	"math"
	bits64 "math/bits"
	"slices"
)

// columns is a round's updates from n ranks, coordinate by coordinate,
// split by how many ranks have a value other than +0 there.
//
// Where two or more do (or any, on fewer than 4 ranks) the coordinate is
// a shared column: at[k] the coordinate, ascending; v[k*n+i] rank i's
// value there, +0 where it has none; nz[k] how many are other than +0.
// A column's values side by side are what its median and the rank-by-rank
// sums read.
//
// Where one rank alone does, on 4 ranks or more, the coordinate is that
// rank's alone: rank i's such values are alone[i], at aloneAt[i]
// (ascending), and own[i] the sum of their squares. Sparse payloads leave
// most coordinates to one rank. There the median is 0 (three or more
// zeros among four), the others' median too, and each CenteredClip step,
// v ← v + Σ_j w_j (x_j − v), keeps v a multiple of the rank's value,
// α_i x, α_i the same at all of rank i's lone coordinates: their part in
// every distance is a sum over ranks of α's and own's, and the
// aggregate there is written once, at the end.
type columns struct {
	n  int
	at []int
	v  []float32
	nz []uint16

	aloneAt [][]int32
	alone   [][]float32
	own     []float64

	// bits, shared and before are merge's scratch: the support as a
	// bitset, the coordinates of two ranks or more as another, and the
	// shared coordinates before each word.
	bits, shared []uint64
	before       []int32
}

// lonesFrom is the fewest ranks whose lone coordinates are kept apart:
// with fewer, a coordinate's one value moves the others' median.
const lonesFrom = 4

// reset empties c for n ranks, keeping its memory.
func (c *columns) reset(n int) {
	c.n, c.at, c.v, c.nz = n, c.at[:0], c.v[:0], c.nz[:0]
	c.aloneAt, c.alone = slices.Grow(c.aloneAt[:0], n)[:n], slices.Grow(c.alone[:0], n)[:n]
	for i := range n {
		c.aloneAt[i], c.alone[i] = c.aloneAt[i][:0], c.alone[i][:0]
	}
	c.own = append(c.own[:0], make([]float64, n)...)
}

// addAlone adds rank i's value x at coordinate j, where it alone has one.
func (c *columns) addAlone(i, j int, x float32) {
	c.aloneAt[i], c.alone[i] = append(c.aloneAt[i], int32(j)), append(c.alone[i], x)
	c.own[i] += float64(x) * float64(x) // exact: a float32's square fits a float64
}

// gather makes c the columns of the dense updates xs (each as long as
// the first) at the coordinates sup, or at every coordinate if sup is
// nil; a value whose bits are not +0's counts as one (a coordinate
// where none has one adds nothing anywhere, and is left out).
func (c *columns) gather(xs [][]float32, sup []int) *columns {
	n := len(xs)
	c.reset(n)
	if n == 0 {
		return c
	}
	add := func(j int) {
		nz, last := 0, 0
		for i, x := range xs {
			if math.Float32bits(x[j]) != 0 {
				nz, last = nz+1, i
			}
		}
		switch {
		case nz == 0:
		case nz == 1 && n >= lonesFrom:
			c.addAlone(last, j, xs[last][j])
		default:
			for _, x := range xs {
				c.v = append(c.v, x[j])
			}
			c.at, c.nz = append(c.at, j), append(c.nz, uint16(nz))
		}
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
// values val[i] (a value ±0 counts as none): what gather makes of the
// dense updates. The coordinates are found in bitsets of size bits (a few
// KB, where the work stays), and a shared coordinate's column is the
// count of shared coordinates before it.
func (c *columns) merge(size int, idx [][]int32, val [][]float32) *columns {
	n := len(idx)
	c.reset(n)
	words := (size + 63) / 64
	if cap(c.bits) < words {
		c.bits, c.shared, c.before = make([]uint64, words), make([]uint64, words), make([]int32, words)
	}
	bits, shared, before := c.bits[:words], c.shared[:words], c.before[:words]
	clear(bits)
	clear(shared)
	for i, js := range idx {
		vi := val[i][:len(js)]
		for e, j := range js {
			if vi[e] != 0 {
				w, b := j>>6, uint64(1)<<(j&63)
				bw := bits[w]
				shared[w] |= bw & b
				bits[w] = bw | b
			}
		}
	}
	if n < lonesFrom {
		copy(shared, bits)
	}
	for w, word := range shared {
		before[w] = int32(len(c.at))
		for ; word != 0; word &= word - 1 {
			c.at = append(c.at, w<<6+bits64.TrailingZeros64(word))
		}
	}
	cols := len(c.at)
	// One column more than the shared ones, which a lone entry is
	// written to and left out of: every entry does the same work, with no
	// branch on whether it is shared, which no predictor learns where the
	// supports partly overlap.
	c.v, c.nz = slices.Grow(c.v, (cols+1)*n)[:(cols+1)*n], slices.Grow(c.nz, cols+1)[:cols+1]
	clear(c.v)
	clear(c.nz)
	cv, cnz := c.v, c.nz
	for i, js := range idx {
		vi := val[i][:len(js)]
		at, alone := slices.Grow(c.aloneAt[i][:0], len(js))[:len(js)], slices.Grow(c.alone[i][:0], len(js))[:len(js)]
		na, own := 0, 0.0
		for e, j := range js {
			x := vi[e]
			if x == 0 {
				continue
			}
			w, sh := j>>6, uint(j&63)
			sw := shared[w]
			in := int(sw >> sh & 1) // 1: shared, 0: this rank's alone
			at[na], alone[na] = j, x
			na += 1 - in
			// x·x is exact in float64, and a lone one adds +0 to own.
			own += float64(x) * float64(x) * float64(1-in)
			k := int(before[w]) + bits64.OnesCount64(sw&(uint64(1)<<sh-1))
			k = cols + (k-cols)*in // the spare column for a lone entry
			cv[k*n+i] = x
			cnz[k] += uint16(in)
		}
		c.aloneAt[i], c.alone[i], c.own[i] = at[:na], alone[:na], own
	}
	c.v, c.nz = c.v[:cols*n], c.nz[:cols]
	return c
}

// lones adds to acc (each rank's sum of squares to the aggregate so far)
// the lone coordinates' part, the aggregate there being α_j x at rank j's:
// (1 − α_i)² own_i for rank i's own, α_j² own_j for each other rank j's;
// in rank order, each product rounded before it is added.
func (c *columns) lones(acc, alpha []float64) {
	for i := range acc[:c.n] {
		for j, o := range c.own {
			a := alpha[j]
			if j == i {
				a = 1 - a
			}
			acc[i] += float64(float64(a*a) * o)
		}
	}
}

// median writes into m (one value a column) the coordinate-wise median:
// the middle value, or the mean of the middle two. Where more than half
// the values are +0 that is +0, without sorting; at lone coordinates it
// is 0 and not written. With dist, it writes there each rank's distance
// to the median too (distances); with cos,
// each rank's cosine against the median of the others' alone
// (othersCos), from the same sort of each column.
func (c *columns) median(m []float32, dist []float64, cos []float64) {
	n := c.n
	var oc *othersCos
	if cos != nil {
		oc = &othersCos{xa: make([]float64, n), aa: make([]float64, n)}
	}
	s := medianScratch{make([]int, n), make([]float32, n), make([]uint64, n)}
	if n == 4 && !slices.ContainsFunc(c.nz, func(z uint16) bool { return z < 2 }) {
		c.median4(m, oc)
	} else {
		for k := range c.nz {
			c.medianAt(k, m, oc, s)
		}
	}
	if dist != nil {
		c.distances(dist, m, nil)
	}
	if oc != nil {
		// A rank's own squares add up alike whatever the median.
		oc.xx = make([]float64, n)
		c.squares(oc.xx, nil)
		for i, o := range c.own {
			oc.xx[i] += o
		}
		oc.cosines(cos)
	}
}

// medianScratch is median's scratch for one column: its ranks in order,
// their values, their keys (sortRanks), so that a round's columns
// allocate nothing.
type medianScratch struct {
	idx  []int
	col  []float32
	keys []uint64
}

// medianAt writes column k's median into m[k] and adds its terms to oc
// (nil: none).
func (c *columns) medianAt(k int, m []float32, oc *othersCos, s medianScratch) {
	n, nz := c.n, int(c.nz[k])
	row := c.v[k*n : k*n+n : k*n+n]
	againstZero := 2*(n-nz-1) > n-1 // every rank's others' median is +0
	if sorted := 2*nz >= n || oc != nil && !againstZero; sorted {
		sortRanks(s.idx, s.col, row, s.keys)
	}
	var mk float32
	if 2*nz >= n {
		if n%2 == 1 {
			mk = s.col[n/2]
		} else {
			mk = float32(float64(s.col[n/2-1])/2 + float64(s.col[n/2])/2)
		}
	}
	m[k] = mk
	if oc != nil && !againstZero {
		oc.add(row, s.idx, s.col)
	}
}

// median4 is median's columns on four ranks, each with two values or
// more other than +0 (every column merge or gather makes of four; median
// checks), with the sums for oc (nil: none) in registers: it sorts a
// column in sortRanks' network, the median is the middle two's mean, and
// the others' median of the two lowest is the third value, of the two
// highest the second (othersCos.add). The same bits as medianAt's: each
// rank's sums take the columns in order.
func (c *columns) median4(m []float32, oc *othersCos) {
	vals := c.v[:4*len(c.nz)]
	var xa, aa [4]float64
	if oc != nil {
		copy(xa[:], oc.xa)
		copy(aa[:], oc.aa)
	}
	for k := range c.nz {
		r := vals[4*k : 4*k+4 : 4*k+4]
		i0, i1, i2, i3 := sort4(r)
		c0, c1, c2, c3 := float64(r[i0]), float64(r[i1]), float64(r[i2]), float64(r[i3])
		m[k] = float32(c1/2 + c2/2)
		if oc == nil {
			continue
		}
		xa[i0] += c0 * c2
		xa[i1] += c1 * c2
		xa[i2] += c2 * c1
		xa[i3] += c3 * c1
		aa[i0] += c2 * c2
		aa[i1] += c2 * c2
		aa[i2] += c1 * c1
		aa[i3] += c1 * c1
	}
	if oc != nil {
		copy(oc.xa, xa[:])
		copy(oc.aa, aa[:])
	}
}

// sortRanks writes into idx the ranks in the order of their values in
// row, ranks with equal values (−0 and +0 among them) in rank order, and
// those values in that order into col. Each value and its rank are one
// integer key, ordered as the pair, so that four ranks sort in a
// network of five branch-free compare-exchanges, and more by insertion
// over the keys (keys: scratch as long as row, so that a round's columns
// allocate nothing); the values are finite (decoded payloads).
func sortRanks(idx []int, col, row []float32, keys []uint64) {
	n := len(row)
	if n == 4 {
		row := row[:4:4]
		i0, i1, i2, i3 := sort4(row)
		idx, col := idx[:4:4], col[:4:4]
		idx[0], idx[1], idx[2], idx[3] = int(i0), int(i1), int(i2), int(i3)
		col[0], col[1], col[2], col[3] = row[i0], row[i1], row[i2], row[i3]
		return
	}
	keys = keys[:n]
	for i, x := range row {
		keys[i] = rankKey(x, i)
	}
	for a := 1; a < n; a++ {
		for b := a; b > 0 && keys[b] < keys[b-1]; b-- {
			keys[b], keys[b-1] = keys[b-1], keys[b]
		}
	}
	for p, k := range keys {
		i := int(uint32(k))
		idx[p], col[p] = i, row[i]
	}
}

// sort4 is the ranks of four values in order, as sortRanks orders them:
// five branch-free compare-exchanges of their keys.
func sort4(row []float32) (i0, i1, i2, i3 uint32) {
	row = row[:4:4]
	k0, k1, k2, k3 := rankKey(row[0], 0), rankKey(row[1], 1), rankKey(row[2], 2), rankKey(row[3], 3)
	k0, k1 = min(k0, k1), max(k0, k1)
	k2, k3 = min(k2, k3), max(k2, k3)
	k0, k2 = min(k0, k2), max(k0, k2)
	k1, k3 = min(k1, k3), max(k1, k3)
	k1, k2 = min(k1, k2), max(k1, k2)
	return uint32(k0) & 3, uint32(k1) & 3, uint32(k2) & 3, uint32(k3) & 3
}

// rankKey is x and rank i as one integer that orders as (x, i) do: x's
// bits made to order as its value (−0 as +0) above i.
func rankKey(x float32, i int) uint64 {
	b := math.Float32bits(x)
	if b == 1<<31 { // −0
		b = 0
	}
	// Negative: every bit flipped; else the sign bit set. A mask, not a
	// branch: signs in a column come in no order a predictor learns.
	b ^= uint32(int32(b)>>31) | 1<<31
	return uint64(b)<<32 | uint64(uint32(i))
}

// distances writes into dist each rank's Euclidean distance to the
// aggregate: v at the shared columns, α_j x at rank j's lone coordinates
// (alpha nil: 0); the shared columns' terms first, then the lone ones'
// (lones).
func (c *columns) distances(dist []float64, v []float32, alpha []float64) {
	c.squares(dist, v)
	if alpha == nil {
		alpha = make([]float64, c.n)
	}
	c.lones(dist, alpha)
	for i, a := range dist[:c.n] {
		dist[i] = math.Sqrt(a)
	}
}

// squares writes into acc each rank's sum of the squares of its values
// less v's at the shared columns (v nil: 0 everywhere), column by column in
// order, each rounded before it is added, so the bits do not depend on
// the CPU. Four ranks at a time, each with a sum of its own: the sums
// stay in registers, and four chains of adds run side by side.
func (c *columns) squares(acc []float64, v []float32) {
	n, vals := c.n, c.v
	cols := len(c.nz)
	ref := func(k int) float64 {
		if v == nil {
			return 0
		}
		return float64(v[k])
	}
	i0 := 0
	for ; i0+4 <= n; i0 += 4 {
		var a0, a1, a2, a3 float64
		for k := range cols {
			r := vals[k*n+i0 : k*n+i0+4 : k*n+i0+4]
			mk := ref(k)
			d0, d1, d2, d3 := float64(r[0])-mk, float64(r[1])-mk, float64(r[2])-mk, float64(r[3])-mk
			a0 += float64(d0 * d0)
			a1 += float64(d1 * d1)
			a2 += float64(d2 * d2)
			a3 += float64(d3 * d3)
		}
		acc[i0], acc[i0+1], acc[i0+2], acc[i0+3] = a0, a1, a2, a3
	}
	for ; i0 < n; i0++ { // the last ranks, one at a time
		var a float64
		for k := range cols {
			d := float64(vals[k*n+i0]) - ref(k)
			a += float64(d * d)
		}
		acc[i0] = a
	}
}

// clipStep moves the aggregate one CenteredClip step,
// v ← v + Σ_i w_i (x_i − v): v at the shared columns, each product
// rounded before it is added, in rank order; at rank j's lone
// coordinates, where the aggregate is α_j x and every other rank's value
// 0, α_j ← α_j + w_j − α_j Σ_i w_i. With dist, it writes there each
// rank's distance to the new aggregate too.
func (c *columns) clipStep(v []float32, alpha, w []float64, dist []float64) {
	n, vals := c.n, c.v
	w = w[:n]
	var all float64
	for _, wi := range w {
		all += wi
	}
	for j, a := range alpha[:n] {
		alpha[j] = a + (w[j] - float64(a*all))
	}
	if n == 4 {
		acc := dist
		if acc == nil {
			acc = make([]float64, 4) // the step's bits, its sums unused
		}
		c.clipStep4(v, w, acc)
		if dist != nil {
			c.lones(dist, alpha)
			for i, a := range dist[:n] {
				dist[i] = math.Sqrt(a)
			}
		}
		return
	}
	for k, vk := range v {
		row := vals[k*n : k*n+n : k*n+n]
		ref := float64(vk)
		var step float64
		for i, x := range row {
			step += float64(w[i] * (float64(x) - ref))
		}
		v[k] = float32(ref + step)
	}
	if dist != nil {
		c.distances(dist, v, alpha)
	}
}

// clipStep4 is clipStep's step at the shared columns of four ranks, with
// each rank's sum of squares to the new aggregate there written into acc
// in the same pass: the bits of the step and of squares, in their order,
// with the sums in registers and the columns read once.
func (c *columns) clipStep4(v []float32, w, acc []float64) {
	vals := c.v[:4*len(v)]
	w0, w1, w2, w3 := w[0], w[1], w[2], w[3]
	var a0, a1, a2, a3 float64
	for k, vk := range v {
		r := vals[4*k : 4*k+4 : 4*k+4]
		x0, x1, x2, x3 := float64(r[0]), float64(r[1]), float64(r[2]), float64(r[3])
		ref := float64(vk)
		var step float64 // from +0, as clipStep: the sign of a zero step counts
		step += float64(w0 * (x0 - ref))
		step += float64(w1 * (x1 - ref))
		step += float64(w2 * (x2 - ref))
		step += float64(w3 * (x3 - ref))
		nk := float32(ref + step)
		v[k] = nk
		m := float64(nk)
		d0, d1, d2, d3 := x0-m, x1-m, x2-m, x3-m
		a0 += float64(d0 * d0)
		a1 += float64(d1 * d1)
		a2 += float64(d2 * d2)
		a3 += float64(d3 * d3)
	}
	acc[0], acc[1], acc[2], acc[3] = a0, a1, a2, a3
}

// othersCos is the sums of each rank's cosine against the median of
// the others' (median, with cos): each rank's products with the
// others' median, its own squares and the median's.
type othersCos struct{ xa, xx, aa []float64 }

// add adds the products and the median's squares of a column, row, whose
// ranks idx sorts to the values col: without the value at sorted
// position p, the others' middle is at most two positions over, so one
// sort gives every rank's median of the others. (A column where every
// rank's others' median is +0 adds nothing to them but zeros' signs.)
func (o *othersCos) add(row []float32, idx []int, col []float32) {
	m := len(row) - 1
	at := func(j, p int) float32 { // the others' j-th smallest, without position p
		if j < p {
			return col[j]
		}
		return col[j+1]
	}
	for p, i := range idx {
		ref := at(m/2, p)
		if m%2 == 0 {
			ref = float32(float64(at(m/2-1, p))/2 + float64(at(m/2, p))/2)
		}
		o.xa[i] += float64(row[i]) * float64(ref)
		o.aa[i] += float64(ref) * float64(ref)
	}
}

// cosines writes each rank's cosine into cos (0 where either vector is 0).
func (o *othersCos) cosines(cos []float64) {
	for i := range cos {
		cos[i] = 0
		if o.xx[i] > 0 && o.aa[i] > 0 {
			cos[i] = o.xa[i] / math.Sqrt(o.xx[i]*o.aa[i])
		}
	}
}
