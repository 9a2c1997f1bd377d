package p2p

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// AdmitProtocol tells a standby it is admitted: the message is a Hello
// whose Proposal is the ring to be, old members first, and whose
// Generation is the ring's current one. Then all of them Reform.
const AdmitProtocol = "/ringtrain/admit/2.0.0"

// Standbys are the verified peers of this job that are connected but not
// in members, and whose latest hello says they wait (Hello.Waiting): late
// arrivals, waiting to be admitted.
func (n *Node) Standbys(members []peer.ID) []peer.ID {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []peer.ID
	for p, pi := range n.peers {
		// Connected: a peer that said hello and is still there (the
		// verified set also holds members lost since). Seen gone, it
		// waits no longer: started again, it is a standby once its own
		// hello says so (Hello.Waiting).
		if n.h.Network().Connectedness(p) != network.Connected {
			pi.waiting = false
			continue
		}
		if pi.verified && pi.waiting && !pi.refused && !pi.lied && !slices.Contains(members, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// Distrust marks peers the training caught lying as the node marks one
// that proposed what no honest peer could: never a standby again, its
// admissions ignored and no exemption from the guard's limits — for as
// long as the node remembers it, across its restarts with the same
// identity. A restarted liar would otherwise be admitted as a newcomer.
func (n *Node) Distrust(ps []peer.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range ps {
		if p == n.h.ID() {
			continue
		}
		if pi := n.trackLocked(p); pi != nil {
			pi.lied = true
		}
	}
}

// Admit tells standby p that the ring prev grows into members.
func (n *Node) Admit(ctx context.Context, p peer.ID, prev *Formation, members []peer.ID) error {
	if err := n.tellStandby(ctx, p, AdmitProtocol, "ringtrain admission", prev.Generation, members); err != nil {
		return fmt.Errorf("p2p: admitting %s: %w", p, err)
	}
	return nil
}

// tellStandby sends standby p, on protocol, a Hello whose Proposal is
// members (sorted) in generation gen, within the hello timeout.
func (n *Node) tellStandby(ctx context.Context, p peer.ID, protocol protocol.ID, why string, gen uint64, members []peer.ID) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.HelloTimeout)
	defer cancel()
	prepareDial(n.h, p)
	s, err := n.h.NewStream(network.WithAllowLimitedConn(ctx, why), p, protocol)
	if err != nil {
		return err
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(n.cfg.HelloTimeout))
	h := &Hello{Version: ProtocolVersion, Proof: proof(n.key, n.h.ID(), p)}
	sorted := slices.Clone(members)
	slices.Sort(sorted)
	h.setProposal(Proposal{Gen: gen, Members: sorted}, &n.names)
	if err := writeHello(s, h); err != nil {
		s.Reset()
		return err
	}
	return nil
}

// EndedProtocol tells a standby that the job it waits on has ended: the
// message is a Hello (the job's proof) whose Proposal is the ring that
// finished. A standby believes it only from a member of the ring it
// waits for.
const EndedProtocol = "/ringtrain/ended/1.0.0"

// ErrJobEnded means the job ended before this standby was admitted: a
// member of the ring it waited for said so. Not a failure: there is
// nothing left to train.
var ErrJobEnded = errors.New("p2p: the job ended before this standby was admitted")

// Ended tells the standbys outside members that the job has ended, so that
// they stop waiting to be admitted; each is told within the hello
// timeout, and one that cannot be reached is left to its own timeout.
func (n *Node) Ended(ctx context.Context, members []peer.ID, gen uint64) {
	var wg sync.WaitGroup
	for _, p := range n.Standbys(members) {
		wg.Go(func() {
			if err := n.tellEnded(ctx, p, members, gen); err != nil {
				n.cfg.Logger.Debug().Err(err).Stringer("standby", p).Msg("could not tell a standby the job has ended")
			}
		})
	}
	wg.Wait()
}

func (n *Node) tellEnded(ctx context.Context, p peer.ID, members []peer.ID, gen uint64) error {
	return n.tellStandby(ctx, p, EndedProtocol, "ringtrain job ended", gen, members)
}

// handleEnded takes word that the job has ended from a verified member of
// the ring this standby waits for; from anyone else it is ignored, so
// that no other standby can send it away.
func (n *Node) handleEnded(s network.Stream) {
	defer s.Close()
	_, from, ok := n.readJobHello(s)
	if !ok {
		return
	}
	n.mu.Lock()
	member := believeEnded(n.peers[from], n.join.Claim(), from)
	n.mu.Unlock()
	if !member {
		const msg = "ignored word that the job has ended from a peer outside the ring this standby waits for"
		n.warns.Warn(from.String(), msg).Msg(msg)
		return
	}
	select {
	case n.ended <- from:
	default: // one is waiting already
	}
}

// believeEnded says whether a standby takes word that the job has ended
// from a peer (pi, nil if unknown): only from a verified member of the
// ring it waits for (claim).
func believeEnded(pi *peerInfo, claim *Proposal, from peer.ID) bool {
	return pi != nil && pi.verified && claim != nil && slices.Contains(claim.Members, from)
}

// takeAdmission says whether a standby takes an admission, whose sender
// proved it holds the job key, from a peer (pi, nil if unknown): from any
// but one caught lying or refused. Proof is enough; the sender's hello need
// not have arrived: rank 0 admits a standby as soon as it has heard the
// standby's hello, which can be before its own answer has reached the
// standby, and an admission ignored then holds the ring in its
// re-formation until the standby is found not to come.
func takeAdmission(pi *peerInfo) bool {
	return pi == nil || (!pi.lied && !pi.refused)
}

// ErrClaimGone means the ring a standby waited for never showed itself:
// none of its members could be reached for NodeConfig.ClaimTimeout. The
// claim is forgotten, and the peer forms again.
var ErrClaimGone = errors.New("p2p: the ring this standby waited for is gone")

// WaitAdmission waits, as a standby, until a member of the formed ring
// admits this node, and returns the formation to Reform from: the ring to
// be, in the generation before. It gives up when no peer of the job has
// been connected for idle (the job has ended, most likely), and with
// ErrClaimGone when no member of the ring it waits for has been for
// ClaimTimeout — a liar's claim, or a ring that ended.
func (n *Node) WaitAdmission(ctx context.Context, idle time.Duration) (*Formation, error) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	last, shown := time.Now(), time.Now()
	var claim *Proposal
	// At once, not at the first tick: rank 0 admits this peer only once
	// it has heard from it that it waits.
	n.mu.Lock()
	n.greetMembersLocked()
	n.mu.Unlock()
	for {
		select {
		case f := <-n.admitted:
			n.mu.Lock()
			c := n.join.Claim()
			n.mu.Unlock()
			if c != nil && f.Generation < c.Gen {
				// Taken while this peer was still joining, and the ring
				// has re-formed since: it will not form with this peer.
				n.cfg.Logger.Debug().Uint64("admitted_to", f.Generation+1).Uint64("ring", c.Gen).Msg("a stale admission: waiting for the next")
				continue
			}
			return f, nil
		case p := <-n.ended:
			return nil, fmt.Errorf("%w: %s, a member of its ring, said so", ErrJobEnded, p)
		case <-ctx.Done():
			return nil, fmt.Errorf("p2p: waiting to be admitted to job %q: %w", n.job.Name, ctx.Err())
		case <-tick.C:
		}
		n.mu.Lock()
		n.greetMembersLocked()
		if c := n.join.Claim(); c != nil {
			claim = c // a claim passing from one generation to the next is briefly none
		}
		for p, pi := range n.peers {
			if pi.verified && n.h.Network().Connectedness(p) == network.Connected {
				last = time.Now()
				if claim != nil && slices.Contains(claim.Members, p) {
					shown = time.Now()
				}
			}
		}
		if time.Since(shown) > n.cfg.ClaimTimeout {
			// Its members unreachable, or the claim no longer proved (a
			// member found gone is no longer counted for it).
			c := cmp.Or(claim, &Proposal{})
			n.join.Disprove(claim)
			n.learnt = time.Now()
			n.mu.Unlock()
			n.cfg.Logger.Warn().Uint64("generation", c.Gen).Stringers("members", peerStringers(c.Members)).Dur("unreachable_for", n.cfg.ClaimTimeout).
				Msg("the ring this standby waited for has not shown itself: its claim is taken for a lie, forming again")
			return nil, fmt.Errorf("%w: no member of the ring of generation %d it claimed was reachable for %v", ErrClaimGone, c.Gen, n.cfg.ClaimTimeout)
		}
		n.mu.Unlock()
		if time.Since(last) > idle {
			return nil, fmt.Errorf("p2p: waited to be admitted to job %q, but none of its peers has been reachable for %v: the job has ended or gone", n.job.Name, idle)
		}
	}
}

