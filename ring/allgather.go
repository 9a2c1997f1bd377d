package ring

import (
	"context"
	"fmt"
)

// Allgather gives every rank every rank's segment of buf: buf holds the
// segments of ranks 0…n−1 one after another, counts[k] elements of rank
// k's, and on entry this rank's own segment filled. It takes n − 1 steps,
// in step s a rank sending the segment of rank − s and receiving that of
// rank − s − 1, each frame forwarded as soon as it came: every rank sends
// each segment but the last it receives once, so a rank slow to forward
// holds the others up n − 1 times, where n broadcasts would wait on it
// n(n − 1) times. Segments are copied, not added: they arrive bit for bit.
// Every rank must pass the same counts.
func (r *Ring) Allgather(ctx context.Context, buf []float32, counts []int) error {
	if len(counts) != r.cfg.Size {
		return fmt.Errorf("ring: allgather of %d segments on a ring of %d", len(counts), r.cfg.Size)
	}
	total := 0
	for k, c := range counts {
		if c < 0 {
			return fmt.Errorf("ring: allgather: rank %d's segment of %d elements", k, c)
		}
		total += c
	}
	if total != len(buf) {
		return fmt.Errorf("ring: allgather of %d elements in a buffer of %d", total, len(buf))
	}
	return r.call(ctx, func(seq uint64) error { return r.allgather(seq, buf, counts) })
}

func (r *Ring) allgather(seq uint64, buf []float32, counts []int) error {
	n, rank := r.cfg.Size, r.cfg.Rank
	starts := make([]uint64, n+1)
	for k, c := range counts {
		starts[k+1] = starts[k] + uint64(c)
	}
	base := Header{Op: OpAllgather, Generation: r.cfg.Generation, Seq: seq, Count: uint64(len(buf))}
	frame := func(s, seg, c int) Header {
		h := base
		h.Step, h.Segment = uint32(s), uint32(seg)
		h.Offset = starts[seg] + uint64(c*r.chunk)
		h.Length = uint32(4 * (min(h.Offset+uint64(r.chunk), starts[seg+1]) - h.Offset))
		return h
	}
	nframes := 0
	for k := range n {
		nframes += frames(uint64(counts[k]), r.chunk)
	}
	// An empty segment still goes as one empty frame (frames), so that
	// every step has a frame to check and to wait for.
	framesOf := func(seg int) int { return frames(uint64(counts[seg]), r.chunk) }
	send := func(f *flow) error {
		for s := range n - 1 {
			seg := mod(rank-s, n)
			for c := range framesOf(seg) {
				if s > 0 && !f.awaitReady() {
					return nil
				}
				h := frame(s, seg, c)
				if err := r.writeFrame(&h, buf[h.Offset:h.Offset+uint64(h.Length/4)]); err != nil {
					return err
				}
			}
		}
		return nil
	}
	recv := func(f *flow) error {
		for s := range n - 1 {
			seg := mod(rank-s-1, n)
			for c := range framesOf(seg) {
				want := frame(s, seg, c)
				if err := r.fr.read(&want, asBytes(buf[want.Offset:want.Offset+uint64(want.Length/4)])); err != nil {
					return r.recvErr(&want, err)
				}
				if s < n-2 {
					f.ready <- struct{}{}
				}
			}
		}
		return nil
	}
	return r.pipe(send, recv, nframes+n)
}
