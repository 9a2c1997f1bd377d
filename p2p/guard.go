package p2p

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/rs/zerolog"
)

// Limits bound what one peer may ask of this one on each protocol whose
// handler is set on a Host: ringtrain's own (hello, re-formation,
// admission, ring links, job config, served data) and the DHT's. A peer
// that breaks them — or sends what does not decode — earns a strike; at
// Strikes within a minute it is cut off (its connections closed) and
// refused for BanFor. libp2p's resource manager bounds the rest beneath
// this: connections per IP and their rate, streams and memory per peer
// (NewHost). The defaults leave a member of a job many times the room it
// uses; zero fields take them.
type Limits struct {
	// RequestsPerSecond is how many streams one peer may open a second
	// on one protocol, on average; Burst how many at once above that.
	// Defaults 50 and 200: a member in formation opens a few a second.
	RequestsPerSecond float64
	Burst             int
	// StreamsPerPeer is how many of one peer's streams on one protocol
	// may be in their handler at once. Default 32.
	StreamsPerPeer int
	// Strikes within a minute cut a peer off. Default 100.
	Strikes int
	// BanFor is how long a cut-off peer is refused. Default 10 minutes.
	BanFor time.Duration
	// MaxBanned is how many cut-off peers are remembered; past it the ban
	// that would end first is forgotten. Default 4096.
	MaxBanned int
	// ConnsPerIP is how many connections one IPv4 address (an IPv6 /56)
	// may hold with the host, and ConnBurstPerIP how many new ones it may
	// open at once, then one every 5 s: libp2p's resource manager's
	// limits, with its defaults, 8 and 16. 127.0.0.1 and ::1, where a
	// machine's own peers are, are exempt. They are taken when the host
	// starts (HostConfig.Limits); SetLimits does not change them.
	ConnsPerIP     int
	ConnBurstPerIP int
	// PeerStreams and PeerMemory bound what one peer's streams and
	// connections may hold with the host, all protocols together: libp2p's
	// resource manager's per-peer limits, 0 for its defaults scaled to the
	// machine (512 streams; 64 MiB of memory, more on a machine with more: libp2p's AutoScale).
	// Taken when the host starts.
	PeerStreams int
	PeerMemory  int64
	// DHTMessagesPerSecond is how many DHT messages one peer may send a
	// second, on all its streams together, on average; DHTMessageBurst how
	// many at once above that. One address may send four times as many,
	// whatever identities it holds (127.0.0.1 and ::1 are exempt).
	// Defaults 100 and 400.
	DHTMessagesPerSecond float64
	DHTMessageBurst      int
}

// Defaults of Limits.
const (
	DefaultRequestsPerSecond = 50
	DefaultBurst             = 200
	DefaultStreamsPerPeer    = 32
	DefaultStrikes           = 100
	DefaultBanFor            = 10 * time.Minute
	DefaultMaxBanned         = 4096
	DefaultConnsPerIP        = 8
	DefaultConnBurstPerIP    = 16
)

// strikeWindow is how long strikes are counted together.
const strikeWindow = time.Minute

// maxGuardKeys bounds the (peer, protocol) pairs the guard keeps a rate
// for; the resource manager's connection limits keep the real number far
// below it.
const maxGuardKeys = 1 << 14

// WithDefaults returns l with its zero fields at their defaults.
func (l Limits) WithDefaults() Limits {
	if l.RequestsPerSecond <= 0 {
		l.RequestsPerSecond = DefaultRequestsPerSecond
	}
	if l.Burst <= 0 {
		l.Burst = DefaultBurst
	}
	if l.StreamsPerPeer <= 0 {
		l.StreamsPerPeer = DefaultStreamsPerPeer
	}
	if l.Strikes <= 0 {
		l.Strikes = DefaultStrikes
	}
	if l.BanFor <= 0 {
		l.BanFor = DefaultBanFor
	}
	if l.MaxBanned <= 0 {
		l.MaxBanned = DefaultMaxBanned
	}
	if l.ConnsPerIP <= 0 {
		l.ConnsPerIP = DefaultConnsPerIP
	}
	if l.ConnBurstPerIP <= 0 {
		l.ConnBurstPerIP = DefaultConnBurstPerIP
	}
	if l.DHTMessagesPerSecond <= 0 {
		l.DHTMessagesPerSecond = DefaultDHTMessagesPerSecond
	}
	if l.DHTMessageBurst <= 0 {
		l.DHTMessageBurst = DefaultDHTMessageBurst
	}
	return l
}

// verdict is what the guard says of a stream a peer opened.
type verdict int

