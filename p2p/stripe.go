package p2p

import (
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A TLS ring link over a path with a long round trip is several TCP
// connections: one connection's window is its send buffer (Linux caps
// autotuning at 4 MiB), which over 100 ms of round trip carries 335
// Mbit/s at most. The link's bytes go round its connections in stripes
// of stripeBytes — stripe j on connection j mod k — so each connection
// stays an ordered stream and the reader knows where every byte is
// without a header.
const (
	maxLinkStreams = 8
	stripeBytes    = 256 << 10
	// streamWindow is what one connection is taken to carry in a round
	// trip, and streamRate the rate a link's connections are sized for:
	// 1 Gbit/s, twice over (at 100 ms, 6 connections moved 0.88 of the
	// link's rate in bench-longlinks, 4 of them 0.86).
	streamWindow = 4 << 20
	streamRate   = 125_000_000 * 2
)

// linkStreams is how many connections a link whose round trip is rtt
// opens: enough that their windows cover streamRate × rtt; one where the
// round trip is short or unknown.
func linkStreams(rtt time.Duration) int {
	need := int((float64(streamRate)*rtt.Seconds() + streamWindow - 1) / streamWindow)
	return min(max(need, 1), maxLinkStreams)
}

// connRTT is the kernel's smoothed round-trip time of a TCP connection
// (0 if it cannot be had).
func connRTT(c net.Conn) time.Duration {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return 0
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return 0
	}
	var rtt time.Duration
	raw.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			rtt = time.Duration(info.Rtt) * time.Microsecond
		}
	})
	return rtt
}

// setReadBuffer gives a connection of a striped link a receive buffer of
// 2·streamWindow from the start, rather than one Linux grows round trip
// by round trip from what the reader took. Only where the kernel allows
// one that large (fixedReadBuffer): a buffer set by hand is capped at
// net.core.rmem_max (then doubled) and is no longer grown, and on a
// machine left at the default cap (208 KiB) it would be far smaller than
// what autotuning reaches.
func setReadBuffer(c io.ReadCloser) {
	if sc, ok := c.(*secureConn); ok {
		c = sc.raw
	}
	if tc, ok := c.(interface{ SetReadBuffer(int) error }); ok {
		tc.SetReadBuffer(2 * streamWindow)
	}
}

// rmemMax is the kernel's cap on a receive buffer set by hand (0 if it
// cannot be read).
func rmemMax() int {
	b, err := os.ReadFile("/proc/sys/net/core/rmem_max")
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// fixedReadBuffer says whether a receive buffer set by hand, under a cap
// of rmemMax bytes, comes out at least 2·streamWindow (Linux doubles
// what is asked, for its bookkeeping).
func fixedReadBuffer(rmemMax int) bool { return 2*rmemMax >= 2*streamWindow }

// stripedWriter writes a link's bytes round its connections, stripe by
// stripe.
type stripedWriter struct {
	parts []io.WriteCloser
	cur   int // the connection the next byte goes on
	off   int // bytes of the current stripe written
}

func (s *stripedWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		m := min(len(p), stripeBytes-s.off)
		k, err := s.parts[s.cur].Write(p[:m])
		n += k
		s.off += k
		if s.off == stripeBytes {
			s.cur, s.off = (s.cur+1)%len(s.parts), 0
		}
		if err != nil {
			return n, err
		}
		p = p[m:]
	}
	return n, nil
}

// WriteBuffers writes b's slices in order (ring.BuffersWriter).
func (s *stripedWriter) WriteBuffers(b *net.Buffers) (int64, error) {
	var n int64
	for _, p := range *b {
		k, err := s.Write(p)
		n += int64(k)
		if err != nil {
			return n, err
		}
	}
	*b = nil
	return n, nil
}

// CloseWrite ends each connection's stream, so the reader reads to the
// end of what was sent.
func (s *stripedWriter) CloseWrite() error {
	var errs []error
	for _, p := range s.parts {
		if cw, ok := p.(interface{ CloseWrite() error }); ok {
			errs = append(errs, cw.CloseWrite())
		}
	}
	return errors.Join(errs...)
}

func (s *stripedWriter) Close() error { return closeParts(s.parts) }

