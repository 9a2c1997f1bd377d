package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
)

// TestRankPrefix: a peer's lines switch from [peer i] to [rank r] once its
// status records say it formed a ring, and again on a re-formation; other
// records, lines and log text that merely mention a rank change nothing.
func TestRankPrefix(t *testing.T) {
	steps := []struct{ status, line, want string }{
		{"", "looking for peers", "[peer 4] "},
		{`{"level":"info","rank":2,"message":"training"}`, "ring formed: rank 2 of 3", "[peer 4] "},
		{"not json", `{"level":"info","rank":3,"message":"ring formed"}`, "[peer 4] "},
		{`{"level":"info","generation":1,"rank":2,"world_size":3,"message":"ring formed"}`, "training", "[rank 2] "},
		{`{"level":"info","generation":2,"rank":1,"world_size":2,"message":"ring re-formed without the lost peers; running the step again"}`, "training", "[rank 1] "},
		{`{"level":"info","rank":0,"message":"pipeline formed"}`, "x", "[rank 0] "},
		{`{"level":"info","generation":3,"rank":2,"world_size":3,"message":"ring formed"}`, "x", "[rank 2] "},
		{`{"level":"info","generation":3,"rank":1,"world_size":3,"order":[0,2,1],"message":"ring ordered by measured links"}`, "rank 1 of 3", "[rank 1] "},
	}
	var out bytes.Buffer
	p := &peerOut{peer: 4, prefix: "[peer 4] ", mu: &sync.Mutex{}}
	for _, s := range steps {
		p.status(io.NopCloser(strings.NewReader(s.status + "\n")))
		out.Reset()
		p.println(&out, s.line)
		if got := out.String(); got != s.want+s.line+"\n" {
			t.Errorf("after the record %q: %q; want the prefix %q", s.status, got, s.want)
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

// A failing test prints each peer's last lines, not one peer's flood.
func TestTails(t *testing.T) {
	var b strings.Builder
	for i := range 40 {
		fmt.Fprintf(&b, "[rank 0] line %d\n", i)
		if i%4 == 0 {
			fmt.Fprintf(&b, "[peer 1] line %d\n", i)
		}
	}
	b.WriteString("ringtrain: local: peer 1: exit status 1\n")
	got := tails(b.String())
	for _, want := range []string{"… 15 earlier lines of [rank 0]\n[rank 0] line 15\n", "[rank 0] line 39\n", "[peer 1] line 0\n", "[peer 1] line 36\n", "ringtrain: local: peer 1: exit status 1\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("tails lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "[rank 0] line 14\n") {
		t.Errorf("tails kept rank 0's 15th line from the end:\n%s", got)
	}
}
