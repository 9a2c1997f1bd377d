package p2p

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/ping"

	"github.com/ringtrain/ringtrain/ring"
)

// RingOrder says how a ring's members are ranked.
type RingOrder int

// Ring orders.
const (
	// OrderMeasured ranks the members by their links: at each formation
	// they measure the links between them, sign what they measured, share
	// it and solve the same order from it (ring.Order).
	OrderMeasured RingOrder = iota
	// OrderID ranks the members by peer ID, whatever their links.
	OrderID
)

// ParseRingOrder reads a ring order's name: measured or id ("" is
// measured).
func ParseRingOrder(s string) (RingOrder, error) {
	switch s {
	case "", "measured":
		return OrderMeasured, nil
	case "id":
		return OrderID, nil
	}
	return 0, fmt.Errorf("p2p: ring order %q; want measured or id", s)
}

// String is the order's name in a job config.
func (o RingOrder) String() string {
	if o == OrderID {
		return "id"
	}
	return "measured"
}

// Bounds of the measuring of links at formation: each member sends each
// other member probeBytes at most, and waits for each round of probes
// probeRound at most (a link too slow to carry its probe in that time is
// measured by what it carried). probePings round trips are timed to each
// member over its libp2p connection, the least taken.
const (
	probeBytes  = 512 << 10
	probeChunk  = 32 << 10
	probeRound  = 2 * time.Second
	probePings  = 3
	probeHeader = 8
	// maxSigSize bounds a link row's signature: an RSA-4096 one is 512
	// bytes, ed25519's 64.
	maxSigSize = 1024
)

// linkMemo is what a Membership keeps of the links it measured in this job:
// the link to it from each peer, by peer; pairs of members that were both
// in the last ring are not probed again.
type linkMemo map[peer.ID]ring.Link

// ordered measures the links of formation f (members sorted by ID), shares
// the signed measures and returns f with its members in the order solved
// from them. Every member of f runs it at once; any that fails leaves the
// others without its links, and the formation fails for all.
func (m *Membership) ordered(ctx context.Context, f *Formation) (*Formation, error) {
	start := time.Now()
	n, me := len(f.Members), f.Rank
	if m.memo == nil {
		m.memo = linkMemo{}
	}
	row := make([]ring.Link, n)
	rtts := make([]uint64, n) // to each member, from the kernel's measure of the probe's connection
	for k := 1; k < n; k++ {
		to, from := (me+k)%n, (me-k+n)%n
		w, r, err := m.links.Pair(ctx, f, ChannelProbe, to, from)
		if err != nil {
			return nil, fmt.Errorf("p2p: probing links: %w", err)
		}
		rtts[to] = uint64(linkRTT(w))
		size := uint32(probeBytes)
		if m.cur != nil && slices.Contains(m.cur.Members, f.Members[to]) && slices.Contains(m.cur.Members, f.Members[me]) {
			size = 0 // measured before
		}
		if m.badProbes {
			size = probeBytes + 1
		}
		bw, err := probe(ctx, w, r, size)
		if err != nil {
			// A probe cut short — a relay's byte limit cuts a relayed
			// link's — or one no honest member sends: the link counts as
			// not measured. A member that is gone fails the rows' ring
			// after.
			const msg = "a link's probe did not come whole; the link counts as not measured"
			m.node.cfg.Logger.Warn().Str("peer", f.Members[from].String()).Err(err).Msg(msg)
			bw = 0
		}
		p := f.Members[from]
		if bw > 0 {
			m.memo[p] = ring.Link{Bandwidth: bw, RTT: m.memo[p].RTT}
		}
		row[from].Bandwidth = m.memo[p].Bandwidth
	}
	for i, rtt := range m.roundTrips(ctx, f, rtts) {
		row[i].RTT = rtt
	}
	if m.shapeRow != nil {
		m.shapeRow(f, row)
	}
	in, err := m.shareRows(ctx, f, row)
	if err != nil {
		return nil, err
	}
	order := ring.Order(in)
	of := &Formation{Members: make([]peer.ID, n), Generation: f.Generation}
	for k, i := range order {
		of.Members[k] = f.Members[i]
		if i == me {
			of.Rank = k
		}
	}
	ident := make([]int, n)
	for i := range ident {
		ident[i] = i
	}
	m.node.cfg.Logger.Info().Uint64("generation", f.Generation).Int("rank", of.Rank).Int("world_size", n).Ints("order", order).
		Float64("slowest_link_mbit", mbit(ring.OrderBottleneck(in, order))).
		Float64("slowest_link_by_id_mbit", mbit(ring.OrderBottleneck(in, ident))).
		Dur("took", time.Since(start)).Msg("ring ordered by measured links")
	return of, nil
}

