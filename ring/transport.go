package ring

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Streams is a Transport made of two streams: one to the successor and one
// from the predecessor. In-memory pipes, TCP connections and libp2p streams
// all fit it.
type Streams struct {
	next io.WriteCloser
	prev io.ReadCloser
	once sync.Once
	err  error
}

var _ Transport = (*Streams)(nil)

// NewStreams returns a Transport that writes to next and reads from prev,
// and closes both when it is closed.
func NewStreams(next io.WriteCloser, prev io.ReadCloser) *Streams {
	return &Streams{next: next, prev: prev}
}

// Write sends to the successor.
func (s *Streams) Write(p []byte) (int, error) { return s.next.Write(p) }

// WriteBuffers sends b to the successor: through the stream's own
// WriteBuffers where it has one, in one writev where it is a net.Conn,
// and write by write otherwise.
func (s *Streams) WriteBuffers(b *net.Buffers) (int64, error) {
	if bw, ok := s.next.(BuffersWriter); ok {
		return bw.WriteBuffers(b)
	}
	return b.WriteTo(s.next)
}

// Read receives from the predecessor.
func (s *Streams) Read(p []byte) (int, error) { return s.prev.Read(p) }

// Close closes both streams once; later calls return the first result.
func (s *Streams) Close() error {
	s.once.Do(func() { s.err = errors.Join(s.next.Close(), s.prev.Close()) })
	return s.err
}

var _ Drainer = (*Streams)(nil)

// Drain half-closes the stream to the successor (where it can be: TCP
// connections and libp2p streams can, a pipe closes whole), then reads
// both streams to their ends — the predecessor's closing, and the
// successor's closing of its side — discarding what comes, until ctx
// ends; then it closes both. The stream from the predecessor is closed as
// soon as its end is read, which tells the predecessor that all it sent
// was read: so every rank of a ring can drain at once, each waiting only
// on its neighbours.
func (s *Streams) Drain(ctx context.Context) error {
	if cw, ok := s.next.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	} else {
		s.next.Close()
	}
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() {
		io.Copy(io.Discard, s.prev)
		s.prev.Close()
	})
	if r, ok := s.next.(io.Reader); ok {
		wg.Go(func() { io.Copy(io.Discard, r) })
	}
	wg.Wait()
	s.Close()
	return ctx.Err()
}

// MemRing returns the Transports of an in-memory ring of n ranks, indexed by
// rank, for tests and benchmarks. Each link is an io.Pipe, so bytes are
// copied once, straight from the sender's buffer into the receiver's.
func MemRing(n int) []Transport {
	readers := make([]*io.PipeReader, n)
	writers := make([]*io.PipeWriter, n)
	for i := range n {
		readers[i], writers[i] = io.Pipe() // link i: rank i → rank i+1
	}
	ts := make([]Transport, n)
	for i := range n {
		ts[i] = NewStreams(writers[i], readers[mod(i-1, n)])
	}
	return ts
}

// tcpHello is what a dialing rank sends first on a TCP ring link, so the
// acceptor can tell its predecessor of this generation from anyone else.
const (
	tcpHelloMagic uint32 = 0x31485452 // "RTH1"
	tcpHelloSize         = 16         // magic u32 | rank u32 | generation u64
)

// ConnectTCP forms this rank's links of a plain TCP ring: it dials next (the
// successor's listen address) and accepts the predecessor on ln, each side
// checked by a short hello that carries rank and generation. Dialing is
// retried until ctx ends, since the successor may not be listening yet.
// Connections that do not say hello correctly are closed and waited past.
// ln is not closed.
func ConnectTCP(ctx context.Context, ln net.Listener, next string, cfg Config) (*Streams, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	type result struct {
		c   net.Conn
		err error
	}
	dialed := make(chan result, 1)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		c, err := dialSuccessor(ctx, next, cfg)
		dialed <- result{c, err}
	}()
	prev, aerr := acceptPredecessor(ctx, ln, cfg)
	if aerr != nil {
		cancel()
	}
	d := <-dialed
	if aerr != nil || d.err != nil {
		for _, c := range []net.Conn{prev, d.c} {
			if c != nil {
				c.Close()
			}
		}
		return nil, errors.Join(aerr, d.err)
	}
	return NewStreams(d.c, prev), nil
}

