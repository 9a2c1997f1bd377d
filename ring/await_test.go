package ring

import (
	"context"
	"errors"
	"math/rand"
	"testing"
)

// TestAwaitIncoming: a rank waiting for the next collective returns once
// its predecessor has begun one, and the byte it read ahead reaches the
// collective — the sums are right. Ranks that wait while they call the
// collective themselves do not deadlock: the collective's reads wait for
// the read ahead, which the predecessor's first frame ends.
func TestAwaitIncoming(t *testing.T) {
	const n, length = 3, 1000
	for _, chunk := range []int{0, 64} {
		ts, reading := MemRing(n), make([]chan struct{}, n)
		for k := range ts {
			reading[k] = make(chan struct{}, 1<<16)
			ts[k] = &readSignal{Transport: ts[k], c: reading[k]}
		}
		rs := newRings(t, ts, chunk)
		rng := rand.New(rand.NewSource(12))
		in := randomBuffers(rng, n, length)
		out := clone(in)

		// Rank 1 waits; rank 0 begins; rank 1's wait ends; then 1 and 2 join.
		awaited := make(chan error, 1)
		go func() { awaited <- rs[1].AwaitIncoming(context.Background()) }()
		first := make(chan error, 1)
		go func() { first <- rs[0].AllreduceSum(context.Background(), out[0]) }()
		if err := <-awaited; err != nil {
			t.Fatalf("chunk %d: AwaitIncoming: %v", chunk, err)
		}
		errs := onAll(n, func(k int) error {
			if k == 0 {
				return <-first
			}
			return rs[k].AllreduceSum(context.Background(), out[k])
		})
		for k, err := range errs {
			if err != nil {
				t.Fatalf("chunk %d: rank %d: %v", chunk, k, err)
			}
		}
		checkAllreduce(t, OpAllreduceSum, in, out)

		// Every rank waits, and calls while it waits.
		in = randomBuffers(rng, n, length)
		out = clone(in)
		waits := make([]chan error, n)
		for k := range n {
			for len(reading[k]) > 0 {
				<-reading[k]
			}
			waits[k] = make(chan error, 1)
			go func() { waits[k] <- rs[k].AwaitIncoming(context.Background()) }()
			<-reading[k] // blocked in the read ahead
		}
		errs = onAll(n, func(k int) error { return rs[k].AllreduceSum(context.Background(), out[k]) })
		for k := range n {
			if err := errors.Join(errs[k], <-waits[k]); err != nil {
				t.Fatalf("chunk %d: rank %d: %v", chunk, k, err)
			}
		}
		checkAllreduce(t, OpAllreduceSum, in, out)
	}
}

// TestAwaitIncomingEnds: a wait ends with its context, and with the ring.
func TestAwaitIncomingEnds(t *testing.T) {
	rs := newRings(t, MemRing(2), 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := rs[0].AwaitIncoming(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("with its context cancelled: %v; want context.Canceled", err)
	}
	done := make(chan error, 1)
	go func() { done <- rs[1].AwaitIncoming(context.Background()) }()
	rs[0].Close()
	if err := <-done; !errors.Is(err, ErrPeerLost) {
		t.Errorf("with the predecessor closed: %v; want ErrPeerLost", err)
	}
	solo, err := New(nil, Config{Rank: 0, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := solo.AwaitIncoming(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("a ring of one: %v; want its context's end", err)
	}
}

// readSignal sends on c each time it is read from.
type readSignal struct {
	Transport
	c chan struct{}
}

func (r *readSignal) Read(p []byte) (int, error) {
	r.c <- struct{}{}
	return r.Transport.Read(p)
}
