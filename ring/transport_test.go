package ring

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestConnectTCPRefusesStrangers: connections that do not say hello as this
// rank's predecessor — garbage, or the right shape from the wrong rank or
// generation — are closed, and the real predecessor is still accepted.
func TestConnectTCPRefusesStrangers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var lc net.ListenConfig
	ln0, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln0.Close()
	ln1, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln1.Close()

	// Strangers reach rank 1 first: rank 1's predecessor is rank 0 of
	// generation 5.
	strangers := []Config{{Rank: 1, Size: 2, Generation: 5}, {Rank: 0, Size: 2, Generation: 4}}
	for _, cfg := range strangers {
		c, err := dialSuccessor(ctx, ln1.Addr().String(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	garbage, err := net.Dial("tcp", ln1.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer garbage.Close()
	garbage.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))

	errs := onAll(2, func(i int) error {
		lns := []net.Listener{ln0, ln1}
		s, err := ConnectTCP(ctx, lns[i], lns[1-i].Addr().String(), Config{Rank: i, Size: 2, Generation: 5})
		if err != nil {
			return err
		}
		r, err := New(s, Config{Rank: i, Size: 2, Generation: 5})
		if err != nil {
			return err
		}
		defer r.Close()
		buf := []float32{float32(i + 1)}
		if err := r.AllreduceSum(ctx, buf); err != nil {
			return err
		}
		if buf[0] != 3 {
			return errors.New("allreduce over the accepted links gave the wrong sum")
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestConnectTCPTimesOut: with nobody at the successor's address, ConnectTCP
// gives up when its context ends and says what it was waiting for.
func TestConnectTCPTimesOut(t *testing.T) {
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dead, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := dead.Addr().String()
	dead.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = ConnectTCP(ctx, ln, addr, Config{Rank: 0, Size: 2})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ConnectTCP to nobody = %v; want context.DeadlineExceeded", err)
	}
}

// TestLeaveDeliversTheLastFrames: a rank that leaves after writing its
// last bytes returns from Leave only once its neighbours have closed their
// links — after they read everything it sent — and not before, over TCP
// and over in-memory pipes; a neighbour that never closes costs it ctx's
// bound, no more.
func TestLeaveDeliversTheLastFrames(t *testing.T) {
	for _, kind := range []string{"tcp", "mem"} {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ts := MemRing(2)
			if kind == "tcp" {
				var err error
				if ts, err = LoopbackTCP(ctx, 2, 1); err != nil {
					t.Fatal(err)
				}
			}
			leaver, err := New(ts[0], Config{Rank: 0, Size: 2, Generation: 1})
			if err != nil {
				t.Fatal(err)
			}
			last := bytes.Repeat([]byte{7}, 4<<20)
			wrote := make(chan error, 1)
			go func() { _, err := ts[0].Write(last); wrote <- err }()
			got := make(chan []byte, 1)
			closed := make(chan time.Time, 1)
			go func() {
				b := make([]byte, len(last))
				io.ReadFull(ts[1], b)
				got <- b
				closed <- time.Now()
				ts[1].Close()
			}()
			if err := <-wrote; err != nil {
				t.Fatal(err)
			}
			if err := leaver.Leave(ctx); err != nil {
				t.Fatalf("Leave: %v", err)
			}
			left := time.Now()
			if !bytes.Equal(<-got, last) {
				t.Fatal("the neighbour did not read the leaver's last bytes whole")
			}
			if c := <-closed; left.Before(c) {
				t.Fatalf("Leave returned %v before the neighbour closed", c.Sub(left))
			}
			if err := leaver.Barrier(ctx); !errors.Is(err, ErrClosed) {
				t.Fatalf("a call after Leave: %v; want ErrClosed", err)
			}
		})
	}
	// A neighbour that never closes: Leave ends with ctx.
	ts := MemRing(2)
	r, _ := New(ts[0], Config{Rank: 0, Size: 2, Generation: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := r.Leave(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Leave beside a neighbour that never closes: %v; want the deadline", err)
	}
}

// TestEveryRankLeavesAtOnce: when all ranks of a ring leave together —
// the end of a job, after its last barrier — each Leave returns once its
// neighbours have read what it sent, without waiting for ctx: no rank
// waits on one that waits on it.
func TestEveryRankLeavesAtOnce(t *testing.T) {
	for _, kind := range []string{"tcp", "mem"} {
		t.Run(kind, func(t *testing.T) {
			const n = 4
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ts := MemRing(n)
			if kind == "tcp" {
				var err error
				if ts, err = LoopbackTCP(ctx, n, 1); err != nil {
					t.Fatal(err)
				}
			}
			errs := make(chan error, n)
			for rank := range n {
				go func() {
					r, err := New(ts[rank], Config{Rank: rank, Size: n, Generation: 1})
					if err == nil {
						if err = r.Barrier(ctx); err == nil {
							err = r.Leave(ctx)
						}
					}
					errs <- err
				}()
			}
			for range n {
				if err := <-errs; err != nil {
					t.Fatalf("a rank's barrier and leave: %v; want both done before the deadline", err)
				}
			}
		})
	}
}
