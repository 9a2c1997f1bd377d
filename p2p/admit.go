package p2p

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// AdmitProtocol tells a standby it is admitted: the message is a Hello
// whose Proposal is the ring to be, old members first, and whose
// Generation is the ring's current one. Then all of them Reform.
const AdmitProtocol = "/ringtrain/admit/1.0.0"

// Standbys are the peers of this job that said hello to this node but are
// not in members: late arrivals, waiting to be admitted.
func (n *Node) Standbys(members []peer.ID) []peer.ID {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []peer.ID
	for p := range n.verified {
		// Connected: a peer that said hello and is still there (the
		// verified set also holds members lost since).
		if !slices.Contains(members, p) && !n.refusedBy[p] && n.h.Network().Connectedness(p) == network.Connected {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// Admit tells standby p that the ring prev grows into members.
func (n *Node) Admit(ctx context.Context, p peer.ID, prev *Formation, members []peer.ID) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	s, err := n.h.NewStream(ctx, p, AdmitProtocol)
	if err != nil {
		return fmt.Errorf("p2p: admitting %s: %w", p, err)
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(3 * time.Second))
	h := &Hello{Version: ProtocolVersion, Job: n.job.Name, ConfigHash: n.job.ConfigHash, WorldSize: n.job.WorldSize, Generation: prev.Generation}
	for _, m := range members {
		h.Proposal = append(h.Proposal, m.String())
	}
	if err := writeHello(s, h); err != nil {
		s.Reset()
		return fmt.Errorf("p2p: admitting %s: %w", p, err)
	}
	return nil
}

// WaitAdmission waits, as a standby, until a member of the formed ring
// admits this node, and returns the formation to Reform from: the ring to
// be, in the generation before. It gives up when no peer of the job has
// been connected for idle (the job has ended, most likely).
func (n *Node) WaitAdmission(ctx context.Context, idle time.Duration) (*Formation, error) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case f := <-n.admitted:
			return f, nil
		case <-ctx.Done():
			return nil, fmt.Errorf("p2p: waiting to be admitted to job %q: %w", n.job.Name, ctx.Err())
		case <-tick.C:
		}
		n.mu.Lock()
		for p := range n.verified {
			if p != n.h.ID() && n.h.Network().Connectedness(p) == network.Connected {
				last = time.Now()
				break
			}
		}
		n.mu.Unlock()
		if time.Since(last) > idle {
			return nil, fmt.Errorf("p2p: waited to be admitted to job %q, but none of its peers has been reachable for %v: the job has ended or gone", n.job.Name, idle)
		}
	}
}

// handleAdmit takes an admission from a peer this node has verified, for a
// ring that includes it.
func (n *Node) handleAdmit(s network.Stream) {
	defer s.Close()
	h, from, ok := n.readJobHello(s)
	if !ok {
		return
	}
	n.mu.Lock()
	known := n.verified[from]
	n.mu.Unlock()
	var members []peer.ID
	for _, m := range h.Proposal {
		id, err := peer.Decode(m)
		if err != nil {
			return
		}
		members = append(members, id)
	}
	if !known || !slices.Contains(members, n.h.ID()) || !slices.Contains(members, from) {
		n.cfg.Logger.Warn().Stringer("peer", from).Msg("ignored an admission that does not come from the ring or does not include this peer")
		return
	}
	select {
	case n.admitted <- &Formation{Members: members, Rank: slices.Index(members, n.h.ID()), Generation: h.Generation}:
	default: // one is waiting already
	}
}
