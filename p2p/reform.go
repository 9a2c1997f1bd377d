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
)

// ReformProtocol carries the survivors' agreement on the next generation
// of a ring that lost a member. Its messages are Hellos.
const ReformProtocol = "/ringtrain/reform/2.0.0"

// ErrTooFew means fewer peers survived than the job's minimum world size.
var ErrTooFew = errors.New("p2p: too few peers left")

// Reform agrees with the other members of prev on the next generation of
// the ring, after a collective failed, peers left, or standbys were
// admitted (prev then holds them too). A member is alive when it answers
// that it is re-forming too, and dead when it cannot be reached; members
// that are neither yet (still noticing the failure) are waited for. Then
// the two phases of Join run on the survivors (see Agreement). Members in
// gone (peers that said they leave, or that were caught lying) are out from
// the start, whatever they say. It fails with ErrTooFew when fewer than
// minSize members survive, and with ErrJoinTimeout when ctx ends first.
func (n *Node) Reform(ctx context.Context, prev *Formation, minSize int, gone ...peer.ID) (*Formation, error) {
	members := slices.Clone(prev.Members)
	slices.Sort(members)
	a := NewReformAgreement(n.h.ID(), prev.Generation+1, members, minSize, gone)
	// The agreement stays after Reform returns: peers still finishing
	// their ready phase ask this one, which must go on saying it is ready.
	n.mu.Lock()
	n.reform = a
	n.mu.Unlock()
	rd := n.newRedialer(ctx, a)
	defer rd.stop()
	n.mu.Lock()
	nc := newNoShows(n.current, n.cfg.ReformTimeout)
	n.mu.Unlock()
	for {
		if gen, ok := n.reformRound(ctx, a, nc); !ok {
			return nil, fmt.Errorf("%w: generation %d formed without it", ErrSuperseded, gen)
		}
		rd.redial()
		n.mu.Lock()
		d := a.Decide()
		if d.Formed != nil {
			n.current, n.waiting = d.Formed, false
			n.propVersionLocked() // what it says of the ring is this generation now
		}
		n.mu.Unlock()
		if d.Formed != nil {
			f := d.Formed
			n.cfg.Logger.Info().Int("rank", f.Rank).Int("world_size", len(f.Members)).Uint64("generation", f.Generation).
				Stringers("members", peerStringers(f.Members)).Msg("ring re-formed")
			return f, nil
		}
		if d.Err != nil {
			return nil, d.Err
		}
		if _, err := n.wait(ctx, n.cfg.Interval); err != nil {
			n.mu.Lock()
			defer n.mu.Unlock()
			return nil, fmt.Errorf("%w: re-forming generation %d: waiting for %v; unreachable %v: %v",
				ErrJoinTimeout, a.Generation(), a.Waiting(), a.Unreached(), err)
		}
	}
}

// ErrSuperseded means a re-formation was overtaken: a member answered
// that a ring of its generation or later formed without this peer (a
// standby that took an admission too late, say). Nothing will complete
// it; the peer waits to be admitted again.
var ErrSuperseded = errors.New("p2p: the ring re-formed without this peer")

// reformRound exchanges re-formation hellos with every member not known
// unreachable; a newcomer that answers without re-forming for too long is
// taken for unreachable (noShows). It says false, and the generation, if
// a member's ring of a's generation or later formed without this peer.
func (n *Node) reformRound(ctx context.Context, a *Agreement, nc *noShows) (uint64, bool) {
	n.mu.Lock()
	unreached := a.Unreached()
	var peers []peer.ID
	for _, p := range a.Members() {
		if p != n.h.ID() && !slices.Contains(unreached, p) {
			peers = append(peers, p)
		}
	}
	n.mu.Unlock()
	var wg sync.WaitGroup
	var overtaken uint64
	for _, p := range peers {
		wg.Go(func() {
			resp, err := n.reformHello(ctx, p, a)
			n.mu.Lock()
			defer n.mu.Unlock()
			switch {
			case err == nil && overtakes(resp, a, n.h.ID(), &n.names):
				overtaken = max(overtaken, resp.Generation)
			case err != nil && ctx.Err() == nil:
				// A dead process refuses the connection; a stalled one
				// times out. Either way it is not in the next ring.
				n.cfg.Logger.Debug().Stringer("peer", p).Err(err).Msg("a member of the old ring is gone")
				a.Unreachable(p)
			case err == nil && resp.Generation == a.Generation():
				n.stepLocked(a, p, resp)
			case err == nil && nc.notReforming(p, time.Now()):
				n.cfg.Logger.Info().Stringer("peer", p).Dur("for", nc.grace).
					Msg("a standby being admitted does not re-form: the ring re-forms without it")
				a.Unreachable(p)
			}
		})
	}
	wg.Wait()
	return overtaken, overtaken == 0
}

