package p2p

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	"github.com/libp2p/go-libp2p/p2p/protocol/identify"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"github.com/rs/zerolog"
)

// ErrNoPuncher means the host runs no hole-punch service (it is not a
// libp2p basic host).
var ErrNoPuncher = errors.New("p2p: this host cannot hole-punch")

// puncher owns the host's DCUtR hole-punch service. libp2p's own
// (libp2p.EnableHolePunching) starts a punch only when a relayed
// connection opens, tries it three times within a second and gives no
// handle to try again; a pair whose first punch came too early — before
// either side knew the address its NAT gives it — stayed relayed for good.
// Owning the service gives DirectConnect, which RingLinks calls again for
// a ring link that is still relayed.
type puncher struct {
	h     host.Host
	log   zerolog.Logger
	guard *Guard // strikes a peer whose request does not decode
	svc   *holepunch.Service
	seen  *observedAddrs
	sub   event.Subscription
	wg    sync.WaitGroup
}

// newPuncher starts DCUtR on h: it answers other peers' punches, punches
// to every peer that reaches it through a relay (as libp2p's own does),
// and punches on DirectConnect.
func newPuncher(h host.Host, log zerolog.Logger) (*puncher, error) {
	idh, ok := h.(interface{ IDService() identify.IDService })
	if !ok {
		return nil, ErrNoPuncher
	}
	sub, err := h.EventBus().Subscribe(new(event.EvtPeerIdentificationCompleted), eventbus.Name("ringtrain observed addrs"))
	if err != nil {
		return nil, fmt.Errorf("p2p: watching observed addresses: %w", err)
	}
	p := &puncher{h: h, log: log, seen: &observedAddrs{max: maxObservedAddrs}, sub: sub}
	addrs := func() []ma.Multiaddr { return p.seen.publicWith(h.Addrs()) }
	p.svc, err = holepunch.NewService(h, idh.IDService(), addrs, holepunch.WithTracer(punchLog{log}), holepunch.DirectDialTimeout(directDialTimeout))
	if err != nil {
		sub.Close()
		return nil, fmt.Errorf("p2p: hole-punch service: %w", err)
	}
	p.wg.Go(func() {
		for e := range sub.Out() {
			if id, ok := e.(event.EvtPeerIdentificationCompleted); ok && id.ObservedAddr != nil {
				p.seen.add(id.ObservedAddr)
			}
		}
	})
	return p, nil
}

// ErrNoPublicAddr means a hole punch has nothing to aim the other side at:
// no peer has told this one the public address it sees it at.
var ErrNoPublicAddr = errors.New("p2p: no public address of this peer is known yet")

// DirectConnect tries for a direct connection to a peer reached through a
// relay. A peer behind the same NAT is reached only at its private
// address — a punch aims at the NAT, which seldom turns traffic back in —
// and identify over a relayed connection does not tell private addresses
// (libp2p keeps only public ones from a public remote): so the other side
// is asked (PunchProtocol), with this side's private addresses, to dial
// them. Else a DCUtR hole punch, which only the side that a relayed
// connection came in to may start: this side, or the other, asked.
func (p *puncher) DirectConnect(ctx context.Context, to peer.ID) error {
	if directTo(p.h, to) {
		return nil
	}
	sameNAT := slices.ContainsFunc(p.h.Peerstore().Addrs(to), func(a ma.Multiaddr) bool {
		return manet.IsPublicAddr(a) && !isRelayAddr(a) && p.seen.sharesIP(a)
	})
	in, out := relayedDirections(p.h, to)
	// Where each side dialled the other through a relay, the lower peer ID
	// punches, so that two punches do not cross.
	if !sameNAT && in && (!out || p.h.ID() < to) {
		return p.initiate(ctx, to)
	}
	return p.ask(ctx, to)
}

