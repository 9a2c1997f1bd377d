package p2p

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	msmux "github.com/multiformats/go-multistream"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/ring"
)

// RingProtocol opens one ring generation's link from a rank to its
// successor. With the stream data plane the frames then flow on that
// stream; with the TLS and TCP data planes it carries the one-time token
// for a direct TCP connection, or, for a TLS link that cannot be direct,
// the frames themselves.
const RingProtocol = "/ringtrain/ring/5.0.0"

// DataPlane says what carries the ring's frames.
type DataPlane int

const (
	// PlaneTLS sends frames over a direct TCP connection between
	// neighbours running TLS 1.3, each side proving its libp2p identity
	// and the dialer proving that the ring named it for the link (see
	// securelink.go); no stream multiplexer in between. Where no direct
	// connection can be had — a relayed pair, a successor behind NAT, a
	// dial that fails — the link is the libp2p stream instead. The
	// default.
	PlaneTLS DataPlane = iota
	// PlaneLibp2p sends frames on the authenticated, encrypted libp2p
	// stream (TLS preferred), through yamux.
	PlaneLibp2p
	// PlaneTCP sends frames in the clear over a direct TCP connection that
	// the successor admits only with a one-time token it gave over the
	// authenticated libp2p stream — as NCCL, Gloo and MPI send gradients.
	// Anything on the path can read and alter them: for trusted networks.
	PlaneTCP
	maxPlane = PlaneTCP
)

var planeNames = [...]string{PlaneTLS: "tls", PlaneLibp2p: "libp2p", PlaneTCP: "tcp"}

// String is the plane's name on the command line.
func (p DataPlane) String() string {
	if p >= 0 && p <= maxPlane {
		return planeNames[p]
	}
	return fmt.Sprintf("plane(%d)", int(p))
}

// ParsePlane reads a data plane's name: tls, libp2p or tcp.
func ParsePlane(name string) (DataPlane, error) {
	for p, n := range planeNames {
		if n == name {
			return DataPlane(p), nil
		}
	}
	return 0, fmt.Errorf("data plane %q; want tls, libp2p or tcp", name)
}

const (
	linkMagic       uint32 = 0x334c5452 // "RTL3"
	linkHello              = 24         // magic u32 | rank u32 | generation u64 | plane u32 | channel u32
	tokenSize              = 32
	maxInbox               = 64 // links waiting to be claimed, all generations together
	maxPendingTCP          = 16 // TCP connections not yet past their token
	maxPendingPerIP        = 4  // of those, from one address (127.0.0.1 and ::1 exempt)
)

// linkHelloMsg is what a ring link's opener says first: who it is in the
// ring, of which generation, on which channel and plane.
type linkHelloMsg struct {
	rank  int
	gen   uint64
	plane DataPlane
	ch    Channel
}

func (m linkHelloMsg) encode() []byte {
	b := binary.LittleEndian.AppendUint32(nil, linkMagic)
	b = binary.LittleEndian.AppendUint32(b, uint32(m.rank))
	b = binary.LittleEndian.AppendUint64(b, m.gen)
	b = binary.LittleEndian.AppendUint32(b, uint32(m.plane))
	return binary.LittleEndian.AppendUint32(b, uint32(m.ch))
}

// parseLinkHello reads a link hello, each field checked: the magic, a rank
// a ring can hold, a known plane and channel.
func parseLinkHello(b []byte) (linkHelloMsg, error) {
	if len(b) != linkHello {
		return linkHelloMsg{}, fmt.Errorf("a link hello of %d bytes; want %d", len(b), linkHello)
	}
	if magic := binary.LittleEndian.Uint32(b); magic != linkMagic {
		return linkHelloMsg{}, fmt.Errorf("magic %#x; want %#x", magic, linkMagic)
	}
	m := linkHelloMsg{rank: int(binary.LittleEndian.Uint32(b[4:])), gen: binary.LittleEndian.Uint64(b[8:]),
		plane: DataPlane(binary.LittleEndian.Uint32(b[16:])), ch: Channel(binary.LittleEndian.Uint32(b[20:]))}
	switch {
	case m.rank >= maxHelloPeers:
		return m, fmt.Errorf("rank %d; a ring holds at most %d peers", m.rank, maxHelloPeers)
	case m.plane < 0 || m.plane > maxPlane:
		return m, fmt.Errorf("unknown data plane %d", m.plane)
	case m.ch > maxChannel:
		return m, fmt.Errorf("unknown channel %d", m.ch)
	}
	return m, nil
}

