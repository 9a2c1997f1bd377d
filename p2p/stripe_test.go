package p2p

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"
)

// pipeEnd is one connection of a striped link held in memory.
type pipeEnd struct {
	*io.PipeReader
	w *io.PipeWriter
}

func (p pipeEnd) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p pipeEnd) Close() error                { p.w.Close(); return p.PipeReader.Close() }
func (p pipeEnd) CloseWrite() error           { return p.w.Close() }

// TestStripesCarryWhatWasWritten: over 1 to 4 connections, writes of any
// size — a byte, a stripe and a bit, many stripes, buffers — read back in
// order with reads of any size, and the link's end is io.EOF.
func TestStripesCarryWhatWasWritten(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for k := 1; k <= 4; k++ {
		w := &stripedWriter{}
		var parts []io.ReadCloser
		for range k {
			pr, pw := io.Pipe()
			e := pipeEnd{pr, pw}
			w.parts = append(w.parts, e)
			parts = append(parts, e)
		}
		r := newStripedReader(parts)
		var want []byte
		done := make(chan error, 1)
		wrng := rand.New(rand.NewPCG(uint64(k), 9)) // the writer's own
		go func() {
			for _, n := range []int{1, stripeBytes + 3, 5*stripeBytes - 1, 0, 17, 3 * stripeBytes} {
				p := make([]byte, n)
				for i := range p {
					p[i] = byte(wrng.Uint32())
				}
				want = append(want, p...)
				b := net.Buffers{p[:n/2], p[n/2:]}
				if _, err := w.WriteBuffers(&b); err != nil {
					done <- err
					return
				}
			}
			done <- w.CloseWrite()
		}()
		var got []byte
		buf := make([]byte, stripeBytes*2)
		for {
			n, err := r.Read(buf[:1+rng.IntN(len(buf)-1)])
			got = append(got, buf[:n]...)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%d connections: read %d bytes, %d written, or out of order", k, len(got), len(want))
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStripesReadAhead: a connection's bytes are taken from it before
// their turn — the sender's window stays open — up to stripeAhead, and
// Close ends a Read that waits and the reading ahead.
func TestStripesReadAhead(t *testing.T) {
	var ends []pipeEnd
	var parts []io.ReadCloser
	for range 2 {
		pr, pw := io.Pipe()
		ends = append(ends, pipeEnd{pr, pw})
		parts = append(parts, ends[len(ends)-1])
	}
	r := newStripedReader(parts)
	wrote := make(chan error, 1)
	go func() {
		// Stripes 1, 3, 5…: the second connection's, while nothing came
		// on the first; an io.Pipe's write waits for its reader.
		_, err := ends[1].Write(make([]byte, stripeAhead))
		wrote <- err
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second connection's bytes were not read before the first connection's stripe")
	}
	read := make(chan error, 1)
	go func() {
		_, err := r.Read(make([]byte, 10))
		read <- err
	}()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-read; !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("a Read under way when the link closed returned %v", err)
	}
}

// TestFixedReadBuffer: a striped connection's receive buffer is set by
// hand only where the kernel's cap lets it reach 2·streamWindow; under
// the default cap (208 KiB) autotuning is left to grow it.
func TestFixedReadBuffer(t *testing.T) {
	for _, c := range []struct {
		rmemMax int
		want    bool
	}{{212992, false}, {streamWindow - 1, false}, {streamWindow, true}, {4 << 20, true}, {64 << 20, true}} {
		if got := fixedReadBuffer(c.rmemMax); got != c.want {
			t.Errorf("fixedReadBuffer(%d) = %v, want %v", c.rmemMax, got, c.want)
		}
	}
}

func TestLinkStreams(t *testing.T) {
	for _, c := range []struct {
		rtt  time.Duration
		want int
	}{{0, 1}, {time.Millisecond, 1}, {15 * time.Millisecond, 1}, {20 * time.Millisecond, 2}, {100 * time.Millisecond, 6}, {time.Second, maxLinkStreams}} {
		if got := linkStreams(c.rtt); got != c.want {
			t.Errorf("linkStreams(%v) = %d, want %d", c.rtt, got, c.want)
		}
	}
}