func dialSuccessor(ctx context.Context, addr string, cfg Config) (net.Conn, error) {
	var d net.Dialer
	backoff := 10 * time.Millisecond
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			var hello [tcpHelloSize]byte
			binary.LittleEndian.PutUint32(hello[0:], tcpHelloMagic)
			binary.LittleEndian.PutUint32(hello[4:], uint32(cfg.Rank))
			binary.LittleEndian.PutUint64(hello[8:], cfg.Generation)
			if _, err = c.Write(hello[:]); err == nil {
				return c, nil
			}
			c.Close()
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("ring: rank %d dialing successor at %s: %w (last error: %v)", cfg.Rank, addr, ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// acceptPredecessor accepts connections on ln until one says hello as this
// rank's predecessor in this generation.
func acceptPredecessor(ctx context.Context, ln net.Listener, cfg Config) (net.Conn, error) {
	pred := mod(cfg.Rank-1, cfg.Size)
	// Accept does not take a context: closing would end the caller's
	// listener, so wake it with a deadline instead where the listener allows.
	type deadliner interface{ SetDeadline(time.Time) error }
	if dl, ok := ln.(deadliner); ok {
		stop := context.AfterFunc(ctx, func() { dl.SetDeadline(time.Unix(1, 0)) })
		defer func() {
			stop()
			dl.SetDeadline(time.Time{})
		}()
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("ring: rank %d waiting for predecessor (rank %d): %w", cfg.Rank, pred, ctx.Err())
			}
			return nil, fmt.Errorf("ring: rank %d accepting predecessor: %w", cfg.Rank, err)
		}
		if err := checkHello(ctx, c, pred, cfg.Generation); err != nil {
			c.Close()
			continue
		}
		return c, nil
	}
}

func checkHello(ctx context.Context, c net.Conn, pred int, gen uint64) error {
	deadline := time.Now().Add(5 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.SetReadDeadline(deadline)
	defer c.SetReadDeadline(time.Time{})
	var hello [tcpHelloSize]byte
	if _, err := io.ReadFull(c, hello[:]); err != nil {
		return err
	}
	le := binary.LittleEndian
	if m, r, g := le.Uint32(hello[0:]), le.Uint32(hello[4:]), le.Uint64(hello[8:]); m != tcpHelloMagic || r != uint32(pred) || g != gen {
		return fmt.Errorf("hello (magic %#x, rank %d, generation %d), want rank %d generation %d", m, r, g, pred, gen)
	}
	return nil
}

// LoopbackTCP forms a plain TCP ring of n ranks on 127.0.0.1, for tests and
// benchmarks, and returns its Transports indexed by rank.
func LoopbackTCP(ctx context.Context, n int, gen uint64) (_ []Transport, err error) {
	lns := make([]net.Listener, n)
	defer func() {
		for _, ln := range lns {
			if ln != nil {
				ln.Close()
			}
		}
	}()
	var lc net.ListenConfig
	for i := range lns {
		if lns[i], err = lc.Listen(ctx, "tcp", "127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("ring: loopback listen: %w", err)
		}
	}
	ts := make([]Transport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			cfg := Config{Rank: i, Size: n, Generation: gen}
			var s *Streams
			s, errs[i] = ConnectTCP(ctx, lns[i], lns[mod(i+1, n)].Addr().String(), cfg)
			if s != nil {
				ts[i] = s
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, t := range ts {
			if t != nil {
				t.Close()
			}
		}
		return nil, err
	}
	return ts, nil
}
