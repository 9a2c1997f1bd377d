// Package sparse codes a pseudo-gradient as its largest entries in a few
// bits each: top-k by magnitude, the indices as varint gaps, the values
// quantized to 2 or 4 bits against one scale, and what the code left out
// kept as error feedback for the next round (SparseLoCo's scheme, arXiv
// 2508.15706; DeMo's and Deep Gradient Compression's before it), so that
// nothing is lost over rounds, only delayed.
//
// A Coder belongs to one rank and holds its error feedback; Encode reads
// a round's vector and returns the payload, and the feedback it would
// leave is kept apart until Commit — a round that every rank skips or
// redoes leaves the feedback as it was. Decode is pure: every rank decodes
// every rank's payload the same way, so every rank adds up the same bits.
package sparse

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Config says how much of a vector a payload carries.
type Config struct {
	// Fraction is the share of entries sent, in (0, 1]: the top
	// ceil(Fraction·N) by magnitude, at least one.
	Fraction float64
	// Bits is each sent value's width: 2 or 4.
	Bits int
}

// Validate says what is wrong with c.
func (c Config) Validate() error {
	switch {
	case !(c.Fraction > 0 && c.Fraction <= 1):
		return fmt.Errorf("sparse: fraction %v; want (0, 1]", c.Fraction)
	case c.Bits != 2 && c.Bits != 4:
		return fmt.Errorf("sparse: %d bits a value; want 2 or 4", c.Bits)
	}
	return nil
}

// K is how many of n entries a payload carries.
func (c Config) K(n int) int {
	if n == 0 {
		return 0
	}
	return min(n, max(1, int(math.Ceil(c.Fraction*float64(n)))))
}

// MaxPayload bounds a payload for n entries: a header, a varint gap of at
// most 5 bytes for each of k entries, and their packed values.
func (c Config) MaxPayload(n int) int {
	k := c.K(n)
	return headerMax + 5*k + (k*c.Bits+7)/8
}

// version opens every payload; a change of layout changes it.
const version = 1

// headerMax: version, bits, two uvarints of up to 5 bytes (N, k), scale.
const headerMax = 2 + 5 + 5 + 4

// ErrBadPayload means a payload did not decode: another version, a size
// that is not this vector's, indices out of order or range, a scale that
// is not finite, bytes missing or left over.
var ErrBadPayload = errors.New("sparse: bad payload")

// Coder encodes one rank's vectors, keeping its error feedback.
type Coder struct {
	cfg      Config
	residual []float32 // committed error feedback
	pending  []float32 // what the last Encode would leave
	mag, sel []float32 // scratch: magnitudes, and a copy to select in
	idx      []int32   // scratch: the selected indices
	out      []byte
}

// NewCoder returns a Coder for vectors of n entries.
func NewCoder(cfg Config, n int) (*Coder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if n < 0 || n > math.MaxInt32 {
		return nil, fmt.Errorf("sparse: a vector of %d entries", n)
	}
	return &Coder{cfg: cfg, residual: make([]float32, n), pending: make([]float32, n),
		mag: make([]float32, n), sel: make([]float32, n)}, nil
}

// Residual is the committed error feedback (read only).
func (c *Coder) Residual() []float32 { return c.residual }

// SetResidual replaces the error feedback (a restored checkpoint).
func (c *Coder) SetResidual(r []float32) error {
	if len(r) != len(c.residual) {
		return fmt.Errorf("sparse: error feedback of %d entries for vectors of %d", len(r), len(c.residual))
	}
	copy(c.residual, r)
	return nil
}

