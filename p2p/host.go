package p2p

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	dhtpb "github.com/libp2p/go-libp2p-kad-dht/pb"
	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	"github.com/libp2p/go-libp2p/x/rate"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// ProtocolPrefix keeps ringtrain's DHT apart from the public IPFS one.
const ProtocolPrefix = "/ringtrain"

// HostConfig says how to start a peer.
type HostConfig struct {
	// Identity is the peer's key; nil means a fresh one (see
	// LoadOrCreateIdentity for a persistent one).
	Identity crypto.PrivKey
	// Listen are the multiaddrs to listen on; empty means TCP on every
	// interface with a port the OS picks.
	Listen []string
	// SwarmKey, if set, makes a private swarm (libp2p pnet): peers without
	// the same key cannot complete a connection. Private swarms run over
	// TCP only, as libp2p's QUIC refuses them.
	SwarmKey pnet.PSK
	// Allow, if not empty, admits only these peers.
	Allow []peer.ID
	// Bootstrap are peers to connect to and seed the DHT with.
	Bootstrap []peer.AddrInfo
	// Known are peers dialled in the background once the host is up, not
	// waited for, until one answers or KnownFor has passed (join: the
	// peers an identity started with no --bootstrap saw in its last ring —
	// the job's, if it is rejoining one; a finished job's, if it is the
	// first peer of another).
	Known    []peer.AddrInfo
	KnownFor time.Duration
	// Relay makes the host a circuit relay (v2) for other peers once it
	// is publicly reachable (AutoNAT's verdict, or Reachability), with
	// RelayResources' limits.
	Relay bool
	// RelayFor, if set, says which peers may reserve a slot on this relay
	// (a job's peers: those verified as holding the job key). Nil admits
	// every peer that can connect, which in a private swarm means the
	// holders of its key.
	RelayFor func(peer.ID) bool
	// RelayUnlimited, with RelayFor nil, relays every peer that can
	// connect without time or byte limits, as RelayFor's peers are; else
	// such a relay serves strangers under StrangerRelayResources — unless
	// SwarmKey is set, where only its holders connect. Set it only where
	// strangers cannot connect or are welcome to the bandwidth.
	RelayUnlimited bool
	// Reachability overrides AutoNAT: network.ReachabilityPublic for a
	// host known to be reachable (a bootstrap peer on a public address),
	// ReachabilityPrivate for one known not to be; Unknown, the zero
	// value, takes the host for private at once where every address of
	// the machine is private and a bootstrap peer's is public (a NAT is
	// the only way between them), and else lets AutoNAT find out.
	Reachability network.Reachability
	// Registerer, if set, is where libp2p registers its metrics (the
	// swarm's connections and dials, identify, the relay, AutoNAT, hole
	// punching, the resource manager's scopes and blocks), so that the
	// job's /metrics serves them; nil leaves them on Prometheus's default
	// registry, which nothing serves.
	Registerer prometheus.Registerer
	// Logger hears what AutoNAT concludes, the relay addresses the host
	// gets, and how each hole punch ends.
	Logger zerolog.Logger

	// Limits bound what each peer may ask of this one (Guard); zero
	// fields take their defaults.
	Limits Limits

	// gater, for tests, stands in for a NAT.
	gater connmgr.ConnectionGater
}

// Host is a libp2p host with ringtrain's Kademlia DHT.
type Host struct {
	host.Host
	DHT *dht.IpfsDHT
	// Guard enforces the host's Limits on every handler set on Host.
	Guard *Guard

	natLog    event.Subscription // ends watchNAT when closed
	natWG     sync.WaitGroup     // watchNAT and the dial of the Known peers
	stopKnown context.CancelFunc // ends the dial of the Known peers
	punch     *puncher
}