func mbit(bytesPerSec uint64) float64 { return math.Round(float64(bytesPerSec)*8/1e4) / 100 }

// roundTrips is the round trip to each other member of f: as measured in
// this job before, else known (the kernel's measure of the probe's
// connection to it), else timed over its libp2p connection (ping) within
// probeRound. 0 where none came back.
func (m *Membership) roundTrips(ctx context.Context, f *Formation, known []uint64) []uint64 {
	ctx, cancel := context.WithTimeout(ctx, probeRound)
	defer cancel()
	out := make([]uint64, len(f.Members))
	var wg sync.WaitGroup
	for i, p := range f.Members {
		switch {
		case i == f.Rank:
		case m.memo[p].RTT > 0:
			out[i] = m.memo[p].RTT
		case known[i] > 0:
			out[i] = known[i]
		default:
			wg.Go(func() { out[i] = m.ping(ctx, p) })
		}
	}
	wg.Wait()
	for i, p := range f.Members {
		if out[i] > 0 {
			m.memo[p] = ring.Link{Bandwidth: m.memo[p].Bandwidth, RTT: out[i]}
		}
	}
	return out
}

// ping is the least of probePings round trips to p over its libp2p
// connection (libp2p ping), 0 if none came back.
func (m *Membership) ping(ctx context.Context, p peer.ID) uint64 {
	var least time.Duration
	got := 0
	for res := range ping.Ping(ctx, m.node.h, p) {
		if res.Error != nil {
			break
		}
		if got == 0 || res.RTT < least {
			least = res.RTT
		}
		if got++; got == probePings {
			break
		}
	}
	if got == 0 {
		return 0
	}
	return uint64(max(least, 1))
}

// linkRTT is the kernel's round trip of a data-plane link's (first) TCP
// connection, 0 where it has none (a libp2p stream).
func linkRTT(w io.Writer) time.Duration {
	switch c := w.(type) {
	case *stripedWriter:
		return linkRTT(c.parts[0])
	case *secureConn:
		return connRTT(c.raw)
	case net.Conn:
		return connRTT(c)
	}
	return 0
}

// probe sends size bytes (0: none, the link measured before) on w while
// it times the probe that comes on r, and returns the bandwidth that
// probe came at: 0 if the sender skipped it. w and r are closed after.
func probe(ctx context.Context, w io.WriteCloser, r io.ReadCloser, size uint32) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, probeRound)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { w.Close(); r.Close() })
	defer stop()
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		var h [probeHeader]byte
		binary.LittleEndian.PutUint32(h[:], size)
		if _, err := w.Write(h[:]); err != nil {
			return
		}
		chunk := make([]byte, probeChunk)
		for left := int(size); left > 0; left -= probeChunk {
			if _, err := w.Write(chunk[:min(left, probeChunk)]); err != nil {
				return
			}
		}
	}()
	bw, err := timeProbe(ctx, r)
	<-sent
	w.Close()
	r.Close()
	return bw, err
}

// timeProbe reads one probe and measures it from the end of its header to
// its last byte; a probe cut by the round's end is measured by what came.
func timeProbe(ctx context.Context, r io.Reader) (uint64, error) {
	var h [probeHeader]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, fmt.Errorf("its probe's header: %w", err)
	}
	size := binary.LittleEndian.Uint32(h[:])
	if size > probeBytes || binary.LittleEndian.Uint32(h[4:]) != 0 {
		return 0, fmt.Errorf("%w: %d bytes, at most %d, and its reserved word %#x", errBadProbe, size, probeBytes, binary.LittleEndian.Uint32(h[4:]))
	}
	if size == 0 {
		return 0, nil
	}
	start := time.Now()
	buf := make([]byte, probeChunk)
	got := 0
	for got < int(size) {
		k, err := r.Read(buf[:min(len(buf), int(size)-got)])
		got += k
		if err != nil {
			if ctx.Err() != nil && got > 0 {
				break // too slow for the round: measured by what came
			}
			return 0, fmt.Errorf("its probe after %d bytes: %w", got, err)
		}
	}
	took := max(time.Since(start), time.Microsecond)
	return uint64(float64(got) / took.Seconds()), nil
}

