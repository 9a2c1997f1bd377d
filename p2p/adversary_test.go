package p2p

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/ring"
)

// rawHello sends req from h to p on proto, as an attacker's own code would,
// and returns the answer and its bytes as they came.
func rawHello(t *testing.T, h *Host, p peer.ID, proto protocol.ID, req *Hello) (*Hello, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := h.NewStream(ctx, p, proto)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(5 * time.Second))
	if err := writeHello(s, req); err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(s)
	if err != nil || len(raw) == 0 {
		return nil, raw // cut off
	}
	resp, err := readHello(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("answer %q: %v", raw, err)
	}
	return resp, raw
}

// outsider starts a host that knows the swarm's first host and nothing of
// the job.
func outsider(t *testing.T, boot *Host) *Host {
	t.Helper()
	h, err := NewHost(context.Background(), HostConfig{Listen: loopback, Bootstrap: []peer.AddrInfo{info(boot)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestOutsiderLearnsNothing: a peer without the job — any job name, no
// proof, an echo of what it was told, or a proof a member made for it and
// replayed to another member — is refused with words that name nothing of
// the job, and hears no member, address or proposal. Before hellos carried
// proofs, the refusal named the job's real name, config hash and world
// size, and echoing them back made the stranger verified.
func TestOutsiderLearnsNothing(t *testing.T) {
	j := job
	j.WorldSize = 2
	s := swarm(t, 2, j)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Join(ctx); err != nil {
		t.Fatal(err)
	}
	x := outsider(t, s.Hosts[0])
	a, b := s.Hosts[0].ID(), s.Hosts[1].ID()
	x.Peerstore().AddAddrs(b, s.Hosts[1].Addrs(), time.Minute) // as the DHT would give it
	replayed := proof(jobKey(j), a, x.ID())                    // what a says when it greets x, found in the DHT
	var echoed *Hello
	for _, tc := range []struct {
		name string
		req  func() *Hello
	}{
		{"any job, no proof", func() *Hello { return &Hello{Version: ProtocolVersion} }},
		{"a made-up proof", func() *Hello { return &Hello{Version: ProtocolVersion, Proof: proof([]byte("guess"), x.ID(), b)} }},
		{"echo of the refusal", func() *Hello { return echoed }},
		{"a's proof to x, replayed to b", func() *Hello { return &Hello{Version: ProtocolVersion, Proof: replayed} }},
		{"a's proof to x, sent back to a", func() *Hello { return &Hello{Version: ProtocolVersion, Proof: replayed} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to := b
			if tc.name == "a's proof to x, sent back to a" {
				to = a
			}
			req := tc.req()
			if req == nil {
				req = &Hello{Version: ProtocolVersion}
			}
			resp, raw := rawHello(t, x, to, HelloProtocol, req)
			if resp == nil || resp.Refused != refusal || resp.Members != nil || resp.Proposal != nil || resp.Proof != "" || resp.Ready || resp.Formed {
				t.Errorf("answer %+v; want a bare refusal", resp)
			}
			for _, secret := range []string{j.Name, j.ConfigHash[:16], a.String(), "world", "127.0.0.1"} {
				if bytes.Contains(raw, []byte(secret)) {
					t.Errorf("the answer %q holds %q", raw, secret)
				}
			}
			echoed = resp
		})
	}
	for i, n := range s.Nodes {
		if slices.Contains(n.Standbys(nil), x.ID()) || n.Expects(1, x.ID()) {
			t.Errorf("node %d takes the outsider for a standby or a ring member", i)
		}
	}
}

// member is a raw host that holds the job key — a member of the job that
// runs its own code.
type member struct {
	*Host
	key []byte
}

func (m member) hello(to peer.ID, prop []peer.ID, ready bool) *Hello {
	h := &Hello{Version: ProtocolVersion, Proof: proof(m.key, m.ID(), to)}
	h.setProposal(Proposal{Gen: 1, Members: prop, Ready: ready}, &idNames{})
	return h
}

// TestMemberCannotForceABadRing: a member that proposes, ready, a ring with
// itself twice ([victim, A, A]) or with a peer nobody verified, cannot make
// the victim form it. Before proposals were checked, the first made the
// victim form a 3-ring with A twice.
func TestMemberCannotForceABadRing(t *testing.T) {
	j := job
	j.WorldSize = 3
	s := swarm(t, 1, j)
	victim := s.Nodes[0]
	liar := member{outsider(t, s.Hosts[0]), jobKey(j)}
	ghost := outsider(t, s.Hosts[0]) // a real peer that never says hello
	v, a := s.Hosts[0].ID(), liar.ID()
	twice := []peer.ID{v, a, a}
	slices.Sort(twice)
	withGhost := []peer.ID{v, a, ghost.ID()}
	slices.Sort(withGhost)
	for _, prop := range [][]peer.ID{twice, withGhost} {
		resp, _ := rawHello(t, liar.Host, v, HelloProtocol, liar.hello(v, prop, true))
		if resp == nil || resp.Refused != "" {
			t.Fatalf("the victim refuses a member's hello: %+v", resp)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	f, err := victim.Join(ctx)
	if f != nil || !errors.Is(err, ErrJoinTimeout) {
		t.Errorf("victim's Join = %+v, %v; want no ring (ErrJoinTimeout)", f, err)
	}
}

// TestRingLinksRefuseStrangers: ring links opened by a peer that is not a
// member of the ring — 70 of them, each of another generation — are cut
// off, and the members' own links still connect and carry an allreduce.
// Before the gate, 64 such links filled the inbox and every later Connect
// failed with "too many ring links waiting". A member that asks for the TCP
// plane of a job on libp2p streams is refused, and no TCP listener opens.
func TestRingLinksRefuseStrangers(t *testing.T) {
	j := job
	j.WorldSize = 2
	s := swarm(t, 2, j)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Join(ctx); err != nil {
		t.Fatal(err)
	}
	links := make([]*RingLinks, 2)
	for i, h := range s.Hosts {
		links[i] = NewRingLinks(h, s.Nodes[i], LinksConfig{Logger: zerolog.Nop()})
		t.Cleanup(links[i].Close)
	}
	x := outsider(t, s.Hosts[0])
	open := func(from *Host, to peer.ID, gen uint64, plane DataPlane, ch ...Channel) error {
		st, err := from.NewStream(ctx, to, RingProtocol)
		if err != nil {
			return err
		}
		defer st.Close()
		var b [linkHello]byte
		binary.LittleEndian.PutUint32(b[0:], linkMagic)
		binary.LittleEndian.PutUint64(b[8:], gen)
		binary.LittleEndian.PutUint32(b[16:], uint32(plane))
		if len(ch) > 0 {
			binary.LittleEndian.PutUint32(b[20:], uint32(ch[0]))
		}
		st.Write(b[:])
		st.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = st.Read(make([]byte, 1))
		return err
	}
	for gen := range uint64(70) {
		if err := open(x, s.Hosts[0].ID(), gen, PlaneLibp2p); err == nil {
			t.Fatalf("a stranger's ring link of generation %d was not cut off", gen)
		}
	}
	if err := open(s.Hosts[1], s.Hosts[0].ID(), 1, PlaneTCP); err == nil {
		t.Error("a ring link asking for the TCP plane of a libp2p job was not cut off")
	}
	if err := open(s.Hosts[1], s.Hosts[0].ID(), 1, PlaneLibp2p, maxChannel+1); err == nil {
		t.Error("a member's ring link on an unknown channel was not cut off")
	}
	links[0].mu.Lock()
	ln, waiting := links[0].ln, len(links[0].inbox)
	links[0].mu.Unlock()
	if ln != nil || waiting != 0 {
		t.Errorf("after the strangers: TCP listener %v, %d links waiting; want none and none", ln, waiting)
	}
	ts := make([]ring.Transport, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { ts[s.Formations[i].Rank], errs[i] = links[i].Connect(ctx, s.Formations[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("the members' Connect after the strangers: %v", err)
	}
	sums := make([][]float32, 2)
	for r := range 2 {
		wg.Go(func() {
			rg, err := ring.New(ts[r], ring.Config{Rank: r, Size: 2, Generation: 1})
			if err != nil {
				t.Error(err)
				return
			}
			defer rg.Close()
			sums[r] = []float32{float32(r + 1)}
			errs[r] = rg.AllreduceSum(ctx, sums[r])
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil || sums[0][0] != 3 || sums[1][0] != 3 {
		t.Errorf("allreduce after the strangers: %v, %v; want 3 on both", sums, err)
	}
}

// TestPeerStateBounded: a node remembers at most MaxPeers peers however
// many strangers greet it.
func TestPeerStateBounded(t *testing.T) {
	hs := startHosts(t, 1, nil)
	n, err := NewNode(hs[0], job, NodeConfig{MaxPeers: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for range 6 {
		x := outsider(t, hs[0])
		rawHello(t, x, hs[0].ID(), HelloProtocol, &Hello{Version: ProtocolVersion})
	}
	n.mu.Lock()
	got := len(n.peers)
	n.mu.Unlock()
	if got > 3 {
		t.Errorf("a node with MaxPeers 3 remembers %d peers after 6 strangers", got)
	}
}

// nodeAndMember starts size hosts for a job of that world size: a node on
// the first, a member (key, own code) on the second, the rest bare.
func nodeAndMember(t *testing.T, size int) ([]*Host, *Node, member) {
	t.Helper()
	j := job
	j.WorldSize = size
	hs := startHosts(t, size, nil)
	return hs, startNodes(t, hs[:1], j)[0], member{hs[1], jobKey(j)}
}

// TestOvertakenProposalIsIgnored: hellos cross, so a peer's answer written
// before it got ready can arrive after its hello that says ready. The older
// one, by Seq, must not undo the newer: before Seq, the node went back to
// taking the peer for not ready, and waited a refresh to hear it again.
func TestOvertakenProposalIsIgnored(t *testing.T) {
	hs, n, m := nodeAndMember(t, 2)
	ring := []peer.ID{hs[0].ID(), hs[1].ID()}
	slices.Sort(ring)
	newer, older := m.hello(hs[0].ID(), ring, true), m.hello(hs[0].ID(), ring, false)
	newer.Seq, older.Seq = 7, 6
	n.learn(m.ID(), newer)
	n.learn(m.ID(), older)
	n.mu.Lock()
	defer n.mu.Unlock()
	if v := n.join.views[m.ID()]; !v.Ready {
		t.Errorf("after a ready hello and then an older one, the node holds %+v; want the ready one", v)
	}
}

// TestFailedPeerIsTriedAgainWhenVouchedFor: a peer whose first hello failed
// is greeted again once a verified peer vouches for it after the back-off.
// Before, it stayed remembered and never greeted again, and a 64-peer
// formation on a loaded machine timed out with pairs that never met.
func TestFailedPeerIsTriedAgainWhenVouchedFor(t *testing.T) {
	hs, n, m := nodeAndMember(t, 3)
	failed := hs[2].ID()
	n.mu.Lock()
	n.peers[failed] = &peerInfo{seen: time.Now(), deadUntil: time.Now().Add(-time.Second), deadFor: 2 * time.Second}
	n.mu.Unlock()
	h := m.hello(hs[0].ID(), nil, false)
	h.Members = []Member{{ID: failed.String()}}
	n.learn(m.ID(), h)
	n.mu.Lock()
	defer n.mu.Unlock()
	if !slices.Contains(n.pending, failed) {
		t.Errorf("pending %v after a verified peer vouched for %s, whose hello failed a while ago; want it greeted again", n.pending, failed)
	}
}

// TestRestartedPeerIsNewsAgain: a peer started again with the same identity
// knows nothing of what its last process was told, and the others knew it
// as one of theirs. A hello of a new incarnation makes it news both ways:
// the node tells it of every member again (with addresses), and tells the
// other members of it. Without that, neither happens: the restarted peer
// cannot reach rank 0 ("no addresses"), rank 0 never hears of it, and it
// waits as a standby until the job ends.
func TestRestartedPeerIsNewsAgain(t *testing.T) {
	hs, n, m := nodeAndMember(t, 3)
	other := hs[2].ID()
	first := m.hello(hs[0].ID(), nil, false)
	first.Incarnation = 100
	n.learn(m.ID(), first)
	n.mu.Lock()
	pi := n.peers[m.ID()]
	if pi == nil || !pi.verified {
		n.mu.Unlock()
		t.Fatal("the member's hello did not verify it")
	}
	n.peers[other] = &peerInfo{verified: true, seen: time.Now(), knows: map[peer.ID]bool{m.ID(): true}, hasStmt: map[peer.ID]uint64{m.ID(): 3}}
	n.stmts[other] = &signed{}
	pi.knows[other] = true
	n.mu.Unlock()
	for _, tc := range []struct {
		incarnation uint64
		reborn      bool
	}{
		{100, false}, // the same process again
		{0, false},   // a hello that says nothing of it
		{200, true},  // started again
	} {
		h := m.hello(hs[0].ID(), nil, false)
		h.Incarnation = tc.incarnation
		n.learn(m.ID(), h)
		n.mu.Lock()
		news := n.newsLocked(m.ID(), pi)
		otherKnows := n.peers[other].knows[m.ID()]
		n.mu.Unlock()
		if got := slices.Contains(news, other); got != tc.reborn {
			t.Errorf("incarnation %d: the other member is news to it = %v; want %v", tc.incarnation, got, tc.reborn)
		}
		if otherKnows == tc.reborn {
			t.Errorf("incarnation %d: the other member knows of it = %v; want %v", tc.incarnation, otherKnows, !tc.reborn)
		}
	}
}

// FuzzLinkHello: whatever a ring link's opener says first is a hello whose
// fields are in range, that encodes back to the same bytes, or an error.
func FuzzLinkHello(f *testing.F) {
	f.Add(linkHelloMsg{rank: 3, gen: 7, plane: PlaneTCP, ch: ChannelBackward}.encode())
	f.Add(make([]byte, linkHello))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseLinkHello(b)
		if err != nil {
			return
		}
		if m.rank < 0 || m.rank >= maxHelloPeers || m.ch > maxChannel {
			t.Fatalf("a hello out of range passed: %+v", m)
		}
		if !bytes.Equal(m.encode(), b) {
			t.Fatalf("%+v encodes to other bytes", m)
		}
	})
}

// TestFormedClaimCannotHoldAJob: peers that know the job (its name, config
// hash and world size, all on the join command) claim that a ring of a far
// later generation trains without the honest peers — one liar of a ring of
// itself at generation 2^62, and three sybils of a ring of themselves —
// and then go. The honest peers form their ring all the same: the lone
// liar's claim is refused, the sybils' is taken back once their ring never
// shows itself. Before claims were proved, one such hello held every
// honest peer as a standby past its join timeout.
func TestFormedClaimCannotHoldAJob(t *testing.T) {
	slow(t)
	for _, tc := range []struct {
		name   string
		sybils int
		gen    uint64
	}{
		{"one liar, generation 2^62", 1, 1 << 62},
		{"three sybils, generation 5", 3, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := job
			j.WorldSize, j.MinWorldSize = 3, 3
			if tc.sybils == 1 {
				j.MinWorldSize = 1 // the liar's ring of one is of an allowed size: only its generation gives it away
			}
			hs := startHosts(t, 3, nil)
			nodes := make([]*Node, 3)
			for i, h := range hs {
				n, err := NewNode(h, j, NodeConfig{ClaimTimeout: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				nodes[i] = n
				t.Cleanup(n.Close)
			}
			liars := make([]member, tc.sybils)
			var fake []peer.ID
			for i := range liars {
				liars[i] = member{outsider(t, hs[0]), jobKey(j)}
				fake = append(fake, liars[i].ID())
			}
			slices.Sort(fake)
			for _, l := range liars {
				for _, h := range hs {
					l.Peerstore().AddAddrs(h.ID(), h.Addrs(), time.Minute)
					req := &Hello{Version: ProtocolVersion, Proof: proof(l.key, l.ID(), h.ID())}
					req.setProposal(Proposal{Gen: tc.gen, Members: fake, Ready: true, Formed: true}, &idNames{})
					if resp, _ := rawHello(t, l.Host, h.ID(), HelloProtocol, req); resp == nil || resp.Refused != "" {
						t.Fatalf("a peer of the job refuses the liar's hello: %+v", resp)
					}
				}
			}
			for _, l := range liars {
				l.Close() // the liars go
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rings := make([]*ring.Ring, 3)
			errs := make([]error, 3)
			var wg sync.WaitGroup
			for i, h := range hs {
				links := NewRingLinks(h, nodes[i], LinksConfig{Logger: zerolog.Nop()})
				t.Cleanup(links.Close)
				m := NewMembership(nodes[i], links, 20*time.Second)
				wg.Go(func() { rings[i], _, errs[i] = m.Form(ctx) })
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("peer %d: %v; want the honest ring formed", i, err)
				}
				if rings[i].Size() != 3 {
					t.Errorf("peer %d is in a ring of %d; want the 3 honest peers", i, rings[i].Size())
				}
				rings[i].Close()
			}
		})
	}
}
