package p2p

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	drouting "github.com/libp2p/go-libp2p/p2p/discovery/routing"
	dutil "github.com/libp2p/go-libp2p/p2p/discovery/util"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/rs/zerolog"
)

// Errors Join returns.
var (
	// ErrJoinTimeout: too few peers were found before the join timeout.
	ErrJoinTimeout = errors.New("p2p: join timed out")
	// ErrRefused: a peer of the same job refused this one (another
	// config or protocol version), so no ring can form with it.
	ErrRefused = errors.New("p2p: refused")
	// ErrStandby: the ring formed without this peer; it waits as a standby.
	ErrStandby = errors.New("p2p: standby")
)

// Job is what peers must agree on to form a ring.
type Job struct {
	Name       string
	ConfigHash string // hex SHA-256 of the canonical job config
	WorldSize  int
}

// view is what a peer last said it proposes.
type view struct {
	prop   []peer.ID
	ready  bool
	formed bool
}

// Formation is an agreed ring: its members in rank order.
type Formation struct {
	Members    []peer.ID
	Rank       int
	Generation uint64
}

// NodeConfig tunes a Node.
type NodeConfig struct {
	// Logger receives discovery progress, refusals and the formed ring;
	// the zero value logs nothing.
	Logger zerolog.Logger
	// Interval is the first pause between discovery rounds; it doubles to
	// a second while nothing new is learned. Zero means 50 ms.
	Interval time.Duration
}

// Node finds the other peers of a job and agrees with them on a ring. It
// answers hellos and keeps advertising until Close.
//
// Agreement is in two phases, because with more peers than world_size the
// views differ while they spread. A peer proposes the world_size smallest
// IDs it has verified. When every member of its proposal proposes the same
// ring, it becomes ready on it and stops changing its proposal. The ring
// forms when every member is ready on it. So rings that form never share a
// peer, and a peer left out sees a ring whose members are all ready without
// it and becomes a standby. A ready peer that sees a member ready on another
// ring gives up its own, which then cannot form, and proposes again.
type Node struct {
	h   *Host
	job Job
	cfg NodeConfig
	ns  string // rendezvous key

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	verified  map[peer.ID]bool // peers of this job that said a matching hello
	views     map[peer.ID]view // the last proposal each verified peer sent
	refusals  []error          // why peers refused us, one per peer
	refusedBy map[peer.ID]bool
	// deadUntil: peers whose hello failed (stale DHT records of peers that
	// are gone, mostly) are skipped until then, so one cannot stall every
	// round for a dial timeout.
	deadUntil map[peer.ID]time.Time
	deadFor   map[peer.ID]time.Duration
	pending   []peer.ID    // vouched for by a verified peer, not yet greeted
	locked    []peer.ID    // the ring we are ready to form, once all members proposed it
	reform    *reformState // the latest re-formation, if any
	admitted  chan *Formation
	formed    bool // Join has returned a ring
}

