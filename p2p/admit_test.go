package p2p

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
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

// TestStandbyHearsTheJobEnd: of four peers for a ring of two, the two
// standbys wait to be admitted; one standby's word that the job has ended
// does not send the other away, a member's does, at once, naming it.
func TestStandbyHearsTheJobEnd(t *testing.T) {
	j := job
	j.WorldSize = 2
	s := swarm(t, 4, j)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.Join(ctx)
	var members, standbys []int
	for i, err := range s.Errs {
		switch {
		case err == nil:
			members = append(members, i)
		case errors.Is(err, ErrStandby):
			standbys = append(standbys, i)
		default:
			t.Fatalf("node %d: %v", i, err)
		}
	}
	if len(members) != 2 || len(standbys) != 2 {
		t.Fatalf("members %v, standbys %v; want two of each", members, standbys)
	}
	f := s.Formations[members[0]]
	waiting := s.Nodes[standbys[1]]
	done := make(chan error, 1)
	go func() {
		_, err := waiting.WaitAdmission(ctx, time.Minute)
		done <- err
	}()
	// The other standby says the job has ended: it is no member.
	s.Nodes[standbys[0]].tellEnded(ctx, s.Hosts[standbys[1]].ID(), f.Members, f.Generation)
	member := s.Hosts[members[0]].ID()
	began := time.Now()
	for time.Since(began) < 20*time.Second {
		s.Nodes[members[0]].Ended(ctx, f.Members, f.Generation)
		select {
		case err := <-done:
			if !errors.Is(err, ErrJobEnded) || !strings.Contains(err.Error(), member.String()) {
				t.Fatalf("WaitAdmission = %v; want ErrJobEnded from member %s", err, member)
			}
			return
		case <-time.After(500 * time.Millisecond):
			// The member may not count the standby among its standbys yet
			// (its hello still on the way): tell again.
		}
	}
	t.Fatal("the standby still waits 20 s after a member said the job has ended")
}