const (
	admitted     verdict = iota
	overRate             // more streams a second than RequestsPerSecond and Burst allow
	overStreams          // StreamsPerPeer of its streams are being handled
	banned               // the peer is cut off
	full                 // no room to remember the pair: refused, not held against the peer
	overMessages         // more DHT messages a second than its peer or address may send
)

func (v verdict) String() string {
	return [...]string{"admitted", "over its rate of streams", "over its streams at once", "cut off", "no room", "over its rate of DHT messages"}[v]
}

type guardKey struct {
	p     peer.ID
	proto protocol.ID
}

// bucket is a token bucket and a count of streams in their handler.
type bucket struct {
	tokens float64
	at     time.Time
	open   int
}

type strikes struct {
	since time.Time
	n     int
}

// guard is the decision part of Guard: what to do with a peer's stream,
// when a peer has struck out, and whom to refuse; it does no I/O and
// reads no clock, so a table drives it.
type guard struct {
	lim     Limits
	buckets map[guardKey]*bucket
	msgs    map[msgKey]*bucket // DHT messages, per peer and per address
	strikes map[peer.ID]*strikes
	banned  map[peer.ID]time.Time // until
	swept   time.Time             // the last sweep: at most one a second, since each costs a pass over every pair
}

func newGuard(l Limits) *guard {
	return &guard{lim: l.WithDefaults(), buckets: map[guardKey]*bucket{}, msgs: map[msgKey]*bucket{}, strikes: map[peer.ID]*strikes{}, banned: map[peer.ID]time.Time{}}
}

// open decides on a stream of p on proto at now; admitted streams are
// counted as open until close.
func (g *guard) open(now time.Time, p peer.ID, proto protocol.ID) verdict {
	if g.isBanned(now, p) {
		return banned
	}
	b := g.bucket(now, guardKey{p, proto})
	if b == nil {
		return full
	}
	switch {
	case b.open >= g.lim.StreamsPerPeer:
		return overStreams
	case b.tokens < 1:
		return overRate
	}
	b.tokens--
	b.open++
	return admitted
}

// anyStream decides on a stream p opens on any protocol, before it is
// negotiated: a token bucket of anyProtocolScale times a protocol's rate
// and burst, and no count of streams at once (the per-protocol buckets
// keep that).
func (g *guard) anyStream(now time.Time, p peer.ID) verdict {
	if g.isBanned(now, p) {
		return banned
	}
	b := g.bucket(now, guardKey{p, anyProtocol})
	if b == nil {
		return full
	}
	if b.tokens < 1 {
		return overRate
	}
	b.tokens--
	return admitted
}

// anyProtocol keys the bucket of a peer's streams on every protocol;
// anyProtocolScale is how many times one protocol's rate it gets.
const (
	anyProtocol      protocol.ID = "*"
	anyProtocolScale             = 4
)

// close ends a stream open admitted.
func (g *guard) close(p peer.ID, proto protocol.ID) {
	if b := g.buckets[guardKey{p, proto}]; b != nil && b.open > 0 {
		b.open--
	}
}

// bucket is k's token bucket refilled to now — made full if new — or nil
// when there is no room to remember another.
func (g *guard) bucket(now time.Time, k guardKey) *bucket {
	b := g.buckets[k]
	if b == nil {
		if len(g.buckets) >= maxGuardKeys {
			g.sweep(now)
		}
		if len(g.buckets) >= maxGuardKeys {
			return nil
		}
		b = &bucket{tokens: g.burst(k), at: now}
		g.buckets[k] = b
	}
	g.refill(now, k, b)
	return b
}

// burst is how many streams k's bucket holds: a protocol's Burst, or
// anyProtocolScale times it for a peer's streams on every protocol.
func (g *guard) burst(k guardKey) float64 {
	if k.proto == anyProtocol {
		return anyProtocolScale * float64(g.lim.Burst)
	}
	return float64(g.lim.Burst)
}

func (g *guard) refill(now time.Time, k guardKey, b *bucket) {
	if d := now.Sub(b.at); d > 0 {
		full := g.burst(k)
		b.tokens = min(full, b.tokens+d.Seconds()*g.lim.RequestsPerSecond*full/float64(g.lim.Burst))
		b.at = now
	}
}

// sweep forgets pairs with nothing to remember (a full bucket, no stream
// open) and strikes whose window has passed — at most once a second.
func (g *guard) sweep(now time.Time) {
	if now.Sub(g.swept) < time.Second {
		return
	}
	g.swept = now
	for k, b := range g.buckets {
		g.refill(now, k, b)
		if b.open == 0 && b.tokens >= g.burst(k) {
			delete(g.buckets, k)
		}
	}
	for k, b := range g.msgs {
		full := float64(g.lim.DHTMessageBurst) * scale(k)
		if b.tokens+now.Sub(b.at).Seconds()*g.lim.DHTMessagesPerSecond*scale(k) >= full {
			delete(g.msgs, k)
		}
	}
	for p, s := range g.strikes {
		if now.Sub(s.since) >= strikeWindow {
			delete(g.strikes, p)
		}
	}
}

