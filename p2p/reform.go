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
const ReformProtocol = "/ringtrain/reform/1.0.0"

// ErrTooFew means fewer peers survived than the job's minimum world size.
var ErrTooFew = errors.New("p2p: too few peers left")

// reformState is one re-formation under way: the generation it makes and
// what each member of the old ring said of it.
type reformState struct {
	gen   uint64
	prev  []peer.ID
	views map[peer.ID]view // survivors' proposals for gen
	dead  map[peer.ID]bool
	lock  []peer.ID // the ring this node is ready to form
}

// Reform agrees with the other survivors of prev on the next generation of
// the ring, after a collective failed. A member is alive when it answers
// that it is re-forming too, and dead when it cannot be reached; members of
// prev that are neither yet (still noticing the failure) are waited for.
// Then the two phases of Join run on the survivors: each proposes the
// survivors it knows, in the old rank order; all ready on one list form it.
// Members in gone (peers that said they leave) are out from the start.
// It fails with ErrTooFew when fewer than minSize members survive, and with
// ErrJoinTimeout when ctx ends first.
func (n *Node) Reform(ctx context.Context, prev *Formation, minSize int, gone ...peer.ID) (*Formation, error) {
	st := &reformState{gen: prev.Generation + 1, prev: prev.Members, views: map[peer.ID]view{}, dead: map[peer.ID]bool{}}
	for _, p := range gone {
		st.dead[p] = true
	}
	// The state stays after Reform returns: peers still finishing their
	// ready phase ask this one, which must go on saying it is ready.
	n.mu.Lock()
	n.reform = st
	n.mu.Unlock()
	for {
		n.reformRound(ctx, st)
		f, err := n.reformAgreed(st, minSize)
		if f != nil || err != nil {
			if f != nil {
				n.cfg.Logger.Info().Int("rank", f.Rank).Int("world_size", len(f.Members)).Uint64("generation", f.Generation).
					Stringers("members", peerStringers(f.Members)).Msg("ring re-formed")
			}
			return f, err
		}
		t := time.NewTimer(n.cfg.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			n.mu.Lock()
			defer n.mu.Unlock()
			return nil, fmt.Errorf("%w: re-forming generation %d: %d of the %d members of generation %d answered, %d unreachable: %v",
				ErrJoinTimeout, st.gen, len(st.views)+1, len(st.prev), prev.Generation, len(st.dead), ctx.Err())
		case <-t.C:
		}
	}
}

// reformRound exchanges re-formation hellos with every old member not
// known dead.
func (n *Node) reformRound(ctx context.Context, st *reformState) {
	n.mu.Lock()
	var peers []peer.ID
	for _, p := range st.prev {
		if p != n.h.ID() && !st.dead[p] {
			peers = append(peers, p)
		}
	}
	n.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Go(func() {
			resp, err := n.reformHello(ctx, p, st)
			n.mu.Lock()
			defer n.mu.Unlock()
			switch {
			case err != nil && ctx.Err() == nil:
				// A dead process refuses the connection; a stalled one
				// times out. Either way it is not in the next ring.
				n.cfg.Logger.Debug().Stringer("peer", p).Err(err).Msg("a member of the old ring is gone")
				st.dead[p] = true
				delete(st.views, p)
			case err == nil && resp.Generation == st.gen && resp.Refused == "":
				n.learnReform(st, p, resp)
			}
		})
	}
	wg.Wait()
}

// reformHello sends our view of generation st.gen to p and returns p's.
func (n *Node) reformHello(ctx context.Context, p peer.ID, st *reformState) (*Hello, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := n.h.NewStream(ctx, p, ReformProtocol)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(2 * time.Second))
	if err := writeHello(s, n.reformHelloOf(st)); err != nil {
		s.Reset()
		return nil, err
	}
	resp, err := readHello(s)
	if err != nil {
		s.Reset()
		return nil, err
	}
	if why := n.check(resp); why != "" {
		return nil, fmt.Errorf("%w: %s", ErrRefused, why)
	}
	return resp, nil
}

