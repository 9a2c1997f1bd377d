package p2p

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/p2p/host/autorelay"
	lpswarm "github.com/libp2p/go-libp2p/p2p/net/swarm"
	circuitproto "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/proto"
	relayv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"github.com/rs/zerolog"
)

// ErrPlaneBehindNAT means a ring link of the token-gated TCP data plane
// would have to cross a NAT: the plane has the predecessor dial a fresh TCP
// connection to the successor's IP and a port of its own, which a NAT in
// front of the successor does not let in — neither through a relay nor
// after a hole punch, which opens only the libp2p connection's port.
var ErrPlaneBehindNAT = errors.New("p2p: the TCP data plane cannot cross a NAT: jobs with peers behind NAT need the libp2p plane")

// behindNAT says whether a direct connection reached this peer through a
// NAT in front of it: our end has a private address and the other end a
// public one, so the other end sees us at our router's address, not ours.
func behindNAT(c network.Conn) bool {
	local, remote := c.LocalMultiaddr(), c.RemoteMultiaddr()
	return !isRelayed(c) && manet.IsPrivateAddr(local) && !manet.IsIPLoopback(local) && manet.IsPublicAddr(remote)
}

// RelayResources are the limits a ringtrain relay serves under. libp2p's
// defaults suit a relay that only helps two peers meet and hole-punch: a
// circuit is cut after 2 minutes or 128 KiB each way, which a ring link —
// a whole job's gradients, tens of MB a step — passes in its first step.
// So a circuit here has no time or byte limit (and is not "limited" to
// libp2p: streams open on it without WithAllowLimitedConn); what bounds a
// relay's load is how many it carries, and reservations go only to peers
// RelayFor admits. The copy buffer is 64 KiB, not 2 KiB: a relayed 4-rank
// ring ran at 0.068 GB/s busbw with 2 KiB and 0.130 with 64 KiB here
// (p2p/RESULTS.md, "Peers behind NAT").
func RelayResources() relayv2.Resources {
	rc := relayv2.DefaultResources()
	rc.Limit = nil
	rc.ReservationTTL = time.Hour
	rc.MaxReservations = 256
	rc.MaxCircuits = 16 // per peer: a ring needs 2 per member, re-formations a few more
	rc.BufferSize = 64 << 10
	rc.MaxReservationsPerIP = 64 // every peer behind one NAT shares its IP
	rc.MaxReservationsPerASN = 256
	return rc
}

// StrangerRelayResources are the limits of a relay that knows no job
// (bootstrap, serve) and so cannot tell a job's peers from strangers:
// libp2p's own, which let two peers meet and hole-punch — a circuit ends
// after 2 minutes or 128 KiB each way, at most 128 reservations, 8 an
// address — and not carry a stranger's traffic for free. Without it two
// strangers relayed 256 MiB through a bootstrap peer in under a second,
// and kept the circuit for minutes. HostConfig.RelayUnlimited lifts it,
// for a relay that only the job's peers reach (a swarm key).
func StrangerRelayResources() relayv2.Resources {
	rc := relayv2.DefaultResources()
	rc.BufferSize = 64 << 10
	return rc
}

// natOptions are the NAT traversal parts of a host: AutoNAT's service for
// others; relay client and AutoRelay, which reserves a slot on relays
// among the peers it is connected to once AutoNAT (or Reachability) says
// it is not reachable; and, with cfg.Relay, the relay service itself,
// which libp2p runs only while the host is public. DCUtR hole punching
// NewHost starts itself (puncher), to have a handle on it.
func natOptions(cfg HostConfig, self *atomic.Pointer[host.Host], guard *Guard) []libp2p.Option {
	opts := []libp2p.Option{
		libp2p.EnableNATService(),
		libp2p.EnableRelay(),
		// AutoRelay's defaults wait 3 minutes for 4 candidates and back off
		// a failed relay for an hour: right for the public IPFS network,
		// where relays abound; a job has one or two, known at once.
		libp2p.EnableAutoRelayWithPeerSource(func(ctx context.Context, num int) <-chan peer.AddrInfo {
			return relayCandidates(self.Load(), num)
		}, autorelay.WithMinCandidates(1), autorelay.WithBootDelay(0), autorelay.WithBackoff(10*time.Second),
			autorelay.WithMinInterval(2*time.Second), autorelay.WithNumRelays(2)),
	}
	switch cfg.Reachability {
	case network.ReachabilityPublic:
		opts = append(opts, libp2p.ForceReachabilityPublic())
	case network.ReachabilityPrivate:
		opts = append(opts, libp2p.ForceReachabilityPrivate())
	}
	if cfg.Relay {
		rc := RelayResources()
		// A private swarm's peers all hold its key: none is a stranger.
		if cfg.RelayFor == nil && !cfg.RelayUnlimited && cfg.SwarmKey == nil {
			rc = StrangerRelayResources()
		}
		ropts := []relayv2.Option{relayv2.WithResources(rc)}
		if cfg.RelayFor != nil {
			ropts = append(ropts, relayv2.WithACL(relayACL{allow: cfg.RelayFor, guard: guard}))
		}
		opts = append(opts, libp2p.EnableRelayService(ropts...))
	}
	return opts
}

