package train

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
)

// Control data rides in the collectives as float32s: the step's flags,
// positions, parameter hashes, peer lists. It is all encoded here, so that
// every reader checks it the same way.
//
// Most of it travels in a table with one row per rank, shared with an
// AllreduceSum: each rank fills only its own row and the others hold
// zeros, so every column sums one value and every rank ends with every
// row, exactly — each value is a 16-bit piece or a 0/1 flag, which float32
// holds exactly.

// table is a per-rank table of width values per row.
type table struct {
	width int
	vals  []float32
}

func newTable(size, width int) table { return table{width: width, vals: make([]float32, size*width)} }

func (t table) row(rank int) []float32 { return t.vals[rank*t.width : (rank+1)*t.width] }

func (t table) rows() int { return len(t.vals) / t.width }

// share gives every rank every row.
func (t table) share(ctx context.Context, c Collective) error { return c.AllreduceSum(ctx, t.vals) }

// Field widths in a row.
const (
	intSlots  = 2 // a non-negative int below 2^32, as two 16-bit halves
	hashSlots = 8 // 128 bits of a hash, as eight 16-bit pieces
)

// putInt writes a non-negative int below 2^32 as two 16-bit halves.
func putInt(dst []float32, v int) {
	dst[0], dst[1] = float32(v>>16&0xffff), float32(v&0xffff)
}

// getInt reads what putInt wrote; a value that is not two whole 16-bit
// halves (another rank's garbage) reads as -1.
func getInt(src []float32) int {
	hi, lo := src[0], src[1]
	if hi < 0 || lo < 0 || hi > 0xffff || lo > 0xffff || hi != float32(math.Trunc(float64(hi))) || lo != float32(math.Trunc(float64(lo))) {
		return -1
	}
	return int(hi)<<16 | int(lo)
}

// putHash writes the first 128 bits of h.
func putHash(dst []float32, h [32]byte) {
	for i := range hashSlots {
		dst[i] = float32(binary.LittleEndian.Uint16(h[2*i:]))
	}
}

// hash128 is the part of a hash a table carries.
type hash128 [hashSlots]float32

func getHash(src []float32) hash128 {
	var h hash128
	copy(h[:], src[:hashSlots])
	return h
}

// Step trailer: after the gradients in the step's AllreduceMean come the
// non-finite flag, the newcomer flag, then one leave slot per rank, then —
// with the gradient norm guard — one norm slot per rank. A mean of flags
// is the share of ranks that set them; a norm slot's mean times the size
// is that rank's norm.
const (
	flagNonFinite = iota
	flagNewcomer
	stepFlags
)

func stepTrailer(size int, norms bool) int {
	if norms {
		return stepFlags + 2*size
	}
	return stepFlags + size
}

// stepSays is what one rank's trailer says.
type stepSays struct {
	nonFinite bool    // its gradients hold a NaN or an Inf
	leave     bool    // it asks to leave after this step
	newcomer  bool    // a newcomer waits to be admitted after this step
	norm      float32 // its gradient norm, if the trailer has norm slots
}

// put writes this rank's trailer, clearing the other ranks' slots.
func (s stepSays) put(tail []float32, rank, size int) {
	clear(tail)
	if s.nonFinite {
		tail[flagNonFinite] = 1
	}
	if s.newcomer {
		tail[flagNewcomer] = 1
	}
	if s.leave {
		tail[stepFlags+rank] = 1
	}
	if len(tail) == stepTrailer(size, true) {
		tail[stepFlags+size+rank] = s.norm
	}
}

// normsOf reads the ranks' declared gradient norms from an averaged
// trailer with norm slots.
func normsOf(tail []float32, size int) []float64 {
	out := make([]float64, size)
	for k, v := range tail[stepFlags+size : stepFlags+2*size] {
		out[k] = float64(v) * float64(size)
	}
	return out
}

// stepFlagsOf reads an averaged trailer: how many ranks had non-finite
// gradients, whether any rank saw a newcomer waiting, and which asked to
// leave.
func stepFlagsOf(tail []float32, size int) (nonFinite int, newcomer bool, leaving []int) {
	nonFinite = int(math.Round(float64(tail[flagNonFinite]) * float64(size)))
	for k, v := range tail[stepFlags : stepFlags+size] {
		if v != 0 {
			leaving = append(leaving, k)
		}
	}
	return nonFinite, tail[flagNewcomer] != 0, leaving
}

// BroadcastStrings sends root's list of strings — at most maxN, each at
// most maxLen bytes — to every rank, so that all act on the same list (rank
// 0's choice of standbys to admit, say). What arrives is checked against
// the same bounds before it is used.
func BroadcastStrings(ctx context.Context, c Collective, root int, ss []string, maxN, maxLen int) ([]string, error) {
	width := 1 + maxLen // the length, then one byte per value
	buf := make([]float32, 1+maxN*width)
	if c.Rank() == root {
		if len(ss) > maxN {
			return nil, fmt.Errorf("train: %d strings to send, at most %d", len(ss), maxN)
		}
		buf[0] = float32(len(ss))
		for i, s := range ss {
			if len(s) > maxLen {
				return nil, fmt.Errorf("train: a %d-byte string to send, at most %d", len(s), maxLen)
			}
			row := buf[1+i*width:]
			row[0] = float32(len(s))
			for j := range len(s) {
				row[1+j] = float32(s[j])
			}
		}
	}
	if err := c.Broadcast(ctx, buf, root); err != nil {
		return nil, fmt.Errorf("%w: broadcasting from rank %d: %w", ErrCollective, root, err)
	}
	k := int(buf[0])
	if float32(k) != buf[0] || k < 0 || k > maxN {
		return nil, fmt.Errorf("train: rank %d sends %v strings, at most %d expected", root, buf[0], maxN)
	}
	out := make([]string, 0, k)
	for i := range k {
		row := buf[1+i*width:]
		l := int(row[0])
		if float32(l) != row[0] || l < 0 || l > maxLen {
			return nil, fmt.Errorf("train: rank %d sends a string of %v bytes, at most %d", root, row[0], maxLen)
		}
		b := make([]byte, l)
		for j := range b {
			v := row[1+j]
			if v < 0 || v > 255 || v != float32(int(v)) {
				return nil, fmt.Errorf("train: rank %d sends %v as a byte", root, v)
			}
			b[j] = byte(v)
		}
		out = append(out, string(b))
	}
	return out, nil
}
