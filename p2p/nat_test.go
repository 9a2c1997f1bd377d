package p2p

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/core/protocol"
	lpswarm "github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	circuitproto "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/proto"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/ringtrain/ringtrain/ring"
)

// TestRingFormsBehindNAT: three peers that each refuse every connection
// not through the relay (a NAT each) find each other through the relay's
// DHT, agree on a ring and run an allreduce over relayed links; every
// connection between two of them goes through the relay. The TCP data
// plane refuses such links on both sides with ErrPlaneBehindNAT rather than
// waiting out its timeout. The same in a private swarm, where relayed
// connections must pass the swarm key too.
func TestRingFormsBehindNAT(t *testing.T) {
	slow(t)
	key := make(pnet.PSK, 32)
	for i := range key {
		key[i] = byte(i)
	}
	for _, c := range []struct {
		name string
		key  pnet.PSK
	}{{"open", nil}, {"private swarm", key}} {
		t.Run(c.name, func(t *testing.T) { testRingBehindNAT(t, c.key) })
	}
}

func testRingBehindNAT(t *testing.T, key pnet.PSK) {
	const n = 3
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	j := job
	j.WorldSize = n
	s, err := startBehindNAT(ctx, n, j, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Join(ctx); err != nil {
		t.Fatal(err)
	}
	ts, done, err := s.Connect(ctx, PlaneLibp2p)
	if err != nil {
		t.Fatal(err)
	}
	bufs := make([][]float32, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		bufs[r] = []float32{float32(r), float32(10 * r)}
		wg.Go(func() {
			rg, err := ring.New(ts[r], ring.Config{Rank: r, Size: n, Generation: s.Formations[0].Generation})
			if err != nil {
				errs[r] = err
				return
			}
			defer rg.Close()
			errs[r] = rg.AllreduceSum(ctx, bufs[r])
		})
	}
	wg.Wait()
	done()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r, b := range bufs {
		if !slices.Equal(b, []float32{3, 30}) {
			t.Errorf("rank %d: sum %v, want [3 30]", r, b)
		}
	}
	members := make([]peer.ID, n)
	for i, h := range s.Hosts {
		members[i] = h.ID()
	}
	for i, h := range s.Hosts {
		for _, c := range h.Network().Conns() {
			if slices.Contains(members, c.RemotePeer()) && !isRelayed(c) {
				t.Errorf("peer %d holds a direct connection to %s through the NAT: %s", i, c.RemotePeer(), c.RemoteMultiaddr())
			}
			if isRelayed(c) && relayOf(c) != s.Relay.ID() {
				t.Errorf("peer %d: relayed connection %s names relay %q, want %s", i, c.RemoteMultiaddr(), relayOf(c), s.Relay.ID())
			}
		}
	}

	_, _, err = s.Connect(ctx, PlaneTCP)
	if !errors.Is(err, ErrPlaneBehindNAT) {
		t.Fatalf("TCP data plane over relayed links: %v, want ErrPlaneBehindNAT", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the TCP plane's refusal waited out the test's deadline")
	}
}

// addrConn is a network.Conn with only its two addresses.
type addrConn struct {
	network.Conn
	local, remote ma.Multiaddr
}

func (c addrConn) LocalMultiaddr() ma.Multiaddr  { return c.local }
func (c addrConn) RemoteMultiaddr() ma.Multiaddr { return c.remote }

// TestBehindNAT: the TCP data plane's test for a link that crossed a NAT
// in front of this peer — a direct connection after a hole punch, which
// opens the libp2p port only — and for relayed links.
func TestBehindNAT(t *testing.T) {
	relay := "/ip4/11.0.0.1/tcp/4001/p2p/12D3KooWHM9Lx3GX7zoANW6JCgjRPnX1aKegfHHehN7yQhbu1Hq5/p2p-circuit"
	for _, c := range []struct {
		local, remote string
		nat, relayed  bool
	}{
		{"/ip4/10.1.0.2/tcp/4001", "/ip4/11.0.0.3/tcp/4001", true, false},    // punched through our NAT
		{"/ip4/192.168.1.5/tcp/4001", "/ip4/8.8.4.4/tcp/9", true, false},     // any private range
		{"/ip4/10.1.0.2/tcp/4001", "/ip4/10.1.0.3/tcp/4001", false, false},   // the same LAN
		{"/ip4/11.0.0.1/tcp/4001", "/ip4/11.0.0.2/tcp/1621", false, false},   // we are public: the predecessor's NAT lets it out
		{"/ip4/127.0.0.1/tcp/4001", "/ip4/127.0.0.1/tcp/4002", false, false}, // loopback
		{"/ip4/10.1.0.2/tcp/4001", relay, false, true},
	} {
		conn := addrConn{local: ma.StringCast(c.local), remote: ma.StringCast(c.remote)}
		if got := behindNAT(conn); got != c.nat {
			t.Errorf("%s → %s: behindNAT %v, want %v", c.local, c.remote, got, c.nat)
		}
		if got := isRelayed(conn); got != c.relayed {
			t.Errorf("%s → %s: isRelayed %v, want %v", c.local, c.remote, got, c.relayed)
		}
		if c.relayed && relayOf(conn).String() != "12D3KooWHM9Lx3GX7zoANW6JCgjRPnX1aKegfHHehN7yQhbu1Hq5" {
			t.Errorf("relayOf(%s) = %s", c.remote, relayOf(conn))
		}
	}
}

// TestPrepareDialClearsBackoff: a dial that failed puts the peer's
// addresses in libp2p's dial backoff; prepareDial lifts it, so that a
// re-formation's one hello really dials.
func TestPrepareDialClearsBackoff(t *testing.T) {
	a := startHosts(t, 1, nil)[0]
	// A peer with no host at all: a second live host would dial a back
	// (its DHT bootstrap does) and a.Connect would succeed on that
	// inbound connection, as it did once in CI.
	k, _, err := crypto.GenerateEd25519Key(rand.NewChaCha8([32]byte{1}))
	if err != nil {
		t.Fatal(err)
	}
	b, err := peer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	dead := ma.StringCast("/ip4/127.0.0.1/tcp/1") // nothing listens on port 1
	a.Peerstore().AddAddr(b, dead, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Connect(ctx, peer.AddrInfo{ID: b}); err == nil {
		t.Fatal("dialled a port nothing listens on")
	}
	sw, ok := a.Network().(interface{ Backoff() *lpswarm.DialBackoff })
	if !ok {
		t.Fatalf("the host's network is a %T, with no dial backoff to clear", a.Network())
	}
	if !sw.Backoff().Backoff(b, dead) {
		t.Fatal("a failed dial left no backoff: the test shows nothing")
	}
	prepareDial(a.Host, b)
	if sw.Backoff().Backoff(b, dead) {
		t.Error("prepareDial left the address in backoff")
	}
}

// TestRelayReservesOnlyForRelayFor: a relay grants slots to the peers
// RelayFor names (a job's verified peers) and refuses the others, who could
// otherwise use its unlimited circuits for anything.
func TestRelayReservesOnlyForRelayFor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var allowed atomic.Pointer[peer.ID] // set once the hosts exist
	relay, hs := relayAndTwo(ctx, t, HostConfig{RelayFor: func(p peer.ID) bool { a := allowed.Load(); return a != nil && p == *a }}, func(hs []*Host) {
		id := hs[0].ID()
		allowed.Store(&id)
	})
	if _, err := client.Reserve(ctx, hs[0].Host, info(relay)); err != nil {
		t.Errorf("the allowed peer got no reservation: %v", err)
	}
	if _, err := client.Reserve(ctx, hs[1].Host, info(relay)); err == nil {
		t.Error("a peer RelayFor does not name got a reservation")
	}
	relay.Guard.mu.Lock()
	s := relay.Guard.g.strikes[hs[1].ID()]
	relay.Guard.mu.Unlock()
	if s == nil || s.n == 0 {
		t.Error("a refused reservation is no strike")
	}
}

// TestBehindNATGuess: a machine whose every address is private must be
// behind NAT to reach a public bootstrap peer — unless both have public
// IPv6 — and nothing is guessed from private or absent bootstrap peers.
func TestBehindNATGuess(t *testing.T) {
	boot := func(addrs ...string) []peer.AddrInfo {
		var ai peer.AddrInfo
		for _, a := range addrs {
			ai.Addrs = append(ai.Addrs, ma.StringCast(a))
		}
		return []peer.AddrInfo{ai}
	}
	ips := func(s ...string) []net.IP {
		var out []net.IP
		for _, x := range s {
			out = append(out, net.ParseIP(x))
		}
		return out
	}
	// Private addresses are only classified here, never dialled.
	home, office := net.IPv4(192, 168, 1, 20), net.IPv4(10, 0, 0, 5)
	with := func(ip net.IP, more []net.IP) []net.IP { return append([]net.IP{ip}, more...) }
	cases := []struct {
		name  string
		local []net.IP
		boots []peer.AddrInfo
		want  bool
	}{
		{"a home LAN, a public bootstrap peer", with(home, ips("127.0.0.1")), boot("/ip4/11.0.0.2/tcp/4001"), true},
		{"a carrier-grade NAT", ips("100.64.3.4"), boot("/ip4/11.0.0.2/tcp/4001"), true},
		{"a public machine", with(office, ips("11.0.0.7")), boot("/ip4/11.0.0.2/tcp/4001"), false},
		{"a LAN job", with(home, nil), []peer.AddrInfo{{Addrs: []ma.Multiaddr{ma.StringCast("/ip4/" + net.IPv4(192, 168, 1, 2).String() + "/tcp/4001")}}}, false},
		{"no bootstrap peer", with(home, nil), nil, false},
		{"public IPv6 on both sides", with(home, ips("2a01:4f8::1")), boot("/ip4/11.0.0.2/tcp/4001", "/ip6/2a01:4f9::2/tcp/4001"), false},
		{"public IPv6 here only", with(home, ips("2a01:4f8::1")), boot("/ip4/11.0.0.2/tcp/4001"), true},
		{"a bootstrap peer by DNS name only", with(home, nil), boot("/dns4/boot.example/tcp/4001"), false},
	}
	for _, c := range cases {
		if got := behindNATGuess(c.local, c.boots); got != c.want {
			t.Errorf("%s: %v; want %v", c.name, got, c.want)
		}
	}
}

// relayAndTwo starts a public relay of cfg's relay settings and two hosts
// that know it, calls ready (if set) with them, and waits until the first
// hears the relay speak the hop protocol — libp2p starts the relay
// service once it hears it is public, just after the host starts.
func relayAndTwo(ctx context.Context, t *testing.T, cfg HostConfig, ready func([]*Host)) (*Host, []*Host) {
	t.Helper()
	cfg.Listen, cfg.Relay, cfg.Reachability = loopback, true, network.ReachabilityPublic
	relay, err := NewHost(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	hs := make([]*Host, 2)
	for i := range hs {
		if hs[i], err = NewHost(ctx, HostConfig{Listen: loopback, Bootstrap: []peer.AddrInfo{info(relay)}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { hs[i].Close() })
	}
	if ready != nil {
		ready(hs)
	}
	for ok := []protocol.ID(nil); len(ok) == 0; ok, _ = hs[0].Peerstore().SupportsProtocols(relay.ID(), circuitproto.ProtoIDv2Hop) {
		select {
		case <-ctx.Done():
			t.Fatal("the relay never spoke the hop protocol")
		case <-time.After(20 * time.Millisecond):
		}
		hs[0].Connect(ctx, info(relay))
	}
	return relay, hs
}

// TestStrangerRelayIsLimited: a relay that knows no job (bootstrap,
// serve) relays two strangers within libp2p's limits — a reservation and
// a circuit, but not 1 MiB through it — unless told to be unlimited.
// Before, it relayed 256 MiB between strangers in under a second.
func TestStrangerRelayIsLimited(t *testing.T) {
	slow(t)
	for _, unlimited := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		relay, hs := relayAndTwo(ctx, t, HostConfig{RelayUnlimited: unlimited}, nil)
		if _, err := client.Reserve(ctx, hs[0].Host, info(relay)); err != nil {
			t.Fatalf("unlimited %v: a stranger got no reservation: %v", unlimited, err)
		}
		got := make(chan int64, 1)
		hs[0].SetStreamHandler("/ringtrain/test-sink", func(s network.Stream) {
			n, _ := io.Copy(io.Discard, s)
			got <- n
			s.Close()
		})
		circuit := ma.StringCast("/p2p/" + relay.ID().String() + "/p2p-circuit")
		hs[1].Peerstore().AddAddrs(hs[0].ID(), []ma.Multiaddr{relay.Addrs()[0].Encapsulate(circuit)}, time.Minute)
		s, err := hs[1].NewStream(network.WithAllowLimitedConn(ctx, "test"), hs[0].ID(), "/ringtrain/test-sink")
		if err != nil {
			t.Fatalf("unlimited %v: no circuit between two strangers: %v", unlimited, err)
		}
		if c := s.Conn(); !isRelayed(c) {
			t.Fatalf("the strangers' stream goes over %v, not the relay", c.RemoteMultiaddr())
		}
		s.SetDeadline(time.Now().Add(3 * time.Second)) // a limited circuit stops carrying, and the writer waits
		chunk := make([]byte, 64<<10)
		var sent int64
		for sent < 1<<20 {
			n, err := s.Write(chunk)
			sent += int64(n)
			if err != nil {
				break
			}
		}
		s.CloseWrite()
		var n int64
		select {
		case n = <-got:
		case <-time.After(5 * time.Second):
		}
		s.Reset()
		if through := n >= 1<<20; through != unlimited {
			t.Errorf("unlimited %v: %d bytes went through the relay between strangers; want 1 MiB only when unlimited", unlimited, n)
		}
	}
}
