package p2p

import (
	"bytes"
	"context"
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