// NewHost starts a host: TCP; TLS preferred over Noise (TLS moves bulk data
// about 1.6× faster here); yamux; libp2p's default autoscaled resource
// limits; AutoNAT, circuit relay v2 (the service with cfg.Relay) and
// AutoRelay for peers behind NAT (natOptions), and DCUtR hole punching
// that can be asked again (DirectConnect, PunchProtocol); a DHT in
// server mode with protocol prefix /ringtrain, connected to any bootstrap
// peers it could reach. ctx bounds the start only. If NewHost fails, nothing it started
// is left running. Close the Host when done.
func NewHost(ctx context.Context, cfg HostConfig) (_ *Host, err error) {
	if len(cfg.Listen) == 0 {
		cfg.Listen = []string{"/ip4/0.0.0.0/tcp/0"}
	}
	if err := cfg.Limits.Check(); err != nil {
		return nil, err
	}
	rm, err := newResourceManager(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Reachability == network.ReachabilityUnknown && behindNATGuess(localIPs(cfg.Listen), cfg.Bootstrap) {
		// AutoNAT would take 15 s or more to find it out.
		cfg.Reachability = network.ReachabilityPrivate
		cfg.Logger.Info().Msg("every address of this machine is private and a bootstrap peer's is public: behind NAT, so reserving a relay at once (--reachability overrides)")
	}
	guard := newGuardFor(cfg.Limits, cfg.Logger)
	var self atomic.Pointer[host.Host] // for the relay source, which may run before New returns
	opts := hostOptions(cfg, guardedRM{ResourceManager: rm, g: guard}, guard, &self)
	h, err := libp2p.New(opts...)
	if err != nil {
		rm.Close()
		return nil, fmt.Errorf("p2p: starting host: %w", err)
	}
	self.Store(&h)
	// Before the bootstrap peers are dialled: their identify tells the
	// puncher the address our NAT gives us.
	punch, err := newPuncher(h, cfg.Logger)
	if err != nil {
		h.Close()
		return nil, err
	}
	defer func() {
		if err != nil {
			punch.Close()
		}
	}()
	guard.cut = func(p peer.ID) { h.Network().ClosePeer(p) }
	guard.warns.byAddress(h)
	// A new variable: self's goroutines read h.
	gh := guardedHost{Host: h, g: guard}
	punch.guard = guard
	gh.SetStreamHandler(PunchProtocol, punch.handleAsk)
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	d, err := newDHT(ctx, gh, guard)
	if err != nil {
		return nil, err
	}
	const notYet = "no bootstrap peer reachable yet: trying again until the join timeout"
	if err := connectBootstrap(ctx, h, cfg.Bootstrap, cfg.Logger, notYet); err != nil {
		d.Close()
		return nil, err
	}
	sub, err := h.EventBus().Subscribe([]any{new(event.EvtLocalReachabilityChanged), new(event.EvtAutoRelayAddrsUpdated)}, eventbus.Name("ringtrain nat log"))
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("p2p: watching reachability: %w", err)
	}
	kctx, stopKnown := context.WithTimeout(context.Background(), cfg.KnownFor)
	out := &Host{Host: gh, DHT: d, Guard: guard, natLog: sub, punch: punch, stopKnown: stopKnown}
	out.natWG.Go(func() { watchNAT(sub, cfg.Logger) })
	if len(cfg.Known) > 0 {
		out.natWG.Go(func() {
			const notYet = "no peer this identity remembers reachable yet: trying again in the background until the join timeout"
			if err := connectBootstrap(kctx, h, cfg.Known, cfg.Logger, notYet); err != nil {
				cfg.Logger.Info().Int("peers", len(cfg.Known)).Msg("none of the peers this identity remembers answered; going on without them")
			}
		})
	}
	return out, nil
}