// Gate says which ring links to accept: *Node's Expects takes those of the
// members of the ring it is in or ready on.
type Gate interface {
	Expects(gen uint64, from peer.ID) bool
	// JobDigest is the job's JobDigest: a TLS link must name it.
	JobDigest() [sha256.Size]byte
}

// LinksConfig says how RingLinks carries frames.
type LinksConfig struct {
	// Plane is the job's data plane; a link asking for another is refused,
	// and the TCP listener exists only when Plane is PlaneTLS or PlaneTCP.
	Plane DataPlane
	// TCPListen is the TLS or TCP data plane's listen address
	// (host:port); "" means the one IP the host's libp2p listeners are
	// bound to, if they are bound to one, else every interface, and a
	// port the OS picks.
	TCPListen string
	// Logger hears of peers cut off for garbage or strangeness, and of
	// each link to a successor: direct, or through which relay.
	Logger zerolog.Logger
	// PunchWait is how long a link that would go through a relay waits
	// for a hole punch to give a direct connection; 0 means 3 s, below 0
	// no wait. A punch that works took 5–20 ms here once under way
	// (testdata/netns-nat.sh), but DCUtR starts only once the relayed
	// connection is identified and tries up to three times; a link that
	// stays relayed costs up to PunchWait more at each formation.
	PunchWait time.Duration
	// Puncher, if set, tries again for a direct connection to a successor
	// still reached through a relay: twice within PunchWait, then in the
	// background, until one exists; the ring's next generation opens its
	// link on it. *Host is one.
	Puncher Puncher
}

// Puncher tries for a direct connection to a peer reached through a
// relay (DCUtR hole punching).
type Puncher interface {
	DirectConnect(ctx context.Context, p peer.ID) error
}

// RingLinks accepts ring links on a host — only from the peers its Gate
// expects — and hands each to the formation that waits for it.
type RingLinks struct {
	h     host.Host
	gate  Gate
	cfg   LinksConfig
	log   zerolog.Logger
	warns *warnLimiter // warnings about what other peers did

	mu     sync.Mutex
	inbox  map[linkKey]chan inbound
	ln     net.Listener
	tokens map[[tokenSize]byte]*pendingLink // one-time tokens not yet used
	// inHello counts, by peer, the TLS links past their handshake and not
	// yet past their hello: at most the tokens the peer holds.
	inHello map[peer.ID]int
	wg      sync.WaitGroup
	closed  bool
	tls     tlsIdentity
	live    map[*secureConn]struct{} // TLS links open: Close ends them too
	// redirect, when set, is where a dialer goes instead of the address
	// a successor gives: tests put a man in the middle there.
	redirect func(addr string) string
	// streams, when set, is how many connections each TLS link opens
	// whatever its round trip: tests stripe links on loopback.
	streams int
	// rcvBuf: the kernel lets a striped connection's receive buffer be
	// set to 2·streamWindow (setReadBuffer), read once at the start.
	rcvBuf bool
	// punching are the relayed successors a background loop tries to
	// reach directly (punchOn); stop ends those loops at Close.
	punching map[peer.ID]bool
	stop     context.CancelFunc
	stopped  context.Context
}

type linkKey struct {
	gen  uint64
	from peer.ID
	ch   Channel
}

// Channel tells apart the links one generation holds between the same two
// peers: the ring of all members, and — in a pipeline job — the ring of a
// stage's peers and the boundaries between stages, one each way.
type Channel uint32

// Channels of a generation.
const (
	ChannelRing     Channel = 0 // the ring of all members
	ChannelStage    Channel = 1 // the ring of a pipeline stage's peers
	ChannelForward  Channel = 2 // stage s to s+1: activations
	ChannelBackward Channel = 3 // stage s+1 to s: gradients
	ChannelProbe    Channel = 4 // the links' measures at formation (RingOrder)
	ChannelRows     Channel = 5 // the ring by ID that gathers the measures
	ChannelState    Channel = 6 // a donor's part of the state to a newcomer (DirectLinks)
	ChannelRowsBack Channel = 7 // the measures again, the ring by ID the other way round
	maxChannel              = ChannelRowsBack
)

type inbound struct {
	r    io.ReadCloser
	rank int
	err  error // the link cannot be: the predecessor learns why from its own side
}