// strike counts one against p and says whether that cut it off (true only
// the once).
func (g *guard) strike(now time.Time, p peer.ID) bool {
	if g.isBanned(now, p) {
		return false
	}
	s := g.strikes[p]
	if s == nil || now.Sub(s.since) >= strikeWindow {
		if s == nil && len(g.strikes) >= maxGuardKeys {
			g.sweep(now)
		}
		if s == nil && len(g.strikes) >= maxGuardKeys {
			return false
		}
		s = &strikes{since: now}
		g.strikes[p] = s
	}
	s.n++
	if s.n < g.lim.Strikes {
		return false
	}
	delete(g.strikes, p)
	g.ban(now, p)
	return true
}

// ban refuses p until now + BanFor, forgetting the ban that ends first if
// there is no room for another.
func (g *guard) ban(now time.Time, p peer.ID) {
	if len(g.banned) >= g.lim.MaxBanned {
		var first peer.ID
		var end time.Time
		for q, until := range g.banned {
			if !until.After(now) {
				delete(g.banned, q)
				continue
			}
			if first == "" || until.Before(end) {
				first, end = q, until
			}
		}
		if len(g.banned) >= g.lim.MaxBanned {
			delete(g.banned, first)
		}
	}
	g.banned[p] = now.Add(g.lim.BanFor)
}

func (g *guard) isBanned(now time.Time, p peer.ID) bool {
	until, ok := g.banned[p]
	if ok && !until.After(now) {
		delete(g.banned, p)
		return false
	}
	return ok
}

// Guard enforces Limits on a Host: every stream handler set on the Host
// passes through it, and its gater refuses connections of peers it has
// cut off. Handlers call Strike for input that does not decode.
type Guard struct {
	now   func() time.Time
	cut   func(peer.ID) // closes a peer's connections
	log   zerolog.Logger
	warns *warnLimiter

	mu sync.Mutex
	g  *guard

	trustMu sync.Mutex
	trusted map[int]func(peer.ID) bool
	nextID  int

	refused atomic.Int64
	bans    atomic.Int64
}

func newGuardFor(l Limits, log zerolog.Logger) *Guard {
	return &Guard{now: time.Now, log: log, warns: newWarnLimiter(log), g: newGuard(l), cut: func(peer.ID) {}}
}

// Trust exempts the peers f says yes to from the limits and strikes until
// the returned func is called. A Node trusts the verified members of its
// job: they prove the job's key, and what a member does wrong is the
// agreement's to judge (a liar is named and the ring re-forms without
// it) — while a re-formation opens a stream to every member each round,
// and rounds come as fast as the answers do.
func (g *Guard) Trust(f func(peer.ID) bool) (untrust func()) {
	g.trustMu.Lock()
	defer g.trustMu.Unlock()
	if g.trusted == nil {
		g.trusted = map[int]func(peer.ID) bool{}
	}
	id := g.nextID
	g.nextID++
	g.trusted[id] = f
	return func() {
		g.trustMu.Lock()
		delete(g.trusted, id)
		g.trustMu.Unlock()
	}
}

// isTrusted asks the trusting funcs without holding g.mu: a Node's takes
// its own lock.
func (g *Guard) isTrusted(p peer.ID) bool {
	g.trustMu.Lock()
	fs := make([]func(peer.ID) bool, 0, len(g.trusted))
	for _, f := range g.trusted {
		fs = append(fs, f)
	}
	g.trustMu.Unlock()
	for _, f := range fs {
		if f(p) {
			return true
		}
	}
	return false
}

// SetLimits replaces the limits (a job's config is read after its host
// starts); what the guard remembers stays.
func (g *Guard) SetLimits(l Limits) {
	g.mu.Lock()
	g.g.lim = l.WithDefaults()
	g.mu.Unlock()
}

// Limits returns the limits in force.
func (g *Guard) Limits() Limits {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.g.lim
}

// Banned reports whether p is cut off now.
func (g *Guard) Banned(p peer.ID) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.g.isBanned(g.now(), p)
}

// Refused is how many streams the guard has refused; Bans how many peers
// it has cut off.
func (g *Guard) Refused() int64 { return g.refused.Load() }