// newDHT is the host's Kademlia DHT, in server mode under ProtocolPrefix.
func newDHT(ctx context.Context, gh host.Host, guard *Guard) (*dht.IpfsDHT, error) {
	// The DHT lives as long as the host: kad-dht derives its own lifetime
	// from the context New is given, and ctx only bounds the start (a
	// caller's join timeout, say). Close stops it.
	//
	// No routing-table refresh, at start or later: each refresh looks up
	// random keys and so connects to every peer it can find — with 32 peers
	// in one process, 1.8 s and 3.6 CPU-seconds, several times all the rest of a
	// formation. The table fills from the peers this host talks to, which
	// is all a job's rendezvous needs (see Node's discoverLoop), and
	// lookups still walk from whatever it holds.
	//
	// Every message is counted against its peer and address (Guard.Message),
	// the provider records are held in a bounded store, and the routing
	// table is kad-dht's k-buckets (20 peers a bucket).
	d, err := dht.New(context.WithoutCancel(ctx), gh, dht.Mode(dht.ModeServer), dht.ProtocolPrefix(ProtocolPrefix), dht.DisableAutoRefresh(),
		dht.ProviderStore(newProviderStore()),
		dht.OnRequestHook(func(_ context.Context, s network.Stream, _ *dhtpb.Message) { guard.Message(s) }))
	if err != nil {
		return nil, fmt.Errorf("p2p: starting DHT: %w", err)
	}
	return d, nil
}

// newResourceManager is libp2p's resource manager: its autoscaled default
// limits with cfg.Limits' per-peer ones over them, the per-IP limits, and
// its own metrics where cfg.Registerer is set.
func newResourceManager(cfg HostConfig) (network.ResourceManager, error) {
	scaled := rcmgr.DefaultLimits.AutoScale()
	// Zero is the resource manager's "default": the scaled limit stays.
	perPeer := rcmgr.PartialLimitConfig{PeerDefault: rcmgr.ResourceLimits{Streams: rcmgr.LimitVal(cfg.Limits.PeerStreams), Memory: rcmgr.LimitVal64(cfg.Limits.PeerMemory)}}
	rmOpts := perIPLimits(cfg.Limits.WithDefaults())
	if cfg.Registerer != nil {
		// The resource manager's own series: connections, streams, memory
		// and what its limits blocked, by scope.
		rcmgr.MustRegisterWith(cfg.Registerer)
		str, err := rcmgr.NewStatsTraceReporter()
		if err != nil {
			return nil, fmt.Errorf("p2p: resource manager metrics: %w", err)
		}
		rmOpts = append(rmOpts, rcmgr.WithTraceReporter(str))
	}
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(perPeer.Build(scaled)), rmOpts...)
	if err != nil {
		return nil, fmt.Errorf("p2p: resource manager: %w", err)
	}
	return rm, nil
}

// hostOptions are libp2p's options for a host of cfg (see NewHost): its
// transports and security, rm, the connection gaters (guard's, the
// allowlist, a test's), and the NAT traversal, whose relay source reads
// the host from self once it exists.
func hostOptions(cfg HostConfig, rm network.ResourceManager, guard *Guard, self *atomic.Pointer[host.Host]) []libp2p.Option {
	opts := []libp2p.Option{
		libp2p.ListenAddrStrings(cfg.Listen...),
		libp2p.Transport(tcp.NewTCPTransport),
		libp2p.Security(libp2ptls.ID, libp2ptls.New),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		libp2p.ResourceManager(rm),
	}
	if cfg.Identity != nil {
		opts = append(opts, libp2p.Identity(cfg.Identity))
	}
	if cfg.Registerer != nil {
		opts = append(opts, libp2p.PrometheusRegisterer(cfg.Registerer))
	}
	if cfg.SwarmKey != nil {
		opts = append(opts, libp2p.PrivateNetwork(cfg.SwarmKey))
	}
	gs := gaters{guardGater{guard}}
	if len(cfg.Allow) > 0 {
		gs = append(gs, allowList(cfg.Allow))
	}
	if cfg.gater != nil {
		gs = append(gs, cfg.gater)
	}
	opts = append(opts, libp2p.ConnectionGater(gs))
	return append(opts, natOptions(cfg, self, guard)...)
}