// planeListen is where the data plane listens unless told: on the one IP
// the host's libp2p listeners are bound to, if there is one — a peer told
// to listen on 127.0.0.1 alone opened its TLS plane on every interface —
// else on every interface.
func planeListen(addrs []ma.Multiaddr) string {
	var ip net.IP
	for _, a := range addrs {
		x, err := manet.ToIP(a)
		switch {
		case err != nil:
			continue // a relay's, say
		case x.IsUnspecified() || ip != nil && !ip.Equal(x):
			return ":0"
		}
		ip = x
	}
	if ip == nil {
		return ":0"
	}
	return net.JoinHostPort(ip.String(), "0")
}

// NewRingLinks registers RingProtocol on h, accepting links that gate
// expects over cfg.Plane. Close it when done.
func NewRingLinks(h host.Host, gate Gate, cfg LinksConfig) *RingLinks {
	if cfg.TCPListen == "" {
		cfg.TCPListen = planeListen(h.Network().ListenAddresses())
	}
	if cfg.PunchWait == 0 {
		cfg.PunchWait = 3 * time.Second
	}
	l := &RingLinks{h: h, gate: gate, cfg: cfg, log: cfg.Logger, warns: newWarnLimiter(cfg.Logger).byAddress(h), inbox: map[linkKey]chan inbound{}, tokens: map[[tokenSize]byte]*pendingLink{}, live: map[*secureConn]struct{}{},
		punching: map[peer.ID]bool{}, rcvBuf: fixedReadBuffer(rmemMax())}
	l.stopped, l.stop = context.WithCancel(context.Background())
	h.SetStreamHandler(RingProtocol, l.handle)
	return l
}

// Close stops accepting links, closes those never claimed, the TLS links
// still open (as a process that ends would) and the listener, and waits
// for its accept loop.
func (l *RingLinks) Close() {
	l.h.RemoveStreamHandler(RingProtocol)
	l.stop()
	l.mu.Lock()
	l.closed = true
	// Closed after the lock is let go: closing a TLS link takes it
	// (track's closed).
	var unclaimed []io.Closer
	for k, ch := range l.inbox {
		select {
		case in := <-ch:
			unclaimed = append(unclaimed, in.r)
		default:
		}
		delete(l.inbox, k)
	}
	if l.ln != nil {
		l.ln.Close()
	}
	live := l.live
	l.live = map[*secureConn]struct{}{}
	l.mu.Unlock()
	for _, r := range unclaimed {
		r.Close()
	}
	for c := range live {
		c.Close()
	}
	l.wg.Wait()
}

// track has Close end c, unless it is closed first; a link made after
// Close is closed at once.
func (l *RingLinks) track(c *secureConn) *secureConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		c.raw.Close()
		return c
	}
	l.live[c] = struct{}{}
	c.closed = func() {
		l.mu.Lock()
		delete(l.live, c)
		l.mu.Unlock()
	}
	return c
}

func (l *RingLinks) slot(k linkKey) chan inbound {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch, ok := l.inbox[k]
	if !ok {
		if len(l.inbox) >= maxInbox || l.closed {
			return nil
		}
		ch = make(chan inbound, 1)
		l.inbox[k] = ch
	}
	return ch
}

// handle takes a link from a predecessor: its stream itself, or for the TCP
// plane the TCP connection it makes with the token this sends back.
func (l *RingLinks) handle(s network.Stream) {
	s.SetDeadline(time.Now().Add(10 * time.Second))
	var b [linkHello]byte
	if _, err := io.ReadFull(s, b[:]); err != nil {
		s.Reset()
		return
	}
	m, err := parseLinkHello(b[:])
	if err != nil {
		const msg = "cut off a peer that opened a ring link with garbage"
		l.warns.Warn(s.Conn().RemotePeer().String(), msg).Err(err).Msg(msg)
		strike(l.h, s.Conn().RemotePeer(), "a ring link: "+err.Error())
		s.Reset()
		return
	}
	k := linkKey{gen: m.gen, from: s.Conn().RemotePeer(), ch: m.ch}
	in := inbound{r: s, rank: m.rank}
	if !l.gate.Expects(k.gen, k.from) {
		const msg = "refused a ring link from a peer that is not a member of the ring"
		l.warns.Warn(k.from.String(), msg).Uint64("generation", k.gen).Msg(msg)
		s.Reset()
		return
	}
	plane := m.plane
	if plane != l.cfg.Plane {
		const msg = "refused a ring link that asks for another data plane than the job's"
		l.warns.Warn(k.from.String(), msg).Msg(msg)
		s.Reset()
		return
	}
	switch {
	case plane == PlaneLibp2p:
		s.SetDeadline(time.Time{})
	case plane == PlaneTLS && (isRelayed(s.Conn()) || behindNAT(s.Conn())):
		// No direct connection reaches us from there: a zero-length
		// address tells the predecessor the stream is the link.
		if _, err := s.Write([]byte{0}); err != nil {
			s.Reset()
			return
		}
		s.SetDeadline(time.Time{})
	case plane == PlaneTCP && (isRelayed(s.Conn()) || behindNAT(s.Conn())):
		// A zero-length address tells the predecessor (dial) it cannot
		// reach our TCP listener; the slot gets the reason, so that this
		// side's Connect fails now too, not at its timeout.
		s.Write([]byte{0})
		s.Close()
		in = inbound{rank: in.rank, err: fmt.Errorf("%w: the link from %s comes %s", ErrPlaneBehindNAT, k.from, natPath(s.Conn()))}
	default: // PlaneTLS or PlaneTCP, direct
		r, err := l.admit(s, k, m.rank)
		if err != nil {
			l.log.Debug().Err(err).Str("peer", k.from.String()).Msg("a ring link was not admitted")
			return
		}
		in.r = r
	}
	ch := l.slot(k)
	if ch == nil {
		in.r.Close()
		return
	}
	select {
	case ch <- in:
	default: // a second link from the same predecessor: refuse it
		if in.r != nil {
			in.r.Close()
		}
	}
}

