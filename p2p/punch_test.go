package p2p

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/rs/zerolog"
)

// TestPunchSchedule: tries for a direct connection back off from 2 s,
// doubling, to a minute, and stop once the peer is reached directly or is
// gone.
func TestPunchSchedule(t *testing.T) {
	type step struct {
		connected, direct bool
		again             bool
		after             time.Duration
	}
	s := func(connected, direct, again bool, after time.Duration) step {
		return step{connected, direct, again, after}
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"backs off to a minute", []step{
			s(true, false, true, 2*time.Second), s(true, false, true, 4*time.Second), s(true, false, true, 8*time.Second),
			s(true, false, true, 16*time.Second), s(true, false, true, 32*time.Second), s(true, false, true, time.Minute),
			s(true, false, true, time.Minute)}},
		{"direct at once", []step{s(true, true, false, 0)}},
		{"direct after two tries", []step{s(true, false, true, 2*time.Second), s(true, false, true, 4*time.Second), s(true, true, false, 0)}},
		{"the peer is gone", []step{s(true, false, true, 2*time.Second), s(false, false, false, 0)}},
	}
	for _, c := range cases {
		var sch punchSchedule
		for i, st := range c.steps {
			again, after := sch.next(st.connected, st.direct)
			if again != st.again || after != st.after {
				t.Errorf("%s, step %d: next(%v, %v) = %v, %v; want %v, %v", c.name, i, st.connected, st.direct, again, after, st.again, st.after)
			}
		}
	}
}

// TestObservedAddrs: only public, direct addresses are kept, newest last,
// at most max of them; a punch offers the host's own public addresses
// first, then those; sharesIP finds a peer behind the same NAT.
func TestObservedAddrs(t *testing.T) {
	o := &observedAddrs{max: 3}
	lan := ma.StringCast("/ip4/" + net.IPv4(192, 168, 1, 20).String() + "/tcp/4001")
	for _, a := range []string{"/ip4/11.0.0.2/tcp/1", "/ip4/127.0.0.1/tcp/2", "/ip4/11.0.0.1/tcp/4001/p2p/12D3KooWPvR5bLQ7CZif76yXNjfXKpDVGVU8ptDcA7ufgGKaGHsc/p2p-circuit",
		"/ip4/11.0.0.2/tcp/3", "/ip4/11.0.0.2/tcp/4", "/ip4/11.0.0.2/tcp/1", "/ip4/11.0.0.2/tcp/5"} {
		o.add(ma.StringCast(a))
	}
	o.add(lan)
	got := o.publicWith([]ma.Multiaddr{lan, ma.StringCast("/ip4/11.0.0.9/tcp/7"), ma.StringCast("/ip4/11.0.0.2/tcp/5")})
	want := []string{"/ip4/11.0.0.9/tcp/7", "/ip4/11.0.0.2/tcp/5", "/ip4/11.0.0.2/tcp/4", "/ip4/11.0.0.2/tcp/1"}
	var gs []string
	for _, a := range got {
		gs = append(gs, a.String())
	}
	// The kept three, oldest first, are 4, 1 and 5; 5 comes first as the host's own.
	if !slices.Equal(gs, want) {
		t.Errorf("publicWith = %v, want %v", gs, want)
	}
	if !o.sharesIP(ma.StringCast("/ip4/11.0.0.2/tcp/9999")) || o.sharesIP(ma.StringCast("/ip4/11.0.0.3/tcp/4")) {
		t.Error("sharesIP: want the NAT's IP shared, another not")
	}
}

// TestLANAddrs: what an asker sends decodes to the same addresses, and
// every malformed request is refused with errBadLANAddrs, never read past
// its bounds.
func TestLANAddrs(t *testing.T) {
	as := []ma.Multiaddr{ma.StringCast("/ip4/" + net.IPv4(10, 1, 0, 3).String() + "/tcp/4001"), ma.StringCast("/ip6/fd00::3/tcp/4001")}
	got, err := readLANAddrs(bytes.NewReader(encodeLANAddrs(as)))
	if err != nil || len(got) != 2 || !got[0].Equal(as[0]) || !got[1].Equal(as[1]) {
		t.Fatalf("round trip: %v, %v; want %v", got, err, as)
	}
	one := as[0].Bytes()
	cases := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"too many", []byte{maxLANAddrs + 1}},
		{"a zero-length address", []byte{1, 0}},
		{"an address too long", []byte{1, maxLANAddrLen + 1}},
		{"cut short", append([]byte{2, byte(len(one))}, one...)},
		{"not a multiaddr", []byte{1, 3, 0xff, 0xff, 0xff}},
	}
	for _, c := range cases {
		if _, err := readLANAddrs(bytes.NewReader(c.b)); !errors.Is(err, errBadLANAddrs) {
			t.Errorf("%s: %v, want errBadLANAddrs", c.name, err)
		}
	}
}

