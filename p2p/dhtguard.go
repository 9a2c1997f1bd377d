package p2p

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p-kad-dht/records"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// The guard's stream limits count streams opened, and kad-dht reads
// message after message from one stream: eight identities sent 1.2 million
// FIND_NODE and ADD_PROVIDER messages on eight streams in 37 s, unseen, and
// the provider store they filled had no bound. So each DHT message is
// counted too — against its peer and against its address, whatever
// identities that address holds — and what breaks the bounds is struck
// and its stream reset; the provider store is bounded (providerStore).

// Defaults of the DHT message limits (Limits.DHTMessagesPerSecond,
// DHTMessageBurst): a member's lookups and advertisements send a few a
// second. One address may send perIPMessages times a peer's.
const (
	DefaultDHTMessagesPerSecond = 100
	DefaultDHTMessageBurst      = 400
	perIPMessages               = 4
)

// msgKey is what DHT messages are counted against: a peer, or an address.
type msgKey struct {
	p  peer.ID
	ip netip.Addr
}

// message decides on one DHT message from p at ip (the zero Addr for an
// address that is exempt: 127.0.0.1, ::1) at now.
func (g *guard) message(now time.Time, p peer.ID, ip netip.Addr) verdict {
	if g.isBanned(now, p) {
		return banned
	}
	rate, burst := g.lim.DHTMessagesPerSecond, float64(g.lim.DHTMessageBurst)
	keys := []msgKey{{p: p}}
	if ip.IsValid() {
		keys = append(keys, msgKey{ip: ip})
	}
	bs := make([]*bucket, len(keys))
	for i, k := range keys {
		b := g.msgs[k]
		if b == nil {
			if len(g.msgs) >= maxGuardKeys {
				g.sweep(now)
			}
			if len(g.msgs) >= maxGuardKeys {
				return full
			}
			b = &bucket{tokens: burst * scale(k), at: now}
			g.msgs[k] = b
		}
		if d := now.Sub(b.at); d > 0 {
			b.tokens = min(burst*scale(k), b.tokens+d.Seconds()*rate*scale(k))
			b.at = now
		}
		if b.tokens < 1 {
			return overMessages
		}
		bs[i] = b
	}
	for _, b := range bs {
		b.tokens--
	}
	return admitted
}

// scale is how many times a peer's message budget k gets: an address's is
// perIPMessages times.
func scale(k msgKey) float64 {
	if k.ip.IsValid() {
		return perIPMessages
	}
	return 1
}

// remoteIP is the address a stream's connection comes from, or the zero
// Addr where it is exempt (127.0.0.1, ::1: a machine's own peers) or not
// an IP.
func remoteIP(s network.Stream) netip.Addr {
	return exemptIP(s.Conn().RemoteMultiaddr())
}

func exemptIP(a ma.Multiaddr) netip.Addr {
	ip, err := manet.ToIP(a)
	if err != nil {
		return netip.Addr{}
	}
	return exemptNetIP(ip)
}

// exemptAddr is exemptIP of a net.Addr.
func exemptAddr(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		return exemptNetIP(t.IP)
	}
	return netip.Addr{}
}

func exemptNetIP(ip net.IP) netip.Addr {
	addr, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Addr{}
	}
	addr = addr.Unmap()
	if addr == netip.MustParseAddr("127.0.0.1") || addr == netip.IPv6Loopback() {
		return netip.Addr{}
	}
	if addr.Is6() {
		p, _ := addr.Prefix(56) // an IPv6 holder has a /56 at least
		return p.Addr()
	}
	return addr
}

// Message counts one DHT message that s carries against its peer and its
// address, and says whether it may be handled; one over the limits is a
// strike, and its stream is reset.
func (g *Guard) Message(s network.Stream) bool {
	p := s.Conn().RemotePeer()
	if g.isTrusted(p) {
		return true
	}
	g.mu.Lock()
	now := g.now()
	v := g.g.message(now, p, remoteIP(s))
	cut := v == overMessages && g.g.strike(now, p)
	g.mu.Unlock()
	if v == admitted {
		return true
	}
	g.refused.Add(1)
	s.Reset()
	if v == overMessages {
		g.warns.Warn(p.String(), "cut off a DHT stream over this peer's message limits").
			Msg("cut off a DHT stream over this peer's message limits")
	}
	if cut {
		g.cutOff(p, "DHT messages over the limit")
	}
	return false
}

