package p2p

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	drouting "github.com/libp2p/go-libp2p/p2p/discovery/routing"
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
	// MaxWorldSize is how large a ring admissions may grow it to; zero
	// means WorldSize.
	MaxWorldSize int
	// MinWorldSize is the smallest ring the job trains on: a claim that a
	// smaller ring trains without this peer is a lie. Zero means one. It
	// is not part of the job's proof (ConfigHash covers it).
	MinWorldSize int
}

// maxSize is how many members a ring of the job may have.
func (j Job) maxSize() int { return max(j.MaxWorldSize, j.WorldSize) }

// Formation is an agreed ring: its members in rank order — by peer ID as
// Node agrees it, in the measured order once Membership.Ordered has
// ranked them.
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
	// Refresh is how often a verified peer is greeted while nothing we
	// would tell it has changed. Default 1 s. Changes are pushed at once:
	// greeting every peer every round made formation quadratic in hellos.
	Refresh time.Duration
	// Stall is how long a first formation may learn nothing new before
	// this node greets the members it knows only from statements passed
	// on (see Statement) directly — a relaying peer may have died or may
	// be holding statements back. Default 2 s.
	Stall time.Duration
	// ClaimTimeout is how long a standby waits while no member of the
	// ring it waits for can be reached before it takes the claim that
	// the ring trains for a lie and forms again. Default 10 s.
	ClaimTimeout time.Duration
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
	if c.Refresh <= 0 {
		c.Refresh = time.Second
	}
	if c.Stall <= 0 {
		c.Stall = 2 * time.Second
	}
	if c.ClaimTimeout <= 0 {
		c.ClaimTimeout = 10 * time.Second
	}
}

// peerInfo is what a node remembers of one peer.
type peerInfo struct {
	verified bool // proved itself a peer of this job
	// relayed: verified only through its statements, passed on by
	// others; not greeted directly unless the formation stalls.
	relayed bool
	refused bool // refused us
	strange bool // its hello did not prove the job (logged once)
	// lied: it proposed, itself, what no honest peer could (ErrBadProposal):
	// it proves the job, but is no longer exempt from the guard's limits,
	// relayed or admitted.
	lied bool
	seen time.Time
	// deadUntil: a peer whose hello failed (a stale DHT record of a peer
	// that is gone, mostly; a member that died) is skipped until then, so
	// that it cannot stall every round for a dial timeout — nor, where the
	// dial fails at once, be greeted in a busy loop: each failed hello
	// wakes the next round, which would greet it again (a member killed
	// while its ring passed a standby's statement on was greeted 10,000
	// times a second by two peers, whose own dials then failed with "rate
	// limit exceeded": testdata/netns-nat.sh ended in a timed-out admission).
	deadUntil time.Time
	deadFor   time.Duration
	// toldProp is the version of our proposal it last had, and toldAt
	// when it last heard from us; knows, the peers it knows of (it told us
	// of them, or we it). A round greets it when our proposal changed,
	// when we know members it does not (at most every Interval), or when
	// Refresh has passed.
	toldProp int
	toldAt   time.Time
	knows    map[peer.ID]bool
	heard    uint64 // the highest Seq of its proposals this node took
	// incarnation is the Incarnation of its hellos: a new one is a new
	// process of the same peer.
	incarnation uint64
	// waiting: its latest hello said it is joining (Hello.Waiting); cleared
	// when it is seen gone, so that a restarted process is a standby only
	// once it says so itself. toldWaiting: it has had a hello of ours
	// saying this node waits, since it last started.
	waiting, toldWaiting bool
	// waitSeq is the Seq of the hello waiting was taken from. Hellos
	// cross: an answer written before the peer began to join can be read
	// after its own hello saying it waits, and that peer, having said so,
	// does not say it again. A peer stops waiting only by forming a ring,
	// which changes its proposal and so its Seq; at one Seq, waiting wins.
	waitSeq uint64
	// hasStmt: the Seq of each member's statement it has (we told it, or
	// it told us).
	hasStmt map[peer.ID]uint64
}

