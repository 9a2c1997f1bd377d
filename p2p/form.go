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
	// ErrRefused: peers refused this one (another job config or protocol
	// version), so no ring can form with it.
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

// Formation is an agreed ring: its members in rank order.
type Formation struct {
	Members    []peer.ID
	Rank       int
	Generation uint64
}

// NodeConfig tunes a Node. Zero values mean the defaults given.
type NodeConfig struct {
	// Logger receives discovery progress, refusals and the formed ring;
	// the zero value logs nothing.
	Logger zerolog.Logger
	// Interval is the first pause between rounds of hellos; it doubles to
	// a second while nothing new is learned. Default 50 ms.
	Interval time.Duration
	// HelloTimeout bounds one hello exchange with one peer. Default 3 s.
	HelloTimeout time.Duration
	// ReformTimeout bounds one re-formation hello: a member that does not
	// answer within it is taken for gone. Default 2 s.
	ReformTimeout time.Duration
	// MaxPeers bounds how many peers the node remembers — verified,
	// refused or unreachable. Default 64 or four times the world size,
	// whichever is more.
	MaxPeers int
	// Forget is how long a peer that is neither connected nor heard from
	// is remembered. Default one minute.
	Forget time.Duration
}

func (c *NodeConfig) fill(worldSize int) {
	if c.Interval <= 0 {
		c.Interval = 50 * time.Millisecond
	}
	if c.HelloTimeout <= 0 {
		c.HelloTimeout = 3 * time.Second
	}
	if c.ReformTimeout <= 0 {
		c.ReformTimeout = 2 * time.Second
	}
	if c.MaxPeers <= 0 {
		c.MaxPeers = max(64, 4*worldSize)
	}
	if c.Forget <= 0 {
		c.Forget = time.Minute
	}
}

// peerInfo is what a node remembers of one peer.
type peerInfo struct {
	verified bool // proved itself a peer of this job
	refused  bool // refused us, or we it
	seen     time.Time
	// deadUntil: a peer whose hello failed (a stale DHT record of a peer
	// that is gone, mostly) is skipped until then, so that it cannot stall
	// every round for a dial timeout.
	deadUntil time.Time
	deadFor   time.Duration
	sentList  int // the member-list version last sent to it
}

// Node finds the other peers of a job and agrees with them on a ring. It
// answers hellos and keeps advertising until Close. The decisions are an
// Agreement's; Node does the streams, timers and locking around it.
//
// A peer is verified once its hello proves the job (see Hello): only then
// does it hear our members, their addresses and our proposal, and only
// verified peers count for the agreement, may open ring links, or can be
// admitted. What Node remembers of peers is bounded (MaxPeers) and
// forgotten after a while (Forget).
type Node struct {
	h   *Host
	job Job
	key []byte // the job key hello proofs are made with
	cfg NodeConfig
	ns  string // rendezvous key

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{} // something was learned: run a round now

	mu       sync.Mutex
	peers    map[peer.ID]*peerInfo
	list     int        // the member list's version: bumped when it changes
	refusals []error    // why peers refused us, one per peer
	pending  []peer.ID  // vouched for by a verified peer, not yet greeted
	join     *Agreement // the first formation
	reform   *Agreement // the latest re-formation, if any
	current  *Formation // the ring this node is in
	admitted chan *Formation
}

