package p2p

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

func newKey(t *testing.T) (crypto.PrivKey, peer.ID) {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return k, id
}

// TestStatementsCheckOut: a statement passed on through a hello's JSON
// verifies as its maker's, and any change to what it says — or a maker
// other than the signer, or another job's key — is ErrBadStatement.
func TestStatementsCheckOut(t *testing.T) {
	key, other := jobKey(job), jobKey(Job{Name: "other", ConfigHash: job.ConfigHash, WorldSize: job.WorldSize})
	priv, self := newKey(t)
	_, b := newKey(t)
	_, c := newKey(t)
	ring := []peer.ID{self, b, c}
	slices.Sort(ring)
	good, err := sign(priv, key, self, 7, Proposal{Gen: 1, Members: ring, Ready: true})
	if err != nil {
		t.Fatal(err)
	}
	// Through a hello and its JSON, as a relaying peer passes it on.
	names := &idNames{}
	h := &Hello{Version: ProtocolVersion}
	h.putStatements([]peer.ID{self}, []*signed{good}, names)
	raw, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	back, err := decodeHello(raw)
	if err != nil {
		t.Fatal(err)
	}
	from, got, err := back.statement(0, names)
	if err != nil || from != self {
		t.Fatalf("decoding a statement: %s, %v", from, err)
	}
	if err := got.verify(key, from, nil); err != nil {
		t.Fatalf("a good statement passed on: %v", err)
	}
	swapped := slices.Clone(ring)
	swapped[0], swapped[1] = swapped[1], swapped[0]
	for _, tc := range []struct {
		name   string
		change func(s *signed) (peer.ID, []byte)
	}{
		{"a higher seq", func(s *signed) (peer.ID, []byte) { s.seq++; return self, key }},
		{"another generation", func(s *signed) (peer.ID, []byte) { s.prop.Gen = 2; return self, key }},
		{"not ready", func(s *signed) (peer.ID, []byte) { s.prop.Ready = false; return self, key }},
		{"formed", func(s *signed) (peer.ID, []byte) { s.prop.Formed = true; return self, key }},
		{"members reordered", func(s *signed) (peer.ID, []byte) { s.prop.Members = swapped; return self, key }},
		{"a member fewer", func(s *signed) (peer.ID, []byte) { s.prop.Members = ring[:2]; return self, key }},
		{"a flipped signature bit", func(s *signed) (peer.ID, []byte) { s.sig[3] ^= 1; return self, key }},
		{"no signature", func(s *signed) (peer.ID, []byte) { s.sig = nil; return self, key }},
		{"claimed for another peer", func(s *signed) (peer.ID, []byte) { return b, key }},
		{"checked under another job's key", func(s *signed) (peer.ID, []byte) { return self, other }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &signed{seq: got.seq, prop: Proposal{Gen: got.prop.Gen, Members: slices.Clone(got.prop.Members), Ready: got.prop.Ready},
				sig: slices.Clone(got.sig)}
			from, k := tc.change(s)
			if err := s.verify(k, from, nil); !errors.Is(err, ErrBadStatement) {
				t.Errorf("verify = %v; want ErrBadStatement", err)
			}
		})
	}
	for _, bad := range []Statement{
		{From: "not-a-peer-id", Ring: -1},
		{From: self.String(), Ring: 1},
		{From: self.String(), Ring: -2},
	} {
		h := &Hello{Statements: []Statement{bad}, Rings: [][]string{{"not-a-peer-id"}}}
		if _, _, err := h.statement(0, names); !errors.Is(err, ErrBadStatement) {
			t.Errorf("statement %+v: %v; want ErrBadStatement", bad, err)
		}
	}
	h = &Hello{Statements: []Statement{{From: self.String(), Ring: 0}}, Rings: [][]string{{"not-a-peer-id"}}}
	if _, _, err := h.statement(0, names); !errors.Is(err, ErrBadStatement) {
		t.Errorf("a ring holding a malformed ID: %v; want ErrBadStatement", err)
	}
}