// greetMembersLocked says hello to the verified peers this standby knows
// only from statements passed on, to those it is no longer connected to,
// and to those no hello of this process has told that it waits, so that
// every member, rank 0 who admits included, hears from it directly that it
// waits and counts it among the Standbys — and holds a connection to it,
// which a standby behind NAT, not yet relayed, can be reached over only.
// Being connected is not enough: a DHT lookup connects to members without
// a hello. n.mu held.
func (n *Node) greetMembersLocked() {
	if n.ctx.Err() != nil {
		return
	}
	now := time.Now()
	for p, pi := range n.peers {
		if pi.verified && !pi.refused && !now.Before(pi.deadUntil) && (pi.relayed || !pi.toldWaiting || n.h.Network().Connectedness(p) != network.Connected) {
			n.greetLocked(p, true)
		}
	}
}

// handleAdmit takes an admission from a peer that proves the job, for a
// well-formed ring of at most world_size that holds both.
func (n *Node) handleAdmit(s network.Stream) {
	defer s.Close()
	h, from, ok := n.readJobHello(s)
	if !ok {
		return
	}
	n.mu.Lock()
	trusted := takeAdmission(n.peers[from])
	n.mu.Unlock()
	m, err := h.proposal(&n.names)
	if err == nil {
		// The same shape rules as any proposal: sorted, no peer twice, at
		// most world_size.
		err = NewReformAgreement(n.h.ID(), m.Gen, m.Members, 1, nil).valid(m)
		if len(m.Members) > n.job.maxSize() {
			err = fmt.Errorf("a ring of %d, the job's largest is %d", len(m.Members), n.job.maxSize())
		}
	}
	if !trusted || err != nil || !slices.Contains(m.Members, n.h.ID()) || !slices.Contains(m.Members, from) {
		const msg = "ignored an admission from a peer caught lying or refused, or for a ring that does not hold both"
		n.warns.Warn(from.String(), msg).AnErr("proposal", err).Msg(msg)
		return
	}
	n.offerAdmission(&Formation{Members: m.Members, Rank: slices.Index(m.Members, n.h.ID()), Generation: m.Gen})
	n.poke() // a Join under way ends at once: the members wait for this peer
}

// offerAdmission leaves f for WaitAdmission, in place of an admission of an
// earlier generation still waiting there: that one's re-formation has
// ended (the members re-formed without this peer, having waited their
// grace for it), and WaitAdmission would discard it as stale — keeping it
// and dropping f lost the admission the members wait for now, stalling
// their ring for the grace again. Senders hold n.mu, so the channel,
// emptied here, has room.
func (n *Node) offerAdmission(f *Formation) {
	n.mu.Lock()
	defer n.mu.Unlock()
	select {
	case old := <-n.admitted:
		if old.Generation > f.Generation {
			f = old
		}
	default:
	}
	select {
	case n.admitted <- f:
	default: // cannot happen: only senders fill it, under n.mu
	}
}
