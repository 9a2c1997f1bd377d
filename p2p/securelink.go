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
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
)

// The TLS data plane: a ring link is one direct TCP connection between
// neighbours, with no stream multiplexer on it. A TLS 1.3 handshake has
// each side prove its libp2p identity the way libp2p's own TLS transport
// does (a self-signed certificate carrying the host key's signature) and
// gives the keys of the link's records (records.go). The dialer's first
// record then proves that the ring named it for this link: a one-time
// token the successor gave it over the authenticated libp2p stream, the
// job's digest, the generation, its rank and the channel. Nothing of a
// link is handed to the ring before all of that holds.

// secureALPN keeps a ring link's handshake from being taken for a libp2p
// connection's, or one for the other.
const secureALPN = "/ringtrain/link/1"

const (
	secureHelloMagic uint32 = 0x314c5352 // "RSL1"
	secureHelloSize         = 4 + tokenSize + sha256.Size + 8 + 4 + 4 + 2
	// secureHandshake bounds a link's TLS handshake and hello.
	secureHandshake = 10 * time.Second
)

// secureHello is what a dialer says first inside the TLS channel.
type secureHello struct {
	token [tokenSize]byte
	job   [sha256.Size]byte
	gen   uint64
	rank  int
	ch    Channel
	// stream is this connection's place among the link's streams
	// connections (stripe.go); a link of one connection is 0 of 1.
	stream, streams int
}