// TestRingFormsOverAStar: two peers that cannot connect to each other (each
// admits only the first) form a ring of three with it, because the first
// passes their signed statements on. Before statements, every pair of
// peers had to exchange hellos, so this ring never formed — and a 32-peer
// formation needed 496 connections where a star needs 31.
func TestRingFormsOverAStar(t *testing.T) {
	ctx := context.Background()
	hub, err := NewHost(ctx, HostConfig{Listen: loopback})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hub.Close() })
	hs := []*Host{hub}
	for range 2 {
		h, err := NewHost(ctx, HostConfig{Listen: loopback, Bootstrap: []peer.AddrInfo{info(hub)}, Allow: []peer.ID{hub.ID()}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		hs = append(hs, h)
	}
	j := job
	j.WorldSize = 3
	ns := startNodes(t, hs, j)
	jctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	fs := make([]*Formation, 3)
	errs := make([]error, 3)
	done := make(chan struct{})
	for i, n := range ns {
		go func() {
			fs[i], errs[i] = n.Join(jctx)
			done <- struct{}{}
		}()
	}
	for range ns {
		<-done
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i, f := range fs {
		if !slices.Equal(f.Members, fs[0].Members) || f.Members[f.Rank] != hs[i].ID() {
			t.Errorf("peer %d formed %+v; peer 0 %+v", i, f, fs[0])
		}
	}
	if hs[1].Network().Connectedness(hs[2].ID()) == network.Connected {
		t.Errorf("the two peers that admit only the first are connected")
	}
}

// TestForgedStatementIsIgnored: a member that passes on a statement it
// altered — a peer made ready on a ring it never proposed — gets nothing
// into the agreement; the same statement unaltered is taken.
func TestForgedStatementIsIgnored(t *testing.T) {
	hs, n, m := nodeAndMember(t, 3)
	priv := hs[2].Peerstore().PrivKey(hs[2].ID())
	victim := hs[2].ID()
	ring := []peer.ID{hs[0].ID(), hs[1].ID(), victim}
	slices.Sort(ring)
	st, err := sign(priv, m.key, victim, 5, Proposal{Gen: 1, Members: ring})
	if err != nil {
		t.Fatal(err)
	}
	forged := &signed{seq: 6, prop: Proposal{Gen: 1, Members: ring, Ready: true}, sig: st.sig}
	names := &idNames{}
	for _, tc := range []struct {
		s     *signed
		taken bool
	}{{forged, false}, {st, true}} {
		h := m.hello(hs[0].ID(), nil, false)
		h.putStatements([]peer.ID{victim}, []*signed{tc.s}, names)
		n.learn(m.ID(), h)
		n.mu.Lock()
		v, ok := n.join.views[victim]
		n.mu.Unlock()
		if ok != tc.taken || ok && (v.Ready || !slices.Equal(v.Members, ring)) {
			t.Errorf("after a statement %+v passed on by a member, the node holds %+v (%t); want taken %t, not ready", tc.s.prop, v, ok, tc.taken)
		}
	}
}

// TestLateStandbyIsKnownToEveryMember: a peer that comes after the ring
// formed, knowing only one member (not necessarily rank 0, who admits),
// is counted a standby by every member while it waits. Before standbys
// greeted the members they know only from statements, only its bootstrap
// member heard from it, and rank 0 never admitted it (the netns test's
// replacement waited until the job ended).
func TestLateStandbyIsKnownToEveryMember(t *testing.T) {
	lateStandby(t)
}

// lateStandby forms a ring of 3 and starts a late peer bootstrapped from
// the member with the highest ID (never rank 0, who admits); it returns
// once every member counts the late peer a standby, with the ring, the
// late peer's host and the ring's members.
func lateStandby(t *testing.T) (*localSwarm, *Host, []peer.ID) {
	t.Helper()
	j := job
	j.WorldSize = 3
	s := swarm(t, 3, j)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	if err := s.Join(ctx); err != nil {
		t.Fatal(err)
	}
	members := s.Formations[0].Members
	last := slices.IndexFunc(s.Hosts, func(h *Host) bool { return h.ID() == members[len(members)-1] })
	h, err := NewHost(ctx, HostConfig{Listen: loopback, Bootstrap: []peer.AddrInfo{info(s.Hosts[last])}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	late := startNodes(t, []*Host{h}, j)[0]
	if _, err := late.Join(ctx); !errors.Is(err, ErrStandby) {
		t.Fatalf("late peer's Join = %v; want ErrStandby", err)
	}
	go late.WaitAdmission(ctx, time.Minute)
	for i, n := range s.Nodes {
		for !slices.Contains(n.Standbys(members), h.ID()) {
			select {
			case <-ctx.Done():
				t.Fatalf("member %d never counts the late peer a standby", i)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return s, h, members
}

// TestPokeWakesEveryLoop: news wakes both a Join or Reform loop and
// passOn, which run at once after a formation. On one channel passOn took
// the pokes a re-formation waited for, and SIGKILL to the first step of
// the new ring went from 84 to 181 ms in bench-elastic.
func TestPokeWakesEveryLoop(t *testing.T) {
	n := startNodes(t, startHosts(t, 1, nil), job)[0]
	n.poke()
	for _, c := range []struct {
		name string
		ch   chan struct{}
	}{{"Join and Reform's", n.kick}, {"passOn's", n.relay}} {
		select {
		case <-c.ch:
		default:
			t.Errorf("a poke left %s channel empty", c.name)
		}
	}
}

// FuzzStatements feeds the statements of a hello — the signed proposals a
// member passes on for others — whatever a peer may send: each is read
// and checked against the job key, and only one its maker really signed
// passes; none panics.
func FuzzStatements(f *testing.F) {
	// The same key in every fuzzing process: the seed is made in each.
	priv, _, err := crypto.GenerateEd25519Key(bytes.NewReader(bytes.Repeat([]byte{7}, 64)))
	if err != nil {
		f.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(priv)
	if err != nil {
		f.Fatal(err)
	}
	key := []byte("job key")
	s, err := sign(priv, key, id, 3, Proposal{Gen: 2, Members: []peer.ID{id}, Ready: true})
	if err != nil {
		f.Fatal(err)
	}
	var names idNames
	var h Hello
	h.Version = ProtocolVersion
	h.putStatements([]peer.ID{id}, []*signed{s}, &names)
	var b bytes.Buffer
	if err := writeHello(&b, &h); err != nil {
		f.Fatal(err)
	}
	f.Add(b.Bytes())
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := readHello(bytes.NewReader(in))
		if err != nil {
			return
		}
		var names idNames
		for i := range h.Statements {
			from, st, err := h.statement(i, &names)
			if err != nil {
				continue
			}
			if st.verify(key, from, nil) == nil && from != id {
				t.Fatalf("a statement of %s that it never signed verifies", from)
			}
		}
	})
}

// TestDistrustedPeerIsNoStandby: a late peer waits as a standby; once the
// members distrust it (the training caught it lying) it is no standby on
// any of them, though still connected and proving the job.
func TestDistrustedPeerIsNoStandby(t *testing.T) {
	s, h, members := lateStandby(t)
	for i, n := range s.Nodes {
		n.Distrust([]peer.ID{h.ID(), n.h.ID()}) // its own ID is skipped
		if slices.Contains(n.Standbys(members), h.ID()) {
			t.Errorf("member %d still counts the distrusted peer a standby: it would admit it", i)
		}
	}
}
