package p2p

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	dhtpb "github.com/libp2p/go-libp2p-kad-dht/pb"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-msgio"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"
)

// TestGuardCountsDHTMessages: DHT messages are counted per peer and per
// address: a peer gets its burst, then its rate; a second identity at the
// same address gets its own, until the address's (four times a peer's) is
// spent; 127.0.0.1 is counted per peer only.
func TestGuardCountsDHTMessages(t *testing.T) {
	now := time.Unix(0, 0)
	g := newGuard(Limits{DHTMessagesPerSecond: 10, DHTMessageBurst: 20})
	ip := netip.MustParseAddr("192.0.2.7")
	count := func(p peer.ID, ip netip.Addr, n int) int {
		ok := 0
		for range n {
			if g.message(now, p, ip) == admitted {
				ok++
			}
		}
		return ok
	}
	if got := count("a", ip, 100); got != 20 {
		t.Errorf("one peer's 100 messages at once: %d admitted; want its burst, 20", got)
	}
	now = now.Add(time.Second)
	if got := count("a", ip, 100); got != 10 {
		t.Errorf("a second later: %d admitted; want its rate, 10", got)
	}
	admittedFrom := 0
	for i := range 10 {
		admittedFrom += count(peer.ID(fmt.Sprint("sybil", i)), ip, 100)
	}
	// The address's burst is 80: 20 spent, 40 back a second later (at
	// most 80), 10 spent.
	if want := 70; admittedFrom != want {
		t.Errorf("ten identities at the same address: %d admitted; want what is left of the address's budget, %d", admittedFrom, want)
	}
	if got := count("local", netip.Addr{}, 100); got != 20 {
		t.Errorf("a peer at an exempt address: %d admitted; want its own burst, 20", got)
	}
	if v := g.message(now, "a", ip); v != overMessages {
		t.Errorf("over the limit: %v; want %v", v, overMessages)
	}
	now = now.Add(time.Hour)
	g.sweep(now)
	if len(g.msgs) != 0 {
		t.Errorf("an hour later the guard holds %d message counts; want none", len(g.msgs))
	}
}

// TestProviderStoreBounded: the provider store holds at most its keys,
// providers per key and keys per provider, forgets the least recently
// provided key first, and drops records past their validity.
func TestProviderStoreBounded(t *testing.T) {
	now := time.Unix(0, 0)
	ps := newProviderStore()
	ps.now = func() time.Time { return now }
	ctx := context.Background()
	a := ma.StringCast("/ip4/192.0.2.1/tcp/1")
	job := []byte("job key")
	if err := ps.AddProvider(ctx, job, peer.AddrInfo{ID: "member", Addrs: []ma.Multiaddr{a}}); err != nil {
		t.Fatal(err)
	}
	refused := 0
	for i := range 2 * maxKeysPerProvider {
		if ps.AddProvider(ctx, fmt.Appendf(nil, "k%d", i), peer.AddrInfo{ID: "flooder", Addrs: []ma.Multiaddr{a}}) != nil {
			refused++
		}
	}
	if refused != maxKeysPerProvider || ps.count["flooder"] != maxKeysPerProvider {
		t.Errorf("one peer providing %d keys: %d refused, %d held; want %d and %d", 2*maxKeysPerProvider, refused, ps.count["flooder"], maxKeysPerProvider, maxKeysPerProvider)
	}
	for i := range 2 * maxProvidersPerKey {
		ps.AddProvider(ctx, []byte("popular"), peer.AddrInfo{ID: peer.ID(fmt.Sprint("p", i))})
		now = now.Add(time.Millisecond)
	}
	if got, _ := ps.GetProviders(ctx, []byte("popular")); len(got) != maxProvidersPerKey || got[0].ID != peer.ID(fmt.Sprint("p", 2*maxProvidersPerKey-1)) {
		t.Errorf("a key provided by %d peers holds %d, newest first %v; want the newest %d", 2*maxProvidersPerKey, len(got), got[:1], maxProvidersPerKey)
	}
	for i := range 2 * maxProviderKeys {
		ps.AddProvider(ctx, fmt.Appendf(nil, "s%d", i), peer.AddrInfo{ID: peer.ID(fmt.Sprint("sybil", i))})
	}
	if len(ps.keys) > maxProviderKeys || ps.order.Len() != len(ps.keys) {
		t.Errorf("after %d keys the store holds %d (list %d); want at most %d", 2*maxProviderKeys, len(ps.keys), ps.order.Len(), maxProviderKeys)
	}
	if got, _ := ps.GetProviders(ctx, job); len(got) != 0 {
		t.Errorf("the least recently provided key survived %d newer ones: %v", 2*maxProviderKeys, got)
	}
	ps.AddProvider(ctx, job, peer.AddrInfo{ID: "member", Addrs: []ma.Multiaddr{a}})
	if got, _ := ps.GetProviders(ctx, job); len(got) != 1 || got[0].ID != "member" || len(got[0].Addrs) != 1 {
		t.Errorf("a key provided again: %v; want the member at its address", got)
	}
	now = now.Add(providerStoreRecordTT + time.Second)
	if got, _ := ps.GetProviders(ctx, job); len(got) != 0 || ps.count["member"] != 0 {
		t.Errorf("past its validity: %v, counted %d; want it gone", got, ps.count["member"])
	}
}

