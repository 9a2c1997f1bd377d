package p2p

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestWarnLimiter: per peer and kind of warning, Burst lines a Window
// pass; the others are counted and said with the next that passes; other
// peers and kinds have their own counts; and what it remembers is bounded.
func TestWarnLimiter(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(0, 0)
	w := newWarnLimiter(zerolog.New(&buf))
	w.now = func() time.Time { return now }
	lines := func() int { n := strings.Count(buf.String(), "\n"); buf.Reset(); return n }
	for range 1000 {
		w.Warn("a", "bad hello").Msg("bad hello")
	}
	if n := lines(); n != warnBurst {
		t.Fatalf("1,000 bad hellos from one peer wrote %d lines; want %d", n, warnBurst)
	}
	w.Warn("b", "bad hello").Msg("bad hello")
	w.Warn("a", "bad request").Msg("bad request")
	if n := lines(); n != 2 {
		t.Fatalf("another peer, another kind: %d lines; want 2", n)
	}
	now = now.Add(warnWindow)
	w.Warn("a", "bad hello").Msg("bad hello")
	if got := buf.String(); !strings.Contains(got, fmt.Sprintf(`"left_out":%d`, 1000-warnBurst)) {
		t.Fatalf("the next window's first line: %s; want the count of those left out", got)
	}
	lines()
	for i := range 2 * maxWarnKeys {
		w.Warn(fmt.Sprint("sybil", i), "bad hello").Msg("bad hello")
	}
	if len(w.seen) > maxWarnKeys {
		t.Fatalf("remembers %d peers; want at most %d", len(w.seen), maxWarnKeys)
	}
	if n := lines(); n > maxWarnKeys {
		t.Fatalf("%d peers wrote %d lines; want at most %d", 2*maxWarnKeys, n, maxWarnKeys)
	}
}