// relayCandidates are the connected peers that serve as relays: a job's
// bootstrap peers and its public members. libp2p's identify has told the
// peerstore which protocols each speaks.
func relayCandidates(hp *host.Host, num int) <-chan peer.AddrInfo {
	var out []peer.AddrInfo
	if hp != nil {
		h := *hp
		for _, p := range h.Network().Peers() {
			if len(out) == num {
				break
			}
			if ok, _ := h.Peerstore().SupportsProtocols(p, circuitproto.ProtoIDv2Hop); len(ok) > 0 {
				out = append(out, h.Peerstore().PeerInfo(p))
			}
		}
	}
	ch := make(chan peer.AddrInfo, len(out))
	for _, ai := range out {
		ch <- ai
	}
	close(ch)
	return ch
}

// relayACL admits reservations only from the peers it says yes to. Any peer
// may open a circuit to one that holds a reservation, as it could dial
// that peer if it were not behind NAT; the peer itself then refuses
// strangers' hellos and ring links.
// A refused reservation is a strike: a stranger asking again and again
// is cut off like any other flood.
type relayACL struct {
	allow func(peer.ID) bool
	guard *Guard
}

func (a relayACL) AllowReserve(p peer.ID, _ ma.Multiaddr) bool {
	if a.allow(p) {
		return true
	}
	a.guard.Strike(p, "a relay reservation it may not have")
	return false
}

func (relayACL) AllowConnect(peer.ID, ma.Multiaddr, peer.ID) bool { return true }

// isRelayed says whether a connection goes through a circuit relay.
func isRelayed(c network.Conn) bool { return isRelayAddr(c.RemoteMultiaddr()) }

// relayOf is the relay a relayed connection goes through.
func relayOf(c network.Conn) peer.ID {
	relay, _ := ma.SplitFunc(c.RemoteMultiaddr(), func(c ma.Component) bool { return c.Code() == ma.P_CIRCUIT })
	if v, err := relay.ValueForProtocol(ma.P_P2P); err == nil {
		if id, err := peer.Decode(v); err == nil {
			return id
		}
	}
	return ""
}