// Encode codes v plus the committed error feedback and returns the
// payload, valid until the next Encode; the feedback it leaves waits for
// Commit. v must be finite.
func (c *Coder) Encode(v []float32) ([]byte, error) {
	n := len(c.residual)
	if len(v) != n {
		return nil, fmt.Errorf("sparse: a vector of %d entries for a coder of %d", len(v), n)
	}
	u, mag, res := c.pending[:n], c.mag[:n], c.residual[:n]
	finite := true
	for i, x := range v {
		y := x + res[i]
		u[i], mag[i] = y, abs(y)
		finite = finite && y-y == 0 // false for a NaN or an Inf
	}
	if !finite {
		for i, y := range u {
			if y-y != 0 {
				return nil, fmt.Errorf("sparse: entry %d is %v", i, y)
			}
		}
	}
	k := c.cfg.K(n)
	c.idx = topK(c.idx[:0], mag, c.sel, k)
	var scale float32
	for _, i := range c.idx {
		scale = max(scale, abs(u[i]))
	}
	out := append(c.out[:0], version, byte(c.cfg.Bits))
	out = binary.AppendUvarint(out, uint64(n))
	out = binary.AppendUvarint(out, uint64(len(c.idx)))
	out = binary.LittleEndian.AppendUint32(out, math.Float32bits(scale))
	prev := int32(-1)
	for _, i := range c.idx {
		out = binary.AppendUvarint(out, uint64(i-prev-1))
		prev = i
	}
	levels := uint32(1)<<c.cfg.Bits - 1
	var acc uint32
	var nacc int
	for _, i := range c.idx {
		q := quantize(u[i], scale, levels)
		u[i] -= dequantize(q, scale, levels) // what the code left out stays
		acc |= q << nacc
		nacc += c.cfg.Bits
		if nacc == 8 {
			out = append(out, byte(acc))
			acc, nacc = 0, 0
		}
	}
	if nacc > 0 {
		out = append(out, byte(acc))
	}
	c.out = out
	return out, nil
}

// Commit keeps the error feedback the last Encode left: its payload was
// applied.
func (c *Coder) Commit() { c.residual, c.pending = c.pending, c.residual }

// Decode adds weight times the vector payload codes to dst, whose length
// must be the coded vector's. Nothing is added unless all of it decodes.
func Decode(dst []float32, payload []byte, weight float32) error {
	h, err := parse(payload, len(dst), nil, 0)
	if err != nil {
		return err
	}
	h.decode(dst, payload, weight)
	return nil
}

// decode adds weight times the vector of p, parsed as h, to dst.
func (h header) decode(dst []float32, p []byte, weight float32) {
	mask := uint32(1)<<h.bits - 1
	t := h.table()
	r := p[h.gaps:]
	i := -1
	for j := range h.k {
		g, w := binary.Uvarint(r)
		r = r[w:]
		i += int(g) + 1
		bit := j * h.bits
		q := uint32(h.vals[bit/8]>>(bit%8)) & mask
		dst[i] += weight * t[q]
	}
}

// values appends to val the values of the payload parsed as h, in order.
func (h header) values(val []float32) []float32 {
	t := h.table()
	val = slices.Grow(val, h.k)
	j := 0
	if h.bits == 4 { // two values a byte, the first in the low half
		for ; j+1 < h.k; j += 2 {
			b := h.vals[j/2]
			val = append(val, t[b&15], t[b>>4])
		}
	}
	mask := uint32(1)<<h.bits - 1
	for ; j < h.k; j++ {
		bit := j * h.bits
		q := uint32(h.vals[bit/8]>>(bit%8)) & mask
		val = append(val, t[q])
	}
	return val
}

// table is every level's value (dequantize's, so the same bits), looked
// up rather than divided for each entry.
func (h header) table() *[16]float32 {
	var t [16]float32
	levels := uint32(1)<<h.bits - 1
	for q := range levels + 1 {
		t[q] = dequantize(q, h.scale, levels)
	}
	return &t
}

// AppendPart appends payload to dst as one part of a payload in parts:
// its length as a uvarint, then its bytes. A vector sent in pieces, each
// with a Coder of its own, travels as one message of parts in order.
func AppendPart(dst, payload []byte) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(payload))), payload...)
}

// MaxParts bounds a payload in parts for vectors of these sizes.
func (c Config) MaxParts(sizes []int) int {
	n := 0
	for _, s := range sizes {
		n += binary.MaxVarintLen64 + c.MaxPayload(s)
	}
	return n
}

