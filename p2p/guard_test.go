package p2p

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/rs/zerolog"
)

// TestGuardDecides drives the guard's decisions from a table: each step
// is a stream opened (or closed, or a strike) at a time, and what the
// guard must say.
func TestGuardDecides(t *testing.T) {
	const a, b = peer.ID("a"), peer.ID("b")
	const hello, data = protocol.ID("/hello"), protocol.ID("/data")
	t0 := time.Unix(1000, 0)
	type step struct {
		at    time.Duration
		do    string // open, close, strike
		p     peer.ID
		proto protocol.ID
		want  verdict // for open
		cut   bool    // for strike: this strike cuts the peer off
	}
	lim := Limits{RequestsPerSecond: 2, Burst: 3, StreamsPerPeer: 2, Strikes: 3, BanFor: time.Minute, MaxBanned: 2}
	cases := []struct {
		name  string
		lim   Limits
		steps []step
	}{
		{"a burst, then the rate", lim, []step{
			{0, "open", a, hello, admitted, false}, {0, "close", a, hello, 0, false},
			{0, "open", a, hello, admitted, false}, {0, "close", a, hello, 0, false},
			{0, "open", a, hello, admitted, false}, {0, "close", a, hello, 0, false},
			{0, "open", a, hello, overRate, false},
			{0, "open", a, data, admitted, false},                       // each protocol has its own
			{0, "open", b, hello, admitted, false},                      // and each peer
			{500 * time.Millisecond, "open", a, hello, admitted, false}, // one token back
			{500 * time.Millisecond, "open", a, hello, overRate, false},
		}},
		{"streams at once", lim, []step{
			{0, "open", a, data, admitted, false},
			{0, "open", a, data, admitted, false},
			{0, "open", a, data, overStreams, false},
			{0, "close", a, data, 0, false},
			{0, "open", a, data, admitted, false},
		}},
		{"strikes cut off, for BanFor", lim, []step{
			{0, "strike", a, "", 0, false},
			{0, "strike", a, "", 0, false},
			{0, "open", a, hello, admitted, false},
			{0, "strike", a, "", 0, true},
			{0, "open", a, hello, banned, false},
			{0, "strike", a, "", 0, false}, // cut off once
			{0, "open", b, hello, admitted, false},
			{time.Minute, "open", a, hello, admitted, false},
		}},
		{"strikes of another minute are not counted together", lim, []step{
			{0, "strike", a, "", 0, false},
			{0, "strike", a, "", 0, false},
			{time.Minute, "strike", a, "", 0, false},
			{time.Minute, "strike", a, "", 0, false},
			{time.Minute, "strike", a, "", 0, true},
		}},
		{"the ban that ends first is forgotten for want of room", lim, []step{
			{0, "strike", a, "", 0, false}, {0, "strike", a, "", 0, false}, {0, "strike", a, "", 0, true},
			{time.Second, "strike", b, "", 0, false}, {time.Second, "strike", b, "", 0, false}, {time.Second, "strike", b, "", 0, true},
			{2 * time.Second, "strike", "c", "", 0, false}, {2 * time.Second, "strike", "c", "", 0, false}, {2 * time.Second, "strike", "c", "", 0, true},
			{2 * time.Second, "open", a, hello, admitted, false},
			{2 * time.Second, "open", b, hello, banned, false},
			{2 * time.Second, "open", "c", hello, banned, false},
		}},
		{"defaults", Limits{}, []step{
			{0, "open", a, hello, admitted, false},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := newGuard(c.lim)
			for i, s := range c.steps {
				now := t0.Add(s.at)
				switch s.do {
				case "open":
					if got := g.open(now, s.p, s.proto); got != s.want {
						t.Fatalf("step %d: open %s %s at %v: %v; want %v", i, s.p, s.proto, s.at, got, s.want)
					}
				case "close":
					g.close(s.p, s.proto)
				case "strike":
					if got := g.strike(now, s.p); got != s.cut {
						t.Fatalf("step %d: strike %s at %v cut it off: %v; want %v", i, s.p, s.at, got, s.cut)
					}
				}
			}
		})
	}
}