func (m secureHello) encode() []byte {
	b := binary.LittleEndian.AppendUint32(make([]byte, 0, secureHelloSize), secureHelloMagic)
	b = append(b, m.token[:]...)
	b = append(b, m.job[:]...)
	b = binary.LittleEndian.AppendUint64(b, m.gen)
	b = binary.LittleEndian.AppendUint32(b, uint32(m.rank))
	b = binary.LittleEndian.AppendUint32(b, uint32(m.ch))
	return append(b, byte(m.stream), byte(max(m.streams, 1)))
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
	m.stream, m.streams = int(b[16]), int(b[17])
	switch {
	case m.streams < 1 || m.streams > maxLinkStreams || m.stream >= m.streams:
		return m, fmt.Errorf("connection %d of %d; a link has 1 to %d", m.stream, m.streams, maxLinkStreams)
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
// generation, channel and rank it must come from. Its connections come
// one by one (parts, by place, under RingLinks.mu); once all have, the
// link goes on conn and claimed is set.
type pendingLink struct {
	key     linkKey
	rank    int
	conn    chan io.ReadCloser // gets the link once claimed
	claimed bool               // under RingLinks.mu
	parts   []io.ReadCloser
	have    int
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
	// No TLS record may follow the handshake: the link's own records do,
	// and a session ticket among them would read as a forged one.
	conf.SessionTicketsDisabled = true
	return conf, keys
}

// dialSecure opens a TLS connection to succ at addr; the caller says
// hello in it (sayHello) before the successor's handshake deadline.
func dialSecure(ctx context.Context, id *libp2ptls.Identity, succ peer.ID, addr string) (*secureConn, error) {
	ctx, cancel := context.WithTimeout(ctx, secureHandshake)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("TLS data plane: dialing %s: %w", addr, err)
	}
	conf, _ := linkTLSConfig(id, succ)
	tc := tls.Client(&handshakeConn{Conn: c}, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("TLS data plane: handshake with %s at %s: %w", succ, addr, err)
	}
	cs := tc.ConnectionState()
	if cs.NegotiatedProtocol != secureALPN {
		c.Close()
		return nil, fmt.Errorf("TLS data plane: %s at %s speaks %q, not a ring link", succ, addr, cs.NegotiatedProtocol)
	}
	sc, err := newSecureConn(c, cs, true)
	if err != nil {
		c.Close()
		return nil, err
	}
	return sc, nil
}

// sayHello sends hello on sc within secureHandshake.
func sayHello(sc *secureConn, succ peer.ID, hello secureHello) error {
	sc.raw.SetWriteDeadline(time.Now().Add(secureHandshake))
	if _, err := sc.Write(hello.encode()); err != nil {
		sc.Close()
		return fmt.Errorf("TLS data plane: hello to %s: %w", succ, err)
	}
	sc.raw.SetWriteDeadline(time.Time{})
	return nil
}

// acceptSecure runs the acceptor's side of a TLS link on c: the
// handshake, which proves the dialer's libp2p identity, then its hello,
// which must name a pending link for exactly that peer. The connection
// joins that link (claim), which goes to its waiter once its every
// connection has come. It returns who dialed; on error c is closed and
// the peer (if the handshake got that far) is who to blame.
func (l *RingLinks) acceptSecure(c net.Conn) (peer.ID, error) {
	fail := func(who peer.ID, err error) (peer.ID, error) {
		c.Close()
		return who, err
	}
	id, err := l.tls.get(l.h.Peerstore().PrivKey(l.h.ID()))
	if err != nil {
		return fail("", err)
	}
	conf, keys := linkTLSConfig(id, "")
	tc := tls.Server(&handshakeConn{Conn: c}, conf)
	c.SetDeadline(time.Now().Add(secureHandshake))
	if err := tc.Handshake(); err != nil {
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
	// A peer proven in the handshake holds a slot until its hello only
	// while it has a token to present there: a stranger (no token is ever
	// given one) or a peer past its tokens is closed at once, so that no
	// identity, from however many addresses, keeps the slots that the
	// ring's links wait for.
	if !l.helloSlot(who) {
		return fail(who, errors.New("no link is awaited from this peer, or its every awaited link is already in hand"))
	}
	defer l.helloDone(who)
	cs := tc.ConnectionState()
	if cs.NegotiatedProtocol != secureALPN {
		return fail(who, fmt.Errorf("protocol %q, not a ring link", cs.NegotiatedProtocol))
	}
	sc, err := newSecureConn(c, cs, false)
	if err != nil {
		return fail(who, err)
	}
	sc.limit = secureHelloSize // no larger record before the hello proves the link
	var b [secureHelloSize]byte
	if _, err := io.ReadFull(sc, b[:]); err != nil {
		return fail(who, fmt.Errorf("reading the link hello: %w", err))
	}
	sc.limit = maxRecord
	m, err := parseSecureHello(b[:])
	if err != nil {
		return fail(who, err)
	}
	c.SetDeadline(time.Time{})
	if _, err := l.claim(who, m, l.track(sc)); err != nil {
		sc.Close()
		return who, err
	}
	return who, nil
}

// helloSlot takes one of who's slots for a hello: it has as many as the
// connections the tokens given it may still bring.
func (l *RingLinks) helloSlot(who peer.ID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	awaited := 0
	for _, p := range l.tokens {
		if p.key.from == who && !p.claimed {
			awaited += maxLinkStreams - p.have
		}
	}
	if l.inHello[who] >= awaited {
		return false
	}
	if l.inHello == nil {
		l.inHello = map[peer.ID]int{}
	}
	l.inHello[who]++
	return true
}

// helloDone gives back who's hello slot.
func (l *RingLinks) helloDone(who peer.ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inHello[who]--; l.inHello[who] <= 0 {
		delete(l.inHello, who)
	}
}

// claim takes the pending link that hello m from peer who names, if every
// field matches what its token was given for; a token presented by the
// wrong peer, or for another job, generation, channel or rank, is left
// for the one it was given to.
func (l *RingLinks) claim(who peer.ID, m secureHello, sc io.ReadCloser) (*pendingLink, error) {
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
	return found, l.joinLocked(found, tok, m.stream, m.streams, sc)
}

// joinLocked adds connection stream of streams to link p, whose token is
// tok; once the link has every connection, it goes to its waiter (on
// p.conn) and the token is spent.
func (l *RingLinks) joinLocked(p *pendingLink, tok [tokenSize]byte, stream, streams int, c io.ReadCloser) error {
	if p.parts != nil && (streams != len(p.parts) || p.parts[stream] != nil) {
		return fmt.Errorf("connection %d of %d of a link that has %d of its %d", stream, streams, p.have, len(p.parts))
	}
	if p.parts == nil {
		p.parts = make([]io.ReadCloser, streams)
	}
	p.parts[stream] = c
	if streams > 1 && l.rcvBuf {
		setReadBuffer(c)
	}
	if p.have++; p.have < len(p.parts) {
		return nil
	}
	delete(l.tokens, tok)
	p.claimed = true
	if len(p.parts) == 1 {
		p.conn <- p.parts[0]
	} else {
		p.conn <- newStripedReader(p.parts)
	}
	return nil
}