// admit sends the predecessor, over the authenticated stream s, the
// address to dial and a fresh one-time token for link k from rank, and
// returns the connection that presents that token — or, on the TLS plane,
// s itself if the predecessor says it could not reach the address. s is
// closed or returned on every path.
func (l *RingLinks) admit(s network.Stream, k linkKey, rank int) (io.ReadCloser, error) {
	ln, err := l.tcpListener()
	if err != nil {
		s.Reset()
		return nil, err
	}
	// Advertise the IP the predecessor already reaches us at.
	ip, err := manet.ToIP(s.Conn().LocalMultiaddr())
	if err != nil {
		s.Reset()
		return nil, err
	}
	addr := net.JoinHostPort(ip.String(), strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	var tok [tokenSize]byte
	rand.Read(tok[:])
	p := &pendingLink{key: k, rank: rank, conn: make(chan io.ReadCloser, 1)}
	l.mu.Lock()
	l.tokens[tok] = p
	l.mu.Unlock()
	received := false
	defer func() {
		l.mu.Lock()
		delete(l.tokens, tok)
		claimed, parts := p.claimed, p.parts
		l.mu.Unlock()
		switch {
		case claimed && !received:
			// Claimed as we gave up: the acceptor has handed it over.
			(<-p.conn).Close()
		case !claimed:
			// Some of a link's connections came, not all: no one takes
			// them now (the token is gone).
			closeParts(parts)
		}
	}()
	msg := append([]byte{byte(len(addr))}, addr...)
	if _, err := s.Write(append(msg, tok[:]...)); err != nil {
		s.Reset()
		return nil, err
	}
	// One byte back on the stream, 1, says the address could not be
	// reached; the end of the stream says the token is on its way.
	said := make(chan bool, 1)
	go func() {
		var b [1]byte
		_, err := io.ReadFull(s, b[:])
		said <- err == nil && b[0] == 1
	}()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for reading := true; ; {
		select {
		case c := <-p.conn:
			received = true
			s.Close()
			if reading {
				<-said
			}
			return c, nil
		case unreachable := <-said:
			reading, said = false, nil
			if unreachable && l.cfg.Plane == PlaneTLS {
				s.SetDeadline(time.Time{})
				return s, nil
			}
		case <-timeout.C:
			s.Reset()
			if reading {
				<-said
			}
			return nil, errors.New("p2p: predecessor never presented its token")
		}
	}
}

func (l *RingLinks) tcpListener() (net.Listener, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errors.New("p2p: ring links closed")
	}
	if l.ln != nil {
		return l.ln, nil
	}
	ln, err := net.Listen("tcp", l.cfg.TCPListen)
	if err != nil {
		return nil, fmt.Errorf("p2p: TCP data plane: %w", err)
	}
	l.ln = ln
	l.wg.Go(func() { l.acceptLoop(ln) })
	return ln, nil
}