// initiate starts a DCUtR punch to a peer whose relayed connection came
// in to this one.
func (p *puncher) initiate(ctx context.Context, to peer.ID) error {
	// The service takes a punch only once it has a public address to
	// offer, and waits for one without a way to give up: ask it only when
	// its handler, set once it has one, is there.
	if !slices.Contains(p.h.Mux().Protocols(), holepunch.Protocol) {
		return ErrNoPublicAddr
	}
	done := make(chan error, 1)
	go func() { done <- p.svc.DirectConnect(to) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		// The punch ends by itself, bounded by its own timeouts, or at Close.
		return ctx.Err()
	}
}

// PunchProtocol asks a peer reached through a relay for a direct
// connection. The asker sends its private addresses (encodeLANAddrs);
// the other side dials those of them on its own LANs, else, if the
// relayed connection came in to it, starts a DCUtR hole punch. The answer
// is one byte, punchOK or punchFailed.
const PunchProtocol = "/ringtrain/punch/1.0.0"

const (
	punchOK     byte = 0
	punchFailed byte = 1
	// punchAnswerWait bounds the wait for the answer: a dial, then a punch
	// of three tries, each bounded by directDialTimeout.
	punchAnswerWait = 10 * time.Second
	// maxLANAddrs bounds the addresses an asker may send, and
	// maxLANAddrLen each one's encoding.
	maxLANAddrs   = 8
	maxLANAddrLen = 64
)

// ErrPunchFailed means the peer asked for a direct connection tried and
// failed.
var ErrPunchFailed = errors.New("p2p: the peer could not make a direct connection")

// ask asks to for a direct connection (PunchProtocol).
func (p *puncher) ask(ctx context.Context, to peer.ID) error {
	ctx, cancel := context.WithTimeout(ctx, punchAnswerWait)
	defer cancel()
	s, err := p.h.NewStream(network.WithNoDial(ctx, "hole punch"), to, PunchProtocol)
	if err != nil {
		return fmt.Errorf("p2p: asking %s for a direct connection: %w", to, err)
	}
	defer s.Close()
	if d, ok := ctx.Deadline(); ok {
		s.SetDeadline(d)
	}
	var b [1]byte
	if _, err := s.Write(encodeLANAddrs(privateAddrs(p.h.Addrs()))); err != nil {
		s.Reset()
		return fmt.Errorf("p2p: asking %s for a direct connection: %w", to, err)
	}
	if _, err := io.ReadFull(s, b[:]); err != nil {
		s.Reset()
		return fmt.Errorf("p2p: asking %s for a direct connection: %w", to, err)
	}
	if b[0] != punchOK && !directTo(p.h, to) {
		return fmt.Errorf("%w: %s", ErrPunchFailed, to)
	}
	return nil
}

// handleAsk answers PunchProtocol: for a peer reached only through a
// relay, a direct dial to its addresses on this machine's LANs, else a
// punch, if the relayed connection came in here (a punch from the other
// side only could not be started). A stream that is not so is reset; the
// guard bounds how often a peer may ask, and a try costs a few packets.
func (p *puncher) handleAsk(s network.Stream) {
	from := s.Conn().RemotePeer()
	if !isRelayed(s.Conn()) {
		s.Reset()
		return
	}
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	addrs, err := readLANAddrs(s)
	if err != nil {
		s.Reset()
		if p.guard != nil {
			p.guard.Strike(from, err.Error())
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), punchAnswerWait-time.Second)
	defer cancel()
	if lan := onOwnLANs(addrs, interfaceNets()); len(lan) > 0 && !directTo(p.h, from) {
		p.h.Peerstore().AddAddrs(from, lan, peerstore.TempAddrTTL)
		dctx, cancel := context.WithTimeout(network.WithForceDirectDial(ctx, "ring link"), directDialTimeout)
		err := p.h.Connect(dctx, peer.AddrInfo{ID: from})
		cancel()
		if err != nil {
			p.log.Debug().Err(err).Stringer("peer", from).Msg("a direct dial to a peer on this LAN failed")
		}
	}
	if in, _ := relayedDirections(p.h, from); in && !directTo(p.h, from) {
		if err := p.initiate(ctx, from); err != nil {
			p.log.Debug().Err(err).Stringer("peer", from).Msg("hole punch, asked for, failed")
		}
	}
	answer := punchFailed
	if directTo(p.h, from) {
		answer = punchOK
	}
	s.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := s.Write([]byte{answer}); err != nil {
		s.Reset()
		return
	}
	s.Close()
}