// told is what a hello told a verified peer: our proposal's version, the
// members it did not know of, and the statements it lacked.
type told struct {
	prop    int
	members []peer.ID
	stmts   map[peer.ID]uint64
	waiting bool // the hello said this node is joining
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
	h     *Host
	job   Job
	key   []byte // the job key hello proofs and statements are made with
	priv  crypto.PrivKey
	cfg   NodeConfig
	warns *warnLimiter // warnings about what other peers did
	ns    string       // rendezvous key
	// untrust ends the host guard's exemption of this job's members.
	untrust func()
	names   idNames

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{} // something was learned: run a round now (Join, Reform)
	// relay is kick for passOn, which runs beside a Reform: on one channel
	// it took the pokes a re-formation waited for, and each round of the
	// re-formation waited out its Interval (SIGKILL to first step 84 →
	// 181 ms in bench-elastic).
	relay chan struct{}

	mu          sync.Mutex
	passing     bool   // passOn runs
	incarnation uint64 // this process's Hello.Incarnation: random, so it tells nothing
	waiting     bool   // from Join until a ring with this node forms (Hello.Waiting)
	peers       map[peer.ID]*peerInfo
	propVer     int                 // our proposal's version: bumped when it changes
	seq0        uint64              // Seq of version 0: when the node started, so a restarted peer's Seqs rise still
	nearby      []peer.ID           // connected peers that speak the hello protocol, not yet greeted
	busy        map[peer.ID]bool    // a hello to it is under way
	lastProp    Proposal            // the proposal of version propVer
	stmts       map[peer.ID]*signed // the newest statement of each verified peer, ours included
	learnt      time.Time           // when the first formation last learned something
	dhtOn       chan struct{}       // closed once the DHT is used (see discoverLoop)
	dhtOnce     sync.Once
	refusals    []error    // why peers refused us, one per peer
	pending     []peer.ID  // vouched for by a verified peer, not yet greeted
	join        *Agreement // the first formation
	reform      *Agreement // the latest re-formation, if any
	current     *Formation // the ring this node is in
	admitted    chan *Formation
	ended       chan peer.ID // a member said the job has ended (handleEnded)
}

// NewNode registers the hello protocol on h and starts advertising the job
// under a rendezvous key derived from its name.
func NewNode(h *Host, job Job, cfg NodeConfig) (*Node, error) {
	if job.Name == "" || job.WorldSize < 1 || job.ConfigHash == "" {
		return nil, fmt.Errorf("p2p: job %q of world size %d with config hash %q: want a name, a size ≥ 1 and a hash", job.Name, job.WorldSize, job.ConfigHash)
	}
	cfg.fill(job.maxSize())
	priv := h.Peerstore().PrivKey(h.ID())
	if priv == nil {
		return nil, fmt.Errorf("p2p: the host's private key is not in its peerstore: statements cannot be signed")
	}
	n := &Node{
		h: h, job: job, key: jobKey(job), cfg: cfg, priv: priv, stmts: map[peer.ID]*signed{}, learnt: time.Now(), dhtOn: make(chan struct{}),
		warns:       newWarnLimiter(cfg.Logger).byAddress(h),
		ns:          "ringtrain/job/" + job.Name,
		kick:        make(chan struct{}, 1),
		relay:       make(chan struct{}, 1),
		peers:       map[peer.ID]*peerInfo{},
		busy:        map[peer.ID]bool{},
		join:        NewJoinAgreement(h.ID(), job, cfg.MaxPeers),
		admitted:    make(chan *Formation, 1),
		ended:       make(chan peer.ID, 1),
		seq0:        uint64(time.Now().UnixNano()),
		incarnation: rand.Uint64() | 1, // never 0, which says nothing
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.mu.Lock()
	n.propVersionLocked() // signs our first statement
	n.mu.Unlock()
	n.untrust = h.Guard.Trust(n.Verified)
	h.SetStreamHandler(HelloProtocol, n.handleHello)
	h.SetStreamHandler(ReformProtocol, n.handleReform)
	h.SetStreamHandler(AdmitProtocol, n.handleAdmit)
	h.SetStreamHandler(EndedProtocol, n.handleEnded)
	sub, err := h.EventBus().Subscribe([]any{new(event.EvtPeerIdentificationCompleted), new(event.EvtPeerProtocolsUpdated)})
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("p2p: watching for peers: %w", err)
	}
	n.wg.Go(func() { n.watch(sub) })
	n.wg.Go(func() {
		select {
		case <-n.dhtOn:
		case <-n.ctx.Done():
			return
		}
		advertise(n.ctx, drouting.NewRoutingDiscovery(h.DHT), n.ns, n.cfg.Interval)
	})
	return n, nil
}