// Bans is how many peers the guard has cut off.
func (g *Guard) Bans() int64 { return g.bans.Load() }

// Strike counts input from p that did not decode (why says what) against
// it; enough of them cut it off.
func (g *Guard) Strike(p peer.ID, why string) {
	if g.isTrusted(p) {
		return
	}
	g.mu.Lock()
	cut := g.g.strike(g.now(), p)
	g.mu.Unlock()
	if cut {
		g.cutOff(p, why)
	}
}

func (g *Guard) cutOff(p peer.ID, why string) {
	g.bans.Add(1)
	lim := g.Limits()
	g.log.Warn().Stringer("peer", p).Str("last", why).Dur("for", lim.BanFor).Int("strikes", lim.Strikes).
		Msg("cut off a peer that broke this peer's limits or sent what does not decode")
	g.cut(p)
}

// allowStream counts a stream p opens, on whatever protocol, before it is
// negotiated (guardedRM), and says whether it may be: past the rate it is
// refused, a strike.
func (g *Guard) allowStream(p peer.ID) bool {
	if g.isTrusted(p) {
		return true
	}
	g.mu.Lock()
	now := g.now()
	v := g.g.anyStream(now, p)
	cut := v == overRate && g.g.strike(now, p)
	g.mu.Unlock()
	if v == admitted || v == full {
		return true
	}
	g.refused.Add(1)
	if v == overRate {
		g.warns.Warn(p.String(), "refused a stream over this peer's rate on all protocols").Msg("refused a stream over this peer's rate on all protocols")
	}
	if cut {
		g.cutOff(p, "streams over the rate on all protocols")
	}
	return false
}

// guardedRM is the host's resource manager with every stream a peer opens
// counted by the guard before it is negotiated: streams on protocols no
// handler serves (relay reservations asked of a peer that is no relay,
// say) never reached the per-protocol limits, and cost a negotiation each
// — 3,500 a second from one flooder.
type guardedRM struct {
	network.ResourceManager
	g *Guard
}

// errStreamRate is why a stream over a peer's rate is refused.
var errStreamRate = errors.New("p2p: streams over this peer's rate")

func (rm guardedRM) OpenStream(p peer.ID, dir network.Direction) (network.StreamManagementScope, error) {
	if dir == network.DirInbound && !rm.g.allowStream(p) {
		return nil, errStreamRate
	}
	return rm.ResourceManager.OpenStream(p, dir)
}

// wrap puts handler behind the guard for proto.
func (g *Guard) wrap(proto protocol.ID, handler network.StreamHandler) network.StreamHandler {
	return func(s network.Stream) {
		p := s.Conn().RemotePeer()
		if g.isTrusted(p) {
			handler(s)
			return
		}
		g.mu.Lock()
		now := g.now()
		v := g.g.open(now, p, proto)
		cut := false
		if v == overRate || v == overStreams {
			cut = g.g.strike(now, p)
		}
		g.mu.Unlock()
		if v != admitted {
			g.refused.Add(1)
			s.Reset()
			if v != banned && v != full {
				g.warns.Warn(p.String(), "refused a stream over this peer's limits").Str("protocol", string(proto)).Stringer("why", v).
					Msg("refused a stream over this peer's limits")
			}
			if cut {
				g.cutOff(p, fmt.Sprintf("%s on %s", v, proto))
			}
			return
		}
		defer func() {
			g.mu.Lock()
			g.g.close(p, proto)
			g.mu.Unlock()
		}()
		handler(s)
	}
}

// strike counts a strike against p on h's guard, if h has one (a Host's
// host.Host does).
func strike(h host.Host, p peer.ID, why string) {
	if gh, ok := h.(guardedHost); ok {
		gh.g.Strike(p, why)
	}
}

// guardedHost passes every handler set on it through its Guard, the DHT's
// too (kad-dht sets its handlers on the host it is given).
type guardedHost struct {
	host.Host
	g *Guard
}

func (h guardedHost) SetStreamHandler(pid protocol.ID, handler network.StreamHandler) {
	h.Host.SetStreamHandler(pid, h.g.wrap(pid, handler))
}

func (h guardedHost) SetStreamHandlerMatch(pid protocol.ID, m func(protocol.ID) bool, handler network.StreamHandler) {
	h.Host.SetStreamHandlerMatch(pid, m, h.g.wrap(pid, handler))
}

// gaters admits a connection only if each of its gaters does.
type gaters []connmgr.ConnectionGater

var _ connmgr.ConnectionGater = gaters(nil)

func (gs gaters) InterceptPeerDial(p peer.ID) bool {
	for _, g := range gs {
		if !g.InterceptPeerDial(p) {
			return false
		}
	}
	return true
}