// NewNode registers the hello protocol on h and starts advertising the job
// under a rendezvous key derived from its name.
func NewNode(h *Host, job Job, cfg NodeConfig) (*Node, error) {
	if job.Name == "" || job.WorldSize < 1 || job.ConfigHash == "" {
		return nil, fmt.Errorf("p2p: job %q of world size %d with config hash %q: want a name, a size ≥ 1 and a hash", job.Name, job.WorldSize, job.ConfigHash)
	}
	cfg.fill(job.WorldSize)
	n := &Node{
		h: h, job: job, key: jobKey(job), cfg: cfg,
		ns:       "ringtrain/job/" + job.Name,
		kick:     make(chan struct{}, 1),
		peers:    map[peer.ID]*peerInfo{},
		join:     NewJoinAgreement(h.ID(), job.WorldSize, cfg.MaxPeers),
		admitted: make(chan *Formation, 1),
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
// on one ring, and returns it. It fails with ErrRefused as soon as peers of
// the job refuse this one while none accepts it, with ErrStandby when the
// ring formed without it, and with ErrJoinTimeout when ctx ends first,
// saying how many peers were found and which.
func (n *Node) Join(ctx context.Context) (*Formation, error) {
	// Discovery runs beside the rounds of hellos, so that a slow DHT query
	// never holds a round up.
	dctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Go(func() { n.discoverLoop(dctx) })
	pause := n.cfg.Interval
	for {
		learned := n.exchange(ctx)
		if f, err := n.decideJoin(); f != nil || err != nil {
			if f != nil {
				n.cfg.Logger.Info().Int("rank", f.Rank).Int("world_size", len(f.Members)).Uint64("generation", f.Generation).
					Stringers("members", peerStringers(f.Members)).Msg("ring formed")
			}
			return f, err
		}
		if learned {
			pause = n.cfg.Interval
		}
		if err := n.wait(ctx, pause); err != nil {
			if errors.Is(err, context.Canceled) {
				return nil, fmt.Errorf("p2p: join of job %q: %w", n.job.Name, err)
			}
			return nil, n.timeoutError()
		}
		pause = min(2*pause, time.Second)
	}
}

// wait pauses until d has passed or something was learned.
func (n *Node) wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-n.kick:
	case <-t.C:
	}
	return nil
}

func (n *Node) poke() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

func (n *Node) decideJoin() (*Formation, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	// Refused by peers while none agrees with us: our config is the odd
	// one out. (One refusal alone could be the odd peer refusing us.)
	if n.verifiedLocked() == 0 && len(n.refusals) > 0 && len(n.refusals) >= min(2, n.job.WorldSize-1) {
		return nil, errors.Join(n.refusals...)
	}
	d := n.join.Decide()
	if d.Formed != nil {
		n.current = d.Formed
	}
	return d.Formed, d.Err
}

func (n *Node) verifiedLocked() int {
	k := 0
	for _, pi := range n.peers {
		if pi.verified {
			k++
		}
	}
	return k
}

func (n *Node) timeoutError() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	ids := []string{n.h.ID().String()}
	for p, pi := range n.peers {
		if pi.verified {
			ids = append(ids, p.String())
		}
	}
	slices.Sort(ids)
	err := fmt.Errorf("%w: found %d of %d peers for job %q: %v; want %d (world_size)",
		ErrJoinTimeout, len(ids), n.job.WorldSize, n.job.Name, ids, n.job.WorldSize)
	return errors.Join(append([]error{err}, n.refusals...)...)
}

// discoverLoop asks the DHT who advertises the job, now and then, and
// says hello to the peers it did not know.
func (n *Node) discoverLoop(ctx context.Context) {
	rd := drouting.NewRoutingDiscovery(n.h.DHT)
	pause := n.cfg.Interval
	for {
		if n.discover(ctx, rd) {
			pause = n.cfg.Interval
			n.poke()
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		pause = min(2*pause, time.Second)
	}
}

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
		n.h.Peerstore().AddAddrs(ai.ID, ai.Addrs[:min(len(ai.Addrs), maxMemberAddrs)], peerstore.TempAddrTTL)
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
	pi := n.peers[p]
	return pi != nil && (pi.verified || pi.refused || time.Now().Before(pi.deadUntil))
}

// trackLocked returns what is remembered of p, making room for it if it
// is new: peers not heard from for cfg.Forget (and not in the ring) are
// forgotten first. It returns nil when MaxPeers are remembered still.
func (n *Node) trackLocked(p peer.ID) *peerInfo {
	if pi := n.peers[p]; pi != nil {
		return pi
	}
	if len(n.peers) >= n.cfg.MaxPeers {
		n.forgetLocked()
	}
	if len(n.peers) >= n.cfg.MaxPeers {
		return nil
	}
	pi := &peerInfo{seen: time.Now()}
	n.peers[p] = pi
	return pi
}

// forgetLocked drops the peers neither connected nor heard from for
// cfg.Forget, and not members of the ring.
func (n *Node) forgetLocked() {
	now := time.Now()
	for p, pi := range n.peers {
		if now.Sub(pi.seen) < n.cfg.Forget || n.h.Network().Connectedness(p) == network.Connected ||
			n.current != nil && slices.Contains(n.current.Members, p) {
			continue
		}
		if pi.verified {
			n.list++
		}
		delete(n.peers, p)
		n.join.Forget(p)
	}
}

