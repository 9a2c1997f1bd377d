package p2p

import (
	"errors"
	"io"
	"net"
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
// wrote them.
type stripedReader struct {
	parts []io.ReadCloser
	cur   int
	off   int
}

func (s *stripedReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	m := min(len(p), stripeBytes-s.off)
	k, err := s.parts[s.cur].Read(p[:m])
	s.off += k
	if s.off == stripeBytes {
		s.cur, s.off = (s.cur+1)%len(s.parts), 0
	}
	return k, err
}

func (s *stripedReader) Close() error { return closeParts(s.parts) }

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