// advertise keeps ns advertised in the DHT until ctx ends: again at 7/8 of
// each advertisement's lifetime, and after a failure, first soon and then
// less often. libp2p's discovery/util.Advertise waits 2 minutes after a
// failure, and the first one fails whenever it comes before the routing
// table holds a peer — always, straight after NewHost, since the DHT adds
// the bootstrap peer only once identify has run: two peers of a new job
// behind NAT then found nobody to meet for 2 minutes, past their join
// timeout (testdata/netns-nat.sh's TCP-plane part, in 2 of 29 runs).
func advertise(ctx context.Context, rd *drouting.RoutingDiscovery, ns string, first time.Duration) {
	pause := first
	for {
		wait := pause
		if ttl, err := rd.Advertise(ctx, ns); err == nil {
			wait, pause = 7*ttl/8, first
		} else {
			pause = min(2*pause, 10*time.Second)
		}
		if sleepCtx(ctx, wait) != nil {
			return
		}
	}
}

// watch notes the connected peers that speak the hello protocol — the DHT
// connects peers long before a rendezvous query finds them — so that the
// next round greets them.
func (n *Node) watch(sub event.Subscription) {
	defer sub.Close()
	for _, p := range n.h.Network().Peers() {
		if ok, _ := n.h.Peerstore().SupportsProtocols(p, HelloProtocol); len(ok) > 0 {
			n.near(p)
		}
	}
	for {
		select {
		case <-n.ctx.Done():
			return
		case e, ok := <-sub.Out():
			if !ok {
				return
			}
			switch e := e.(type) {
			case event.EvtPeerIdentificationCompleted:
				if slices.Contains(e.Protocols, HelloProtocol) {
					n.near(e.Peer)
				}
			case event.EvtPeerProtocolsUpdated:
				if slices.Contains(e.Added, HelloProtocol) {
					n.near(e.Peer)
				}
			}
		}
	}
}

func (n *Node) near(p peer.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p == n.h.ID() || n.peers[p] != nil || len(n.nearby) >= n.cfg.MaxPeers || slices.Contains(n.nearby, p) {
		return
	}
	n.nearby = append(n.nearby, p)
	n.poke()
}

// Verified says whether p has proved, by a hello or a statement signed
// under the job key, that it is a peer of this job: the peers a ringtrain
// relay grants reservations (HostConfig.RelayFor).
func (n *Node) Verified(p peer.ID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	pi := n.peers[p]
	return pi != nil && pi.verified && !pi.lied
}

// Close stops answering hellos and advertising, and waits for both.
func (n *Node) Close() {
	n.h.RemoveStreamHandler(HelloProtocol)
	n.h.RemoveStreamHandler(ReformProtocol)
	n.h.RemoveStreamHandler(AdmitProtocol)
	n.h.RemoveStreamHandler(EndedProtocol)
	n.untrust()
	n.mu.Lock()
	n.cancel() // under n.mu: exchange starts no hello once it is done
	n.mu.Unlock()
	n.wg.Wait()
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
	n.mu.Lock()
	n.waiting = true
	n.mu.Unlock()
	first, start := n.connectedPeers(), time.Now()
	pause := n.cfg.Interval
	for {
		n.exchange()
		// A peer this one was started next to (its bootstrap) may be a
		// member of the job's ring already: its answer says so, and this
		// peer then waits to be admitted. Deciding first, a job of world
		// size 1 would form a second ring of this peer alone.
		if !n.greeting(first, start) {
			if f, err := n.decideJoin(); f != nil || err != nil {
				n.formed(f)
				return f, err
			}
		}
		if len(n.admitted) > 0 {
			// A member admitted this peer while it was still joining: the
			// members wait for it now (for the re-formation hello's time).
			return nil, fmt.Errorf("%w: admitted to the job's ring under way", ErrStandby)
		}
		kicked, err := n.wait(ctx, pause)
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return nil, fmt.Errorf("p2p: join of job %q: %w", n.job.Name, err)
			}
			return nil, n.timeoutError()
		}
		if kicked {
			pause = n.cfg.Interval
		} else {
			pause = min(2*pause, time.Second)
		}
	}
}

// formed logs a first ring formed (f; nil: none) and keeps its members.
func (n *Node) formed(f *Formation) {
	if f == nil {
		return
	}
	n.cfg.Logger.Info().Int("rank", f.Rank).Int("world_size", len(f.Members)).Uint64("generation", f.Generation).
		Stringers("members", peerStringers(f.Members)).Msg("ring formed")
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ctx.Err() == nil {
		n.keepMembersLocked(f.Members)
		n.passOnLocked()
		n.useDHT() // so that peers who come later find the job
	}
}

// connectedPeers are the peers connected now — the bootstrap peers,
// which NewHost connected — noted so that this round greets them. Their
// protocols are not asked: identify may not have told them yet, and a
// hello to a peer that does not speak it fails at once.
func (n *Node) connectedPeers() []peer.ID {
	out := n.h.Network().Peers()
	for _, p := range out {
		n.near(p)
	}
	return out
}