// FuzzLANAddrs: any bytes decode or are refused, without panic, and what
// decodes encodes back to the bytes read.
func FuzzLANAddrs(f *testing.F) {
	f.Add(encodeLANAddrs([]ma.Multiaddr{ma.StringCast("/ip4/127.0.0.1/tcp/1")}))
	f.Add([]byte{1, 3, 0xff, 0xff, 0xff})
	f.Add([]byte{0})
	f.Fuzz(func(t *testing.T, b []byte) {
		as, err := readLANAddrs(bytes.NewReader(b))
		if err != nil {
			return
		}
		if enc := encodeLANAddrs(as); !bytes.HasPrefix(b, enc) {
			t.Fatalf("decoded %v from %x, which encodes to %x", as, b, enc)
		}
	})
}

// TestOnOwnLANs: an asker's addresses are dialled only where they lie on
// one of this machine's LANs — never a public, loopback, relayed or
// non-TCP address, nor a private one elsewhere.
func TestOnOwnLANs(t *testing.T) {
	nets := []*net.IPNet{{IP: net.IPv4(10, 1, 0, 0), Mask: net.CIDRMask(24, 32)}, {IP: net.IPv4(127, 0, 0, 0), Mask: net.CIDRMask(8, 32)}, {IP: net.IPv4(11, 0, 0, 0), Mask: net.CIDRMask(24, 32)}}
	at := func(ip net.IP, rest string) string { return "/ip4/" + ip.String() + rest }
	in := []string{
		at(net.IPv4(10, 1, 0, 3), "/tcp/4001"),          // on our LAN: kept
		at(net.IPv4(10, 2, 0, 3), "/tcp/4001"),          // another LAN
		at(net.IPv4(10, 1, 0, 4), "/udp/4001/quic-v1"),  // not TCP
		"/ip4/127.0.0.1/tcp/4001",                       // loopback
		"/ip4/11.0.0.5/tcp/4001",                        // public, even on an interface's network
		at(net.IPv4(10, 1, 0, 5), "/tcp/1/p2p-circuit"), // relayed
		at(net.IPv4(192, 168, 0, 1), "/tcp/22"),         // nowhere of ours
	}
	var as []ma.Multiaddr
	for _, s := range in {
		as = append(as, ma.StringCast(s))
	}
	got := onOwnLANs(as, nets)
	if len(got) != 1 || got[0].String() != in[0] {
		t.Errorf("onOwnLANs = %v, want only %s", got, in[0])
	}
}

// TestAskingForAPunchOverADirectConnectionIsRefused: PunchProtocol is for
// peers that reach each other only through a relay; over a direct
// connection the stream is reset before anything is dialled.
func TestAskingForAPunchOverADirectConnectionIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, err := NewHost(ctx, HostConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewHost(ctx, HostConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Bootstrap: []peer.AddrInfo{{ID: a.ID(), Addrs: a.Addrs()}}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s, err := b.NewStream(ctx, a.ID(), PunchProtocol)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(10 * time.Second))
	s.Write(encodeLANAddrs(nil))
	var one [1]byte
	if n, err := s.Read(one[:]); err == nil || n != 0 {
		t.Fatalf("read %d bytes (%v), %v; want the stream reset", n, one[:n], err)
	}
}

// fakePuncher records whom it is asked to reach and reaches no one.
type fakePuncher struct{ calls chan peer.ID }

func (f *fakePuncher) DirectConnect(_ context.Context, p peer.ID) error {
	select {
	case f.calls <- p:
	default:
	}
	return errors.New("fake: no direct connection")
}

// TestRelayedLinkKeepsTryingForDirect: a ring link that would go through a
// relay asks its Puncher for a direct connection to the successor within
// PunchWait, goes relayed when none comes, and keeps asking in the
// background until the links close — and not after.
func TestRelayedLinkKeepsTryingForDirect(t *testing.T) {
	slow(t)
	const n = 2
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	j := job
	j.WorldSize = n
	s, err := startBehindNAT(ctx, n, j, pnet.PSK(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Join(ctx); err != nil {
		t.Fatal(err)
	}
	fakes := make([]*fakePuncher, n)
	links := make([]*RingLinks, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, h := range s.Hosts {
		fakes[i] = &fakePuncher{calls: make(chan peer.ID, 16)}
		links[i] = NewRingLinks(h, s.Nodes[i], LinksConfig{Plane: PlaneLibp2p, Logger: zerolog.Nop(), PunchWait: 400 * time.Millisecond, Puncher: fakes[i]})
		wg.Go(func() {
			tr, err := links[i].Connect(ctx, s.Formations[i])
			if tr != nil {
				defer tr.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i, f := range fakes {
		succ := s.Formations[i].Members[(s.Formations[i].Rank+1)%n]
		// Within PunchWait, then in the background: two asks at least.
		for k := range 3 {
			select {
			case p := <-f.calls:
				if p != succ {
					t.Errorf("peer %d asked to reach %s, want its successor %s", i, p, succ)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("peer %d: ask %d for a direct connection to its relayed successor never came", i, k+1)
			}
		}
	}
	for i, l := range links {
		l.Close()
		// Close waits for the background loop, which leaves punching as it ends.
		l.mu.Lock()
		if len(l.punching) != 0 {
			t.Errorf("peer %d: still trying for %v after its links closed", i, l.punching)
		}
		l.mu.Unlock()
	}
}