// NewNode registers the hello protocol on h and starts advertising the job
// under a rendezvous key derived from its name.
func NewNode(h *Host, job Job, cfg NodeConfig) (*Node, error) {
	if job.Name == "" || job.WorldSize < 1 || job.ConfigHash == "" {
		return nil, fmt.Errorf("p2p: job %q of world size %d with config hash %q: want a name, a size ≥ 1 and a hash", job.Name, job.WorldSize, job.ConfigHash)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 50 * time.Millisecond
	}
	n := &Node{
		h: h, job: job, cfg: cfg,
		ns:        "ringtrain/job/" + job.Name,
		verified:  map[peer.ID]bool{h.ID(): true},
		views:     map[peer.ID]view{},
		refusedBy: map[peer.ID]bool{},
		deadUntil: map[peer.ID]time.Time{},
		deadFor:   map[peer.ID]time.Duration{},
		admitted:  make(chan *Formation, 1),
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	h.SetStreamHandler(HelloProtocol, n.handleHello)
	h.SetStreamHandler(ReformProtocol, n.handleReform)
	h.SetStreamHandler(AdmitProtocol, n.handleAdmit)
	rd := drouting.NewRoutingDiscovery(h.DHT)
	n.wg.Go(func() {
		// Advertise retries on its own; a first Provide may fail while
		// the routing table is still empty.
		dutil.Advertise(n.ctx, rd, n.ns)
	})
	return n, nil
}

// Close stops answering hellos and advertising, and waits for both.
func (n *Node) Close() error {
	n.h.RemoveStreamHandler(HelloProtocol)
	n.h.RemoveStreamHandler(ReformProtocol)
	n.h.RemoveStreamHandler(AdmitProtocol)
	n.cancel()
	n.wg.Wait()
	return nil
}

// Join discovers peers and exchanges hellos until world_size of them agree
// on one ring, and returns it. It fails with ErrRefused as soon as a peer of
// the job refuses this one, and with ErrJoinTimeout when ctx ends first,
// saying how many peers were found and which.
func (n *Node) Join(ctx context.Context) (*Formation, error) {
	rd := drouting.NewRoutingDiscovery(n.h.DHT)
	pause := n.cfg.Interval
	for {
		learned := n.discover(ctx, rd)
		learned = n.exchange(ctx) || learned
		if f, err := n.agreed(); f != nil || err != nil {
			if f != nil {
				n.cfg.Logger.Info().Int("rank", f.Rank).Int("world_size", len(f.Members)).Uint64("generation", f.Generation).
					Stringers("members", peerStringers(f.Members)).Msg("ring formed")
			}
			return f, err
		}
		if learned {
			pause = n.cfg.Interval
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil, fmt.Errorf("p2p: join of job %q: %w", n.job.Name, ctx.Err())
			}
			return nil, n.timeoutError()
		case <-t.C:
		}
		pause = min(2*pause, time.Second)
	}
}

func (n *Node) timeoutError() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var ids []string
	for id := range n.verified {
		ids = append(ids, id.String())
	}
	slices.Sort(ids)
	err := fmt.Errorf("%w: found %d of %d peers for job %q: %v; want %d (world_size)",
		ErrJoinTimeout, len(ids), n.job.WorldSize, n.job.Name, ids, n.job.WorldSize)
	return errors.Join(append([]error{err}, n.refusals...)...)
}

// discover asks the DHT who advertises the job and says hello to the peers
// it did not know.
func (n *Node) discover(ctx context.Context, rd *drouting.RoutingDiscovery) bool {
	fctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ch, err := rd.FindPeers(fctx, n.ns)
	if err != nil {
		return false
	}
	var fresh []peer.AddrInfo
	for ai := range ch {
		if ai.ID == n.h.ID() || len(ai.Addrs) == 0 || n.isKnown(ai.ID) {
			continue
		}
		fresh = append(fresh, ai)
	}
	for _, ai := range fresh {
		n.h.Peerstore().AddAddrs(ai.ID, ai.Addrs, peerstore.TempAddrTTL)
	}
	n.helloAll(ctx, ids(fresh))
	return len(fresh) > 0
}

func ids(ais []peer.AddrInfo) []peer.ID {
	out := make([]peer.ID, len(ais))
	for i, ai := range ais {
		out[i] = ai.ID
	}
	return out
}

// isKnown: verified, refused, or recently unreachable — either way,
// discovery has nothing to add.
func (n *Node) isKnown(p peer.ID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.verified[p] || n.refusedBy[p] || time.Now().Before(n.deadUntil[p])
}

// unreachable backs off from a peer whose hello failed: 2 s, then doubling
// up to a minute.
func (n *Node) unreachable(p peer.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	d := min(max(2*n.deadFor[p], 2*time.Second), time.Minute)
	n.deadFor[p] = d
	n.deadUntil[p] = time.Now().Add(d)
}

// exchange says hello to every verified peer, carrying our proposal, and
// reports whether anything new was learned.
func (n *Node) exchange(ctx context.Context) bool {
	n.mu.Lock()
	before := len(n.verified)
	var peers []peer.ID
	for p := range n.verified {
		if p != n.h.ID() {
			peers = append(peers, p)
		}
	}
	for _, p := range n.pending {
		if !n.verified[p] && !n.refusedBy[p] && !time.Now().Before(n.deadUntil[p]) && !slices.Contains(peers, p) {
			peers = append(peers, p)
		}
	}
	n.pending = nil
	n.mu.Unlock()
	n.helloAll(ctx, peers)
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.verified) > before
}

