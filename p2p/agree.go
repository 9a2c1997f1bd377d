package p2p

import (
	"errors"
	"fmt"
	"slices"

	"github.com/libp2p/go-libp2p/core/peer"
)

// ErrBadProposal means a peer proposed a ring that no honest peer could:
// unsorted, with a peer twice, of the wrong size, of another generation's
// members, or ready on nothing. The proposal is not used.
var ErrBadProposal = errors.New("p2p: bad proposal")

// Proposal is what a peer says about one generation of the ring: the
// members it proposes, in rank order (sorted by peer ID), whether it is
// ready on them (it will not change its proposal any more), and, for the
// first generation, whether its ring has formed and is training.
type Proposal struct {
	Gen     uint64
	Members []peer.ID
	Ready   bool
	Formed  bool
}

// Decision is what an Agreement has decided: a formed ring, or an error
// (ErrTooFew, ErrStandby), or neither yet.
type Decision struct {
	Formed *Formation
	Err    error
}

type liveness uint8

const (
	unknown liveness = iota // not heard from yet (re-formation only)
	alive                   // a verified peer of the job that answers
	dead                    // unreachable; may answer again
	out                     // left or dropped: never part of this generation
	doubted                 // named in a claim taken back: only its own hello makes it alive again
)

// Agreement decides one generation of a ring among peers, in two phases:
// each peer proposes a ring; once every member of a proposal proposes it,
// each becomes ready on it and stops changing it; the ring forms when every
// member is ready on it. A ready peer that sees a member ready on another
// ring gives its own up. So rings that form never share a peer.
//
// It is a pure state machine, in the shape of etcd-io/raft's RawNode: the
// caller feeds it what it hears (Verified, Unreachable, Step) and asks what
// to say (Proposal) and what is decided (Decide); it does no I/O, keeps no
// time and takes no lock. Node is the loop around it.
//
// One type serves the first formation (NewJoinAgreement: any verified peer
// of the job may be a member; the ring is the world_size smallest IDs) and
// re-formation and admission (NewReformAgreement: the members come from a
// fixed list; the ring is all of them that answer, once every one has
// answered or is known unreachable).
type Agreement struct {
	self     peer.ID
	gen      uint64
	min, max int
	fixed    bool // candidates fixed at the start (re-formation)
	limit    int  // at most this many candidates (first formation)
	peers    map[peer.ID]liveness
	views    map[peer.ID]Proposal
	lock     []peer.ID // the ring this peer is ready on
	formed   bool
	// First formation only: minLater and maxLater bound a ring of a later
	// generation that may claim to train (min_world_size, and the largest
	// admissions may grow the job to); seen
	// is the latest generation of a proven claim; disproved, per peer, the
	// latest generation of a claim of its that was taken back (its ring
	// never showed itself), so that the same claim passed on again is not
	// believed twice.
	minLater  int
	maxLater  int
	seen      uint64
	disproved map[peer.ID]uint64
}

// maxGenLead bounds how far past the latest generation this peer has seen a
// claim of a formed ring may be: a job re-forms a few times a minute at
// most, so a million generations ahead is a lie, whoever signs it.
const maxGenLead = 1 << 20

// NewJoinAgreement is the agreement on a job's first ring (generation 1)
// of exactly job.WorldSize peers. A ring of a later generation that claims
// to train without this peer must hold from job.MinWorldSize (zero: one)
// to the job's largest (MaxWorldSize, grown by admissions) members. It
// remembers at most limit peers (zero: 64 or four times the world size,
// whichever is more), so that a swarm of strangers cannot grow its state
// without bound.
func NewJoinAgreement(self peer.ID, job Job, limit int) *Agreement {
	if limit <= 0 {
		limit = max(64, 4*job.WorldSize)
	}
	a := &Agreement{self: self, gen: 1, min: job.WorldSize, max: job.WorldSize, limit: limit,
		minLater: max(job.MinWorldSize, 1), maxLater: job.maxSize(), seen: 1,
		peers: map[peer.ID]liveness{self: alive}, views: map[peer.ID]Proposal{}, disproved: map[peer.ID]uint64{}}
	return a
}