// rowSize is a link row's size in bytes: bandwidth and round trip per
// member.
func rowSize(n int) int { return 16 * n }

// rowDigest is what a member signs of its row: the job, the generation,
// the members and the row.
func rowDigest(key []byte, f *Formation, signer int, row []byte) []byte {
	h := hmac.New(sha256.New, key)
	var b []byte
	b = append(b, "ringtrain links\x00"...)
	b = binary.LittleEndian.AppendUint64(b, f.Generation)
	b = binary.AppendUvarint(b, uint64(signer))
	b = binary.AppendUvarint(b, uint64(len(f.Members)))
	for _, p := range f.Members {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	h.Write(b)
	h.Write(row)
	return h.Sum(nil)
}

func encodeRow(row []ring.Link) []byte {
	b := make([]byte, 0, rowSize(len(row)))
	for _, l := range row {
		b = binary.LittleEndian.AppendUint64(b, l.Bandwidth)
		b = binary.LittleEndian.AppendUint64(b, l.RTT)
	}
	return b
}

func decodeRow(b []byte) []ring.Link {
	row := make([]ring.Link, len(b)/16)
	for i := range row {
		row[i] = ring.Link{Bandwidth: binary.LittleEndian.Uint64(b[16*i:]), RTT: binary.LittleEndian.Uint64(b[16*i+8:])}
	}
	return row
}

// errBadProbe means a link probe's header is out of bounds.
var errBadProbe = errors.New("p2p: a malformed link probe")

// errBadRow means a member's signed link row did not check out.
var errBadRow = errors.New("p2p: a link row that does not check out")

// shareRows signs this member's row and gathers every member's twice, in a
// ring allgather over the members by ID (ChannelRows) and in one over them
// the other way round (ChannelRowsBack), and returns the rows that every
// honest member takes alike. A row comes by two paths that share no member
// but its signer and its reader, so a member that alters rows it forwards
// (caught by their signatures) breaks at most one copy of each: every
// other member's row is whole in at least one. What a member sends of its
// own reaches every member unaltered both ways, so one that signed two
// rows is seen to by all: its row counts as not measured everywhere, as
// does one that came whole neither way. No member's word on what it found
// is needed, which one forwarding it could alter for the members after it.
func (m *Membership) shareRows(ctx context.Context, f *Formation, row []ring.Link) ([][]ring.Link, error) {
	n := len(f.Members)
	signed := func(row []ring.Link) ([]byte, error) {
		b := encodeRow(row)
		sig, err := m.node.priv.Sign(rowDigest(m.node.key, f, f.Rank, b))
		if err != nil {
			return nil, fmt.Errorf("p2p: signing the link row: %w", err)
		}
		if len(sig) > maxSigSize {
			return nil, fmt.Errorf("p2p: a link row's signature of %d bytes", len(sig))
		}
		return append(append(binary.LittleEndian.AppendUint32(nil, uint32(len(sig))), b...), sig...), nil
	}
	mine, err := signed(row)
	if err != nil {
		return nil, err
	}
	back, other := mine, row
	if m.otherRow != nil {
		other = slices.Clone(row)
		m.otherRow(f, other)
		if back, err = signed(other); err != nil {
			return nil, err
		}
	}
	byID, reversed := make([]int, n), make([]int, n)
	for i := range n {
		byID[i], reversed[i] = i, n-1-i
	}
	var got [2][][]byte
	var errs [2]error
	var wg sync.WaitGroup
	wg.Go(func() { got[0], errs[0] = m.gatherRows(ctx, f, ChannelRows, byID, mine) })
	wg.Go(func() { got[1], errs[1] = m.gatherRows(ctx, f, ChannelRowsBack, reversed, back) })
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("p2p: sharing link rows: %w", err)
	}
	in := make([][]ring.Link, n)
	for root := range n {
		copies := [][]ring.Link{row, other} // what it sent, which the others take by the same rule
		var why []error
		if root != f.Rank {
			copies, why = m.checkCopies(f, root, got[0][root], got[1][root])
		}
		var taken bool
		if in[root], taken = rowOf(n, copies); !taken && len(copies) == 2 {
			why = append(why, fmt.Errorf("%w: rank %d (%s) signed two rows", errBadRow, root, f.Members[root]))
		}
		if len(why) > 0 {
			const msg = "a link row did not check out"
			m.node.cfg.Logger.Warn().Uint64("generation", f.Generation).Err(errors.Join(why...)).Bool("taken", taken).Msg(msg)
		}
	}
	return in, nil
}