// acceptLoop admits a connection only once it has presented a token
// handed out and not yet used — in the clear on the TCP plane; on the TLS
// plane inside TLS, from the peer the token was given to (acceptSecure) —
// and closes anything else before another byte is read.
func (l *RingLinks) acceptLoop(ln net.Listener) {
	var wg sync.WaitGroup
	defer wg.Wait()
	pending := make(chan struct{}, maxPendingTCP)
	var mu sync.Mutex
	perIP := map[netip.Addr]int{}
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		// One address holds at most maxPendingPerIP of the slots: a
		// stranger that opens them all and sends nothing would turn every
		// link away until it stopped.
		ip := exemptAddr(c.RemoteAddr())
		mu.Lock()
		full := ip.IsValid() && perIP[ip] >= maxPendingPerIP
		if !full {
			select {
			case pending <- struct{}{}:
				if ip.IsValid() {
					perIP[ip]++
				}
			default: // a flood of connections that send no token: turn them away at once
				full = true
			}
		}
		mu.Unlock()
		if full {
			c.Close()
			continue
		}
		wg.Go(func() {
			defer func() {
				mu.Lock()
				if ip.IsValid() {
					if perIP[ip]--; perIP[ip] == 0 {
						delete(perIP, ip)
					}
				}
				mu.Unlock()
				<-pending
			}()
			if l.cfg.Plane == PlaneTLS {
				// A link's last connection hands the link over (claim).
				if who, err := l.acceptSecure(c); err != nil {
					const msg = "closed a TLS data-plane connection that is no ring link of ours"
					l.warns.Warn(hostOf(c.RemoteAddr()), msg).Str("peer", who.String()).Err(err).Msg(msg)
				}
				return
			}
			l.acceptTCP(c)
		})
	}
}

// acceptTCP takes a clear TCP plane connection: a token, then which of
// its link's connections this is; one without a live token is closed.
func (l *RingLinks) acceptTCP(c net.Conn) {
	var b [tokenSize + 2]byte
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, b[:]); err != nil {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	stream, streams := int(b[tokenSize]), int(b[tokenSize+1])
	l.mu.Lock()
	var p *pendingLink
	var tok [tokenSize]byte
	for t, tp := range l.tokens {
		if subtle.ConstantTimeCompare(t[:], b[:tokenSize]) == 1 {
			p, tok = tp, t
		}
	}
	err := errors.New("no valid token")
	if p != nil && streams >= 1 && streams <= maxLinkStreams && stream < streams {
		err = l.joinLocked(p, tok, stream, streams, c)
	}
	l.mu.Unlock()
	if err != nil {
		const msg = "closed a TCP data-plane connection without a valid token"
		l.warns.Warn(hostOf(c.RemoteAddr()), msg).Err(err).Msg(msg)
		c.Close()
	}
}

// linkDialRetries bounds how often a failed link dial is tried again. A
// dial can fail for a reason that clears at once: with port reuse, two
// peers that dial each other from their listen ports in the same instant
// make a TCP simultaneous open, and both sides then speak TLS as the
// client. A few tries with jitter, under a second in all, get past it
// without hiding a peer that is really gone.
const linkDialRetries = 5

// redial says whether a link dial that failed with err, after failures
// failed dials so far, is worth trying again. A successor that formed the
// ring a moment after us may not have registered RingProtocol yet, so
// "protocol not supported" is retried until ctx ends; other failures a
// bounded number of times.
func redial(ctx context.Context, err error, failures int) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	var unsupported msmux.ErrNotSupported[protocol.ID]
	if errors.As(err, &unsupported) {
		return true
	}
	return failures < linkDialRetries
}

// open opens a stream of RingProtocol to succ, trying again while redial
// says so, with jittered, doubling waits.
func (l *RingLinks) open(ctx context.Context, succ peer.ID) (network.Stream, error) {
	for failures, wait := 0, 10*time.Millisecond; ; failures, wait = failures+1, min(2*wait, 500*time.Millisecond) {
		prepareDial(l.h, succ)
		s, err := l.h.NewStream(ctx, succ, RingProtocol)
		if !redial(ctx, err, failures) {
			if err != nil && ctx.Err() != nil {
				return nil, fmt.Errorf("%w (last: %v)", ctx.Err(), err)
			}
			return s, err
		}
		l.log.Debug().Err(err).Str("peer", succ.String()).Msg("ring link dial failed; trying again")
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(wait/2 + mrand.N(wait/2)):
		}
	}
}