// TestWarnLimiterByAddress: a thousand identities at one address write a
// few lines, not five each.
func TestWarnLimiterByAddress(t *testing.T) {
	var buf bytes.Buffer
	w := newWarnLimiter(zerolog.New(&buf))
	w.addrOf = func(p string) string {
		if strings.HasPrefix(p, "sybil") {
			return "192.0.2.9"
		}
		return ""
	}
	for i := range 1000 {
		w.Warn(fmt.Sprint("sybil", i), "bad hello").Msg("bad hello")
	}
	if n := strings.Count(buf.String(), "\n"); n != perIPWarns*warnBurst {
		t.Errorf("1,000 identities at one address wrote %d lines; want %d", n, perIPWarns*warnBurst)
	}
	buf.Reset()
	w.Warn("honest", "bad hello").Msg("bad hello")
	if buf.Len() == 0 {
		t.Error("a peer at another address is kept quiet by the sybils")
	}
}

// TestDHTFloodIsCutOff: a peer that sends DHT messages one after another
// on one kad stream — FIND_NODE and ADD_PROVIDER of ever new keys — is
// cut off, and the victim holds at most maxKeysPerProvider of its
// records. Before messages were counted, 1.2 million of them on eight
// streams went unseen and the victim's memory grew without bound.
func TestDHTFloodIsCutOff(t *testing.T) {
	slow(t)
	victim := limitedHost(t, Limits{DHTMessagesPerSecond: 50, DHTMessageBurst: 100, Strikes: 20, BanFor: time.Minute})
	flooder := outsider(t, victim)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := flooder.NewStream(ctx, victim.ID(), ProtocolPrefix+"/kad/1.0.0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w := msgio.NewVarintWriter(s)
	addr := [][]byte{flooder.Addrs()[0].Bytes()}
	sent := 0
	for ; sent < 20000 && !victim.Guard.Banned(flooder.ID()); sent++ {
		m := &dhtpb.Message{Type: dhtpb.Message_FIND_NODE, Key: fmt.Appendf(nil, "key %d", sent)}
		if sent%2 == 1 {
			m = &dhtpb.Message{Type: dhtpb.Message_ADD_PROVIDER, Key: fmt.Appendf(nil, "key %d", sent),
				ProviderPeers: []*dhtpb.Message_Peer{{Id: []byte(flooder.ID()), Addrs: addr}}}
		}
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if w.WriteMsg(b) != nil {
			// Reset: open another, as a flooder would.
			if s, err = flooder.NewStream(ctx, victim.ID(), ProtocolPrefix+"/kad/1.0.0"); err != nil {
				break
			}
			w = msgio.NewVarintWriter(s)
		}
	}
	waitFor(t, 10*time.Second, func() bool { return victim.Guard.Banned(flooder.ID()) }, fmt.Sprintf("the DHT flooder to be cut off (%d messages sent)", sent))
	ps := victim.DHT.ProviderStore().(*providerStore)
	ps.mu.Lock() // the DHT's handlers may still be adding what was in flight
	held := len(ps.keys)
	ps.mu.Unlock()
	if held > maxKeysPerProvider {
		t.Errorf("the victim holds %d provider keys of the flooder; want at most %d", held, maxKeysPerProvider)
	}
}

// TestStreamsOnUnservedProtocolsAreCounted: a peer that opens stream after
// stream on protocols no handler serves (relay reservations asked of a
// peer that is no relay) is counted before negotiation, refused past four
// times a protocol's rate, and cut off. Before, no handler saw them, and
// a flooder cost its victim a negotiation each, 3,500 a second.
func TestStreamsOnUnservedProtocolsAreCounted(t *testing.T) {
	slow(t)
	victim := limitedHost(t, Limits{RequestsPerSecond: 5, Burst: 10, Strikes: 20, BanFor: time.Minute})
	flooder := outsider(t, victim)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opened := 0
	for ; opened < 5000 && !victim.Guard.Banned(flooder.ID()); opened++ {
		if s, err := flooder.NewStream(ctx, victim.ID(), "/libp2p/circuit/relay/0.2.0/hop"); err == nil {
			s.Reset()
		}
	}
	waitFor(t, 10*time.Second, func() bool { return victim.Guard.Banned(flooder.ID()) },
		fmt.Sprintf("the peer opening streams no handler serves to be cut off (%d opened)", opened))
	if opened > 500 {
		t.Errorf("cut off after %d streams; want about its burst (40) and its strikes (20)", opened)
	}
}
