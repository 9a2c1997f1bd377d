package p2p

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/rs/zerolog"
)

// cutGater refuses every connection with one peer while cut is set: a
// link that is down for a while (a NAT with no hole punched yet, a relay
// reservation not made yet).
type cutGater struct {
	peer peer.ID // written before cut is first set
	cut  atomic.Bool
}

func (g *cutGater) allow(p peer.ID) bool { return !g.cut.Load() || p != g.peer }

func (g *cutGater) InterceptPeerDial(p peer.ID) bool                 { return g.allow(p) }
func (g *cutGater) InterceptAddrDial(p peer.ID, _ ma.Multiaddr) bool { return g.allow(p) }
func (g *cutGater) InterceptAccept(network.ConnMultiaddrs) bool      { return true }
func (g *cutGater) InterceptSecured(_ network.Direction, p peer.ID, _ network.ConnMultiaddrs) bool {
	return g.allow(p)
}
func (g *cutGater) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) { return true, 0 }

// logWatch closes seen once a log line holds want.
type logWatch struct {
	want string
	seen chan struct{}
	once sync.Once
}

func (w *logWatch) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(w.want)) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

// TestReformGreetsUnreachedMembersAgain: of a ring of three, two members
// cannot reach each other when it re-forms, so each finds the other
// unreachable and proposes a ring without it, while the third, which
// reaches both, proposes all three. Once the link is back, they must
// greet each other again and form all three; before, nothing did, and
// the re-formation ran into its timeout (in netns-nat, a NATed standby
// admitted before its relay reservation existed ended the job this way).
func TestReformGreetsUnreachedMembersAgain(t *testing.T) {
	const n = 3
	j := job
	j.WorldSize = n
	gates := []*cutGater{nil, {}, {}}
	watch := make([]*logWatch, n)
	hs := make([]*Host, n)
	ns := make([]*Node, n)
	for i := range n {
		cfg := HostConfig{Listen: loopback}
		if i > 0 {
			cfg.Bootstrap = []peer.AddrInfo{info(hs[0])}
			cfg.gater = gates[i]
		}
		h, err := NewHost(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = h
		t.Cleanup(func() { h.Close() })
		watch[i] = &logWatch{want: "a member of the old ring is gone", seen: make(chan struct{})}
		node, err := NewNode(h, j, NodeConfig{Logger: zerolog.New(watch[i])})
		if err != nil {
			t.Fatal(err)
		}
		ns[i] = node
		t.Cleanup(func() { node.Close() })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fs := make([]*Formation, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { fs[i], errs[i] = ns[i].Join(ctx) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("host %d: Join: %v", i, err)
		}
	}

	gates[1].peer, gates[2].peer = hs[2].ID(), hs[1].ID()
	gates[1].cut.Store(true)
	gates[2].cut.Store(true)
	hs[1].Network().ClosePeer(hs[2].ID())
	hs[2].Network().ClosePeer(hs[1].ID())
	rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
	defer rcancel()
	next := make([]*Formation, n)
	for i := range n {
		wg.Go(func() { next[i], errs[i] = ns[i].Reform(rctx, fs[i], 2) })
	}
	for _, i := range []int{1, 2} {
		select {
		case <-watch[i].seen:
		case <-rctx.Done():
			t.Fatalf("host %d never found the other unreachable", i)
		}
	}
	gates[1].cut.Store(false)
	gates[2].cut.Store(false)
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("host %d: Reform: %v", i, errs[i])
		}
		if f := next[i]; !slices.Equal(f.Members, fs[i].Members) || f.Generation != 2 {
			t.Errorf("host %d: formation %+v; want all three of %v, generation 2", i, f, fs[i].Members)
		}
	}
}

// logCount counts the log lines that hold both want and about.
type logCount struct {
	want, about []byte
	n           atomic.Int64
}

func (c *logCount) Write(p []byte) (int, error) {
	if bytes.Contains(p, c.want) && bytes.Contains(p, c.about) {
		c.n.Add(1)
	}
	return len(p), nil
}

// TestDeadMemberIsNotGreetedInABusyLoop: a member of a formed ring dies
// while its ring still passes statements on, and a standby comes, whose
// statement the dead member lacks. The hub may greet it, fail, and try
// again after a pause; it must not greet it again at once, round after
// round: each failed hello woke the next round, so two peers of
// netns-nat greeted a killed member 10,000 times a second, and their own
// dials then failed ("rate limit exceeded") until the admission timed out.
func TestDeadMemberIsNotGreetedInABusyLoop(t *testing.T) {
	const n = 3
	j := job
	j.WorldSize = n
	hs := startHosts(t, n+1, nil)
	dead := hs[2].ID()
	count := &logCount{want: []byte("hello failed"), about: []byte(dead.String())}
	ns := make([]*Node, n+1)
	start := func(i int) {
		cfg := NodeConfig{}
		if i == 0 {
			// The hub goes on passing statements on for as long as the
			// test needs it to (it stops after Stall with nothing to pass).
			cfg = NodeConfig{Logger: zerolog.New(count), Stall: time.Minute}
		}
		node, err := NewNode(hs[i], j, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ns[i] = node
		t.Cleanup(func() { node.Close() })
	}
	for i := range n {
		start(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { _, errs[i] = ns[i].Join(ctx) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("host %d: Join: %v", i, err)
		}
	}
	ns[2].Close()
	hs[2].Close()
	start(3) // the standby: of the job, but after its ring formed
	if _, err := ns[3].Join(ctx); !errors.Is(err, ErrStandby) {
		t.Fatalf("the fourth peer's Join: %v; want ErrStandby", err)
	}
	for !ns[0].Verified(hs[3].ID()) {
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			t.Fatal("the hub never heard of the standby")
		}
	}
	// One failed hello, and then a pause of 2 s at least: a second.
	if err := sleepCtx(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	if got := count.n.Load(); got > 2 {
		t.Errorf("the hub's hellos to the dead member failed %d times in a second; want at most 2", got)
	}
}

// TestPeersMeetThroughAStrangerAtOnce: two peers of a job behind NAT
// (natGater), whose only bootstrap peer is a relay not of the job (a
// `ringtrain bootstrap` peer), can meet only through the job's record in
// the DHT. Each starts looking at once, before the DHT has taken the
// bootstrap peer into its routing table, so its first advertisement
// fails; it must be made again soon. libp2p's discovery/util.Advertise
// made it 2 minutes later, past the peers' join timeout.
func TestPeersMeetThroughAStrangerAtOnce(t *testing.T) {
	slow(t)
	j := job
	j.WorldSize = 2
	boot, err := NewHost(context.Background(), HostConfig{Listen: loopback, Relay: true, Reachability: network.ReachabilityPublic})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { boot.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		h, err := NewHost(ctx, HostConfig{Listen: loopback, Bootstrap: []peer.AddrInfo{info(boot)},
			Reachability: network.ReachabilityPrivate, gater: &natGater{relay: boot.ID()}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		node, err := NewNode(h, j, NodeConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { node.Close() })
		wg.Go(func() { _, errs[i] = node.Join(ctx) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("peer %d: Join: %v", i, err)
		}
	}
}