// checkCopies checks the two copies of the row of the member at rank root
// of f, byID from this member's predecessor by ID and back from its
// successor, and returns those that check out and why the others did not.
func (m *Membership) checkCopies(f *Formation, root int, byID, back []byte) ([][]ring.Link, []error) {
	n := len(f.Members)
	pub := m.node.h.Peerstore().PubKey(f.Members[root])
	var copies [][]ring.Link
	var why []error
	for d, b := range [][]byte{byID, back} {
		r, err := checkRow(m.node.key, f, root, pub, b)
		if err != nil {
			why = append(why, fmt.Errorf("%w, by way of rank %d", err, []int{(f.Rank - 1 + n) % n, (f.Rank + 1) % n}[d]))
			continue
		}
		copies = append(copies, r)
	}
	return copies, why
}

// rowOf is the row a member takes from the copies of another's that
// checked out: the one, or both if they are the same; else a row of n
// links not measured, and false.
func rowOf(n int, copies [][]ring.Link) ([]ring.Link, bool) {
	if len(copies) == 0 || len(copies) == 2 && !slices.Equal(copies[0], copies[1]) {
		return make([]ring.Link, n), false
	}
	return copies[0], true
}

// gatherRows gathers the members' signed rows (mine this member's) in a
// ring allgather over a ring of their own on channel ch, the members at
// ranks in its order, and returns each member's bytes by its rank in f.
func (m *Membership) gatherRows(ctx context.Context, f *Formation, ch Channel, ranks []int, mine []byte) ([][]byte, error) {
	n := len(f.Members)
	t, err := m.links.ConnectRing(ctx, f, ch, ranks)
	if err != nil {
		return nil, fmt.Errorf("the link rows' ring: %w", err)
	}
	if m.garbleRows != nil {
		t = m.garbleRows(t)
	}
	me := slices.Index(ranks, f.Rank)
	rr, err := ring.New(t, ring.Config{Rank: me, Size: n, Generation: f.Generation})
	if err != nil {
		t.Close()
		return nil, err
	}
	defer rr.Close()
	seg := (4 + rowSize(n) + maxSigSize + 3) / 4
	buf := make([]float32, n*seg)
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), len(buf)*4)
	copy(raw[me*4*seg:(me+1)*4*seg], mine)
	counts := make([]int, n)
	for k := range counts {
		counts[k] = seg
	}
	if err := rr.Allgather(ctx, buf, counts); err != nil {
		return nil, err
	}
	out := make([][]byte, n)
	for k, rank := range ranks {
		out[rank] = raw[k*4*seg : (k+1)*4*seg]
	}
	return out, nil
}

// checkRow reads the row of the member at rank root of f from b (the
// signature's length, the row, the signature) and checks its signature
// with pub, the member's key.
func checkRow(key []byte, f *Formation, root int, pub crypto.PubKey, b []byte) ([]ring.Link, error) {
	n := len(f.Members)
	if len(b) < 4+rowSize(n) || pub == nil {
		return nil, fmt.Errorf("%w: rank %d's (%s) is short or its key unknown", errBadRow, root, f.Members[root])
	}
	sl := int(binary.LittleEndian.Uint32(b))
	got, sig := b[4:4+rowSize(n)], b[4+rowSize(n):]
	if sl > min(maxSigSize, len(sig)) {
		return nil, fmt.Errorf("%w: rank %d's (%s) signature of %d bytes", errBadRow, root, f.Members[root], sl)
	}
	if ok, err := pub.Verify(rowDigest(key, f, root, got), sig[:sl]); err != nil || !ok {
		return nil, fmt.Errorf("%w: rank %d's (%s) signature", errBadRow, root, f.Members[root])
	}
	return decodeRow(got), nil
}