func (gs gaters) InterceptAddrDial(p peer.ID, a ma.Multiaddr) bool {
	for _, g := range gs {
		if !g.InterceptAddrDial(p, a) {
			return false
		}
	}
	return true
}

func (gs gaters) InterceptAccept(c network.ConnMultiaddrs) bool {
	for _, g := range gs {
		if !g.InterceptAccept(c) {
			return false
		}
	}
	return true
}

func (gs gaters) InterceptSecured(d network.Direction, p peer.ID, c network.ConnMultiaddrs) bool {
	for _, g := range gs {
		if !g.InterceptSecured(d, p, c) {
			return false
		}
	}
	return true
}

func (gs gaters) InterceptUpgraded(c network.Conn) (bool, control.DisconnectReason) {
	for _, g := range gs {
		if ok, why := g.InterceptUpgraded(c); !ok {
			return false, why
		}
	}
	return true, 0
}

// guardGater refuses connections to and from peers the guard cut off.
type guardGater struct{ g *Guard }

func (gg guardGater) InterceptPeerDial(p peer.ID) bool                 { return !gg.g.Banned(p) }
func (gg guardGater) InterceptAddrDial(p peer.ID, _ ma.Multiaddr) bool { return !gg.g.Banned(p) }
func (gg guardGater) InterceptAccept(network.ConnMultiaddrs) bool      { return true }
func (gg guardGater) InterceptSecured(_ network.Direction, p peer.ID, _ network.ConnMultiaddrs) bool {
	return !gg.g.Banned(p)
}
func (gg guardGater) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) { return true, 0 }

// ErrBadLimits means a Limits field is out of range.
var ErrBadLimits = errors.New("p2p: bad limits")

// Check says which field of l, if any, is out of range (negative; a rate
// above what a loopback peer could ask).
func (l Limits) Check() error {
	switch {
	case l.RequestsPerSecond < 0 || l.RequestsPerSecond > 1e6:
		return fmt.Errorf("%w: requests_per_second %v: want 0 (default %d) to 1e6", ErrBadLimits, l.RequestsPerSecond, DefaultRequestsPerSecond)
	case l.Burst < 0 || l.Burst > 1e6:
		return fmt.Errorf("%w: burst %d: want 0 (default %d) to 1e6", ErrBadLimits, l.Burst, DefaultBurst)
	case l.StreamsPerPeer < 0 || l.StreamsPerPeer > 1e4:
		return fmt.Errorf("%w: streams_per_peer %d: want 0 (default %d) to 10000", ErrBadLimits, l.StreamsPerPeer, DefaultStreamsPerPeer)
	case l.Strikes < 0:
		return fmt.Errorf("%w: strikes %d: want 0 (default %d) or more", ErrBadLimits, l.Strikes, DefaultStrikes)
	case l.BanFor < 0:
		return fmt.Errorf("%w: ban_for %v: want 0 (default %v) or more", ErrBadLimits, l.BanFor, DefaultBanFor)
	case l.ConnsPerIP < 0 || l.ConnsPerIP > 1<<16:
		return fmt.Errorf("%w: conns_per_ip %d: want 0 (default %d) to %d", ErrBadLimits, l.ConnsPerIP, DefaultConnsPerIP, 1<<16)
	case l.ConnBurstPerIP < 0 || l.ConnBurstPerIP > 1<<16:
		return fmt.Errorf("%w: new_conns_per_ip %d: want 0 (default %d) to %d", ErrBadLimits, l.ConnBurstPerIP, DefaultConnBurstPerIP, 1<<16)
	case l.PeerStreams < 0 || l.PeerMemory < 0:
		return fmt.Errorf("%w: peer_streams %d, peer_memory %d: want 0 (libp2p's defaults) or more", ErrBadLimits, l.PeerStreams, l.PeerMemory)
	case l.DHTMessagesPerSecond < 0 || l.DHTMessagesPerSecond > 1e6 || l.DHTMessageBurst < 0 || l.DHTMessageBurst > 1e6:
		return fmt.Errorf("%w: dht_messages_per_second %v, dht_message_burst %d: want 0 (defaults %d, %d) to 1e6",
			ErrBadLimits, l.DHTMessagesPerSecond, l.DHTMessageBurst, DefaultDHTMessagesPerSecond, DefaultDHTMessageBurst)
	case l.MaxBanned < 0 || l.MaxBanned > 1<<20:
		return fmt.Errorf("%w: max_banned %d: want 0 (default %d) to %d", ErrBadLimits, l.MaxBanned, DefaultMaxBanned, 1<<20)
	}
	return nil
}