// prepareDial readies a dial to p for one of ringtrain's protocols. It
// clears libp2p's dial backoff for p: the swarm refuses, for seconds to
// minutes, addresses that failed lately, and a peer behind NAT fails often
// before its relay reservation exists — so a re-formation's single hello,
// seconds later, found every address "in backoff" and the peer taken for
// gone (seen in testdata/netns-nat.sh). ringtrain's own loops pace their
// retries (Node's deadUntil, the re-formation's timeouts). And for a peer
// we hold no connection to, it adds an address through each relay we are
// connected to, so that a dial to a peer behind NAT that has a slot on one
// of them finds it even when nobody has told us its relayed address yet.
// libp2p dials direct addresses first and relayed ones only if those have
// not connected within half a second, so peers that can meet directly
// still do.
func prepareDial(h host.Host, p peer.ID) {
	if h.Network().Connectedness(p) == network.Connected {
		return
	}
	if sw, ok := h.Network().(interface{ Backoff() *lpswarm.DialBackoff }); ok {
		sw.Backoff().Clear(p)
	}
	var addrs []ma.Multiaddr
	for _, r := range h.Network().Peers() {
		if r == p {
			continue
		}
		if ok, _ := h.Peerstore().SupportsProtocols(r, circuitproto.ProtoIDv2Hop); len(ok) == 0 {
			continue
		}
		a, err := ma.NewMultiaddr("/p2p/" + r.String() + "/p2p-circuit")
		if err == nil && !slices.ContainsFunc(h.Peerstore().Addrs(p), a.Equal) {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) > 0 {
		h.Peerstore().AddAddrs(p, addrs, peerstore.TempAddrTTL)
	}
}

// watchNAT logs what AutoNAT concludes and the relayed addresses AutoRelay
// gets, until sub is closed.
func watchNAT(sub event.Subscription, log zerolog.Logger) {
	for e := range sub.Out() {
		switch e := e.(type) {
		case event.EvtLocalReachabilityChanged:
			log.Info().Stringer("reachability", e.Reachability).Msg("AutoNAT: this peer's reachability")
		case event.EvtAutoRelayAddrsUpdated:
			log.Info().Int("relays", len(e.RelayAddrs)).Msg("relayed addresses updated")
		}
	}
}

// punchLog logs how each DCUtR hole punch ends: a direct connection, or a
// link that stays relayed.
type punchLog struct{ log zerolog.Logger }

func (l punchLog) Trace(e *holepunch.Event) {
	switch ev := e.Evt.(type) {
	case *holepunch.EndHolePunchEvt:
		if ev.Success {
			l.log.Info().Stringer("peer", e.Remote).Dur("took", ev.EllapsedTime).Msg("hole punch: direct connection")
		} else {
			l.log.Info().Stringer("peer", e.Remote).Str("error", ev.Error).Msg("hole punch failed: the link stays relayed")
		}
	case *holepunch.DirectDialEvt:
		if ev.Success {
			l.log.Info().Stringer("peer", e.Remote).Msg("hole punch not needed: a direct dial reached the peer")
		}
	}
}

// natPath says how a connection crosses a NAT, for errors.
func natPath(c network.Conn) string {
	if isRelayed(c) {
		return "through relay " + relayOf(c).String()
	}
	return fmt.Sprintf("through a NAT (we are %s, the other end %s)", c.LocalMultiaddr(), c.RemoteMultiaddr())
}

// behindNATGuess says whether a peer whose own addresses are local must
// be behind NAT to reach its bootstrap peers: some bootstrap peer has a
// public IPv4 address and this machine has none (and cannot reach one over
// public IPv6 either). A private address cannot cross the internet without
// a NAT rewriting it. A cloud machine behind a 1:1 NAT is taken for private
// too: it then reserves a relay it may not need, and hole punching, which
// always gets through such a NAT, gives it direct links.
func behindNATGuess(local []net.IP, boots []peer.AddrInfo) bool {
	public := func(ip net.IP) bool {
		a, err := manet.FromIP(ip)
		return err == nil && manet.IsPublicAddr(a)
	}
	var local4, local6 bool
	for _, ip := range local {
		if public(ip) {
			if ip.To4() != nil {
				local4 = true
			} else {
				local6 = true
			}
		}
	}
	var boot4, boot6 bool
	for _, b := range boots {
		for _, a := range b.Addrs {
			ip, err := manet.ToIP(a)
			if err != nil || !manet.IsPublicAddr(a) {
				continue
			}
			if ip.To4() != nil {
				boot4 = true
			} else {
				boot6 = true
			}
		}
	}
	return boot4 && !local4 && !(boot6 && local6)
}

// localIPs are the IP addresses a host listening on listen has: those
// named, and for an unspecified one every interface's.
func localIPs(listen []string) []net.IP {
	var ips []net.IP
	for _, l := range listen {
		a, err := ma.NewMultiaddr(l)
		if err != nil {
			continue
		}
		ip, err := manet.ToIP(a)
		if err != nil {
			continue
		}
		if !ip.IsUnspecified() {
			ips = append(ips, ip)
			continue
		}
		for _, n := range interfaceNets() {
			ips = append(ips, n.IP)
		}
	}
	return ips
}