// overtakes says whether resp, a member's answer to self's re-formation
// hello for a, shows a ring that will never hold self: one of a's
// generation or later that formed, or one of a's generation the member is
// ready on (its last word on it) without self.
func overtakes(resp *Hello, a *Agreement, self peer.ID, names *idNames) bool {
	m, err := resp.proposal(names)
	if err != nil || slices.Contains(m.Members, self) || len(m.Members) == 0 {
		return false
	}
	return m.Formed && m.Gen >= a.Generation() || m.Ready && m.Gen == a.Generation()
}

// noShows tells, in a re-formation that admits standbys, a newcomer that
// never comes: one that answers but does not re-form (its admission lost
// on the way, or refused) would otherwise hold every member's proposal
// until the join timeout, as a peer the ring waits for. A member of the
// ring before is waited for: it may still be finishing its last step,
// which can take up to the collective's timeout. The redialer greets a
// newcomer taken for unreachable again, and an answer in this generation
// makes it a candidate again.
type noShows struct {
	prev  []peer.ID // the ring before; nil for a standby being admitted, which waits for everyone
	grace time.Duration
	first map[peer.ID]time.Time // the first answer without re-forming, per newcomer
}

func newNoShows(prev *Formation, grace time.Duration) *noShows {
	nc := &noShows{grace: grace, first: map[peer.ID]time.Time{}}
	if prev != nil {
		nc.prev = slices.Clone(prev.Members)
	}
	return nc
}

// notReforming records that p answered at now without re-forming, and
// says whether it is a newcomer that has done so for the grace period.
// n.mu held.
func (nc *noShows) notReforming(p peer.ID, now time.Time) bool {
	if nc.prev == nil || slices.Contains(nc.prev, p) {
		return false
	}
	first, ok := nc.first[p]
	if !ok {
		nc.first[p] = now
		return false
	}
	return now.Sub(first) >= nc.grace
}

// redialer greets again, in the background, the members a re-formation
// found unreachable. One failed hello is no proof of death: a peer behind
// NAT is unreachable until its relay reservation or a hole punch exists
// (a standby admitted just after it started, say). And a member that only
// some peers reach splits the proposals — with it, without it — until the
// join timeout ends the job, unless someone greets it again: nothing else
// does once both sides have marked each other unreachable. An answer makes
// it a candidate again (Agreement.Step). The rounds never wait for these
// hellos, so a member that is really gone costs the re-formation nothing.
type redialer struct {
	n      *Node
	a      *Agreement
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	began  map[peer.ID]time.Time // when its last redial began; the loop's own
	busy   map[peer.ID]bool      // a redial is in flight; n.mu guards it
}

func (n *Node) newRedialer(ctx context.Context, a *Agreement) *redialer {
	rd := &redialer{n: n, a: a, began: map[peer.ID]time.Time{}, busy: map[peer.ID]bool{}}
	rd.ctx, rd.cancel = context.WithCancel(ctx)
	return rd
}

// redial greets each unreachable member with no hello in flight, at most
// once per ReformTimeout/4, while this peer is not ready on a ring. Only
// the re-formation loop calls it.
func (rd *redialer) redial() {
	n := rd.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if rd.a.Ready() != nil {
		return // its ring is chosen: an answer would change nothing
	}
	for _, p := range rd.a.Unreached() {
		if rd.busy[p] || time.Since(rd.began[p]) < n.cfg.ReformTimeout/4 {
			continue
		}
		rd.busy[p], rd.began[p] = true, time.Now()
		rd.wg.Go(func() {
			resp, err := n.reformHello(rd.ctx, p, rd.a)
			n.mu.Lock()
			rd.busy[p] = false
			if err == nil && resp.Generation == rd.a.Generation() {
				n.cfg.Logger.Debug().Stringer("peer", p).Msg("a member unreachable before answered")
				n.stepLocked(rd.a, p, resp)
			}
			n.mu.Unlock()
			if err == nil {
				n.poke()
			}
		})
	}
}