// greeting says whether a hello to one of first, the peers connected
// when Join began, is still under way, for at most one hello's timeout
// from start.
func (n *Node) greeting(first []peer.ID, start time.Time) bool {
	if len(first) == 0 || time.Since(start) >= n.cfg.HelloTimeout {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.ContainsFunc(first, func(p peer.ID) bool { return n.busy[p] })
}

// passOn goes on passing statements to the peers that lack them once this
// node's ring has formed: the others may still wait for the statements
// only this node holds (in a star, the hub forms first). It ends at Close,
// or once nobody has lacked anything for Stall.
func (n *Node) passOn() {
	idle := time.Now()
	for {
		if n.exchangeNews() {
			idle = time.Now()
		} else if time.Since(idle) >= n.cfg.Stall {
			// Ends under the lock, so that news that comes meanwhile
			// either is seen here or starts passOn again (passOnLocked).
			n.mu.Lock()
			lacking := n.exchangeNewsLocked()
			if !lacking {
				n.passing = false
			}
			n.mu.Unlock()
			if !lacking {
				return
			}
			idle = time.Now()
		}
		if _, err := n.waitOn(n.ctx, n.relay, n.cfg.Interval); err != nil {
			return
		}
	}
}

// passOnLocked starts passOn unless it runs. n.mu held.
func (n *Node) passOnLocked() {
	if n.passing || n.ctx.Err() != nil {
		return
	}
	n.passing = true
	n.wg.Go(n.passOn)
}

// exchangeNews greets the verified peers we talk to that lack members or
// statements we hold, and reports whether any did (a hello under way
// counts). n.mu not held.
func (n *Node) exchangeNews() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.exchangeNewsLocked()
}

func (n *Node) exchangeNewsLocked() bool {
	if n.ctx.Err() != nil {
		return false
	}
	lacking := len(n.busy) > 0
	now := time.Now()
	for p, pi := range n.peers {
		if pi.verified && !pi.relayed && (len(n.newsLocked(p, pi)) > 0 || len(n.stmtNewsLocked(p, pi)) > 0) {
			// One whose hello failed lately still lacks it, so that this
			// goes on until it can be told; it is greeted once its pause
			// is over.
			lacking = true
			if !now.Before(pi.deadUntil) {
				n.greetLocked(p, true)
			}
		}
	}
	return lacking
}

// keepMembersLocked keeps the ring members' addresses as long as a job may
// run: re-formation dials every member, and addresses learned from hellos
// expire after minutes, connections over a star being few. n.mu held.
func (n *Node) keepMembersLocked(members []peer.ID) {
	for _, p := range members {
		if p != n.h.ID() {
			n.h.Peerstore().AddAddrs(p, n.h.Peerstore().Addrs(p), memberAddrTTL)
		}
	}
}

// memberAddrTTL is how long a ring member's address is kept.
const memberAddrTTL = 7 * 24 * time.Hour

// wait pauses until d has passed or something was learned, and says which.
func (n *Node) wait(ctx context.Context, d time.Duration) (kicked bool, err error) {
	return n.waitOn(ctx, n.kick, d)
}

func (n *Node) waitOn(ctx context.Context, kick <-chan struct{}, d time.Duration) (kicked bool, err error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case <-kick:
		return true, nil
	case <-t.C:
		return false, nil
	}
}

