package ring

import (
	"context"
	"errors"
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