// NewReformAgreement is the agreement on generation gen among the peers
// in members (the old ring's, or the old ring's and the standbys being
// admitted): the ring is every one of them that answers, and at least
// minSize. The peers in gone (leaving, or dropped for lying) are out from
// the start and stay out.
func NewReformAgreement(self peer.ID, gen uint64, members []peer.ID, minSize int, gone []peer.ID) *Agreement {
	a := &Agreement{self: self, gen: gen, min: max(minSize, 1), max: len(members), fixed: true,
		peers: map[peer.ID]liveness{}, views: map[peer.ID]Proposal{}}
	for _, p := range members {
		a.peers[p] = unknown
	}
	for _, p := range gone {
		if _, ok := a.peers[p]; ok {
			a.peers[p] = out
		}
	}
	a.peers[self] = alive
	return a
}

// Generation is the generation this agreement decides.
func (a *Agreement) Generation() uint64 { return a.gen }

// Candidate reports whether p may be a member of the ring decided here.
func (a *Agreement) Candidate(p peer.ID) bool {
	l, ok := a.peers[p]
	return ok && l != out && l != doubted
}

// Members are the peers that may still be part of the ring (for a
// re-formation, those not gone), sorted.
func (a *Agreement) Members() []peer.ID {
	var ps []peer.ID
	for p, l := range a.peers {
		if l != out {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}

// Verified records that p proved itself a peer of the job and answers. In a
// first formation it becomes a candidate, unless the agreement already
// remembers its limit of peers (it returns false then); in a
// re-formation only the fixed members count, and a gone one stays out.
func (a *Agreement) Verified(p peer.ID) bool {
	l, ok := a.peers[p]
	switch {
	case ok && (l == out || l == doubted):
		return false
	case ok:
		a.peers[p] = alive
		return true
	case a.fixed || len(a.peers) >= a.limit:
		return false
	}
	a.peers[p] = alive
	return true
}

// Unreachable records that p could not be reached: it is left out of this
// peer's proposal until it answers again. In a first formation the caller
// says so only of a peer it holds no connection to — a slow hello is no
// sign of death, but a verified peer that went before the ring formed
// would otherwise hold its place in every proposal until forgotten.
func (a *Agreement) Unreachable(p peer.ID) {
	if l, ok := a.peers[p]; ok && (l == alive || l == unknown) && p != a.self {
		a.peers[p] = dead
		if a.fixed {
			delete(a.views, p)
		}
	}
}

// Forget drops everything known of p (first formation: a peer gone so
// long that it is no longer worth remembering).
func (a *Agreement) Forget(p peer.ID) {
	if a.fixed || p == a.self {
		return
	}
	delete(a.peers, p)
	delete(a.views, p)
}

// Step takes what peer from says of this agreement's generation. A
// proposal that no honest peer could make is refused with ErrBadProposal
// naming what is wrong, and not used; one of another generation, or from a
// peer that is not a candidate, is ignored.
func (a *Agreement) Step(from peer.ID, m Proposal) error {
	if from == a.self {
		return nil
	}
	if l, ok := a.peers[from]; !ok || l == out || l == doubted {
		return nil
	}
	if !a.fixed && m.Gen > a.gen && m.Formed {
		// A ring of a later generation trains: the job's first ring has
		// formed and re-formed since. It is never one to form — its
		// generation has moved on — but says whether this peer is in it,
		// once every member it names says so too (see claim).
		if m.Gen <= a.disproved[from] {
			return nil
		}
		if m.Gen > a.seen && m.Gen-a.seen > maxGenLead {
			return fmt.Errorf("%w from %s: a ring of generation %d, more than %d past generation %d, the latest this peer has seen",
				ErrBadProposal, from, m.Gen, maxGenLead, a.seen)
		}
		if err := checkRing(m.Members, a.minLater, a.maxLater); err != nil {
			return fmt.Errorf("%w from %s for generation %d: %w", ErrBadProposal, from, m.Gen, err)
		}
		a.peers[from] = alive
		a.views[from] = Proposal{Gen: m.Gen, Members: slices.Clone(m.Members), Ready: true, Formed: true}
		return nil
	}
	if m.Gen != a.gen {
		return nil
	}
	if err := a.valid(m); err != nil {
		return fmt.Errorf("%w from %s for generation %d: %w", ErrBadProposal, from, m.Gen, err)
	}
	a.peers[from] = alive // it answered
	a.views[from] = Proposal{Gen: m.Gen, Members: slices.Clone(m.Members), Ready: m.Ready, Formed: m.Formed && !a.fixed}
	return nil
}

// valid checks a proposal's shape: empty and not ready (still waiting), or
// sorted, without a peer twice, of an allowed size, and — where the
// members are fixed — only of them.
func (a *Agreement) valid(m Proposal) error {
	if len(m.Members) == 0 {
		if m.Ready || m.Formed {
			return errors.New("ready on an empty ring")
		}
		return nil
	}
	if err := checkRing(m.Members, a.min, a.max); err != nil {
		return err
	}
	if a.fixed {
		for _, p := range m.Members {
			if !a.Candidate(p) {
				return fmt.Errorf("peer %s is not one of this generation's members", p)
			}
		}
	}
	return nil
}

// checkRing checks a ring's shape: between lo and hi members, sorted,
// without a peer twice.
func checkRing(members []peer.ID, lo, hi int) error {
	if len(members) < lo || len(members) > hi {
		return fmt.Errorf("a ring of %d peers; want %d to %d", len(members), lo, hi)
	}
	for i := 1; i < len(members); i++ {
		if members[i] == members[i-1] {
			return fmt.Errorf("peer %s twice", members[i])
		}
		if members[i] < members[i-1] {
			return fmt.Errorf("members not in rank order (sorted by peer ID) at rank %d", i)
		}
	}
	return nil
}

// Proposal is what this peer says: the ring it is ready on, else the ring
// it proposes (nil while it waits for peers), with Formed once decided.
func (a *Agreement) Proposal() Proposal {
	return Proposal{Gen: a.gen, Members: a.proposal(), Ready: a.lock != nil, Formed: a.formed && !a.fixed}
}

func (a *Agreement) proposal() []peer.ID {
	if a.lock != nil {
		return a.lock
	}
	var live []peer.ID
	for p, l := range a.peers {
		switch {
		case l == alive:
			live = append(live, p)
		case l == unknown && a.fixed:
			return nil // still waiting to hear from p
		}
	}
	if len(live) < a.min {
		return nil
	}
	slices.Sort(live)
	return live[:min(len(live), a.max)]
}

// Decide says what is decided now: the formed ring once every member of the
// one this peer is ready on is ready on it; ErrTooFew when a re-formation
// has heard from everyone and too few are left; ErrStandby when a first
// ring has formed, or is forming, without this peer.
func (a *Agreement) Decide() Decision {
	if a.fixed && a.lock == nil {
		if prop, live := a.proposal(), len(a.in(alive)); prop == nil && len(a.in(unknown)) == 0 && live < a.min {
			return Decision{Err: fmt.Errorf("%w: %d of the %d peers of generation %d answer, and the job needs at least %d (min_world_size)",
				ErrTooFew, live, len(a.peers), a.gen, a.min)}
		}
	}
	if a.lock == nil {
		if c := a.claim(); c != nil {
			// A ring trains (or is all but ready) without this peer: it
			// waits to be admitted rather than form another of the same
			// job — with a world size of 1 it could form one alone.
			a.seen = max(a.seen, c.Gen)
			return Decision{Err: fmt.Errorf("%w: the job's ring of %d (generation %d) formed without this peer", ErrStandby, len(c.Members), c.Gen)}
		}
		// Ready on this peer's own proposal once all its members propose
		// it, or — in a first formation — on one whose other members are
		// all ready on it already. A re-formation takes only its own: one
		// that took another's would leave out members it has not heard
		// from yet.
		cands := [][]peer.ID{a.proposal()}
		for _, p := range a.viewers() {
			if v := a.views[p]; !a.fixed && v.Gen == a.gen {
				cands = append(cands, v.Members)
			}
		}
		for i, prop := range cands {
			if a.acceptable(prop) && a.othersOn(prop, i > 0) {
				a.lock = prop
				break
			}
		}
	}
	if a.lock != nil {
		for _, p := range a.lock {
			if v, ok := a.views[p]; p != a.self && ok && v.Ready && !slices.Equal(v.Members, a.lock) {
				a.lock = nil // a member is ready on another ring: ours cannot form
				return Decision{}
			}
		}
		if a.othersOn(a.lock, true) {
			a.formed = true
			return Decision{Formed: &Formation{Members: slices.Clone(a.lock), Rank: slices.Index(a.lock, a.self), Generation: a.gen}}
		}
		return Decision{}
	}
	return Decision{}
}

// claim is the ring that makes this peer a standby in a first formation,
// or nil: one without this peer that every member it names claims alike —
// ready on it in this generation, or formed in a later one — each a
// verified peer of the job that answers. One member's word is not enough:
// a liar that knows the job could otherwise claim a ring of itself alone,
// of a generation far ahead, and hold every honest peer as a standby.
func (a *Agreement) claim() *Proposal {
	if a.fixed {
		return nil
	}
	for _, p := range a.viewers() {
		v := a.views[p]
		if len(v.Members) == 0 || slices.Contains(v.Members, a.self) || v.Gen < a.gen || v.Gen > a.gen && !v.Formed {
			continue
		}
		proven := true
		for _, q := range v.Members {
			w, ok := a.views[q]
			if !ok || a.peers[q] != alive || w.Gen != v.Gen || !w.Ready || w.Formed != v.Formed && v.Gen > a.gen || !slices.Equal(w.Members, v.Members) {
				proven = false
				break
			}
		}
		if proven {
			return &Proposal{Gen: v.Gen, Members: slices.Clone(v.Members), Ready: true, Formed: v.Formed}
		}
	}
	return nil
}

// Claim is the ring this peer waits as a standby for (see Decide), or
// nil.
func (a *Agreement) Claim() *Proposal { return a.claim() }

// Disprove takes back a claim that made this peer a standby and never
// showed itself — no member of the ring it names could be reached: what
// its members said is forgotten, the same claim, passed on again, is not
// believed, and its members are no candidates until each says hello
// itself (Answered).
func (a *Agreement) Disprove(c *Proposal) {
	if a.fixed || c == nil {
		return
	}
	for _, p := range c.Members {
		if p == a.self {
			continue
		}
		if _, ok := a.disproved[p]; ok || len(a.disproved) < a.limit {
			a.disproved[p] = max(a.disproved[p], c.Gen)
		}
		if _, ok := a.peers[p]; ok {
			a.peers[p] = doubted
		}
		delete(a.views, p)
	}
	if a.lock != nil && slices.ContainsFunc(a.lock, func(p peer.ID) bool { return a.peers[p] != alive }) {
		a.lock = nil
	}
}

// Answered records that p, named in a claim taken back, said hello itself:
// it is a candidate again (its disproved claim stays disbelieved).
func (a *Agreement) Answered(p peer.ID) {
	if a.peers[p] == doubted {
		a.peers[p] = alive
	}
}

// acceptable: a ring this peer may be ready on — of the right shape, with
// this peer in it, and every member a verified, answering candidate.
func (a *Agreement) acceptable(prop []peer.ID) bool {
	if len(prop) == 0 || a.valid(Proposal{Members: prop}) != nil || !slices.Contains(prop, a.self) {
		return false
	}
	for _, p := range prop {
		if a.peers[p] != alive {
			return false
		}
	}
	return true
}

// othersOn reports whether every member of prop other than this peer
// proposes prop — and, with ready, is ready on it.
func (a *Agreement) othersOn(prop []peer.ID, ready bool) bool {
	for _, p := range prop {
		if p == a.self {
			continue
		}
		v, ok := a.views[p]
		if !ok || v.Gen != a.gen || !slices.Equal(v.Members, prop) || ready && !v.Ready {
			return false
		}
	}
	return true
}

// viewers are the peers whose proposals this peer holds, sorted, so that
// a decision never depends on map order.
func (a *Agreement) viewers() []peer.ID {
	ps := make([]peer.ID, 0, len(a.views))
	for p := range a.views {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// in lists the candidates in state l, sorted.
func (a *Agreement) in(l liveness) []peer.ID {
	var ps []peer.ID
	for p, pl := range a.peers {
		if pl == l {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}

// Ready is the ring this peer is ready on, or nil.
func (a *Agreement) Ready() []peer.ID { return a.lock }

// Waiting lists the candidates not heard from yet (re-formation), sorted.
func (a *Agreement) Waiting() []peer.ID { return a.in(unknown) }

// Unreached lists the candidates known unreachable (re-formation), sorted.
func (a *Agreement) Unreached() []peer.ID { return a.in(dead) }