// unreachable backs off from a peer whose hello failed: 2 s, then doubling
// up to a minute.
func (n *Node) unreachable(p peer.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	pi := n.trackLocked(p)
	if pi == nil {
		return
	}
	d := min(max(2*pi.deadFor, 2*time.Second), time.Minute)
	pi.deadFor = d
	pi.deadUntil = time.Now().Add(d)
}

// exchange says hello to every verified peer and to those vouched for,
// and reports whether anything new was learned.
func (n *Node) exchange(ctx context.Context) bool {
	n.mu.Lock()
	before := n.list
	n.forgetLocked()
	var peers []peer.ID
	now := time.Now()
	for p, pi := range n.peers {
		if pi.verified {
			peers = append(peers, p)
		}
	}
	for _, p := range n.pending {
		pi := n.peers[p]
		if (pi == nil || !pi.verified && !pi.refused && !now.Before(pi.deadUntil)) && !slices.Contains(peers, p) {
			peers = append(peers, p)
		}
	}
	n.pending = nil
	n.mu.Unlock()
	n.helloAll(ctx, peers)
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.list != before
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

// helloTo is the hello this node sends to (or answers) p: a proof for p,
// and — only if p is verified — the member list, when it changed since p
// last had it, and our proposal. It returns the list's version too.
func (n *Node) helloTo(p peer.ID) (*Hello, int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := &Hello{Version: ProtocolVersion, Proof: proof(n.key, n.h.ID(), p)}
	pi := n.peers[p]
	if pi == nil || !pi.verified {
		return h, 0
	}
	if pi.sentList != n.list {
		for q, qi := range n.peers {
			if qi.verified && q != p {
				h.Members = append(h.Members, n.memberLocked(q))
			}
		}
		h.Members = append(h.Members, n.memberLocked(n.h.ID()))
	}
	h.setProposal(n.join.Proposal())
	return h, n.list
}

func (n *Node) memberLocked(p peer.ID) Member {
	m := Member{ID: p.String()}
	addrs := n.h.Addrs()
	if p != n.h.ID() {
		addrs = n.h.Peerstore().Addrs(p)
	}
	for _, a := range addrs[:min(len(addrs), maxMemberAddrs)] {
		m.Addrs = append(m.Addrs, a.String())
	}
	return m
}

// sent records that p has had the member list of version v.
func (n *Node) sent(p peer.ID, v int, h *Hello) {
	if h.Members == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if pi := n.peers[p]; pi != nil {
		pi.sentList = v
	}
}

// learn records a verified peer's hello: the peer, its proposal, and the
// members it vouches for, whose addresses go to the peerstore so that the
// next round dials them. It reports whether anything changed.
func (n *Node) learn(from peer.ID, h *Hello) (changed bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	pi := n.trackLocked(from)
	if pi == nil || !n.join.Verified(from) {
		n.cfg.Logger.Debug().Stringer("peer", from).Msg("too many peers remembered: ignored one")
		return false
	}
	pi.seen = time.Now()
	if !pi.verified {
		pi.verified = true
		n.list++
		pi.sentList = -1
		changed = true
	}
	before, had := n.join.views[from]
	defer func() {
		after, has := n.join.views[from]
		changed = changed || has != had || after.Ready != before.Ready || after.Formed != before.Formed || !slices.Equal(after.Members, before.Members)
	}()
	if m, err := h.proposal(); err != nil {
		n.cfg.Logger.Warn().Stringer("peer", from).Err(err).Msg("ignored a proposal")
	} else if err := n.join.Step(from, m); err != nil {
		n.cfg.Logger.Warn().Err(err).Msg("ignored a proposal")
	}
	for _, m := range h.Members {
		id, err := peer.Decode(m.ID)
		if err != nil || id == n.h.ID() {
			continue
		}
		if qi := n.peers[id]; qi != nil || len(n.pending) >= n.cfg.MaxPeers {
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
		if !slices.Contains(n.pending, id) {
			n.pending = append(n.pending, id)
			changed = true
		}
	}
	return changed
}

// sayHello exchanges hellos with p.
func (n *Node) sayHello(ctx context.Context, p peer.ID) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.HelloTimeout)
	defer cancel()
	s, err := n.h.NewStream(ctx, p, HelloProtocol)
	if err != nil {
		return err
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(n.cfg.HelloTimeout))
	req, v := n.helloTo(p)
	if err := writeHello(s, req); err != nil {
		s.Reset()
		return err
	}
	resp, err := readHello(s)
	if err != nil {
		s.Reset()
		n.cfg.Logger.Warn().Stringer("peer", p).Err(err).Msg("cut off a peer that sent a bad hello")
		return err
	}
	n.sent(p, v, req)
	switch {
	case resp.Version != ProtocolVersion:
		n.refuse(p, fmt.Errorf("%w by %s: it speaks protocol version %d, this peer %d", ErrRefused, p, resp.Version, ProtocolVersion))
	case resp.Refused != "":
		n.refuse(p, fmt.Errorf("%w by %s: %s (this peer: job %q, config hash %.16s…, world size %d; every peer must have the same job config)",
			ErrRefused, p, resp.Refused, n.job.Name, n.job.ConfigHash, n.job.WorldSize))
	case !proves(n.key, resp.Proof, p, n.h.ID()):
		n.refuse(p, fmt.Errorf("%w %s: its answer does not prove job %q with config hash %.16s…", ErrRefused, p, n.job.Name, n.job.ConfigHash))
	default:
		if n.learn(p, resp) {
			n.poke()
		}
	}
	return nil
}