// privateAddrs are the direct, private, non-loopback addresses among as,
// at most maxLANAddrs.
func privateAddrs(as []ma.Multiaddr) []ma.Multiaddr {
	var out []ma.Multiaddr
	for _, a := range as {
		if len(out) < maxLANAddrs && manet.IsPrivateAddr(a) && !manet.IsIPLoopback(a) && !isRelayAddr(a) && len(a.Bytes()) <= maxLANAddrLen {
			out = append(out, a)
		}
	}
	return out
}

// encodeLANAddrs: a count byte, then each address as a length byte and
// its binary multiaddr.
func encodeLANAddrs(as []ma.Multiaddr) []byte {
	out := []byte{byte(len(as))}
	for _, a := range as {
		out = append(out, byte(len(a.Bytes())))
		out = append(out, a.Bytes()...)
	}
	return out
}

// errBadLANAddrs means a PunchProtocol request did not decode.
var errBadLANAddrs = errors.New("p2p: a malformed list of LAN addresses")

// readLANAddrs reads what encodeLANAddrs wrote, within its bounds.
func readLANAddrs(r io.Reader) ([]ma.Multiaddr, error) {
	var n [1]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, fmt.Errorf("%w: %w", errBadLANAddrs, err)
	}
	if n[0] > maxLANAddrs {
		return nil, fmt.Errorf("%w: %d addresses, at most %d", errBadLANAddrs, n[0], maxLANAddrs)
	}
	out := make([]ma.Multiaddr, 0, n[0])
	buf := make([]byte, maxLANAddrLen)
	for i := range int(n[0]) {
		var l [1]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return nil, fmt.Errorf("%w: address %d: %w", errBadLANAddrs, i, err)
		}
		if l[0] == 0 || l[0] > maxLANAddrLen {
			return nil, fmt.Errorf("%w: address %d is %d bytes, want 1 to %d", errBadLANAddrs, i, l[0], maxLANAddrLen)
		}
		if _, err := io.ReadFull(r, buf[:l[0]]); err != nil {
			return nil, fmt.Errorf("%w: address %d: %w", errBadLANAddrs, i, err)
		}
		a, err := ma.NewMultiaddrBytes(slices.Clone(buf[:l[0]]))
		if err != nil {
			return nil, fmt.Errorf("%w: address %d: %w", errBadLANAddrs, i, err)
		}
		out = append(out, a)
	}
	return out, nil
}

// onOwnLANs keeps the private, direct, non-loopback TCP addresses among as
// whose IP lies in one of nets: a peer may name only addresses this
// machine could reach on its own LANs, never make it dial elsewhere.
func onOwnLANs(as []ma.Multiaddr, nets []*net.IPNet) []ma.Multiaddr {
	var out []ma.Multiaddr
	for _, a := range as {
		if !manet.IsPrivateAddr(a) || manet.IsIPLoopback(a) || isRelayAddr(a) {
			continue
		}
		if _, err := a.ValueForProtocol(ma.P_TCP); err != nil {
			continue
		}
		ip, err := manet.ToIP(a)
		if err != nil {
			continue
		}
		if slices.ContainsFunc(nets, func(n *net.IPNet) bool { return n.Contains(ip) }) {
			out = append(out, a)
		}
	}
	return out
}

// interfaceNets are the networks of this machine's interfaces.
func interfaceNets() []*net.IPNet {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []*net.IPNet
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			out = append(out, n)
		}
	}
	return out
}

// relayedDirections says whether h holds a relayed connection to p that
// came in, and one that went out.
func relayedDirections(h host.Host, p peer.ID) (in, out bool) {
	for _, c := range h.Network().ConnsToPeer(p) {
		if isRelayed(c) {
			in = in || c.Stat().Direction == network.DirInbound
			out = out || c.Stat().Direction == network.DirOutbound
		}
	}
	return in, out
}