func (n *Node) helloAll(ctx context.Context, peers []peer.ID) {
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Go(func() {
			if err := n.sayHello(ctx, p); err != nil {
				n.cfg.Logger.Debug().Stringer("peer", p).Err(err).Msg("hello failed")
				if ctx.Err() == nil {
					n.unreachable(p)
				}
			}
		})
	}
	wg.Wait()
}

// ourHello is the hello this node sends and answers with.
func (n *Node) ourHello() *Hello {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := &Hello{Version: ProtocolVersion, Job: n.job.Name, ConfigHash: n.job.ConfigHash, WorldSize: n.job.WorldSize, Generation: 1}
	for p := range n.verified {
		m := Member{ID: p.String()}
		addrs := n.h.Addrs()
		if p != n.h.ID() {
			addrs = n.h.Peerstore().Addrs(p)
		}
		for _, a := range addrs {
			m.Addrs = append(m.Addrs, a.String())
		}
		h.Members = append(h.Members, m)
	}
	for _, p := range n.proposalLocked() {
		h.Proposal = append(h.Proposal, p.String())
	}
	h.Ready = n.locked != nil
	h.Formed = n.formed
	return h
}

// proposalLocked is the ring this node proposes: the one it is ready on,
// else the world_size smallest peer IDs it has verified. n.mu held.
func (n *Node) proposalLocked() []peer.ID {
	if n.locked != nil {
		return n.locked
	}
	if len(n.verified) < n.job.WorldSize {
		return nil
	}
	all := make([]peer.ID, 0, len(n.verified))
	for p := range n.verified {
		all = append(all, p)
	}
	slices.Sort(all)
	return all[:n.job.WorldSize]
}

// check says why a hello cannot come from a peer of this ring, or nil.
func (n *Node) check(h *Hello) string {
	switch {
	case h.Job != n.job.Name:
		return fmt.Sprintf("job %q, ours is %q", h.Job, n.job.Name)
	case h.Version != ProtocolVersion:
		return fmt.Sprintf("protocol version %d, ours is %d", h.Version, ProtocolVersion)
	case h.ConfigHash != n.job.ConfigHash || h.WorldSize != n.job.WorldSize:
		return fmt.Sprintf("job config hash %s (world size %d), ours is %s (world size %d)", h.ConfigHash, h.WorldSize, n.job.ConfigHash, n.job.WorldSize)
	}
	return ""
}

// learn records a verified peer's hello: the peer, its proposal, and the
// members it vouches for, whose addresses go to the peerstore so the next
// round dials them.
func (n *Node) learn(from peer.ID, h *Hello) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.verified[from] = true
	var prop []peer.ID
	for _, s := range h.Proposal {
		id, err := peer.Decode(s)
		if err != nil {
			return
		}
		prop = append(prop, id)
	}
	n.views[from] = view{prop: prop, ready: h.Ready, formed: h.Formed}
	for _, m := range h.Members {
		id, err := peer.Decode(m.ID)
		if err != nil || id == n.h.ID() || n.verified[id] {
			continue
		}
		var addrs []ma.Multiaddr
		for _, s := range m.Addrs {
			if a, err := ma.NewMultiaddr(s); err == nil {
				addrs = append(addrs, a)
			}
		}
		n.h.Peerstore().AddAddrs(id, addrs, peerstore.TempAddrTTL)
		// Vouched for by a verified peer: say hello next round.
		n.pending = append(n.pending, id)
	}
}

// sayHello exchanges hellos with p.
func (n *Node) sayHello(ctx context.Context, p peer.ID) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	s, err := n.h.NewStream(ctx, p, HelloProtocol)
	if err != nil {
		return err
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(3 * time.Second))
	if err := writeHello(s, n.ourHello()); err != nil {
		s.Reset()
		return err
	}
	resp, err := readHello(s)
	if err != nil {
		s.Reset()
		n.cfg.Logger.Warn().Stringer("peer", p).Err(err).Msg("cut off a peer that sent a bad hello")
		return err
	}
	if resp.Refused != "" {
		n.refuse(p, fmt.Errorf("%w by %s: it has %s", ErrRefused, p, resp.Refused))
		return nil
	}
	if why := n.check(resp); why != "" {
		n.refuse(p, fmt.Errorf("%w %s: it answered with %s", ErrRefused, p, why))
		return nil
	}
	n.learn(p, resp)
	return nil
}

