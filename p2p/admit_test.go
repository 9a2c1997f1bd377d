package p2p

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rs/zerolog"
)

// lateNode starts a host and node of job j on loopback, bootstrapped from
// boot (nil: none); with join, it joins and must find itself a standby.
func lateNode(ctx context.Context, t *testing.T, j Job, boot *Host, cfg NodeConfig, join bool) *Node {
	t.Helper()
	hc := HostConfig{Listen: loopback}
	if boot != nil {
		hc.Bootstrap = []peer.AddrInfo{info(boot)}
	}
	h, err := NewHost(ctx, hc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	n, err := NewNode(h, j, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	if join {
		if _, err := n.Join(ctx); !errors.Is(err, ErrStandby) {
			t.Fatalf("a late peer's Join = %v; want ErrStandby", err)
		}
	}
	return n
}

// TestLateJoinerOfAJobOfOne: a job of world size 1 whose ring trains; a
// peer started with its member as bootstrap waits as a standby to be
// admitted, rather than forming a ring of its own before its first hello
// is answered — the two rings of one job would then train apart, and
// merge only to name each other liars.
func TestLateJoinerOfAJobOfOne(t *testing.T) {
	j := job
	j.WorldSize, j.MaxWorldSize = 1, 2
	ctx, s := formedRing(t, j)
	lateNode(ctx, t, j, s.Hosts[0], NodeConfig{}, true)
}

// formedRing forms a ring of j's world size on loopback; the context it
// returns, for the rest of the test, ends a minute from now.
func formedRing(t *testing.T, j Job) (context.Context, *localSwarm) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	s := swarm(t, j.WorldSize, j)
	if err := s.Join(ctx); err != nil {
		t.Fatal(err)
	}
	return ctx, s
}

// TestBelieveEnded: a standby takes word that the job has ended only from
// a verified member of the ring it waits for.
func TestBelieveEnded(t *testing.T) {
	a, b, c := peer.ID("a"), peer.ID("b"), peer.ID("c")
	ring := &Proposal{Gen: 3, Members: []peer.ID{a, b}}
	for _, tc := range []struct {
		name  string
		pi    *peerInfo
		claim *Proposal
		from  peer.ID
		want  bool
	}{
		{"a verified member", &peerInfo{verified: true}, ring, a, true},
		{"a verified peer outside the ring (another standby)", &peerInfo{verified: true}, ring, c, false},
		{"a member not verified", &peerInfo{}, ring, b, false},
		{"an unknown peer", nil, ring, a, false},
		{"no ring to wait for", &peerInfo{verified: true}, nil, a, false},
	} {
		if got := believeEnded(tc.pi, tc.claim, tc.from); got != tc.want {
			t.Errorf("%s: %v; want %v", tc.name, got, tc.want)
		}
	}
}

// TestStandbyHearsTheJobEnd: two peers form a ring of two; two more
// arrive late and wait as standbys. One standby's word that the job has
// ended does not send the other away; a member's does, at once, naming
// it.
func TestStandbyHearsTheJobEnd(t *testing.T) {
	j := job
	j.WorldSize = 2
	ctx, s := formedRing(t, j)
	f := s.Formations[0]
	late := make([]*Node, 2)
	var log lockedBuffer // the standbys' logs
	for k := range late {
		late[k] = lateNode(ctx, t, j, s.Hosts[k], NodeConfig{Logger: zerolog.New(&log)}, true)
	}
	done := make(chan error, 1)
	go func() {
		_, err := late[1].WaitAdmission(ctx, time.Minute)
		done <- err
	}()
	// The other standby says the job has ended: it is no member, and is
	// ignored.
	late[0].h.Peerstore().AddAddrs(late[1].h.ID(), late[1].h.Addrs(), time.Minute)
	// Both standbys dial each other (hellos) on loopback, where a TCP
	// simultaneous open now and then makes both ends TLS clients and fails
	// that one dial (libp2p's known quirk): tell again, as a member would.
	for try := 0; ; try++ {
		err := late[0].tellEnded(ctx, late[1].h.ID(), f.Members, f.Generation)
		if err == nil {
			break
		}
		if try == 4 {
			t.Fatalf("one standby telling the other, 5 tries: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for !strings.Contains(log.String(), "ignored word that the job has ended") {
		select {
		case err := <-done:
			t.Fatalf("the standby believed another standby: %v", err)
		case <-ctx.Done():
			t.Fatalf("the standby neither ignored nor believed another standby's word:\n%s", log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	member := s.Hosts[0].ID()
	for {
		s.Nodes[0].Ended(ctx, f.Members, f.Generation)
		select {
		case err := <-done:
			if !errors.Is(err, ErrJobEnded) || !strings.Contains(err.Error(), member.String()) {
				t.Fatalf("WaitAdmission = %v; want ErrJobEnded from member %s", err, member)
			}
			return
		case <-ctx.Done():
			t.Fatal("the standby still waits a minute after a member said the job has ended")
		case <-time.After(500 * time.Millisecond):
			// The member may not count the standby among its standbys yet
			// (its hello still on the way): tell again.
		}
	}
}

// TestTakeAdmission: a standby takes an admission, whose sender proved the
// job, from any peer but one caught lying or one that refused it — also
// from one whose hello it has not heard yet.
func TestTakeAdmission(t *testing.T) {
	for _, tc := range []struct {
		name string
		pi   *peerInfo
		want bool
	}{
		{"a verified peer", &peerInfo{verified: true}, true},
		{"a peer whose hello has not arrived", nil, true},
		{"a peer known, not verified yet", &peerInfo{}, true},
		{"a peer caught lying", &peerInfo{verified: true, lied: true}, false},
		{"a peer that refused this one", &peerInfo{refused: true}, false},
	} {
		if got := takeAdmission(tc.pi); got != tc.want {
			t.Errorf("%s: %v; want %v", tc.name, got, tc.want)
		}
	}
}

// TestAdmissionBeforeTheAdmittersHello: a standby is admitted by a member
// it has never heard a hello from — rank 0 admits a standby as soon as it
// has the standby's hello, and its own can be still on the way. The
// standby must take it (it did not, and the ring then waited for it in
// its re-formation until the join timeout).
func TestAdmissionBeforeTheAdmittersHello(t *testing.T) {
	j := job
	j.WorldSize, j.MaxWorldSize = 2, 4
	ctx, s := formedRing(t, j)
	f := s.Formations[0]
	// The standby waits; the admitter, a member-to-be it never met, admits it.
	standby := lateNode(ctx, t, j, s.Hosts[0], NodeConfig{}, true)
	admitter := lateNode(ctx, t, j, nil, NodeConfig{}, false)
	standby.mu.Lock()
	_, heard := standby.peers[admitter.h.ID()]
	standby.mu.Unlock()
	if heard {
		t.Fatal("the standby knows the admitter already; the test needs one it has not heard from")
	}
	done := make(chan error, 1)
	var got *Formation
	go func() {
		var err error
		got, err = standby.WaitAdmission(ctx, time.Minute)
		done <- err
	}()
	grown := append(slices.Clone(f.Members), admitter.h.ID(), standby.h.ID())
	slices.Sort(grown)
	admitter.h.Peerstore().AddAddrs(standby.h.ID(), standby.h.Addrs(), time.Minute)
	if err := admitter.Admit(ctx, standby.h.ID(), f, grown); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil || !slices.Equal(got.Members, grown) || got.Generation != f.Generation {
			t.Fatalf("WaitAdmission = %+v, %v; want the grown ring of generation %d", got, err, f.Generation)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the standby ignored an admission from a peer proving the job, whose hello it had not heard yet")
	}
}

// TestNoShows: in a re-formation, a newcomer that answers without
// re-forming is taken for unreachable once it has done so for the grace
// period; a member of the ring before never is, nor anyone by a standby
// being admitted (no ring before).
func TestNoShows(t *testing.T) {
	old, nw := peer.ID("old"), peer.ID("new")
	t0 := time.Unix(1000, 0)
	prev := &Formation{Members: []peer.ID{old}}
	for _, tc := range []struct {
		name string
		prev *Formation
		p    peer.ID
		at   []time.Duration // answers without re-forming, after t0
		want bool            // at the last
	}{
		{"a newcomer's first answer", prev, nw, []time.Duration{0}, false},
		{"a newcomer within the grace", prev, nw, []time.Duration{0, 1999 * time.Millisecond}, false},
		{"a newcomer past the grace", prev, nw, []time.Duration{0, time.Second, 2 * time.Second}, true},
		{"a member of the ring before", prev, old, []time.Duration{0, time.Minute}, false},
		{"no ring before (a standby being admitted)", nil, nw, []time.Duration{0, time.Minute}, false},
	} {
		nc := newNoShows(tc.prev, 2*time.Second)
		var got bool
		for _, d := range tc.at {
			got = nc.notReforming(tc.p, t0.Add(d))
		}
		if got != tc.want {
			t.Errorf("%s: %v; want %v", tc.name, got, tc.want)
		}
	}
}

// TestReformWithoutANewcomerThatNeverCame: a ring of two grows by a
// standby whose admission never reached it: the standby answers the
// re-formation hellos without re-forming. The two must re-form without it
// in seconds, not wait for it until their join timeout.
func TestReformWithoutANewcomerThatNeverCame(t *testing.T) {
	j := job
	j.WorldSize = 2
	ctx, s := formedRing(t, j)
	// A standby that has met the members, and is never told it is admitted.
	absent := lateNode(ctx, t, j, s.Hosts[0], NodeConfig{}, true)
	grown := append(slices.Clone(s.Formations[0].Members), absent.h.ID())
	slices.Sort(grown)
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	fs := make([]*Formation, 2)
	for i, n := range s.Nodes {
		prev := &Formation{Members: grown, Rank: slices.Index(grown, n.h.ID()), Generation: s.Formations[i].Generation}
		go func() {
			var err error
			fs[i], err = n.Reform(rctx, prev, 1)
			errs <- err
		}()
	}
	for range s.Nodes {
		if err := <-errs; err != nil {
			t.Fatalf("re-forming with a newcomer that never came: %v", err)
		}
	}
	for i, f := range fs {
		if !slices.Equal(f.Members, s.Formations[0].Members) || f.Generation != s.Formations[0].Generation+1 {
			t.Errorf("member %d re-formed %+v; want the two of generation %d", i, f, s.Formations[0].Generation+1)
		}
	}
}

// TestAdmittedTooLate: a standby takes an admission to the generation
// after 1 when the members have already re-formed generation 2 without it
// (it was still joining, say). Its re-formation must end at once with
// ErrSuperseded, so that it waits to be admitted again; it waited for the
// members until its join timeout, and they, admitting it again at every
// step, dropped it each time.
func TestAdmittedTooLate(t *testing.T) {
	j := job
	j.WorldSize, j.MaxWorldSize = 2, 3
	ctx, s := formedRing(t, j)
	f := s.Formations[0]
	late := lateNode(ctx, t, j, s.Hosts[0], NodeConfig{}, true)
	errs := make(chan error, 2)
	for _, n := range s.Nodes {
		go func() {
			_, err := n.Reform(ctx, &Formation{Members: f.Members, Rank: slices.Index(f.Members, n.h.ID()), Generation: f.Generation}, 1)
			errs <- err
		}()
	}
	for range s.Nodes {
		if err := <-errs; err != nil {
			t.Fatalf("the members' re-formation: %v", err)
		}
	}
	grown := append(slices.Clone(f.Members), late.h.ID())
	slices.Sort(grown)
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err := late.Reform(rctx, &Formation{Members: grown, Rank: slices.Index(grown, late.h.ID()), Generation: f.Generation}, 1)
	if !errors.Is(err, ErrSuperseded) {
		t.Fatalf("the late standby's re-formation = %v; want ErrSuperseded at once", err)
	}
}

// TestAdmissionEndsAJoin: a peer still joining — here alone, its Join
// would wait out its timeout — is admitted: its Join must end at once, as
// a standby's, and WaitAdmission hand over the admission. The members wait
// only the re-formation hello's 2 s for an admitted peer; a restarted peer
// admitted while it joined was dropped, and admitted again a second later.
func TestAdmissionEndsAJoin(t *testing.T) {
	slow(t)
	j := job
	j.WorldSize, j.MaxWorldSize = 2, 3
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	joining := lateNode(ctx, t, j, nil, NodeConfig{}, false)
	admitter := lateNode(ctx, t, j, nil, NodeConfig{}, false)
	joined := make(chan error, 1)
	go func() {
		_, err := joining.Join(ctx)
		joined <- err
	}()
	ring := []peer.ID{admitter.h.ID(), joining.h.ID()}
	slices.Sort(ring)
	admitter.h.Peerstore().AddAddrs(joining.h.ID(), joining.h.Addrs(), time.Minute)
	began := time.Now()
	if err := admitter.Admit(ctx, joining.h.ID(), &Formation{Members: []peer.ID{admitter.h.ID()}, Generation: 4}, ring); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-joined:
		if !errors.Is(err, ErrStandby) {
			t.Fatalf("Join = %v; want ErrStandby (admitted)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an admitted peer's Join went on")
	}
	f, err := joining.WaitAdmission(ctx, time.Minute)
	if err != nil || f.Generation != 4 || !slices.Equal(f.Members, ring) {
		t.Fatalf("WaitAdmission = %+v, %v; want the ring of generation 4 it was admitted to", f, err)
	}
	t.Logf("admitted %v after the admission was sent", time.Since(began).Round(time.Millisecond))
}

// TestNewerAdmissionReplacesAnOlder: a peer admitted at generation 4
// whose admission it has not taken yet (still joining, say) is admitted
// again at 5 — the members waited their grace for it, re-formed without
// it, and admit it to the next ring. It must take the admission to 5, the
// one the members wait for now; an admission to 4 that arrives late
// changes nothing. Keeping the first, as a full channel did, lost the
// one that counts: WaitAdmission took the ring of 4, gone by then.
func TestNewerAdmissionReplacesAnOlder(t *testing.T) {
	slow(t)
	j := job
	j.WorldSize, j.MaxWorldSize = 2, 3
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	standby := lateNode(ctx, t, j, nil, NodeConfig{}, false)
	admitter := lateNode(ctx, t, j, nil, NodeConfig{}, false)
	ring := []peer.ID{admitter.h.ID(), standby.h.ID()}
	slices.Sort(ring)
	admitter.h.Peerstore().AddAddrs(standby.h.ID(), standby.h.Addrs(), time.Minute)
	for _, gen := range []uint64{4, 5, 4} {
		if err := admitter.Admit(ctx, standby.h.ID(), &Formation{Members: []peer.ID{admitter.h.ID()}, Generation: gen}, ring); err != nil {
			t.Fatal(err)
		}
	}
	// Admit returns once its message is sent, not handled: wait for the
	// admission to 5 to be the one waiting (keeping the first, it never is).
	waitFor(t, 30*time.Second, func() bool {
		standby.mu.Lock()
		defer standby.mu.Unlock()
		select {
		case f := <-standby.admitted:
			standby.admitted <- f // room: senders hold mu
			return f.Generation == 5
		default:
			return false
		}
	}, "the admission to 5 to wait for the standby")
	f, err := standby.WaitAdmission(ctx, time.Minute)
	if err != nil || f.Generation != 5 || !slices.Equal(f.Members, ring) {
		t.Fatalf("WaitAdmission = %+v, %v; want the admission to the ring after generation 5", f, err)
	}
}

// TestRestartedPeerIsNoStandbyUntilItJoins: a standby the members know is
// killed and started again with its identity. Its new process connects to
// them at once — its host is up long before it has built its job and
// joins — and the members, who verified its identity before, took it for
// a standby as soon as it was connected: rank 0 admitted it, the ring
// re-formed with it, and waited 2 s for a peer that was not yet re-forming
// (a stall, and a 3.5 s admission, under load in the churn test). It is a
// standby once its hellos say it is forming.
func TestRestartedPeerIsNoStandbyUntilItJoins(t *testing.T) {
	slow(t)
	j := job
	j.WorldSize, j.MaxWorldSize = 2, 3
	ctx, s := formedRing(t, j)
	members := s.Formations[0].Members
	key, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	start := func() (*Host, *Node) {
		h, err := NewHost(ctx, HostConfig{Listen: loopback, Identity: key, Bootstrap: []peer.AddrInfo{info(s.Hosts[0])}})
		if err != nil {
			t.Fatal(err)
		}
		n, err := NewNode(h, j, NodeConfig{})
		if err != nil {
			h.Close()
			t.Fatal(err)
		}
		return h, n
	}
	h1, n1 := start()
	if _, err := n1.Join(ctx); !errors.Is(err, ErrStandby) {
		t.Fatalf("the first process's Join = %v; want ErrStandby", err)
	}
	id := h1.ID()
	isStandby := func() bool { return slices.Contains(s.Nodes[0].Standbys(members), id) }
	waitFor(t, 30*time.Second, isStandby, "the first process to be a standby")
	n1.Close()
	h1.Close()
	waitFor(t, 30*time.Second, func() bool { return !isStandby() }, "the killed process to be gone")
	h2, n2 := start() // connected to rank 0, and not joining
	defer h2.Close()
	defer n2.Close()
	if isStandby() {
		t.Fatal("rank 0 takes the restarted process for a standby before it joins")
	}
	// Nor once it has heard from the new process, which does not wait yet.
	if err := s.Nodes[0].sayHello(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	if isStandby() {
		t.Fatal("rank 0 takes the restarted process for a standby on its hello, before it joins")
	}
	go func() {
		// As `ringtrain join` does: a standby waits to be admitted,
		// greeting the members no hello of its has told that it waits.
		if _, err := n2.Join(ctx); errors.Is(err, ErrStandby) {
			n2.WaitAdmission(ctx, time.Minute) //nolint:errcheck // ends with ctx; the test asks rank 0
		}
	}()
	waitFor(t, 30*time.Second, isStandby, "the joining process to be a standby")
	// Hellos cross: an answer the process wrote before it joined, read
	// after its hello saying it waits, leaves it a standby — the process
	// has said so and does not say it again. A newer hello that does not
	// wait (a ring formed, its proposal changed) ends it.
	s.Nodes[0].mu.Lock()
	took := s.Nodes[0].peers[id].waitSeq
	s.Nodes[0].mu.Unlock()
	now, _ := n2.helloTo(s.Hosts[0].ID())
	for _, tc := range []struct {
		seq     uint64
		standby bool
	}{{took, true}, {took - 1, true}, {max(now.Seq, took) + 1, false}} {
		stale := *now
		stale.Waiting, stale.Seq = false, tc.seq
		s.Nodes[0].learn(id, &stale)
		if isStandby() != tc.standby {
			t.Fatalf("a hello not waiting, Seq %+d from the one its waiting was taken from, read last: standby %v; want %v", int64(tc.seq-took), !tc.standby, tc.standby)
		}
	}
}