// directDialTimeout bounds DirectConnect's direct dial, and each of the
// service's dials (its own direct dial, and each punch's connect): a peer
// that can be dialled answers within a round trip or two, and TCP sends
// its second SYN after 1 s. libp2p's 5 s spent most of a ring link's
// wait on a direct dial to a NAT that drops it, before the punch began.
const directDialTimeout = 1500 * time.Millisecond

// Close stops the service and the address watch.
func (p *puncher) Close() error {
	err := p.svc.Close()
	p.sub.Close()
	p.wg.Wait()
	return err
}

// maxObservedAddrs bounds the addresses a punch offers: the newest ones.
const maxObservedAddrs = 8

// observedAddrs are the public addresses other peers saw this one at
// (identify's observed address), newest last. A peer behind NAT has no
// other public address to offer a hole punch: its TCP connections leave
// from its listen port, and the NAT's mapping of that port is what a punch
// must aim at. libp2p's own list trusts an address only once four peers
// in different networks have seen it; a job behind NAT may have one
// bootstrap peer, and a punch that aims at a wrong address only fails.
type observedAddrs struct {
	mu    sync.Mutex
	max   int
	addrs []ma.Multiaddr
}

// add keeps a, if it is public and direct.
func (o *observedAddrs) add(a ma.Multiaddr) {
	if !manet.IsPublicAddr(a) || isRelayAddr(a) {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.addrs = slices.DeleteFunc(o.addrs, a.Equal)
	o.addrs = append(o.addrs, a)
	if len(o.addrs) > o.max {
		o.addrs = slices.Delete(o.addrs, 0, len(o.addrs)-o.max)
	}
}

// sharesIP says whether a has the IP of an address others saw us at: the
// peer at a is behind the same NAT.
func (o *observedAddrs) sharesIP(a ma.Multiaddr) bool {
	ip, err := manet.ToIP(a)
	if err != nil {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.ContainsFunc(o.addrs, func(b ma.Multiaddr) bool {
		bip, err := manet.ToIP(b)
		return err == nil && bip.Equal(ip)
	})
}

// publicWith is what a punch offers: the public direct addresses among
// own, then those others saw, without repeats.
func (o *observedAddrs) publicWith(own []ma.Multiaddr) []ma.Multiaddr {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []ma.Multiaddr
	for _, a := range append(slices.Clone(own), o.addrs...) {
		if manet.IsPublicAddr(a) && !isRelayAddr(a) && !slices.ContainsFunc(out, a.Equal) {
			out = append(out, a)
		}
	}
	return out
}

func isRelayAddr(a ma.Multiaddr) bool {
	_, err := a.ValueForProtocol(ma.P_CIRCUIT)
	return err == nil
}

// punchBackoff paces the tries for a direct connection to a peer whose
// ring link stayed relayed: the first soon after the link opened, then
// doubling to at most punchMaxBackoff — a NAT's mapping or a peer's
// address may change, and a try costs a few packets.
const (
	punchFirstRetry = 2 * time.Second
	punchMaxBackoff = time.Minute
)

// punchSchedule decides when to try again for a direct connection to a
// relayed peer, from what each try returned; the loop around it does the
// waiting and the punching (punchLoop). It is a plain value so that a
// table test can drive it.
type punchSchedule struct {
	tries int
	wait  time.Duration
}

// next says whether to try again and after how long, given whether the
// peer is still connected (through the relay) and whether a direct
// connection now exists.
func (s *punchSchedule) next(connected, direct bool) (again bool, after time.Duration) {
	if direct || !connected {
		return false, 0
	}
	s.tries++
	if s.wait == 0 {
		s.wait = punchFirstRetry
	} else {
		s.wait = min(2*s.wait, punchMaxBackoff)
	}
	return true, s.wait
}

// directTo says whether h holds a direct connection to p.
func directTo(h host.Host, p peer.ID) bool {
	return slices.ContainsFunc(h.Network().ConnsToPeer(p), func(c network.Conn) bool { return !isRelayed(c) })
}