// DecodeParts is Decode for a payload in parts (AppendPart): part k adds
// weight times its vector to dst[k]. Nothing is added unless every part
// decodes and no byte is left over.
func DecodeParts(dst [][]float32, payload []byte, weight float32) error {
	sizes := make([]int, len(dst))
	for k, d := range dst {
		sizes[k] = len(d)
	}
	hs, ps, err := splitParts(payload, sizes, nil)
	if err != nil {
		return err
	}
	for k, h := range hs {
		h.decode(dst[k], ps[k], weight)
	}
	return nil
}

// AppendEntries appends to idx and val the entries a payload in parts
// (AppendPart) holds for vectors of sizes, as one vector of them all in
// order: each entry's index in that (ascending) and its value, as Decode
// at weight 1 would add it. Nothing is appended unless every part
// decodes and no byte is left over, and the indices fit an int32.
func AppendEntries(idx []int32, val []float32, sizes []int, payload []byte) ([]int32, []float32, error) {
	total := 0
	for _, n := range sizes {
		total += n
	}
	if total > math.MaxInt32 {
		return idx, val, fmt.Errorf("%w: vectors of %d entries in all; entries are indexed by int32", ErrBadPayload, total)
	}
	// The indices are taken as the parts are checked, in one reading of
	// the gaps.
	got := idx
	hs, _, err := splitParts(payload, sizes, &got)
	if err != nil {
		return idx, val, err
	}
	for _, h := range hs {
		val = h.values(val)
	}
	return got, val, nil
}

// splitParts checks every part of a payload in parts for vectors of
// sizes, and that no byte is left over, and returns each part's header
// and bytes; with idx, it appends there every entry's index in the
// vector of all the parts in order.
func splitParts(payload []byte, sizes []int, idx *[]int32) ([]header, [][]byte, error) {
	hs, ps := make([]header, len(sizes)), make([][]byte, len(sizes))
	r := payload
	off := 0
	for k, n := range sizes {
		l, w := binary.Uvarint(r)
		if w <= 0 || l > uint64(len(r)-w) {
			return nil, nil, fmt.Errorf("%w: part %d of %d: its length is missing or runs past the payload's %d bytes", ErrBadPayload, k+1, len(sizes), len(payload))
		}
		ps[k], r = r[w:w+int(l)], r[w+int(l):]
		var err error
		if hs[k], err = parse(ps[k], n, idx, off); err != nil {
			return nil, nil, fmt.Errorf("part %d of %d: %w", k+1, len(sizes), err)
		}
		off += n
	}
	if len(r) > 0 {
		return nil, nil, fmt.Errorf("%w: %d bytes after the last of %d parts", ErrBadPayload, len(r), len(sizes))
	}
	return hs, ps, nil
}

type header struct {
	bits, k int
	scale   float32
	gaps    int    // where the gaps start in the payload
	vals    []byte // the packed values
}

// parse checks all of a payload for a vector of n entries before any of
// it is used; with idx, it appends there each entry's index plus base.
func parse(p []byte, n int, idx *[]int32, base int) (header, error) {
	bad := func(format string, a ...any) (header, error) {
		return header{}, fmt.Errorf("%w: %s", ErrBadPayload, fmt.Sprintf(format, a...))
	}
	if len(p) < 2 {
		return bad("%d bytes", len(p))
	}
	if p[0] != version {
		return bad("version %d, want %d", p[0], version)
	}
	h := header{bits: int(p[1])}
	if h.bits != 2 && h.bits != 4 {
		return bad("%d bits a value", h.bits)
	}
	off := 2
	size, w := binary.Uvarint(p[off:])
	if w <= 0 || size != uint64(n) {
		return bad("a vector of %d entries, want %d", size, n)
	}
	off += w
	k, w := binary.Uvarint(p[off:])
	if w <= 0 || k > uint64(n) {
		return bad("%d entries of %d", k, n)
	}
	off += w
	h.k = int(k)
	if len(p) < off+4 {
		return bad("no scale")
	}
	h.scale = math.Float32frombits(binary.LittleEndian.Uint32(p[off:]))
	if math.IsInf(float64(h.scale), 0) || math.IsNaN(float64(h.scale)) || h.scale < 0 {
		return bad("scale %v", h.scale)
	}
	off += 4
	h.gaps = off
	var got []int32
	if idx != nil {
		got = slices.Grow(*idx, h.k)
	}
	i := -1
	for j := range h.k {
		g, w := binary.Uvarint(p[off:])
		if w <= 0 || g >= uint64(n-i-1) {
			return bad("entry %d: index past the vector's %d entries", j, n)
		}
		i += int(g) + 1
		off += w
		if idx != nil {
			got = append(got, int32(base+i))
		}
	}
	if idx != nil {
		*idx = got
	}
	want := (h.k*h.bits + 7) / 8
	if len(p)-off != want {
		return bad("%d bytes of values for %d entries of %d bits, want %d", len(p)-off, h.k, h.bits, want)
	}
	h.vals = p[off:]
	return h, nil
}

