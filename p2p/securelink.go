package p2p

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
)

// The TLS data plane: a ring link is one direct TCP connection between
// neighbours running TLS 1.3, with no stream multiplexer on it. Each side
// proves its libp2p identity in the handshake the way libp2p's own TLS
// transport does (a self-signed certificate carrying the host key's
// signature), and the dialer then proves, inside the encrypted channel,
// that the ring named it for this link: a one-time token the successor
// gave it over the authenticated libp2p stream, the job's digest, the
// generation, its rank and the channel. Nothing of a link is handed to the
// ring before all of that holds.

// secureALPN keeps a ring link's handshake from being taken for a libp2p
// connection's, or one for the other.
const secureALPN = "/ringtrain/link/1"

const (
	secureHelloMagic uint32 = 0x314c5352 // "RSL1"
	secureHelloSize         = 4 + tokenSize + sha256.Size + 8 + 4 + 4
	// secureHandshake bounds a dialer's TLS handshake and hello.
	secureHandshake = 10 * time.Second
	// batchSize is how many bytes of TLS records one write to the socket
	// carries at most: crypto/tls writes each record of at most 16 KiB
	// with its own system call, and a ring frame is megabytes.
	batchSize = 256 << 10
)

// secureHello is what a dialer says first inside the TLS channel.
type secureHello struct {
	token [tokenSize]byte
	job   [sha256.Size]byte
	gen   uint64
	rank  int
	ch    Channel
}

func (m secureHello) encode() []byte {
	b := binary.LittleEndian.AppendUint32(make([]byte, 0, secureHelloSize), secureHelloMagic)
	b = append(b, m.token[:]...)
	b = append(b, m.job[:]...)
	b = binary.LittleEndian.AppendUint64(b, m.gen)
	b = binary.LittleEndian.AppendUint32(b, uint32(m.rank))
	return binary.LittleEndian.AppendUint32(b, uint32(m.ch))
}

// parseSecureHello reads a secure link's hello, its magic, rank and
// channel checked; the rest is compared with what the token was given for.
func parseSecureHello(b []byte) (secureHello, error) {
	var m secureHello
	if len(b) != secureHelloSize {
		return m, fmt.Errorf("a link hello of %d bytes; want %d", len(b), secureHelloSize)
	}
	if magic := binary.LittleEndian.Uint32(b); magic != secureHelloMagic {
		return m, fmt.Errorf("magic %#x; want %#x", magic, secureHelloMagic)
	}
	b = b[4:]
	copy(m.token[:], b)
	copy(m.job[:], b[tokenSize:])
	b = b[tokenSize+sha256.Size:]
	m.gen = binary.LittleEndian.Uint64(b)
	m.rank = int(binary.LittleEndian.Uint32(b[8:]))
	m.ch = Channel(binary.LittleEndian.Uint32(b[12:]))
	switch {
	case m.rank >= maxHelloPeers:
		return m, fmt.Errorf("rank %d; a ring holds at most %d peers", m.rank, maxHelloPeers)
	case m.ch > maxChannel:
		return m, fmt.Errorf("unknown channel %d", m.ch)
	}
	return m, nil
}

// JobDigest is what a ring link of the TLS plane names its job by: a digest
// of the job key, which only peers that know the job can compute.
func JobDigest(j Job) [sha256.Size]byte {
	return sha256.Sum256(append([]byte("ringtrain/link\x00"), jobKey(j)...))
}

// pendingLink is a link the successor handed a token out for: the peer,
// generation, channel and rank it must come from.
type pendingLink struct {
	key     linkKey
	rank    int
	conn    chan io.ReadCloser // gets the link once claimed
	claimed bool               // under RingLinks.mu
}

// tlsIdentity is this host's libp2p identity as TLS certificates, made
// once.
type tlsIdentity struct {
	once sync.Once
	id   *libp2ptls.Identity
	err  error
}

func (t *tlsIdentity) get(priv crypto.PrivKey) (*libp2ptls.Identity, error) {
	t.once.Do(func() {
		if priv == nil {
			t.err = errors.New("p2p: the host's private key is not in its peerstore: no TLS link can prove it")
			return
		}
		t.id, t.err = libp2ptls.NewIdentity(priv)
	})
	return t.id, t.err
}