// awaitDirect waits, at most PunchWait, for a direct connection to p
// beside the relayed one: DCUtR starts a hole punch as soon as a relayed
// connection opens, and a ring link lasts a whole generation. That first
// punch may have come before either side knew its NAT's address for it,
// or aimed at a NAT both sides are behind; so with a Puncher this side
// asks too, twice within the wait.
func (l *RingLinks) awaitDirect(ctx context.Context, p peer.ID) bool {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.PunchWait)
	defer cancel()
	if l.cfg.Puncher != nil {
		l.goUnlessClosed(func() {
			pause := func(d time.Duration) bool {
				select {
				case <-ctx.Done():
					return false
				case <-time.After(d):
					return true
				}
			}
			// Twice at most: a punch is several tries already, and dials
			// faster than libp2p's rate limit are refused.
			for _, d := range []time.Duration{l.cfg.PunchWait / 10, l.cfg.PunchWait / 4} {
				if !pause(d) || directTo(l.h, p) {
					return
				}
				if err := l.cfg.Puncher.DirectConnect(ctx, p); err != nil {
					l.log.Debug().Err(err).Stringer("peer", p).Msg("hole punch tried again: still relayed")
				}
			}
		})
	}
	for {
		if directTo(l.h, p) {
			return true
		}
		select {
		case <-ctx.Done():
			return directTo(l.h, p)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// goUnlessClosed runs f in a goroutine that Close waits for, unless the
// links are closed.
func (l *RingLinks) goUnlessClosed(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.wg.Go(f)
	}
}

// punchOn keeps trying, in the background, for a direct connection to a
// successor whose link stayed relayed, until one exists, the peer is gone
// or the links close. The link keeps the relayed connection for its
// generation; the next generation's opens on the direct one.
func (l *RingLinks) punchOn(p peer.ID) {
	if l.cfg.Puncher == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.punching[p] {
		return
	}
	l.punching[p] = true
	// Under l.mu: Close, once it has marked the links closed, waits for
	// every goroutine started before, and no other starts.
	l.wg.Go(func() {
		defer func() {
			l.mu.Lock()
			delete(l.punching, p)
			l.mu.Unlock()
		}()
		var s punchSchedule
		for {
			again, after := s.next(l.h.Network().Connectedness(p) == network.Connected, directTo(l.h, p))
			if !again {
				if directTo(l.h, p) {
					l.log.Info().Stringer("peer", p).Int("tries", s.tries).Msg("hole punch: direct connection; the ring link moves to it at the next generation")
				}
				return
			}
			select {
			case <-l.stopped.Done():
				return
			case <-time.After(after):
			}
			ctx, cancel := context.WithTimeout(l.stopped, 20*time.Second)
			err := l.cfg.Puncher.DirectConnect(ctx, p)
			cancel()
			if err != nil {
				l.log.Debug().Err(err).Stringer("peer", p).Msg("hole punch tried again: still relayed")
			}
		}
	})
}

// Connect opens this rank's links of the formed ring — one to its
// successor, and the one its predecessor opens — over the job's data
// plane, and returns them as a ring.Transport (nil for a ring of one).
func (l *RingLinks) Connect(ctx context.Context, f *Formation) (ring.Transport, error) {
	all := make([]int, len(f.Members))
	for i := range all {
		all[i] = i
	}
	return l.ConnectRing(ctx, f, ChannelRing, all)
}

// ConnectRing opens this rank's links of the ring of the members of f at
// ranks (in the ring's order, this rank among them), on channel ch: a
// ring of a part of the formation, such as a pipeline stage's peers, or
// of all in another order. Its ring ranks are the places in ranks.
func (l *RingLinks) ConnectRing(ctx context.Context, f *Formation, ch Channel, ranks []int) (ring.Transport, error) {
	me := slices.Index(ranks, f.Rank)
	if me < 0 {
		return nil, fmt.Errorf("p2p: rank %d is not in the ring of ranks %v", f.Rank, ranks)
	}
	n := len(ranks)
	if n == 1 {
		return nil, nil
	}
	w, r, err := l.Pair(ctx, f, ch, ranks[(me+1)%n], ranks[(me-1+n)%n])
	if err != nil {
		return nil, err
	}
	// Close, not Reset, when the ring closes: Close still delivers what
	// was written (a neighbour may be reading the last frame), and it also
	// ends a Read in progress, which is what an abort needs.
	return ring.NewStreams(w, r), nil
}

// Pair opens, on channel ch of formation f, a link to the member at rank
// to and takes the link the member at rank from opens to this one (−1:
// none), over the job's data plane. Both come, or neither.
func (l *RingLinks) Pair(ctx context.Context, f *Formation, ch Channel, to, from int) (io.WriteCloser, io.ReadCloser, error) {
	plane := l.cfg.Plane
	if to >= len(f.Members) || from >= len(f.Members) || ch > maxChannel {
		return nil, nil, fmt.Errorf("p2p: links to rank %d and from rank %d on channel %d of a ring of %d", to, from, ch, len(f.Members))
	}
	type result struct {
		w   io.WriteCloser
		err error
	}
	out := make(chan result, 1)
	if to >= 0 {
		go func() {
			w, err := l.dial(ctx, f.Members[to], f, ch, plane)
			out <- result{w, err}
		}()
	} else {
		out <- result{}
	}

	var in io.ReadCloser
	var inErr error
	if from >= 0 {
		pred := f.Members[from]
		k := linkKey{gen: f.Generation, from: pred, ch: ch}
		if slot := l.slot(k); slot == nil {
			inErr = errors.New("p2p: too many ring links waiting")
		} else {
			select {
			case got := <-slot:
				in = got.r
				if got.err != nil {
					inErr = fmt.Errorf("p2p: the link from rank %d (%s): %w", from, pred, got.err)
				} else if got.rank != from {
					in.Close()
					in, inErr = nil, fmt.Errorf("p2p: %s says it is rank %d, the ring has it at %d", pred, got.rank, from)
				}
			case <-ctx.Done():
				inErr = fmt.Errorf("p2p: waiting for the link from rank %d (%s): %w", from, pred, ctx.Err())
			}
		}
		l.mu.Lock()
		delete(l.inbox, k)
		l.mu.Unlock()
	}
	o := <-out
	if inErr != nil || o.err != nil {
		if in != nil {
			in.Close()
		}
		if o.w != nil {
			o.w.Close()
		}
		if inErr != nil {
			return nil, nil, inErr
		}
		return nil, nil, fmt.Errorf("p2p: opening the link to rank %d (%s): %w", to, f.Members[to], o.err)
	}
	return o.w, in, nil
}

// dial opens the link to the successor: directly if it can, else through
// a relay — but for the TCP plane, which a relay cannot carry.
func (l *RingLinks) dial(ctx context.Context, succ peer.ID, f *Formation, ch Channel, plane DataPlane) (io.WriteCloser, error) {
	s, err := l.open(ctx, succ)
	if err != nil {
		return nil, err
	}
	if isRelayed(s.Conn()) && plane != PlaneTCP && l.cfg.PunchWait > 0 && l.awaitDirect(ctx, succ) {
		// A hole punch got through: a link opened now takes the direct
		// connection (libp2p picks direct over relayed).
		s.Reset()
		if s, err = l.open(ctx, succ); err != nil {
			return nil, err
		}
	}
	if _, err := s.Write(linkHelloMsg{rank: f.Rank, gen: f.Generation, plane: plane, ch: ch}.encode()); err != nil {
		s.Reset()
		return nil, err
	}
	conn := s.Conn()
	if isRelayed(conn) && plane == PlaneTCP {
		// The hello is sent, so the successor learns it too (handle).
		s.Close()
		return nil, fmt.Errorf("%w: the link to %s goes %s", ErrPlaneBehindNAT, succ, natPath(conn))
	}
	logLink := func(carrier DataPlane) {
		e := l.log.Info().Int("rank", f.Rank).Stringer("successor", succ)
		if isRelayed(conn) {
			e = e.Str("link", "relayed").Stringer("relay", relayOf(conn))
			l.punchOn(succ)
		} else {
			e = e.Str("link", "direct").Stringer("addr", conn.RemoteMultiaddr())
		}
		e.Stringer("plane", carrier).Uint64("generation", f.Generation).Uint32("channel", uint32(ch)).Msg("ring link to the successor")
	}
	if plane == PlaneLibp2p {
		logLink(PlaneLibp2p)
		return s, nil
	}
	addr, tok, err := readLinkAddr(s)
	if err != nil {
		s.Reset()
		return nil, err
	}
	if addr == "" {
		if plane == PlaneTLS {
			// The successor cannot be reached directly: the stream is
			// the link.
			logLink(PlaneLibp2p)
			return s, nil
		}
		s.Close()
		return nil, fmt.Errorf("%w: %s is behind NAT from here (we reach it %s)", ErrPlaneBehindNAT, succ, natPath(conn))
	}
	if l.redirect != nil {
		addr = l.redirect(addr)
	}
	if plane == PlaneTLS {
		w, err := l.dialTLS(ctx, succ, addr, secureHello{token: tok, job: l.gate.JobDigest(), gen: f.Generation, rank: f.Rank, ch: ch})
		if err != nil {
			// Fall back to the stream, which the successor is told of.
			const msg = "a direct TLS ring link failed; this link goes over the libp2p stream"
			l.warns.Warn(succ.String(), msg).Err(err).Msg(msg)
			if _, werr := s.Write([]byte{1}); werr != nil {
				s.Reset()
				return nil, fmt.Errorf("%w (and telling the successor: %v)", err, werr)
			}
			logLink(PlaneLibp2p)
			return s, nil
		}
		s.Close()
		logLink(PlaneTLS)
		return w, nil
	}
	defer s.Close()
	w, err := l.dialTCP(ctx, succ, addr, tok)
	if err != nil {
		return nil, err
	}
	logLink(PlaneTCP)
	return w, nil
}

// readLinkAddr reads what the successor answers a link's hello with on
// the TLS and TCP planes: the address of its listener and a token, or ""
// where it cannot be reached directly.
func readLinkAddr(s network.Stream) (addr string, tok [tokenSize]byte, err error) {
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	var n [1]byte
	if _, err := io.ReadFull(s, n[:]); err != nil {
		return "", tok, fmt.Errorf("reading the link's address: %w", err)
	}
	if n[0] > 0 {
		buf := make([]byte, int(n[0])+tokenSize)
		if _, err := io.ReadFull(s, buf); err != nil {
			return "", tok, fmt.Errorf("reading the link's address and token: %w", err)
		}
		addr = string(buf[:n[0]])
		copy(tok[:], buf[n[0]:])
	}
	s.SetReadDeadline(time.Time{})
	return addr, tok, nil
}

// dialTCP opens the clear TCP plane's link to succ at addr, each of its
// connections presenting tok and its place (dialStriped).
func (l *RingLinks) dialTCP(ctx context.Context, succ peer.ID, addr string, tok [tokenSize]byte) (io.WriteCloser, error) {
	return l.dialStriped(succ, func() (io.WriteCloser, time.Duration, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, 0, fmt.Errorf("TCP data plane to %s: %w", addr, err)
		}
		return c, connRTT(c), nil
	}, func(c io.WriteCloser, stream, streams int) error {
		_, err := c.Write(append(tok[:], byte(stream), byte(streams)))
		return err
	})
}