// quantize maps x in [−scale, scale] to one of levels+1 evenly spaced
// codes, rounding to the nearest.
func quantize(x, scale float32, levels uint32) uint32 {
	if scale == 0 {
		return levels / 2
	}
	t := (x/scale + 1) / 2 * float32(levels)
	q := int64(math.Floor(float64(t) + 0.5))
	return uint32(min(max(q, 0), int64(levels)))
}

// dequantize is the value code q stands for.
func dequantize(q uint32, scale float32, levels uint32) float32 {
	if scale == 0 {
		return 0
	}
	return (2*float32(q)/float32(levels) - 1) * scale
}

func abs(x float32) float32 { return math.Float32frombits(math.Float32bits(x) &^ (1 << 31)) }

// topK appends to idx the indices of the k largest entries of mag (the
// magnitudes of the coded vector), ascending; ties go to the lower index.
// sel is scratch of mag's length.
func topK(idx []int32, mag, sel []float32, k int) []int32 {
	if k == 0 {
		return idx
	}
	t, above := kthLargest(mag, sel, k)
	ties := k - above // entries equal to t that make up the k
	for i, m := range mag {
		if m > t || (m == t && ties > 0) {
			if m == t {
				ties--
			}
			idx = append(idx, int32(i))
		}
	}
	return idx
}

// kthLargest returns the k-th largest of mag (k ≥ 1) and how many entries
// are larger, using sel (mag's length) as scratch. Over a long mag it
// selects first among the entries at or above a threshold taken from a
// strided sample — about 2k of them — which holds the k largest whenever
// at least k entries reach it; where the sample misleads, it selects over
// all of mag. Either way the result is exact.
func kthLargest(mag, sel []float32, k int) (float32, int) {
	const sample = 4096
	n := len(mag)
	cand := sel[:0]
	if n >= 4*sample && k <= n/4 {
		step := n / sample
		s := sel[:0]
		for i := 0; i < n; i += step {
			s = append(s, mag[i])
		}
		t := nthLargest(s, min(len(s)-1, 2*k*len(s)/n+8))
		for _, m := range mag {
			if m >= t {
				cand = append(cand, m)
			}
		}
	}
	if len(cand) < k {
		cand = append(sel[:0], mag...)
	}
	t := nthLargest(cand, k-1)
	above := 0
	for _, m := range cand {
		if m > t {
			above++
		}
	}
	return t, above
}

// nthLargest returns the element that would be at position k were a
// sorted descending, reordering a (Hoare's quickselect with the median of
// three as pivot: deterministic, O(len(a)) on average).
func nthLargest(a []float32, k int) float32 {
	lo, hi := 0, len(a)-1
	for lo < hi {
		mid := lo + (hi-lo)/2
		p := median3(a[lo], a[mid], a[hi])
		i, j := lo, hi
		for i <= j {
			for a[i] > p {
				i++
			}
			for a[j] < p {
				j--
			}
			if i <= j {
				a[i], a[j] = a[j], a[i]
				i++
				j--
			}
		}
		switch {
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default:
			return a[k]
		}
	}
	return a[k]
}

func median3(a, b, c float32) float32 {
	if a > b {
		a, b = b, a
	}
	if b > c {
		b = c
	}
	return max(a, b)
}