// linkTLSConfig is id's config for a ring link to or from remote (""
// means any peer; the caller checks who it was against a token), and the
// channel that gives the remote's key once verified.
func linkTLSConfig(id *libp2ptls.Identity, remote peer.ID) (*tls.Config, <-chan crypto.PubKey) {
	conf, keys := id.ConfigForPeer(remote)
	conf.NextProtos = []string{secureALPN}
	// Ring frames are megabytes: small first records would only add
	// records and system calls.
	conf.DynamicRecordSizingDisabled = true
	return conf, keys
}

// dialSecure opens a TLS link to succ at addr and says hello in it.
func dialSecure(ctx context.Context, id *libp2ptls.Identity, succ peer.ID, addr string, hello secureHello) (*secureConn, error) {
	ctx, cancel := context.WithTimeout(ctx, secureHandshake)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("TLS data plane: dialing %s: %w", addr, err)
	}
	conf, _ := linkTLSConfig(id, succ)
	sc := newSecureConn(c, func(b net.Conn) *tls.Conn { return tls.Client(b, conf) })
	if err := sc.tls.HandshakeContext(ctx); err != nil {
		sc.Close()
		return nil, fmt.Errorf("TLS data plane: handshake with %s at %s: %w", succ, addr, err)
	}
	if p := sc.tls.ConnectionState().NegotiatedProtocol; p != secureALPN {
		sc.Close()
		return nil, fmt.Errorf("TLS data plane: %s at %s speaks %q, not a ring link", succ, addr, p)
	}
	sc.batching.Store(true)
	if deadline, ok := ctx.Deadline(); ok {
		c.SetWriteDeadline(deadline)
	}
	if _, err := sc.Write(hello.encode()); err != nil {
		sc.Close()
		return nil, fmt.Errorf("TLS data plane: hello to %s: %w", succ, err)
	}
	c.SetWriteDeadline(time.Time{})
	return sc, nil
}

// acceptSecure runs the server side of a TLS link on c: the handshake,
// which proves the dialer's libp2p identity, then its hello, which must
// name a pending link for exactly that peer. It returns the link and the
// pending one it fills, which it has taken out of pending; on error c is
// closed and the returned peer (if the handshake got that far) is who to
// blame.
func (l *RingLinks) acceptSecure(c net.Conn) (*secureConn, *pendingLink, peer.ID, error) {
	id, err := l.tls.get(l.h.Peerstore().PrivKey(l.h.ID()))
	if err != nil {
		c.Close()
		return nil, nil, "", err
	}
	conf, keys := linkTLSConfig(id, "")
	sc := newSecureConn(c, func(b net.Conn) *tls.Conn { return tls.Server(b, conf) })
	fail := func(who peer.ID, err error) (*secureConn, *pendingLink, peer.ID, error) {
		sc.Close()
		return nil, nil, who, err
	}
	c.SetDeadline(time.Now().Add(secureHandshake))
	if err := sc.tls.Handshake(); err != nil {
		return fail("", fmt.Errorf("TLS handshake: %w", err))
	}
	var who peer.ID
	select {
	case k, ok := <-keys:
		if ok {
			who, err = peer.IDFromPublicKey(k)
		}
		if !ok || err != nil {
			return fail("", fmt.Errorf("TLS handshake: no peer identity (%v)", err))
		}
	default:
		return fail("", errors.New("TLS handshake: no peer identity"))
	}
	if p := sc.tls.ConnectionState().NegotiatedProtocol; p != secureALPN {
		return fail(who, fmt.Errorf("protocol %q, not a ring link", p))
	}
	var b [secureHelloSize]byte
	if _, err := io.ReadFull(sc, b[:]); err != nil {
		return fail(who, fmt.Errorf("reading the link hello: %w", err))
	}
	m, err := parseSecureHello(b[:])
	if err != nil {
		return fail(who, err)
	}
	c.SetDeadline(time.Time{})
	p, err := l.claim(who, m)
	if err != nil {
		return fail(who, err)
	}
	sc.batching.Store(true)
	return sc, p, who, nil
}