// stop ends the redials and waits for them.
func (rd *redialer) stop() {
	rd.cancel()
	rd.wg.Wait()
}

// stepLocked feeds a re-formation hello to a, logging a lie. n.mu held.
func (n *Node) stepLocked(a *Agreement, from peer.ID, h *Hello) {
	m, err := h.proposal(&n.names)
	if err == nil {
		err = a.Step(from, m)
	}
	if err != nil {
		n.warns.Warn(from.String(), "ignored a re-formation proposal").Err(err).Msg("ignored a re-formation proposal")
	}
}

// reformHello sends our view of a's generation to p and returns p's.
func (n *Node) reformHello(ctx context.Context, p peer.ID, a *Agreement) (*Hello, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ReformTimeout)
	defer cancel()
	prepareDial(n.h, p)
	s, err := n.h.NewStream(network.WithAllowLimitedConn(ctx, "ringtrain re-formation"), p, ReformProtocol)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(n.cfg.ReformTimeout))
	// An ended ctx (the ring formed, say) cuts a hello to a stalled peer
	// off at once, not at the deadline.
	defer context.AfterFunc(ctx, func() { s.Reset() })()
	if err := writeHello(s, n.reformHelloTo(p, a)); err != nil {
		s.Reset()
		return nil, err
	}
	resp, err := readHello(s)
	if err != nil {
		s.Reset()
		return nil, err
	}
	if resp.Version != ProtocolVersion || !proves(n.key, resp.Proof, p, n.h.ID()) {
		return nil, fmt.Errorf("%w: %s does not prove this job", ErrRefused, p)
	}
	return resp, nil
}

// reformHelloTo is this node's view of a, for p. n.mu not held.
func (n *Node) reformHelloTo(p peer.ID, a *Agreement) *Hello {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := &Hello{Version: ProtocolVersion, Proof: proof(n.key, n.h.ID(), p)}
	if a != nil {
		h.setProposal(a.Proposal(), &n.names)
	}
	return h
}

// handleReform answers a re-formation hello from a peer that proves the
// job with this node's view when it is re-forming the same generation, and
// with a hello of no generation (not yet) when it is not.
func (n *Node) handleReform(s network.Stream) {
	defer s.Close()
	h, from, ok := n.readJobHello(s)
	if !ok {
		return
	}
	n.mu.Lock()
	a := n.reform
	if a == nil || a.Generation() != h.Generation {
		a = nil
	} else {
		n.stepLocked(a, from, h)
	}
	cur := n.current
	n.mu.Unlock()
	if a != nil {
		n.poke()
	}
	resp := n.reformHelloTo(from, a)
	if a == nil && cur != nil && cur.Generation >= h.Generation && !slices.Contains(cur.Members, from) {
		// Its ring of that generation, or a later one, formed without the
		// asker: say so, so that it stops waiting for a ring that will not
		// form (ErrSuperseded).
		resp.setProposal(Proposal{Gen: cur.Generation, Members: cur.Members, Formed: true}, &n.names)
	}
	if err := writeHello(s, resp); err != nil {
		s.Reset()
	}
}

// readJobHello reads the one hello of a reform or admit stream; a
// malformed one, or one that does not prove the job, cuts the stream off.
func (n *Node) readJobHello(s network.Stream) (*Hello, peer.ID, bool) {
	s.SetDeadline(time.Now().Add(n.cfg.HelloTimeout))
	from := s.Conn().RemotePeer()
	h, err := readHello(s)
	if err != nil && !hungUp(err) {
		n.h.Guard.Strike(from, msgBadHello)
	}
	if err != nil || h.Version != ProtocolVersion || !proves(n.key, h.Proof, from, n.h.ID()) {
		s.Reset()
		return nil, "", false
	}
	return h, from, true
}
