package ring

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestAllgather: every rank ends with every rank's segment bit for bit —
// NaN payloads and all — for rings of 1 to 5, empty segments, segments
// of many frames, then an allreduce on the same ring still works.
func TestAllgather(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for n := 1; n <= 5; n++ {
		for _, shape := range []string{"even", "ragged", "empty"} {
			counts := make([]int, n)
			for k := range counts {
				switch shape {
				case "even":
					counts[k] = 100
				case "ragged":
					counts[k] = rng.IntN(300)
				case "empty":
					counts[k] = k % 2 * 37 // every other rank has nothing
				}
			}
			total := 0
			for _, c := range counts {
				total += c
			}
			want := make([]float32, total)
			for i := range want {
				want[i] = math.Float32frombits(rng.Uint32()) // NaNs and all
			}
			rs := newRings(t, MemRing(n), 64) // 16 elements a frame
			bufs := make([][]float32, n)
			errs := onAll(n, func(rank int) error {
				bufs[rank] = make([]float32, total)
				lo := 0
				for _, c := range counts[:rank] {
					lo += c
				}
				copy(bufs[rank][lo:lo+counts[rank]], want[lo:lo+counts[rank]])
				return rs[rank].Allgather(context.Background(), bufs[rank], counts)
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("n=%d %s: %v", n, shape, err)
			}
			for rank, b := range bufs {
				if !slices.Equal(f32Bits(b), f32Bits(want)) {
					t.Fatalf("n=%d %s: rank %d's buffer differs from the segments sent", n, shape, rank)
				}
			}
			sums := onAll(n, func(rank int) error { return rs[rank].AllreduceSum(context.Background(), []float32{1}) })
			if err := errors.Join(sums...); err != nil {
				t.Fatalf("n=%d %s: an allreduce after the allgather: %v", n, shape, err)
			}
		}
	}
}

func f32Bits(f []float32) []uint32 {
	out := make([]uint32, len(f))
	for i, v := range f {
		out[i] = math.Float32bits(v)
	}
	return out
}

// TestAllgatherMismatch: ranks that disagree on the segments fail with an
// error, never hang or fill a buffer wrong; bad arguments fail at once.
func TestAllgatherMismatch(t *testing.T) {
	rs := newRings(t, MemRing(3), 64)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errs := onAll(3, func(rank int) error {
		counts := []int{10, 10, 10}
		if rank == 1 {
			counts = []int{10, 12, 8}
		}
		return rs[rank].Allgather(ctx, make([]float32, 30), counts)
	})
	for rank, err := range errs {
		if err == nil || !(errors.Is(err, ErrBadFrame) || errors.Is(err, ErrPeerLost) || errors.Is(err, ErrClosed)) {
			t.Errorf("rank %d: %v; want a frame error", rank, err)
		}
	}
	r := newRings(t, MemRing(2), 64)[0]
	for _, tc := range []struct {
		buf    int
		counts []int
	}{{10, []int{5, 5, 5}}, {10, []int{5, 6}}, {10, []int{-1, 11}}} {
		if err := r.Allgather(ctx, make([]float32, tc.buf), tc.counts); err == nil {
			t.Errorf("%d elements, counts %v: no error", tc.buf, tc.counts)
		}
	}
}