// claim takes the pending link that hello m from peer who names, if every
// field matches what its token was given for; a token presented by the
// wrong peer, or for another job, generation, channel or rank, is left
// for the one it was given to.
func (l *RingLinks) claim(who peer.ID, m secureHello) (*pendingLink, error) {
	job := l.gate.JobDigest()
	l.mu.Lock()
	defer l.mu.Unlock()
	var found *pendingLink
	var tok [tokenSize]byte
	for t, p := range l.tokens {
		if subtle.ConstantTimeCompare(t[:], m.token[:]) == 1 {
			found, tok = p, t
		}
	}
	switch {
	case found == nil:
		return nil, errors.New("a token that was never handed out, or was used")
	case found.key.from != who:
		return nil, fmt.Errorf("a token handed to %s", found.key.from)
	case subtle.ConstantTimeCompare(m.job[:], job[:]) != 1:
		return nil, errors.New("a link of another job")
	case m.gen != found.key.gen:
		return nil, fmt.Errorf("a link of generation %d; the token is for %d", m.gen, found.key.gen)
	case m.ch != found.key.ch || m.rank != found.rank:
		return nil, fmt.Errorf("a link from rank %d on channel %d; the token is for rank %d on channel %d", m.rank, m.ch, found.rank, found.key.ch)
	}
	delete(l.tokens, tok)
	found.claimed = true
	return found, nil
}

// secureConn is a TLS link whose records go out in batches: one Write of a
// ring frame becomes one system call per batchSize bytes, not one per
// 16-KiB record.
type secureConn struct {
	tls      *tls.Conn
	raw      net.Conn
	out      *recordBatcher
	batching *atomic.Bool
	closed   func() // after Close: RingLinks forgets the link
}

func newSecureConn(c net.Conn, wrap func(net.Conn) *tls.Conn) *secureConn {
	b := &recordBatcher{Conn: c}
	return &secureConn{tls: wrap(b), raw: c, out: b, batching: &b.on}
}

// Read reads the plaintext of verified records.
func (s *secureConn) Read(p []byte) (int, error) { return s.tls.Read(p) }

// Write seals p into records and sends them before it returns.
func (s *secureConn) Write(p []byte) (int, error) {
	n, err := s.tls.Write(p)
	if ferr := s.out.flush(); err == nil {
		err = ferr
	}
	return n, err
}

// CloseWrite says close_notify and half-closes the connection, so the
// successor reads to the end of what was sent.
func (s *secureConn) CloseWrite() error {
	err := s.tls.CloseWrite()
	if ferr := s.out.flush(); err == nil {
		err = ferr
	}
	if tc, ok := s.raw.(interface{ CloseWrite() error }); ok {
		if cerr := tc.CloseWrite(); err == nil {
			err = cerr
		}
	}
	return err
}

// Close closes the link; it also ends a Read or Write in progress.
func (s *secureConn) Close() error {
	err := s.tls.Close()
	if s.closed != nil {
		s.closed()
	}
	return err
}

// recordBatcher gathers what crypto/tls writes while on, until flushed.
type recordBatcher struct {
	net.Conn
	on  atomic.Bool
	mu  sync.Mutex // Write and flush against Close's last flush
	buf []byte
}

func (b *recordBatcher) Write(p []byte) (int, error) {
	if !b.on.Load() {
		return b.Conn.Write(p)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.buf)+len(p) > batchSize {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
	}
	if len(p) > batchSize {
		return b.Conn.Write(p)
	}
	if b.buf == nil {
		b.buf = make([]byte, 0, batchSize)
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *recordBatcher) flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.flushLocked()
}

func (b *recordBatcher) flushLocked() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.Conn.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}

// Close sends what is gathered (crypto/tls's close_notify) unless a Write
// is in progress — a Close then is there to break it — and closes.
func (b *recordBatcher) Close() error {
	if b.mu.TryLock() {
		b.flushLocked()
		b.mu.Unlock()
	}
	return b.Conn.Close()
}