func (n *Node) refuse(p peer.ID, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	pi := n.trackLocked(p)
	if pi == nil || pi.refused {
		return
	}
	n.cfg.Logger.Warn().Err(err).Msg("not forming a ring with a peer")
	pi.refused = true
	if len(n.refusals) < n.job.WorldSize {
		n.refusals = append(n.refusals, err)
	}
}

// refusal is all a peer that does not prove the job is told.
const refusal = "not a peer of this job (another job name, config or protocol version)"

// handleHello answers a hello: with ours if the sender proves the job, with
// a refusal that says nothing of ours if not. A malformed hello cuts the
// stream off.
func (n *Node) handleHello(s network.Stream) {
	defer s.Close()
	s.SetDeadline(time.Now().Add(n.cfg.HelloTimeout))
	from := s.Conn().RemotePeer()
	h, err := readHello(s)
	if err != nil {
		n.cfg.Logger.Warn().Stringer("peer", from).Err(err).Msg("cut off a peer that sent a bad hello")
		s.Reset()
		return
	}
	var resp *Hello
	var v int
	switch {
	case h.Version != ProtocolVersion:
		resp = &Hello{Version: ProtocolVersion, Refused: fmt.Sprintf("protocol version %d; yours is %d", ProtocolVersion, h.Version)}
		n.cfg.Logger.Warn().Stringer("peer", from).Int("its_version", h.Version).Msg("refused a peer of another protocol version")
	case !proves(n.key, h.Proof, from, n.h.ID()):
		resp = &Hello{Version: ProtocolVersion, Refused: refusal}
		n.mu.Lock()
		pi := n.trackLocked(from)
		first := pi != nil && !pi.refused
		if first {
			pi.refused = true
		}
		n.mu.Unlock()
		if first {
			// Only this side's job is known: a stranger's hello names none.
			n.cfg.Logger.Warn().Stringer("peer", from).Str("job", n.job.Name).Str("config_hash", n.job.ConfigHash).
				Msg("refused a peer whose hello does not prove this job: another job name, config or world size")
		}
	default:
		if n.learn(from, h) {
			n.poke()
		}
		resp, v = n.helloTo(from)
	}
	if err := writeHello(s, resp); err != nil {
		s.Reset()
		return
	}
	n.sent(from, v, resp)
}

func peerStringers(ps []peer.ID) []fmt.Stringer {
	out := make([]fmt.Stringer, len(ps))
	for i, p := range ps {
		out[i] = p
	}
	return out
}

// Expects reports whether a ring link of generation gen from peer from is
// one this node waits for: from a member of the ring it is in, or of the
// one it is ready on. RingLinks turns every other link away.
func (n *Node) Expects(gen uint64, from peer.ID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c := n.current; c != nil && c.Generation == gen && slices.Contains(c.Members, from) {
		return true
	}
	for _, a := range []*Agreement{n.join, n.reform} {
		if a != nil && a.Generation() == gen && slices.Contains(a.Ready(), from) {
			return true
		}
	}
	return false
}
