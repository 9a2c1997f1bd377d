package p2p

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rs/zerolog"
)

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
	s := swarm(t, 2, j)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.Join(ctx); err != nil {
		t.Fatal(err)
	}
	f := s.Formations[0]
	late := make([]*Node, 2)
	var log lockedBuffer // the standbys' logs
	for k := range late {
		h, err := NewHost(ctx, HostConfig{Listen: loopback, Bootstrap: []peer.AddrInfo{info(s.Hosts[k])}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		late[k], err = NewNode(h, j, NodeConfig{Logger: zerolog.New(&log)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { late[k].Close() })
		if _, err := late[k].Join(ctx); !errors.Is(err, ErrStandby) {
			t.Fatalf("late peer %d's Join = %v; want ErrStandby", k, err)
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := late[1].WaitAdmission(ctx, time.Minute)
		done <- err
	}()
	// The other standby says the job has ended: it is no member, and is
	// ignored.
	late[0].h.Peerstore().AddAddrs(late[1].h.ID(), late[1].h.Addrs(), time.Minute)
	if err := late[0].tellEnded(ctx, late[1].h.ID(), f.Members, f.Generation); err != nil {
		t.Fatalf("one standby telling the other: %v", err)
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