// dialStriped opens a link of one connection, or over a long round trip
// (the first connection's) as many as linkStreams says, striped: open
// dials one connection and gives its round trip, hello says which of how
// many it is.
func (l *RingLinks) dialStriped(succ peer.ID, open func() (io.WriteCloser, time.Duration, error), hello func(c io.WriteCloser, stream, streams int) error) (io.WriteCloser, error) {
	first, rtt, err := open()
	if err != nil {
		return nil, err
	}
	k := linkStreams(rtt)
	if l.streams > 0 {
		k = l.streams
	}
	if err := hello(first, 0, k); err != nil {
		first.Close()
		return nil, err
	}
	parts := make([]io.WriteCloser, k)
	parts[0] = first
	errs := make([]error, k)
	var wg sync.WaitGroup
	// Two at a time: the successor holds at most maxPendingPerIP
	// connections from one address before their hellos, for all the links
	// this peer opens to it at once.
	sem := make(chan struct{}, 2)
	for i := 1; i < k; i++ {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, _, err := open()
			if err == nil {
				if err = hello(c, i, k); err != nil {
					c.Close()
				} else {
					parts[i] = c
				}
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		closeParts(parts)
		return nil, err
	}
	if k == 1 {
		return parts[0], nil
	}
	l.log.Debug().Str("peer", succ.String()).Int("connections", k).Dur("rtt", rtt).Msg("a long ring link: striped over several connections")
	return &stripedWriter{parts: parts}, nil
}

// dialTLS opens the TLS link to succ at addr (dialStriped).
func (l *RingLinks) dialTLS(ctx context.Context, succ peer.ID, addr string, hello secureHello) (io.WriteCloser, error) {
	id, err := l.tls.get(l.h.Peerstore().PrivKey(l.h.ID()))
	if err != nil {
		return nil, err
	}
	return l.dialStriped(succ, func() (io.WriteCloser, time.Duration, error) {
		sc, err := dialSecure(ctx, id, succ, addr)
		if err != nil {
			return nil, 0, err
		}
		return l.track(sc), connRTT(sc.raw), nil
	}, func(c io.WriteCloser, stream, streams int) error {
		h := hello
		h.stream, h.streams = stream, streams
		return sayHello(c.(*secureConn), succ, h)
	})
}
