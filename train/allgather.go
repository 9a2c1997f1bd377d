package train

import (
	"context"
	"fmt"
	"math"
	"unsafe"
)

// maxGatherBytes bounds what allgatherBytes carries from one rank: its
// lengths travel as float32, exact up to 2^24.
const maxGatherBytes = 1 << 24

// allgatherBytes gives every rank every rank's bytes, in rank order, over
// a Collective: the lengths in one AllreduceSum (each rank's at its place,
// zero elsewhere), then the bytes in one ring allgather where the
// Collective has one (Allgatherer), else each rank's broadcast from it —
// copied, not added, so they arrive bit for bit.
// limit bounds every rank's length; a rank that announces more, or a
// length that is not a whole number, is an error before anything else is
// read.
func allgatherBytes(ctx context.Context, c Collective, mine []byte, limit int) ([][]byte, error) {
	limit = min(limit, maxGatherBytes)
	if len(mine) > limit {
		return nil, fmt.Errorf("train: %d bytes to gather, more than %d", len(mine), limit)
	}
	lens := make([]float32, c.Size())
	lens[c.Rank()] = float32(len(mine))
	if err := c.AllreduceSum(ctx, lens); err != nil {
		return nil, err
	}
	return broadcastEach(ctx, c, mine, lens, 1, limit)
}

// broadcastEach is allgatherBytes once the lengths are known: sums[k]/f
// is rank k's, sent in an allreduce that had more to carry (f is the
// size for a mean, 1 for a sum), which saves the ring a collective.
func broadcastEach(ctx context.Context, c Collective, mine []byte, sums []float32, f float64, limit int) ([][]byte, error) {
	limit = min(limit, maxGatherBytes)
	n, me := c.Size(), c.Rank()
	lens := make([]int, n)
	for k, s := range sums {
		v := float64(s) * f
		l := math.Round(v)
		if !(l >= 0 && l <= float64(limit) && math.Abs(v-l) < 0.25) {
			return nil, fmt.Errorf("train: rank %d has %v bytes to gather; want a whole number up to %d", k, v, limit)
		}
		lens[k] = int(l)
	}
	if lens[me] != len(mine) {
		return nil, fmt.Errorf("train: this rank has %d bytes to gather and the sum says %d", len(mine), lens[me])
	}
	out := make([][]byte, n)
	if ag, ok := c.(Allgatherer); ok {
		counts, total := make([]int, n), 0
		for k, l := range lens {
			counts[k] = (l + 3) / 4
			total += counts[k]
		}
		buf := make([]float32, total)
		for k, off := 0, 0; k < n; k++ {
			b := f32Bytes(buf[off : off+counts[k]])
			off += counts[k]
			if k == me {
				copy(b, mine)
			}
			out[k] = b[:lens[k]:lens[k]]
		}
		if err := ag.Allgather(ctx, buf, counts); err != nil {
			return nil, err
		}
		return out, nil
	}
	for k := range n {
		l := lens[k]
		buf := make([]float32, (l+3)/4)
		b := f32Bytes(buf)
		if k == me {
			copy(b, mine)
		}
		if err := c.Broadcast(ctx, buf, k); err != nil {
			return nil, err
		}
		out[k] = b[:l:l]
	}
	return out, nil
}

// Allgatherer is a Collective with a ring allgather (ring.Ring): every
// rank's segment to every rank in n − 1 steps, where n broadcasts would
// each pass every rank.
type Allgatherer interface {
	Allgather(ctx context.Context, buf []float32, counts []int) error
}

// f32Bytes views f as its bytes (the machine's order), without copying.
func f32Bytes(f []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}