// Bounds of the provider store (see providerStore).
const (
	maxProviderKeys       = 4096 // keys held; past it the least recently provided goes
	maxProvidersPerKey    = 64   // peers held for one key; past it the least recently heard goes
	maxKeysPerProvider    = 64   // keys one peer may provide: a peer of a job provides one or two
	maxProviderAddrs      = maxMemberAddrs
	providerStoreRecordTT = 48 * time.Hour // kad-dht's ProvideValidity
)

// ErrTooManyProvided means a peer provides more keys than a provider store
// holds for one peer.
var ErrTooManyProvided = errors.New("p2p: too many keys provided by one peer")

// providerStore is the DHT's provider records in memory, bounded: at most
// maxProviderKeys keys of maxProvidersPerKey peers each, and
// maxKeysPerProvider keys for one peer, so that a flood of ADD_PROVIDER
// messages holds a few hundred kilobytes, not a store that grows until the
// process dies. kad-dht's own store keeps every record it is sent for
// 48 hours and puts every provider's addresses in the peerstore for a day.
type providerStore struct {
	now func() time.Time

	mu    sync.Mutex
	keys  map[string]*list.Element // of *provKey, least recently provided at the front
	order *list.List
	count map[peer.ID]int // keys each peer provides
}

type provKey struct {
	key   string
	provs map[peer.ID]provRecord
}

type provRecord struct {
	addrs []ma.Multiaddr
	at    time.Time
}

var _ records.ProviderStore = (*providerStore)(nil)

func newProviderStore() *providerStore {
	return &providerStore{now: time.Now, keys: map[string]*list.Element{}, order: list.New(), count: map[peer.ID]int{}}
}

// AddProvider records that prov provides key.
func (ps *providerStore) AddProvider(_ context.Context, key []byte, prov peer.AddrInfo) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	now := ps.now()
	e := ps.keys[string(key)]
	if e == nil || e.Value.(*provKey).provs[prov.ID].at.IsZero() {
		if ps.count[prov.ID] >= maxKeysPerProvider {
			return fmt.Errorf("%w: %s provides %d keys already", ErrTooManyProvided, prov.ID, ps.count[prov.ID])
		}
	}
	if e == nil {
		if len(ps.keys) >= maxProviderKeys {
			ps.dropKey(ps.order.Front())
		}
		e = ps.order.PushBack(&provKey{key: string(key), provs: map[peer.ID]provRecord{}})
		ps.keys[string(key)] = e
	}
	ps.order.MoveToBack(e)
	k := e.Value.(*provKey)
	if _, ok := k.provs[prov.ID]; !ok {
		if len(k.provs) >= maxProvidersPerKey {
			var oldest peer.ID
			for p, r := range k.provs {
				if oldest == "" || r.at.Before(k.provs[oldest].at) {
					oldest = p
				}
			}
			ps.dropProvider(k, oldest)
		}
		ps.count[prov.ID]++
	}
	k.provs[prov.ID] = provRecord{addrs: slices.Clone(prov.Addrs[:min(len(prov.Addrs), maxProviderAddrs)]), at: now}
	return nil
}

// GetProviders lists the peers that provide key, and where they are.
func (ps *providerStore) GetProviders(_ context.Context, key []byte) ([]peer.AddrInfo, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	e := ps.keys[string(key)]
	if e == nil {
		return nil, nil
	}
	k := e.Value.(*provKey)
	now := ps.now()
	var out []peer.AddrInfo
	for p, r := range k.provs {
		if now.Sub(r.at) > providerStoreRecordTT {
			ps.dropProvider(k, p)
			continue
		}
		out = append(out, peer.AddrInfo{ID: p, Addrs: slices.Clone(r.addrs)})
	}
	if len(k.provs) == 0 {
		ps.dropKey(e)
	}
	slices.SortFunc(out, func(a, b peer.AddrInfo) int { return k.provs[b.ID].at.Compare(k.provs[a.ID].at) })
	return out, nil
}

func (ps *providerStore) dropProvider(k *provKey, p peer.ID) {
	delete(k.provs, p)
	if ps.count[p]--; ps.count[p] <= 0 {
		delete(ps.count, p)
	}
}

func (ps *providerStore) dropKey(e *list.Element) {
	k := e.Value.(*provKey)
	for p := range k.provs {
		ps.dropProvider(k, p)
	}
	delete(ps.keys, k.key)
	ps.order.Remove(e)
}

// Close does nothing: the store is memory.
func (ps *providerStore) Close() error { return nil }