// TestGuardMemoryIsBounded: a flood of peer IDs (a Sybil's) leaves the
// guard remembering at most maxGuardKeys pairs and MaxBanned bans.
func TestGuardMemoryIsBounded(t *testing.T) {
	g := newGuard(Limits{Strikes: 1, MaxBanned: 100})
	now := time.Unix(0, 0)
	for i := range 3 * maxGuardKeys {
		p := peer.ID(fmt.Sprint(i))
		g.open(now, p, "/x")
		g.close(p, "/x")
		g.open(now, p, "/y") // held open: cannot be swept
		g.strike(now, p)
	}
	if len(g.buckets) > maxGuardKeys || len(g.banned) > 100 || len(g.strikes) > maxGuardKeys {
		t.Fatalf("guard holds %d pairs, %d bans, %d strike counts; want at most %d, 100, %d", len(g.buckets), len(g.banned), len(g.strikes), maxGuardKeys, maxGuardKeys)
	}
}

func TestLimitsCheck(t *testing.T) {
	for _, l := range []Limits{{RequestsPerSecond: -1}, {Burst: -1}, {StreamsPerPeer: 1e5}, {Strikes: -2}, {BanFor: -time.Second}, {MaxBanned: -1}, {ConnsPerIP: -1}, {ConnBurstPerIP: 1 << 20}} {
		if err := l.Check(); err == nil {
			t.Errorf("%+v passes the check", l)
		}
	}
	if err := (Limits{}).Check(); err != nil {
		t.Errorf("zero limits (the defaults): %v", err)
	}
}

// TestFloodingPeerIsCutOff: a peer that opens hello streams as fast as it
// can is refused past its rate, then cut off — its connection closed and
// new ones refused — while a peer at a member's pace is never refused.
// Without the guard every one of the flood's streams would be handled.
func TestFloodingPeerIsCutOff(t *testing.T) {
	slow(t)
	victim := startHosts(t, 1, nil)[0]
	victim.Guard.SetLimits(Limits{RequestsPerSecond: 20, Burst: 20, Strikes: 20, BanFor: time.Minute})
	handled := make(chan struct{}, 1<<16)
	victim.SetStreamHandler("/ringtrain/test-echo", func(s network.Stream) {
		handled <- struct{}{}
		s.Close()
	})
	flooder, polite := outsider(t, victim), outsider(t, victim)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opened := 0
	for ; opened < 2000 && !victim.Guard.Banned(flooder.ID()); opened++ {
		s, err := flooder.NewStream(ctx, victim.ID(), "/ringtrain/test-echo")
		if err != nil {
			break
		}
		s.Close()
	}
	waitFor(t, 10*time.Second, func() bool { return victim.Guard.Banned(flooder.ID()) }, "the flooder to be cut off")
	if n := len(handled); n > 60 {
		t.Errorf("%d of the flood's streams reached the handler; want at most its burst and a second's rate (~40)", n)
	}
	waitFor(t, 10*time.Second, func() bool { return victim.Network().Connectedness(flooder.ID()) != network.Connected }, "the flooder's connection to be closed")
	// Once cut off, nothing it opens reaches the handler (which would
	// count it before closing the stream): a dial may seem to succeed
	// until the victim's gater closes it, but a read ends in an error.
	before := len(handled)
	if s, err := flooder.NewStream(ctx, victim.ID(), "/ringtrain/test-echo"); err == nil {
		s.SetDeadline(time.Now().Add(5 * time.Second))
		io.Copy(io.Discard, s)
		s.Close()
	}
	if len(handled) != before {
		t.Errorf("a cut-off peer's stream reached the handler")
	}
	for range 10 {
		s, err := polite.NewStream(ctx, victim.ID(), "/ringtrain/test-echo")
		if err != nil {
			t.Fatalf("a polite peer's stream: %v", err)
		}
		s.Close()
	}
	if victim.Guard.Banned(polite.ID()) {
		t.Errorf("the polite peer was cut off")
	}
}