// connectBootstrap connects to the bootstrap peers, and while none answers,
// tries them all again — after 250 ms, doubling to 4 s — until one does or
// ctx ends: peers started together, each naming the others, find none of
// them listening yet, and a peer restarted while its bootstrap peer is
// down waits for it, as torchrun's rendezvous waits for its store. notYet
// is logged once, when the first try finds none.
func connectBootstrap(ctx context.Context, h host.Host, boot []peer.AddrInfo, log zerolog.Logger, notYet string) error {
	if len(boot) == 0 {
		return nil
	}
	wait := 250 * time.Millisecond
	for try := 1; ; try++ {
		err := connectAny(ctx, h, boot)
		if err == nil {
			return nil
		}
		if try == 1 {
			log.Info().Int("bootstrap_peers", len(boot)).Msg(notYet)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("p2p: no bootstrap peer reachable in %d tries: %w", try, err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 4*time.Second)
	}
}

// bootstrapGrace is how long the other bootstrap peers have to answer
// once one has: a peer on the same network answers in milliseconds, and
// one whose machine is gone holds its dial until libp2p's dial timeout
// (5 s on a private network, 15 s beyond), which a restarted peer —
// whose remembered peers may include machines long gone — need not wait.
const bootstrapGrace = 500 * time.Millisecond

// connectAny dials every bootstrap peer at once. It returns nil once one
// has connected and the others have connected, failed or had
// bootstrapGrace more (those still dialling are cancelled), and every
// dial's error when none connected.
func connectAny(ctx context.Context, h host.Host, boot []peer.AddrInfo) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(boot))
	connected := make(chan struct{}, len(boot))
	var wg sync.WaitGroup
	for i, b := range boot {
		wg.Go(func() {
			prepareDial(h, b.ID) // a refused dial is not held against the next try
			if err := h.Connect(ctx, b); err != nil {
				errs[i] = fmt.Errorf("bootstrap %s: %w", b.ID, err)
				return
			}
			connected <- struct{}{}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-connected:
		t := time.NewTimer(bootstrapGrace)
		select {
		case <-done:
		case <-t.C:
		}
		t.Stop()
	}
	cancel()
	<-done
	if slices.Contains(errs, nil) {
		return nil
	}
	return errors.Join(errs...)
}

// perIPLimits are the resource manager's per-IP limits (Limits.ConnsPerIP,
// ConnBurstPerIP; libp2p's defaults, which it does not export) with only
// 127.0.0.1 and ::1 exempt, where libp2p exempts all of 127.0.0.0/8: a
// machine's own peers (ringtrain local, the tests) still reach each other
// without limit, and a peer on another loopback address — the flood
// benchmark's hostile one — meets the limits a remote peer would.
func perIPLimits(l Limits) []rcmgr.Option {
	v4, v6 := netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")
	perAddr := rate.Limit{RPS: 0.2, Burst: l.ConnBurstPerIP}
	return []rcmgr.Option{
		rcmgr.WithNetworkPrefixLimit([]rcmgr.NetworkPrefixLimit{{Network: v4, ConnCount: math.MaxInt}}, []rcmgr.NetworkPrefixLimit{{Network: v6, ConnCount: math.MaxInt}}),
		rcmgr.WithLimitPerSubnet([]rcmgr.ConnLimitPerSubnet{{PrefixLength: 32, ConnCount: l.ConnsPerIP}},
			[]rcmgr.ConnLimitPerSubnet{{PrefixLength: 56, ConnCount: l.ConnsPerIP}, {PrefixLength: 48, ConnCount: 8 * l.ConnsPerIP}}),
		rcmgr.WithConnRateLimiters(&rate.Limiter{
			NetworkPrefixLimits: []rate.PrefixLimit{{Prefix: v4}, {Prefix: v6}},
			SubnetRateLimiter: rate.SubnetLimiter{
				IPv4SubnetLimits: []rate.SubnetLimit{{PrefixLength: 32, Limit: perAddr}},
				IPv6SubnetLimits: []rate.SubnetLimit{{PrefixLength: 56, Limit: perAddr}, {PrefixLength: 48, Limit: rate.Limit{RPS: 0.5, Burst: 5 * l.ConnBurstPerIP}}},
				GracePeriod:      time.Minute,
			},
		}),
	}
}

// ErrCloseTimeout means the libp2p host did not stop within CloseTimeout.
var ErrCloseTimeout = errors.New("p2p: host close timed out")

// CloseTimeout bounds Close.
const CloseTimeout = 10 * time.Second

// Close stops the DHT and the host. It returns ErrCloseTimeout, leaving
// libp2p's close to go on in the background, if the host does not stop in
// CloseTimeout: go-libp2p v0.51's Host.Close can wait forever — autonat's
// Close waits for its goroutine, whose unsubscribing waits on an event-bus
// lock held by identify, blocked sending to a subscriber that no longer
// reads (seen in one of two 32-peer formations in one process). A process
// that exits loses nothing by it; a hung one loses the job's exit.
func (h *Host) Close() error {
	done := make(chan error, 1)
	go func() {
		// Unsubscribing takes the event bus's lock too: inside the bound.
		h.natLog.Close()
		h.stopKnown()
		h.natWG.Wait()
		done <- errors.Join(h.punch.Close(), h.DHT.Close(), h.Host.Close())
	}()
	t := time.NewTimer(CloseTimeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("%w: %s still stopping after %v", ErrCloseTimeout, h.ID(), CloseTimeout)
	}
}

// DirectConnect tries for a direct connection to p, a peer reached
// through a relay: at its private address if it is behind our NAT, else
// by a DCUtR hole punch over the relayed connection, started here or
// asked of p (PunchProtocol). It is LinksConfig.Puncher.
func (h *Host) DirectConnect(ctx context.Context, p peer.ID) error {
	return h.punch.DirectConnect(ctx, p)
}

// Addrs returns the host's dialable multiaddrs with its peer ID, the form
// another peer's --bootstrap takes. Unspecified listen addresses are
// expanded to the interfaces' addresses by libp2p.
func (h *Host) FullAddrs() []ma.Multiaddr {
	info := peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()}
	out, _ := peer.AddrInfoToP2pAddrs(&info)
	return out
}

