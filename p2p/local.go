package p2p

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/ring"
)

// localSwarm is n peers of one job on 127.0.0.1 in this process, each given
// only the first one's address: what LocalRing and TimeFormation measure.
type localSwarm struct {
	// Relay, in a swarm startBehindNAT made, is the public bootstrap peer
	// that relays for the others; it is no member.
	Relay      *Host
	Hosts      []*Host
	Nodes      []*Node
	Formations []*Formation // by host, once Join has run
	Errs       []error      // what each node's Join returned
	// streams, if set, is how many connections each TLS link opens
	// (RingLinks.streams): tests stripe links on loopback.
	streams int
}

// startLocalSwarm starts the hosts and nodes; Join forms the ring.
func startLocalSwarm(ctx context.Context, n int, job Job) (_ *localSwarm, err error) {
	s := &localSwarm{}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	for i := range n {
		cfg := HostConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}}
		if i > 0 {
			cfg.Bootstrap = []peer.AddrInfo{{ID: s.Hosts[0].ID(), Addrs: s.Hosts[0].Addrs()}}
		}
		if err := s.add(ctx, cfg, job); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// add starts a host and its node of job.
func (s *localSwarm) add(ctx context.Context, cfg HostConfig, job Job) error {
	h, err := NewHost(ctx, cfg)
	if err != nil {
		return err
	}
	s.Hosts = append(s.Hosts, h)
	node, err := NewNode(h, job, NodeConfig{})
	if err != nil {
		return err
	}
	s.Nodes = append(s.Nodes, node)
	return nil
}

// startBehindNAT is startLocalSwarm as if each of the n peers sat behind
// its own NAT, with a public relay that is no member of the job as the
// bootstrap peer: the peers refuse every connection among themselves that
// does not come through a relay, and know they are private, as AutoNAT
// would tell them; the relay knows it is public. With key, the swarm is
// private.
func startBehindNAT(ctx context.Context, n int, job Job, key pnet.PSK) (_ *localSwarm, err error) {
	s := &localSwarm{}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.Relay, err = NewHost(ctx, HostConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}, SwarmKey: key, Relay: true, RelayUnlimited: true, Reachability: network.ReachabilityPublic}); err != nil {
		return nil, err
	}
	boot := []peer.AddrInfo{{ID: s.Relay.ID(), Addrs: s.Relay.Addrs()}}
	for range n {
		cfg := HostConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Bootstrap: boot, SwarmKey: key,
			Reachability: network.ReachabilityPrivate, gater: &natGater{relay: s.Relay.ID()}}
		if err := s.add(ctx, cfg, job); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// natGater stands in for a NAT in front of a peer: only connections with
// the relay, or through it, get through.
type natGater struct{ relay peer.ID }

func (g *natGater) InterceptPeerDial(peer.ID) bool { return true }
func (g *natGater) InterceptAddrDial(p peer.ID, a ma.Multiaddr) bool {
	_, err := a.ValueForProtocol(ma.P_CIRCUIT)
	return p == g.relay || err == nil
}
func (g *natGater) InterceptAccept(network.ConnMultiaddrs) bool { return true }
func (g *natGater) InterceptSecured(_ network.Direction, p peer.ID, c network.ConnMultiaddrs) bool {
	_, err := c.RemoteMultiaddr().ValueForProtocol(ma.P_CIRCUIT)
	return p == g.relay || err == nil
}
func (g *natGater) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) { return true, 0 }

// Join runs every node's Join at once.
func (s *localSwarm) Join(ctx context.Context) error {
	s.Formations = make([]*Formation, len(s.Nodes))
	s.Errs = make([]error, len(s.Nodes))
	var wg sync.WaitGroup
	for i, n := range s.Nodes {
		wg.Go(func() { s.Formations[i], s.Errs[i] = n.Join(ctx) })
	}
	wg.Wait()
	return errors.Join(s.Errs...)
}

// Connect opens the formed ring's links over plane and returns the
// transports by rank, and what to close them with.
func (s *localSwarm) Connect(ctx context.Context, plane DataPlane) ([]ring.Transport, func(), error) {
	n := len(s.Hosts)
	ts := make([]ring.Transport, n)
	errs := make([]error, n)
	links := make([]*RingLinks, n)
	var wg sync.WaitGroup
	for i, h := range s.Hosts {
		cfg := LinksConfig{Plane: plane, TCPListen: "127.0.0.1:0", Logger: zerolog.Nop()}
		if s.Relay != nil {
			cfg.PunchWait = -1 // the stand-in NATs let no hole punch through
		}
		links[i] = NewRingLinks(h, s.Nodes[i], cfg)
		links[i].streams = s.streams
		wg.Go(func() { ts[s.Formations[i].Rank], errs[i] = links[i].Connect(ctx, s.Formations[i]) })
	}
	wg.Wait()
	closeLinks := func() {
		for _, l := range links {
			l.Close()
		}
	}
	if err := errors.Join(errs...); err != nil {
		for _, t := range ts {
			if t != nil {
				t.Close()
			}
		}
		closeLinks()
		return nil, nil, err
	}
	return ts, closeLinks, nil
}

// Close stops every node and host.
func (s *localSwarm) Close() {
	for _, n := range s.Nodes {
		n.Close()
	}
	for _, h := range s.Hosts {
		h.Close()
	}
	if s.Relay != nil {
		s.Relay.Close()
	}
}

// LocalRing forms an n-peer ring on loopback and connects it over plane;
// the returned func closes everything it started once the transports are
// closed.
func LocalRing(ctx context.Context, n int, plane DataPlane) ([]ring.Transport, func(), error) {
	s, err := startLocalSwarm(ctx, n, Job{Name: "local", ConfigHash: "local", WorldSize: n})
	return localRing(ctx, plane, s, err)
}

// LocalRingBehindNAT is LocalRing with every link through a relay, as
// startBehindNAT sets up: what a ring of peers behind NATs
// that hole punching cannot cross runs at.
func LocalRingBehindNAT(ctx context.Context, n int) ([]ring.Transport, func(), error) {
	s, err := startBehindNAT(ctx, n, Job{Name: "local", ConfigHash: "local", WorldSize: n}, nil)
	return localRing(ctx, PlaneLibp2p, s, err)
}

func localRing(ctx context.Context, plane DataPlane, s *localSwarm, err error) ([]ring.Transport, func(), error) {
	if err != nil {
		return nil, nil, err
	}
	jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.Join(jctx); err != nil {
		s.Close()
		return nil, nil, err
	}
	ts, closeLinks, err := s.Connect(ctx, plane)
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	return ts, func() { closeLinks(); s.Close() }, nil
}

// TimeFormation measures, for n peers on loopback, the time from starting
// the first host to every peer holding the formed ring.
func TimeFormation(ctx context.Context, n int) (time.Duration, error) {
	start := time.Now()
	s, err := startLocalSwarm(ctx, n, Job{Name: fmt.Sprintf("form-%d", n), ConfigHash: "x", WorldSize: n})
	if err != nil {
		return 0, err
	}
	defer s.Close()
	jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.Join(jctx); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}