// waitFor polls cond until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, cond func() bool, what string) {
	t.Helper()
	for end := time.Now().Add(within); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("waited %v for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestJobConfigStreamsPerPeerAreBounded: a peer that opens job-config
// streams and says nothing holds at most StreamsPerPeer of them in the
// handler (each would wait 10 s for its request); the rest are refused at
// once. Without the bound every stream would hold a goroutine.
func TestJobConfigStreamsPerPeerAreBounded(t *testing.T) {
	slow(t)
	server := startHosts(t, 1, nil)[0]
	server.Guard.SetLimits(Limits{StreamsPerPeer: 4, Burst: 1000, Strikes: 1000})
	stop := ServeJobConfig(server, "job", "hash", []byte("{}"), zerolog.Nop())
	defer stop()
	client := outsider(t, server)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var held []network.Stream
	for range 12 {
		s, err := client.NewStream(ctx, server.ID(), JobConfigProtocol)
		if err != nil {
			t.Fatal(err)
		}
		s.Write([]byte{1}) // a request begun, never finished
		held = append(held, s)
	}
	waitFor(t, 10*time.Second, func() bool { return server.Guard.Refused() == 8 }, "8 of 12 silent streams to be refused")
	for _, s := range held {
		s.Reset()
	}
	// Their handlers end with the streams; the peer may ask again.
	key := jobConfigKey("job", "hash")
	var got []byte
	waitFor(t, 10*time.Second, func() bool {
		var err error
		got, err = askJobConfig(ctx, client, server.ID(), key)
		return err == nil
	}, "the job config once the silent streams are gone")
	if string(got) != "{}" {
		t.Errorf("job config %q; want {}", got)
	}
}

// TestGarbageSenderIsCutOff: a peer whose requests do not decode earns a
// strike for each, and at Strikes is cut off.
func TestGarbageSenderIsCutOff(t *testing.T) {
	slow(t)
	server := startHosts(t, 1, nil)[0]
	server.Guard.SetLimits(Limits{Strikes: 5})
	m, tr, te := testData(t)
	serveOn(t, server, DataServerConfig{}, m, tr.Dataset, te.Dataset)
	bad := outsider(t, server)
	garbage := append([]byte{9}, make([]byte, 32)...)
	for i := range 4 {
		st, status := rawRequest(t, bad, server.ID(), garbage)
		st.Close()
		if status != statusBad {
			t.Fatalf("request %d: status %d; want %d (refused)", i, status, statusBad)
		}
	}
	// The fifth strikes it out: its connection is closed, answer or not.
	if st, err := bad.NewStream(context.Background(), server.ID(), DataProtocol); err == nil {
		st.Write(garbage)
		io.ReadAll(st)
		st.Close()
	}
	waitFor(t, 10*time.Second, func() bool { return server.Guard.Banned(bad.ID()) }, "the garbage sender to be cut off")
	if server.Guard.Bans() != 1 {
		t.Errorf("%d peers cut off; want 1", server.Guard.Bans())
	}
}

// TestMembersAreNotLimited: the peers a Node has verified as members of
// its job open streams at any rate (a re-formation's rounds come as fast
// as answers do), while a stranger at the same rate is refused. Without
// the exemption a member's re-formation hellos were refused and the
// member taken for unreachable.
func TestMembersAreNotLimited(t *testing.T) {
	slow(t)
	victim := startHosts(t, 1, nil)[0]
	victim.Guard.SetLimits(Limits{RequestsPerSecond: 1, Burst: 2, Strikes: 1000})
	member, stranger := outsider(t, victim), outsider(t, victim)
	untrust := victim.Guard.Trust(func(p peer.ID) bool { return p == member.ID() })
	defer untrust()
	var handled atomic.Int64
	victim.SetStreamHandler("/ringtrain/test-echo", func(s network.Stream) {
		handled.Add(1)
		s.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := func(h *Host) {
		s, err := h.NewStream(ctx, victim.ID(), "/ringtrain/test-echo")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, s)
		s.Close()
	}
	for range 20 {
		open(member)
	}
	if n := handled.Load(); n != 20 {
		t.Errorf("%d of a member's 20 streams handled; want all", n)
	}
	for range 20 {
		open(stranger)
	}
	if n := handled.Load() - 20; n > 4 {
		t.Errorf("%d of a stranger's 20 streams handled; want its burst and a second's rate at most", n)
	}
}

// TestConnectionsPerIPAreLimited: peers from one address other than
// 127.0.0.1 (here 127.0.0.2, which libp2p alone would exempt with the rest
// of 127.0.0.0/8) get ConnBurstPerIP new connections, then are refused
// before any handshake; without the narrowed exemption all would connect.
func TestConnectionsPerIPAreLimited(t *testing.T) {
	slow(t)
	victim := limitedHost(t, Limits{ConnBurstPerIP: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	connected := connectFrom127002(ctx, t, victim, 8, false)
	if connected == 0 || connected > 3 {
		t.Errorf("%d of 8 peers from 127.0.0.2 connected; want 1 to 3 (the burst)", connected)
	}
}

// TestPeerStreamsAreLimited: PeerStreams bounds the streams one peer holds
// with the host, all protocols together (libp2p's resource manager):
// streams past it are reset before their handler runs.
func TestPeerStreamsAreLimited(t *testing.T) {
	slow(t)
	victim := limitedHost(t, Limits{PeerStreams: 8, StreamsPerPeer: 1000, Burst: 1000})
	hold := make(chan struct{})
	defer close(hold)
	var handled atomic.Int64
	victim.SetStreamHandler("/ringtrain/test-hold", func(s network.Stream) {
		handled.Add(1)
		<-hold
		s.Reset()
	})
	client := outsider(t, victim)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 24 {
		if s, err := client.NewStream(ctx, victim.ID(), "/ringtrain/test-hold"); err == nil {
			s.Write([]byte{1})
			defer s.Reset()
		}
	}
	// Streams past the limit are refused at once; give those within it
	// time to reach the handler.
	waitFor(t, 5*time.Second, func() bool { return handled.Load() > 0 }, "a stream to reach the handler")
	time.Sleep(200 * time.Millisecond)
	if n := handled.Load(); n > 8 {
		t.Errorf("%d of 24 held streams reached the handler; want at most 8 (PeerStreams)", n)
	}
}

// TestConnectionsHeldPerIPAreLimited: ConnsPerIP bounds the connections
// one address holds at once; the burst is no bound on it.
func TestConnectionsHeldPerIPAreLimited(t *testing.T) {
	slow(t)
	victim := limitedHost(t, Limits{ConnsPerIP: 2, ConnBurstPerIP: 100})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	connected := connectFrom127002(ctx, t, victim, 6, true)
	if connected == 0 || connected > 2 {
		t.Errorf("%d of 6 peers from 127.0.0.2 hold a connection; want 1 or 2", connected)
	}
}

// limitedHost is a loopback host with lim, closed when the test ends.
func limitedHost(t *testing.T, lim Limits) *Host {
	t.Helper()
	h, err := NewHost(context.Background(), HostConfig{Listen: loopback, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// connectFrom127002 starts n peers on 127.0.0.2, one after another, each
// connecting to victim, and says how many connected; with hold, each keeps
// its connection until the test ends.
func connectFrom127002(ctx context.Context, t *testing.T, victim *Host, n int, hold bool) int {
	t.Helper()
	connected := 0
	for range n {
		h, err := NewHost(ctx, HostConfig{Listen: []string{"/ip4/127.0.0.2/tcp/0"}})
		if err != nil {
			t.Fatal(err)
		}
		if h.Connect(ctx, info(victim)) == nil {
			connected++
		}
		if hold {
			t.Cleanup(func() { h.Close() })
		} else {
			h.Close()
		}
	}
	return connected
}
