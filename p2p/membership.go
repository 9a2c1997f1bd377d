package p2p

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ringtrain/ringtrain/ring"
)

// Membership is the peers of a job as an elastic job runner sees them
// (train/elastic's Membership): a Node agrees on each generation of the
// ring, RingLinks connect it, and Membership keeps the current one. Its
// methods are called from one goroutine, the runner's.
type Membership struct {
	node  *Node
	links *RingLinks
	// timeout bounds each agreement and connection; a standby waits to
	// be admitted until no peer of the job has been reachable for as long.
	timeout time.Duration
	cur     *Formation
	// Order is how the ring's members are ranked; set it before Form.
	// Every member of a job must use the same (a job config key).
	Order RingOrder
	memo  linkMemo
	// shapeRow, if set, rewrites this member's measures before it signs
	// them: tests give members the links of sites they cannot build on
	// loopback, or make one lie.
	shapeRow func(f *Formation, row []ring.Link)
	// badProbes, set by tests, makes this member send probes no honest
	// one does (too long).
	badProbes bool
	// garbleRows, set by tests, wraps this member's side of the link
	// rows' rings: one that alters what it forwards.
	garbleRows func(ring.Transport) ring.Transport
	// otherRow, set by tests, makes this member sign a second row, so
	// rewritten, for the rows' second ring: one that tells two stories.
	otherRow func(f *Formation, row []ring.Link)
	// Formed, if set, is told the members of every ring connected (from
	// the runner's goroutine): join remembers them (RememberPeers).
	Formed func(members []peer.ID)
}

// NewMembership runs a job's membership through node and links; timeout
// is the job's join timeout.
func NewMembership(node *Node, links *RingLinks, timeout time.Duration) *Membership {
	return &Membership{node: node, links: links, timeout: timeout}
}

// Form joins the job's first ring and connects it. If the ring has formed
// without this peer, it waits as a standby until a member admits it, then
// re-forms with the ring it is admitted to, and says so with admitted.
func (m *Membership) Form(ctx context.Context) (r *ring.Ring, admitted bool, err error) {
	var f *Formation
	for {
		jctx, cancel := context.WithTimeout(ctx, m.timeout)
		f, err = m.node.Join(jctx)
		cancel()
		if !errors.Is(err, ErrStandby) {
			break
		}
		m.node.cfg.Logger.Info().Err(err).Msg("the ring has formed without this peer; waiting as a standby to be admitted at its next step")
		var prev *Formation
		if prev, err = m.node.WaitAdmission(ctx, m.timeout); errors.Is(err, ErrClaimGone) {
			continue // a liar's ring, or one that ended: form again
		}
		if err == nil {
			rctx, cancel := context.WithTimeout(ctx, m.timeout)
			f, err = m.node.Reform(rctx, prev, 1)
			cancel()
			if errors.Is(err, ErrSuperseded) {
				// Admitted too late: the members re-formed without it.
				// Wait for the next admission.
				m.node.cfg.Logger.Info().Err(err).Msg("admitted, but the ring re-formed without this peer first; waiting to be admitted again")
				continue
			}
			admitted = true
		}
		break
	}
	if err != nil {
		return nil, false, err
	}
	r, err = m.connect(ctx, f)
	return r, admitted, err
}

// Reform agrees with the members of the current ring, less those at the
// ranks in gone (leavers, liars), on the next generation and connects it.
// Close the current ring first.
func (m *Membership) Reform(ctx context.Context, minSize int, gone []int) (*ring.Ring, error) {
	var ids []peer.ID
	for _, r := range gone {
		if r < 0 || r >= len(m.cur.Members) {
			return nil, fmt.Errorf("p2p: rank %d to leave out of a ring of %d", r, len(m.cur.Members))
		}
		ids = append(ids, m.cur.Members[r])
	}
	rctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	f, err := m.node.Reform(rctx, m.cur, minSize, ids...)
	if err != nil {
		return nil, err
	}
	return m.connect(ctx, f)
}

// Grow re-forms the current ring with the standbys in add, which every
// member passes alike; with admit (one member: rank 0), this peer first
// tells them they are admitted. Close the current ring first.
func (m *Membership) Grow(ctx context.Context, add []string, admit bool, minSize int) (*ring.Ring, error) {
	grown := slices.Clone(m.cur.Members)
	for _, s := range add {
		id, err := peer.Decode(s)
		if err != nil {
			return nil, fmt.Errorf("p2p: standby %q: %w", s, err)
		}
		if slices.Contains(grown, id) {
			return nil, fmt.Errorf("p2p: standby %s is a member already", id)
		}
		grown = append(grown, id)
	}
	slices.Sort(grown)
	prev := &Formation{Members: grown, Rank: slices.Index(grown, m.node.h.ID()), Generation: m.cur.Generation}
	if admit {
		for _, p := range grown {
			if !slices.Contains(m.cur.Members, p) {
				if err := m.node.Admit(ctx, p, m.cur, grown); err != nil {
					m.node.cfg.Logger.Warn().Err(err).Msg("could not admit a standby")
				}
			}
		}
	}
	rctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	f, err := m.node.Reform(rctx, prev, minSize)
	if err != nil {
		return nil, err
	}
	return m.connect(ctx, f)
}

// Standbys are the verified peers of the job, outside the ring, waiting
// to be admitted.
func (m *Membership) Standbys() []string {
	return idStrings(m.node.Standbys(m.cur.Members))
}