// sleepCtx pauses for d, or less if ctx ends first (its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// poke wakes the loops that wait for news.
func (n *Node) poke() {
	for _, c := range []chan struct{}{n.kick, n.relay} {
		select {
		case c <- struct{}{}:
		default:
		}
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
	before := n.propVersionLocked()
	d := n.join.Decide()
	if d.Formed != nil {
		n.current, n.waiting = d.Formed, false
	}
	if n.propVersionLocked() != before {
		n.poke() // ready now, or formed: tell the others at once
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
//
// The DHT is used only while this node has no verified peer and no hello
// under way (its bootstrap peers are not of the job), or once the formation has learned nothing for
// Stall: a member of the job, once reached, passes on every member it
// knows, and each rendezvous query and advertisement costs connections to
// the peers nearest the key — with 32 peers, about 430 connections against
// the star's 31. So peers that bootstrap from members of the job never touch the DHT before
// their ring forms (then they advertise, for those who come later); peers
// whose bootstrap peers are strangers to the job find it through the DHT
// at once; and two groups that met different members find each other a
// Stall later.
func (n *Node) discoverLoop(ctx context.Context) {
	rd := drouting.NewRoutingDiscovery(n.h.DHT)
	pause := n.cfg.Interval
	for {
		if !n.needDHT() {
			pause = n.cfg.Interval
		} else if n.discover(ctx, rd) {
			pause = n.cfg.Interval
			n.poke()
		}
		if sleepCtx(ctx, pause) != nil {
			return
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
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ai := range fresh {
		if len(n.pending) >= n.cfg.MaxPeers || slices.Contains(n.pending, ai.ID) {
			continue
		}
		n.h.Peerstore().AddAddrs(ai.ID, ai.Addrs[:min(len(ai.Addrs), maxMemberAddrs)], peerstore.TempAddrTTL)
		n.pending = append(n.pending, ai.ID)
	}
	return len(fresh) > 0
}

// needDHT reports whether rendezvous through the DHT is needed (see
// discoverLoop), and once it is, starts advertising; from then on it stays
// needed.
func (n *Node) needDHT() bool {
	select {
	case <-n.dhtOn:
		return true
	default:
	}
	n.mu.Lock()
	alone := n.verifiedLocked() == 0 && len(n.busy) == 0 && len(n.nearby) == 0 && len(n.pending) == 0
	need := alone || time.Since(n.learnt) >= n.cfg.Stall
	n.mu.Unlock()
	if need {
		n.useDHT()
	}
	return need
}

// useDHT starts advertising the job in the DHT, once.
func (n *Node) useDHT() { n.dhtOnce.Do(func() { close(n.dhtOn) }) }

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
		delete(n.peers, p)
		delete(n.stmts, p)
		for _, qi := range n.peers {
			delete(qi.knows, p) // if it comes back, it is news again
			delete(qi.hasStmt, p)
		}
		n.join.Forget(p)
	}
}

// rebornLocked forgets what a peer's last process was told and what the
// others were told of it: the same identity, started again, knows no
// member's address, and the members that knew it as one of theirs must
// hear of it again — as a newcomer, to admit it. n.mu held.
func (n *Node) rebornLocked(p peer.ID, pi *peerInfo) {
	clear(pi.knows)
	clear(pi.hasStmt)
	pi.toldProp, pi.toldAt, pi.heard, pi.toldWaiting, pi.waiting, pi.waitSeq = 0, time.Time{}, 0, false, false, 0
	for _, qi := range n.peers {
		delete(qi.knows, p)
		delete(qi.hasStmt, p)
	}
	n.cfg.Logger.Info().Stringer("peer", p).Msg("a peer started again with the same identity: it is news to the others")
	if n.current != nil {
		// Formed: passOn may have ended, and only it tells the others.
		n.passOnLocked()
		select {
		case n.relay <- struct{}{}:
		default:
		}
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
	if n.h.Network().Connectedness(p) != network.Connected {
		n.join.Unreachable(p)
	}
}

// exchange starts a hello to every verified peer with something new to be
// told (or not greeted for Refresh), to those vouched for or advertising
// the job, and to connected peers that speak the hello protocol. It does
// not wait for them: each answer is learned as it comes, and pokes the
// next round, so one slow peer holds nobody's decision up. At most one
// hello per peer is under way.
func (n *Node) exchange() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ctx.Err() != nil {
		return // closed: n.wg may be waited on already
	}
	n.forgetLocked()
	now := time.Now()
	cur := n.propVersionLocked()
	// Peers known only from their statements are left to the peers that
	// pass them on, unless nothing has been learned for a while.
	stalled := n.current == nil && now.Sub(n.learnt) >= n.cfg.Stall
	for p, pi := range n.peers {
		if !pi.verified || pi.relayed && !stalled || now.Before(pi.deadUntil) {
			continue
		}
		since := now.Sub(pi.toldAt)
		if pi.toldProp != cur || since >= n.cfg.Refresh ||
			since >= n.cfg.Interval && (len(n.newsLocked(p, pi)) > 0 || len(n.stmtNewsLocked(p, pi)) > 0) {
			n.greetLocked(p, true)
		}
	}
	for _, p := range n.pending {
		if pi := n.peers[p]; pi == nil || !pi.verified && !pi.refused && !now.Before(pi.deadUntil) {
			n.greetLocked(p, true)
		}
	}
	n.pending = n.pending[:0]
	for _, p := range n.nearby {
		if n.peers[p] == nil {
			n.greetLocked(p, false)
		}
	}
	n.nearby = n.nearby[:0]
}

// greetLocked starts a hello to p unless one is under way. Peers that are
// strict claim to be of this job (they advertise it, a verified peer
// vouches for them, or they are verified); the others merely speak the
// hello protocol, and only those of the job matter, so one that fails or
// refuses is not held against anyone. n.mu held.
func (n *Node) greetLocked(p peer.ID, strict bool) {
	if n.busy[p] {
		return
	}
	n.busy[p] = true
	n.wg.Go(func() {
		if err := n.sayHello(n.ctx, p, strict); err != nil {
			n.cfg.Logger.Debug().Stringer("peer", p).Err(err).Msg("hello failed")
			if n.ctx.Err() == nil && strict {
				n.unreachable(p)
			}
		}
		n.mu.Lock()
		delete(n.busy, p)
		n.mu.Unlock()
		n.poke() // what it was told may be stale already
	})
}

// propVersionLocked returns the version of this node's proposal, bumping
// it if the proposal changed. n.mu held.
func (n *Node) propVersionLocked() int {
	if m := n.statedLocked(); m.Gen != n.lastProp.Gen || m.Ready != n.lastProp.Ready || m.Formed != n.lastProp.Formed ||
		!slices.Equal(m.Members, n.lastProp.Members) {
		n.propVer++
		n.lastProp = m
		if st, err := sign(n.priv, n.key, n.h.ID(), n.seq0+uint64(n.propVer), m); err == nil {
			n.stmts[n.h.ID()] = st
		} else {
			n.cfg.Logger.Warn().Err(err).Msg("our proposal goes to the peers we greet only")
		}
	}
	return n.propVer
}

// statedLocked is what this node says of the job's ring: once its ring
// has re-formed, the generation it is in now — so that a peer that comes
// back, or comes late, learns that the ring trains without it, and never
// takes the ring of a generation that has ended for one to form — else its
// first-formation proposal. n.mu held.
func (n *Node) statedLocked() Proposal {
	if c := n.current; c != nil && c.Generation > 1 {
		return Proposal{Gen: c.Generation, Members: slices.Clone(c.Members), Ready: true, Formed: true}
	}
	return n.join.Proposal()
}

// stmtNewsLocked lists the peers whose statements p lacks: newer than it
// has, and not its own. n.mu held.
func (n *Node) stmtNewsLocked(p peer.ID, pi *peerInfo) []peer.ID {
	var out []peer.ID
	for q, s := range n.stmts {
		if q != p && s.seq > pi.hasStmt[q] {
			out = append(out, q)
		}
	}
	slices.Sort(out)
	return out
}

// newsLocked lists the verified peers p does not know of — those whose
// statements this node holds, so that p learns of a member and gets its
// statement in the same hello and need not greet it itself. n.mu held.
func (n *Node) newsLocked(p peer.ID, pi *peerInfo) []peer.ID {
	var out []peer.ID
	for q, qi := range n.peers {
		if qi.verified && q != p && !pi.knows[q] && n.stmts[q] != nil {
			out = append(out, q)
		}
	}
	return out
}

// helloTo is the hello this node sends to (or answers) p: a proof for p,
// and — only if p is verified — the members it does not know of, and our
// proposal. It returns what it told (prop -1: nothing).
func (n *Node) helloTo(p peer.ID) (*Hello, told) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := &Hello{Version: ProtocolVersion, Proof: proof(n.key, n.h.ID(), p), Incarnation: n.incarnation, Waiting: n.waiting}
	pi := n.peers[p]
	if pi == nil || !pi.verified {
		return h, told{prop: -1}
	}
	v := told{prop: n.propVersionLocked(), members: n.newsLocked(p, pi), stmts: map[peer.ID]uint64{}, waiting: n.waiting}
	for _, q := range v.members {
		h.Members = append(h.Members, n.memberLocked(q))
	}
	h.setProposal(n.lastProp, &n.names)
	h.Seq = n.seq0 + uint64(v.prop)
	from := n.stmtNewsLocked(p, pi)
	ss := make([]*signed, len(from))
	for i, q := range from {
		ss[i] = n.stmts[q]
		v.stmts[q] = ss[i].seq
	}
	h.putStatements(from, ss, &n.names)
	return h, v
}

func (n *Node) memberLocked(p peer.ID) Member {
	m := Member{ID: n.names.name(p)}
	addrs := n.h.Addrs()
	if p != n.h.ID() {
		addrs = n.h.Peerstore().Addrs(p)
	}
	for _, a := range addrs[:min(len(addrs), maxMemberAddrs)] {
		m.Addrs = append(m.Addrs, a.String())
	}
	return m
}

// sent records that p has been told v.
func (n *Node) sent(p peer.ID, v told) {
	if v.prop < 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if pi := n.peers[p]; pi != nil && pi.verified {
		pi.toldProp, pi.toldAt = max(pi.toldProp, v.prop), time.Now()
		pi.toldWaiting = pi.toldWaiting || v.waiting
		for _, q := range v.members {
			pi.knows[q] = true
		}
		for q, seq := range v.stmts {
			pi.hasStmt[q] = max(pi.hasStmt[q], seq)
		}
	}
}

// learn records a verified peer's hello: the peer, its proposal, and the
// members it vouches for, whose addresses go to the peerstore so that the
// next round dials them. It reports whether anything changed.
func (n *Node) learn(from peer.ID, h *Hello) (changed bool) {
	lied := false
	defer func() { // after the unlock: the guard asks Verified
		if lied {
			n.h.Guard.Strike(from, "a proposal no honest peer could make")
		}
	}()
	n.mu.Lock()
	defer n.mu.Unlock()
	pi := n.trackLocked(from)
	n.join.Answered(from)
	if pi == nil || !n.join.Verified(from) {
		n.cfg.Logger.Debug().Stringer("peer", from).Msg("too many peers remembered: ignored one")
		return false
	}
	pi.seen = time.Now()
	pi.deadUntil, pi.deadFor = time.Time{}, 0 // it answers: greet it again at once
	if h.Incarnation != 0 && h.Incarnation != pi.incarnation {
		if pi.incarnation != 0 {
			n.rebornLocked(from, pi)
			changed = true
		}
		pi.incarnation = h.Incarnation
	}
	if h.Seq > pi.waitSeq || h.Seq == pi.waitSeq && h.Waiting {
		pi.waiting, pi.waitSeq = h.Waiting, h.Seq
	}
	if !pi.verified {
		n.verifyLocked(pi)
		changed = true
	}
	pi.relayed = false // it answers us itself
	defer func() {
		if changed {
			n.learnt = time.Now()
		}
	}()
	defer n.watchView(from, &changed)()
	if m, err := h.proposal(&n.names); err != nil {
		n.warns.Warn(from.String(), "ignored a proposal").Err(err).Msg("ignored a proposal")
	} else if h.Seq < pi.heard {
		// Overtaken by a newer one from the same peer.
	} else if err := n.join.Step(from, m); err != nil {
		pi.lied, lied = true, true
		n.warns.Warn(from.String(), "ignored a proposal").Err(err).Msg("ignored a proposal")
	} else {
		pi.heard = h.Seq
	}
	changed = n.vouchedLocked(pi, h.Members) || changed
	for i := range h.Statements {
		news, err := n.takeStatementLocked(from, pi, h, i)
		if err != nil {
			n.warns.Warn(from.String(), "ignored a statement it passed on").Err(err).Msg("ignored a statement it passed on")
		}
		changed = changed || news
	}
	return changed
}

// vouchedLocked takes the members a verified peer vouches for: their
// addresses go to the peerstore, and those not yet known are greeted next
// round. It reports whether any was new. n.mu held.
func (n *Node) vouchedLocked(pi *peerInfo, members []Member) (changed bool) {
	for _, m := range members {
		id, err := n.names.decode(m.ID)
		if err != nil || id == n.h.ID() {
			continue
		}
		qi := n.peers[id]
		if qi != nil {
			pi.knows[id] = true // only peers remembered: knows stays bounded
			// Verified or refused already, or failed lately: nothing to do.
			// One whose hello failed a while ago is tried again, or two
			// peers whose first hellos timed out would never meet.
			if qi.verified || qi.refused || time.Now().Before(qi.deadUntil) {
				continue
			}
		}
		if len(n.pending) >= n.cfg.MaxPeers {
			continue
		}
		var addrs []ma.Multiaddr
		for _, s := range m.Addrs {
			if a, err := ma.NewMultiaddr(s); err == nil {
				addrs = append(addrs, a)
			}
		}
		n.h.Peerstore().AddAddrs(id, addrs, peerstore.TempAddrTTL)
		// Vouched for by a verified peer: say hello next round, unless
		// its statement shows it a member already.
		if !slices.Contains(n.pending, id) {
			n.pending = append(n.pending, id)
			changed = true
		}
	}
	return changed
}

func (n *Node) verifyLocked(pi *peerInfo) {
	pi.verified = true
	pi.toldProp, pi.knows, pi.hasStmt = -1, map[peer.ID]bool{}, map[peer.ID]uint64{}
}

// watchView notes p's view before a change and, in the func it returns,
// sets *changed if the view changed. n.mu held throughout.
func (n *Node) watchView(p peer.ID, changed *bool) func() {
	before, had := n.join.views[p]
	return func() {
		after, has := n.join.views[p]
		*changed = *changed || has != had || after.Ready != before.Ready || after.Formed != before.Formed || !slices.Equal(after.Members, before.Members)
	}
}

// takeStatementLocked checks statement i of a hello from a verified peer
// and, if it is newer than what this node holds of its maker, keeps it to
// pass on and steps the agreement with it as if its maker had said it
// here. Its maker becomes verified (it holds the job key), known through
// others. n.mu held.
func (n *Node) takeStatementLocked(via peer.ID, vi *peerInfo, h *Hello, i int) (changed bool, err error) {
	from, s, err := h.statement(i, &n.names)
	if err != nil {
		return false, err
	}
	vi.hasStmt[from] = max(vi.hasStmt[from], s.seq)
	if from == n.h.ID() {
		return false, nil
	}
	if old := n.stmts[from]; old != nil && s.seq <= old.seq {
		return false, nil // had it, or a newer one
	}
	if err := s.verify(n.key, from, n.h.Peerstore().PubKey(from)); err != nil {
		return false, fmt.Errorf("statement %d of the hello from %s: %w", i, via, err)
	}
	pi := n.trackLocked(from)
	if pi == nil || !n.join.Verified(from) {
		return false, nil // too many peers remembered
	}
	n.stmts[from] = s
	if !pi.verified {
		n.verifyLocked(pi)
		pi.relayed = true
		changed = true
	}
	pi.seen = time.Now()
	if s.seq < pi.heard {
		return changed, nil
	}
	defer n.watchView(from, &changed)()
	if err := n.join.Step(from, s.prop); err != nil {
		return changed, err
	}
	pi.heard = s.seq
	return changed, nil
}

// sayHello exchanges hellos with p; a refusal from a casual peer is
// ignored (see greetLocked).
func (n *Node) sayHello(ctx context.Context, p peer.ID, strict bool) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.HelloTimeout)
	defer cancel()
	prepareDial(n.h, p)
	// Hellos are small: they may cross a relay that limits strangers' circuits.
	s, err := n.h.NewStream(network.WithAllowLimitedConn(ctx, "ringtrain hello"), p, HelloProtocol)
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
		if hungUp(err) {
			// A peer that is going (Ctrl-C'd, restarting) closes its
			// streams under this one: nothing was malformed.
			n.cfg.Logger.Debug().Stringer("peer", p).Err(err).Msg("a peer hung up before answering a hello")
		} else {
			n.warns.Warn(p.String(), msgBadHello).Err(err).Msg(msgBadHello)
		}
		return err
	}
	n.sent(p, v)
	switch {
	case !strict && (resp.Version != ProtocolVersion || resp.Refused != "" || !proves(n.key, resp.Proof, p, n.h.ID())):
		n.cfg.Logger.Debug().Stringer("peer", p).Msg("a connected peer is not of this job")
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
		s.Reset()
		if hungUp(err) {
			n.cfg.Logger.Debug().Stringer("peer", from).Err(err).Msg("a peer hung up before its hello")
			return
		}
		n.warns.Warn(from.String(), msgBadHello).Err(err).Msg(msgBadHello)
		n.h.Guard.Strike(from, msgBadHello)
		return
	}
	var resp *Hello
	v := told{prop: -1}
	switch {
	case h.Version != ProtocolVersion:
		resp = &Hello{Version: ProtocolVersion, Refused: fmt.Sprintf("protocol version %d; yours is %d", ProtocolVersion, h.Version)}
		n.warns.Warn(from.String(), "refused a peer of another protocol version").Int("its_version", h.Version).Msg("refused a peer of another protocol version")
	case !proves(n.key, h.Proof, from, n.h.ID()):
		resp = &Hello{Version: ProtocolVersion, Refused: refusal}
		n.mu.Lock()
		pi := n.trackLocked(from)
		// Only noted for the log: were it taken for refused, discovery
		// would never greet it, and its refusal of our hello — the sign
		// that our config is the odd one — would never count.
		first := pi != nil && !pi.strange
		if first {
			pi.strange = true
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
	n.sent(from, v)
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

// JobDigest is the job's JobDigest, which the TLS plane's links must name.
func (n *Node) JobDigest() [sha256.Size]byte { return JobDigest(n.job) }

// hungUp reports whether a hello failed because the other side went: its
// stream ended before a byte of the hello came, or its stream or
// connection was reset — what an exiting peer's are. A hello cut short,
// one that does not parse and one held past its deadline are struck.
func hungUp(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, network.ErrReset) || errors.Is(err, syscall.ECONNRESET)
}