// reformHelloOf is this node's view of a re-formation. n.mu not held.
func (n *Node) reformHelloOf(st *reformState) *Hello {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := &Hello{Version: ProtocolVersion, Job: n.job.Name, ConfigHash: n.job.ConfigHash, WorldSize: n.job.WorldSize, Generation: st.gen}
	prop := n.reformProposal(st)
	for _, p := range prop {
		h.Proposal = append(h.Proposal, p.String())
	}
	h.Ready = st.lock != nil
	return h
}

// reformProposal: the ring this node is ready on, else the old members
// that answered (and itself), in the old order — once no member is
// undecided. n.mu held.
func (n *Node) reformProposal(st *reformState) []peer.ID {
	if st.lock != nil {
		return st.lock
	}
	var prop []peer.ID
	for _, p := range st.prev {
		_, answered := st.views[p]
		switch {
		case p == n.h.ID() || answered:
			prop = append(prop, p)
		case !st.dead[p]:
			return nil // still waiting to hear from p
		}
	}
	return prop
}

// learnReform records a survivor's view. n.mu held.
func (n *Node) learnReform(st *reformState, from peer.ID, h *Hello) {
	if !slices.Contains(st.prev, from) {
		return
	}
	var prop []peer.ID
	for _, s := range h.Proposal {
		id, err := peer.Decode(s)
		if err != nil || !slices.Contains(st.prev, id) {
			return
		}
		prop = append(prop, id)
	}
	st.views[from] = view{prop: prop, ready: h.Ready}
	delete(st.dead, from) // it answered after all
}

// reformAgreed is agreed's counterpart: ready once every member of our
// proposal proposes it; formed once all are ready on it.
func (n *Node) reformAgreed(st *reformState, minSize int) (*Formation, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	self := n.h.ID()
	others := func(prop []peer.ID, ready bool) bool {
		for _, p := range prop {
			if p == self {
				continue
			}
			v, ok := st.views[p]
			if !ok || !slices.Equal(v.prop, prop) || ready && !v.ready {
				return false
			}
		}
		return true
	}
	if st.lock == nil {
		prop := n.reformProposal(st)
		if prop != nil && len(prop) < minSize {
			return nil, fmt.Errorf("%w: %d of the %d peers of generation %d survive, and the job needs at least %d (min_world_size)",
				ErrTooFew, len(prop), len(st.prev), st.gen-1, minSize)
		}
		if prop != nil && others(prop, false) {
			st.lock = prop
		}
	}
	if st.lock == nil {
		return nil, nil
	}
	for _, p := range st.lock {
		if v, ok := st.views[p]; p != self && ok && v.ready && !slices.Equal(v.prop, st.lock) {
			st.lock = nil // a member is ready on another list: start again
			return nil, nil
		}
	}
	if others(st.lock, true) {
		return &Formation{Members: st.lock, Rank: slices.Index(st.lock, self), Generation: st.gen}, nil
	}
	return nil, nil
}

// handleReform answers a re-formation hello with this node's view when it
// is re-forming the same generation, and with a hello of no generation
// (not yet) when it is not.
func (n *Node) handleReform(s network.Stream) {
	defer s.Close()
	h, from, ok := n.readJobHello(s)
	if !ok {
		return
	}
	n.mu.Lock()
	st := n.reform
	if st != nil && st.gen == h.Generation {
		n.learnReform(st, from, h)
	}
	n.mu.Unlock()
	resp := &Hello{Version: ProtocolVersion, Job: n.job.Name, ConfigHash: n.job.ConfigHash, WorldSize: n.job.WorldSize}
	if st != nil && st.gen == h.Generation {
		resp = n.reformHelloOf(st)
	}
	if err := writeHello(s, resp); err != nil {
		s.Reset()
	}
}

// readJobHello reads the one hello of a reform or admit stream; a
// malformed one, or one of another job, cuts the stream off.
func (n *Node) readJobHello(s network.Stream) (*Hello, peer.ID, bool) {
	s.SetDeadline(time.Now().Add(5 * time.Second))
	h, err := readHello(s)
	if err != nil || n.check(h) != "" {
		s.Reset()
		return nil, "", false
	}
	return h, s.Conn().RemotePeer(), true
}