// Distrust leaves the peers caught lying (by what they trained: peer IDs)
// out of every later ring and admission (Node.Distrust); a string that
// is no peer ID is skipped.
func (m *Membership) Distrust(peers []string) {
	var ids []peer.ID
	for _, s := range peers {
		if id, err := peer.Decode(s); err == nil {
			ids = append(ids, id)
		}
	}
	m.node.Distrust(ids)
}

// Ended tells the standbys waiting on the current ring that the job has
// ended (Node.Ended).
func (m *Membership) Ended(ctx context.Context) {
	m.node.Ended(ctx, m.cur.Members, m.cur.Generation)
}

// Members are the current ring's members in rank order.
func (m *Membership) Members() []string { return idStrings(m.cur.Members) }

func (m *Membership) connect(ctx context.Context, f *Formation) (*ring.Ring, error) {
	cctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	f, err := m.Ordered(cctx, f)
	if err != nil {
		return nil, err
	}
	t, err := m.links.Connect(cctx, f)
	if err != nil {
		return nil, err
	}
	r, err := ring.New(t, ring.Config{Rank: f.Rank, Size: len(f.Members), Generation: f.Generation})
	if err != nil {
		if t != nil {
			t.Close()
		}
		return nil, err
	}
	m.cur = f
	if m.Formed != nil {
		m.Formed(f.Members)
	}
	return r, nil
}

// Ordered is formation f (as Node agreed it: members by ID) with its
// members ranked as m.Order says — by ID, or in the order solved from the
// links they measure now, which every member of f must call it for at
// once. Form, Reform and Grow connect the ring so ordered.
func (m *Membership) Ordered(ctx context.Context, f *Formation) (*Formation, error) {
	if m.Order != OrderMeasured || len(f.Members) < 3 {
		return f, nil
	}
	return m.ordered(ctx, f)
}

func idStrings(ps []peer.ID) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// StageRing connects the ring of the current formation's members at ranks
// (increasing, this peer among them): a pipeline stage's ring, beside the
// ring of all.
func (m *Membership) StageRing(ctx context.Context, ranks []int) (*ring.Ring, error) {
	cctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	t, err := m.links.ConnectRing(cctx, m.cur, ChannelStage, ranks)
	if err != nil {
		return nil, err
	}
	r, err := ring.New(t, ring.Config{Rank: slices.Index(ranks, m.cur.Rank), Size: len(ranks), Generation: m.cur.Generation})
	if err != nil && t != nil {
		t.Close()
	}
	return r, err
}

// Boundary connects this peer with the members of the current formation
// at ranks prev and next (−1: none) — the pipeline stages before and
// after its own — a stream each way with each: forward to next and from
// prev, backward to prev and from next.
func (m *Membership) Boundary(ctx context.Context, prev, next int) (toPrev, toNext io.ReadWriteCloser, err error) {
	cctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	type pair struct {
		w   io.WriteCloser
		r   io.ReadCloser
		err error
	}
	var fwd, bwd pair
	var wg sync.WaitGroup
	if prev >= 0 || next >= 0 {
		wg.Go(func() { fwd.w, fwd.r, fwd.err = m.links.Pair(cctx, m.cur, ChannelForward, next, prev) })
		wg.Go(func() { bwd.w, bwd.r, bwd.err = m.links.Pair(cctx, m.cur, ChannelBackward, prev, next) })
	}
	wg.Wait()
	if err := errors.Join(fwd.err, bwd.err); err != nil {
		for _, c := range []io.Closer{fwd.w, fwd.r, bwd.w, bwd.r} {
			if c != nil {
				c.Close()
			}
		}
		return nil, nil, fmt.Errorf("p2p: pipeline boundary links: %w", err)
	}
	if prev >= 0 {
		toPrev = duplex{w: bwd.w, r: fwd.r}
	}
	if next >= 0 {
		toNext = duplex{w: fwd.w, r: bwd.r}
	}
	return toPrev, toNext, nil
}

// DirectLinks opens, over the job's data plane, a link to each member of
// the current formation at the ranks in to, and takes one from each at
// the ranks in from (train.DirectLinker): a newcomer takes its state
// straight from every donor, no member forwarding it. All come, or none.
func (m *Membership) DirectLinks(ctx context.Context, to, from []int) ([]io.WriteCloser, []io.ReadCloser, error) {
	cctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	out := make([]io.WriteCloser, len(to))
	in := make([]io.ReadCloser, len(from))
	errs := make([]error, len(to)+len(from))
	var wg sync.WaitGroup
	for i, k := range to {
		wg.Go(func() { out[i], _, errs[i] = m.links.Pair(cctx, m.cur, ChannelState, k, -1) })
	}
	for i, k := range from {
		wg.Go(func() { _, in[i], errs[len(to)+i] = m.links.Pair(cctx, m.cur, ChannelState, -1, k) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, w := range out {
			if w != nil {
				w.Close()
			}
		}
		for _, r := range in {
			if r != nil {
				r.Close()
			}
		}
		return nil, nil, fmt.Errorf("p2p: direct links: %w", err)
	}
	return out, in, nil
}

// duplex is a link each way between two peers as one stream.
type duplex struct {
	w io.WriteCloser
	r io.ReadCloser
}

func (d duplex) Read(b []byte) (int, error)  { return d.r.Read(b) }
func (d duplex) Write(b []byte) (int, error) { return d.w.Write(b) }
func (d duplex) Close() error                { return errors.Join(d.w.Close(), d.r.Close()) }
