package p2p

import (
	"net"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rs/zerolog"
)

// warnLimiter rate-limits warnings about what one peer did. A stranger
// that sends bad hellos or requests in a loop would otherwise make a peer
// write a line for each — tens of thousands a second, the log a second
// channel of the flood. Each (peer, message) gets Burst lines a Window;
// the rest are counted, and the next line that passes says how many of
// its kind were left out ("left_out"). What it remembers is bounded
// (maxWarnKeys): past that, warnings about peers it has no room for are
// counted together and said with the next line that passes.
type warnLimiter struct {
	log    zerolog.Logger
	burst  int
	window time.Duration
	now    func() time.Time
	// addrOf says where a peer connects from ("" where unknown or exempt):
	// a line about a peer is written only while its address, too, has
	// room (perIPWarns times a peer's), so a thousand identities from one
	// address write no more than a few.
	addrOf func(peer string) string

	mu     sync.Mutex
	seen   map[warnKey]*warnCount
	others int // left out for want of room
}

type warnKey struct{ peer, msg string }

type warnCount struct {
	since   time.Time // the window's start
	n       int       // lines in this window
	leftOut int       // lines left out since the last that passed
}

// Defaults of warnLimiter: a few lines a peer and kind, then one more a
// minute at most, with the count of what was left out.
const (
	warnBurst   = 5
	warnWindow  = time.Minute
	maxWarnKeys = 4096
)

// perIPWarns is how many times a peer's lines one address may have.
const perIPWarns = 4

func newWarnLimiter(log zerolog.Logger) *warnLimiter {
	return &warnLimiter{log: log, burst: warnBurst, window: warnWindow, now: time.Now, seen: map[warnKey]*warnCount{}}
}

// byAddress makes w key its lines by the address a peer connects from on
// h too.
func (w *warnLimiter) byAddress(h host.Host) *warnLimiter {
	w.addrOf = func(s string) string {
		p, err := peer.Decode(s)
		if err != nil {
			return ""
		}
		for _, c := range h.Network().ConnsToPeer(p) {
			if ip := exemptIP(c.RemoteMultiaddr()); ip.IsValid() {
				return ip.String()
			}
		}
		return ""
	}
	return w
}

// Warn returns the warning event for msg about peer (its "peer" field
// set), or nil — on which zerolog's methods do nothing — when it is to be
// left out. The caller adds its fields and calls Msg(msg).
func (w *warnLimiter) Warn(peer, msg string) *zerolog.Event {
	left, ok := w.allow(peer, msg)
	if !ok {
		return nil
	}
	ev := w.log.Warn().Str("peer", peer)
	if left > 0 {
		ev = ev.Int("left_out", left)
	}
	return ev
}

// allow decides whether a line about peer of kind msg is written, and how
// many were left out before it.
func (w *warnLimiter) allow(peer, msg string) (leftOut int, ok bool) {
	addr := ""
	if w.addrOf != nil {
		addr = w.addrOf(peer) // before the lock: it asks the host
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	if addr != "" && addr != peer {
		a := w.countLocked(now, warnKey{"addr " + addr, msg})
		if a == nil || a.n >= perIPWarns*w.burst {
			if a != nil {
				a.leftOut++
			}
			return 0, false
		}
		a.n++
	}
	c := w.countLocked(now, warnKey{peer, msg})
	if c == nil {
		return 0, false
	}
	if c.n >= w.burst {
		c.leftOut++
		return 0, false
	}
	c.n++
	leftOut, c.leftOut = c.leftOut+w.others, 0
	w.others = 0
	return leftOut, true
}

// countLocked is the count of k in its window, made if new; nil (and
// counted among the others) when there is no room. w.mu held.
func (w *warnLimiter) countLocked(now time.Time, k warnKey) *warnCount {
	c := w.seen[k]
	if c == nil {
		if len(w.seen) >= maxWarnKeys {
			for key, old := range w.seen {
				if now.Sub(old.since) >= w.window && old.leftOut == 0 {
					delete(w.seen, key)
				}
			}
		}
		if len(w.seen) >= maxWarnKeys {
			w.others++
			return nil
		}
		c = &warnCount{since: now}
		w.seen[k] = c
	}
	if now.Sub(c.since) >= w.window {
		c.since, c.n = now, 0
	}
	return c
}

// msgBadHello is the warning about a peer whose hello does not parse.
const msgBadHello = "cut off a peer that sent a bad hello"

// hostOf is the host part of a network address: what a warning about a
// connection that names no peer is keyed by.
func hostOf(a net.Addr) string {
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host
	}
	return a.String()
}