// stripedReader reads a link's bytes back in the order stripedWriter
// wrote them. Each connection is read ahead into a buffer of its own by a
// goroutine: read only in its turn, a connection whose bytes came early
// would sit full in the kernel, whose receive window then closes and
// stays small (Linux sizes it by what the reader took in the last round
// trip), and the sender finds that connection's window shut half the time
// (bench-longlinks: rwnd_limited 45–57% of each connection's busy time).
type stripedReader struct {
	ahead []*readAhead
	cur   int // the connection the next byte comes on
	off   int // bytes of the current stripe read
	once  sync.Once
	wg    sync.WaitGroup
}

// stripeAhead is how far each connection of a striped link is read ahead
// of the link's reader.
const stripeAhead = 8 * stripeBytes

// newStripedReader reads the link over parts, which it owns: Close closes
// them and stops their goroutines.
func newStripedReader(parts []io.ReadCloser) *stripedReader {
	s := &stripedReader{ahead: make([]*readAhead, len(parts))}
	for i, c := range parts {
		a := &readAhead{c: c, buf: make([]byte, stripeAhead)}
		a.cond.L = &a.mu
		s.ahead[i] = a
		s.wg.Go(a.fill)
	}
	return s
}

func (s *stripedReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	k, err := s.ahead[s.cur].read(p[:min(len(p), stripeBytes-s.off)])
	s.off += k
	if s.off == stripeBytes {
		s.cur, s.off = (s.cur+1)%len(s.ahead), 0
	}
	return k, err
}

// Close closes the connections, ends a Read under way and waits for the
// goroutines reading ahead.
func (s *stripedReader) Close() error {
	var err error
	s.once.Do(func() {
		parts := make([]io.ReadCloser, len(s.ahead))
		for i, a := range s.ahead {
			a.mu.Lock()
			a.closed = true
			a.cond.Broadcast()
			a.mu.Unlock()
			parts[i] = a.c
		}
		err = closeParts(parts)
		s.wg.Wait()
	})
	return err
}

// readAhead is one connection of a striped link read ahead into buf, a
// ring of bytes: fill writes [w, r+len(buf)), read takes [r, w), and the
// two meet under mu.
type readAhead struct {
	c      io.ReadCloser
	buf    []byte
	mu     sync.Mutex
	cond   sync.Cond // on mu: bytes came, room was made, or closed
	r, w   int       // bytes taken, bytes read from c
	err    error     // c's, once its bytes are taken
	closed bool
}

// fill reads c into buf while there is room, until c fails or a is closed.
func (a *readAhead) fill() {
	n := len(a.buf)
	for {
		a.mu.Lock()
		for a.w-a.r == n && !a.closed {
			a.cond.Wait()
		}
		if a.closed {
			a.mu.Unlock()
			return
		}
		at := a.w % n
		room := min(n-(a.w-a.r), n-at)
		a.mu.Unlock()
		k, err := a.c.Read(a.buf[at : at+room])
		a.mu.Lock()
		a.w += k
		a.err = err
		a.cond.Broadcast()
		a.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// read takes up to len(p) bytes read ahead, waiting for some; then c's
// error, or net.ErrClosed once the link is closed.
func (a *readAhead) read(p []byte) (int, error) {
	n := len(a.buf)
	a.mu.Lock()
	for a.w == a.r && a.err == nil && !a.closed {
		a.cond.Wait()
	}
	switch {
	case a.w > a.r:
	case a.err != nil:
		err := a.err
		a.mu.Unlock()
		return 0, err
	default:
		a.mu.Unlock()
		return 0, net.ErrClosed
	}
	at := a.r % n
	k := min(len(p), a.w-a.r, n-at)
	a.mu.Unlock()
	copy(p, a.buf[at:at+k])
	a.mu.Lock()
	a.r += k
	a.cond.Broadcast()
	a.mu.Unlock()
	return k, nil
}

// closeParts closes a link's connections, those there are (nil where a
// connection never came).
func closeParts[C io.Closer](parts []C) error {
	var errs []error
	for _, p := range parts {
		if any(p) != nil {
			errs = append(errs, p.Close())
		}
	}
	return errors.Join(errs...)
}