func (n *Node) refuse(p peer.ID, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.refusedBy[p] {
		return
	}
	n.cfg.Logger.Warn().Err(err).Msg("not forming a ring with a peer")
	n.refusedBy[p] = true
	n.refusals = append(n.refusals, err)
}

// handleHello answers a hello: with ours if the sender belongs to this
// job's ring, with a refusal saying why if not. A malformed hello cuts the
// stream off.
func (n *Node) handleHello(s network.Stream) {
	defer s.Close()
	s.SetDeadline(time.Now().Add(5 * time.Second))
	from := s.Conn().RemotePeer()
	h, err := readHello(s)
	if err != nil {
		n.cfg.Logger.Warn().Stringer("peer", from).Err(err).Msg("cut off a peer that sent a bad hello")
		s.Reset()
		return
	}
	resp := n.ourHello()
	if why := n.check(h); why != "" {
		resp = &Hello{Version: ProtocolVersion, Job: n.job.Name, ConfigHash: n.job.ConfigHash, WorldSize: n.job.WorldSize,
			Refused: fmt.Sprintf("job config hash %s (world size %d), yours is %s", n.job.ConfigHash, n.job.WorldSize, h.ConfigHash)}
		if h.Job != n.job.Name || h.Version != ProtocolVersion {
			resp.Refused = fmt.Sprintf("job %q, protocol version %d; yours is job %q, version %d", n.job.Name, ProtocolVersion, h.Job, h.Version)
		}
		n.cfg.Logger.Warn().Stringer("peer", from).Str("reason", why).Msg("refused a peer")
	} else {
		n.learn(from, h)
	}
	if err := writeHello(s, resp); err != nil {
		s.Reset()
	}
}

// agreed returns the formation once every member of the ring this node is
// ready on is ready on it too; ErrRefused when this node's config is the
// odd one out; ErrStandby once a ring has formed without it.
func (n *Node) agreed() (*Formation, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	// Refused by peers while none agrees with us: our config is the odd
	// one out. (One refusal alone could be the odd peer refusing us.)
	if len(n.verified) == 1 && len(n.refusals) > 0 && len(n.refusals) >= min(2, n.job.WorldSize-1) {
		return nil, errors.Join(n.refusals...)
	}
	self := n.h.ID()
	if n.locked == nil {
		// Ready on our own proposal once all its members propose it, or
		// on one the others are all ready on already.
		candidates := [][]peer.ID{n.proposalLocked()}
		for _, v := range n.views {
			candidates = append(candidates, v.prop)
		}
		for i, prop := range candidates {
			if len(prop) == n.job.WorldSize && slices.Contains(prop, self) && n.allOthers(prop, i > 0) {
				n.locked = prop
				break
			}
		}
	}
	if n.locked != nil {
		for _, p := range n.locked {
			if v := n.views[p]; p != self && v.ready && !slices.Equal(v.prop, n.locked) {
				n.locked = nil // a member is ready on another ring: ours cannot form
				return nil, nil
			}
		}
		if n.allOthers(n.locked, true) {
			f := n.locked
			n.formed = true
			return &Formation{Members: f, Rank: slices.Index(f, self), Generation: 1}, nil
		}
	}
	for _, v := range n.views {
		if v.formed && !slices.Contains(v.prop, self) {
			// A ring is training without us (perhaps smaller than it
			// began, having lost members): wait to be admitted.
			return nil, fmt.Errorf("%w: job %q is training in a ring without this peer", ErrStandby, n.job.Name)
		}
	}
	for _, v := range n.views {
		if len(v.prop) == n.job.WorldSize && !slices.Contains(v.prop, self) && n.allOthers(v.prop, true) {
			return nil, fmt.Errorf("%w: job %q formed its ring of %d without this peer", ErrStandby, n.job.Name, len(v.prop))
		}
	}
	return nil, nil
}

// allOthers reports whether every member of prop other than this node
// proposes prop — and, with ready, is ready on it.
func (n *Node) allOthers(prop []peer.ID, ready bool) bool {
	for _, p := range prop {
		if p == n.h.ID() {
			continue
		}
		v, ok := n.views[p]
		if !ok || !slices.Equal(v.prop, prop) || ready && !v.ready {
			return false
		}
	}
	return true
}

func peerStringers(ps []peer.ID) []fmt.Stringer {
	out := make([]fmt.Stringer, len(ps))
	for i, p := range ps {
		out[i] = p
	}
	return out
}