// ParseBootstrap reads /ip4/…/tcp/…/p2p/<id> multiaddrs.
func ParseBootstrap(addrs []string) ([]peer.AddrInfo, error) {
	var out []peer.AddrInfo
	for _, s := range addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("p2p: bootstrap address %q: %w", s, err)
		}
		ai, err := peer.AddrInfoFromP2pAddr(a)
		if err != nil {
			return nil, fmt.Errorf("p2p: bootstrap address %q needs a /p2p/<peer ID> part: %w", s, err)
		}
		out = append(out, *ai)
	}
	return out, nil
}

// ReadSwarmKey reads a libp2p swarm key file (the /key/swarm/psk/1.0.0/
// format that `ringtrain swarm-key` and IPFS's ipfs-swarm-key-gen write).
func ReadSwarmKey(path string) (pnet.PSK, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("p2p: swarm key: %w", err)
	}
	defer f.Close()
	k, err := pnet.DecodeV1PSK(f)
	if err != nil {
		return nil, fmt.Errorf("p2p: swarm key %s: %w", path, err)
	}
	return k, nil
}

// WriteSwarmKey writes a new random swarm key in the format ReadSwarmKey
// (and IPFS's ipfs-swarm-key-gen) uses. Give the same file to every peer.
//
// Where w is a regular file (swarm-key > FILE), it is made readable by its
// owner alone first: the shell creates it as the umask says, 0644 mostly,
// and anyone who reads a swarm key can join the swarm.
func WriteSwarmKey(w io.Writer) error {
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
			if err := f.Chmod(0o600); err != nil {
				return fmt.Errorf("p2p: making the swarm key's file private: %w", err)
			}
		}
	}
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "/key/swarm/psk/1.0.0/\n/base16/\n%s\n", hex.EncodeToString(k))
	return err
}

// allowList admits connections only from the listed peers.
type allowList []peer.ID

var _ connmgr.ConnectionGater = allowList(nil)

func (a allowList) InterceptPeerDial(p peer.ID) bool                 { return slices.Contains(a, p) }
func (a allowList) InterceptAddrDial(p peer.ID, _ ma.Multiaddr) bool { return slices.Contains(a, p) }
func (a allowList) InterceptAccept(network.ConnMultiaddrs) bool      { return true }
func (a allowList) InterceptSecured(_ network.Direction, p peer.ID, _ network.ConnMultiaddrs) bool {
	return slices.Contains(a, p)
}
func (a allowList) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) { return true, 0 }
