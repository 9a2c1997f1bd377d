package main

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

// TestRankPrefix: a peer's lines switch from [peer i] to [rank r] at the
// first line that assigns the rank — its own stdout line, or its log of
// the formation on stderr in either format, whichever comes first — and
// switch again on a re-formation.
func TestRankPrefix(t *testing.T) {
	lines := []struct{ in, want string }{
		{"09:01:38 INF looking for peers job=demo", "[peer 4] "},
		{`09:01:41 INF ring formed generation=1 members=["a","b"] rank=2 world_size=3`, "[rank 2] "},
		{"09:01:41 INF training generation=1 rank=2 world_size=3", "[rank 2] "},
		{"ring formed: rank 2 of 3", "[rank 2] "},
		{`{"level":"info","generation":2,"rank":1,"world_size":2,"message":"ring re-formed without the lost peers"}`, "[rank 1] "},
		{`{"level":"info","message":"ring formed","rank":0}`, "[rank 0] "},
		{"ring re-formed: rank 1 of 2", "[rank 1] "},
		{`{"level":"info","rank":1,"message":"training"}`, "[rank 1] "},
	}
	var out bytes.Buffer
	p := &peerOut{prefix: "[peer 4] ", mu: &sync.Mutex{}}
	for _, l := range lines {
		out.Reset()
		p.println(&out, l.in)
		if got := out.String(); !strings.HasPrefix(got, l.want) {
			t.Errorf("after %q: %q; want the prefix %q", l.in, got, l.want)
		}
	}
}

func TestPeerThreads(t *testing.T) {
	for _, c := range []struct{ asked, n, cpus, want int }{
		{0, 1, 2, 2},
		{0, 2, 2, 1},
		{0, 3, 2, 1},
		{0, 4, 16, 4},
		{0, 3, 16, 5},
		{3, 2, 2, 3},
	} {
		if got := peerThreads(c.asked, c.n, c.cpus); got != c.want {
			t.Errorf("peerThreads(%d, %d, %d) = %d, want %d", c.asked, c.n, c.cpus, got, c.want)
		}
	}
}
