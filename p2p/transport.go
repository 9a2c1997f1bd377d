package p2p

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ringtrain/ringtrain/ring"
)

// RingProtocol carries one ring generation's frames from a rank to its
// successor, one stream per link.
const RingProtocol = "/ringtrain/ring/1.0.0"

const (
	linkMagic uint32 = 0x314c5452 // "RTL1"
	linkHello        = 16         // magic u32 | rank u32 | generation u64
	maxInbox         = 64         // streams waiting to be claimed
)

// RingLinks accepts ring streams on a host and hands each to the formation
// that waits for it.
type RingLinks struct {
	h     host.Host
	mu    sync.Mutex
	inbox map[linkKey]chan inbound
}

type linkKey struct {
	gen  uint64
	from peer.ID
}

type inbound struct {
	s    network.Stream
	rank int
}

// NewRingLinks registers RingProtocol on h. Close it when done.
func NewRingLinks(h host.Host) *RingLinks {
	l := &RingLinks{h: h, inbox: map[linkKey]chan inbound{}}
	h.SetStreamHandler(RingProtocol, l.handle)
	return l
}

// Close stops accepting ring streams and resets those never claimed.
func (l *RingLinks) Close() {
	l.h.RemoveStreamHandler(RingProtocol)
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, ch := range l.inbox {
		select {
		case in := <-ch:
			in.s.Reset()
		default:
		}
		delete(l.inbox, k)
	}
}

func (l *RingLinks) slot(k linkKey) chan inbound {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch, ok := l.inbox[k]
	if !ok {
		if len(l.inbox) >= maxInbox {
			return nil
		}
		ch = make(chan inbound, 1)
		l.inbox[k] = ch
	}
	return ch
}

func (l *RingLinks) handle(s network.Stream) {
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [linkHello]byte
	if _, err := io.ReadFull(s, b[:]); err != nil || binary.LittleEndian.Uint32(b[0:]) != linkMagic {
		s.Reset()
		return
	}
	s.SetReadDeadline(time.Time{})
	k := linkKey{gen: binary.LittleEndian.Uint64(b[8:]), from: s.Conn().RemotePeer()}
	ch := l.slot(k)
	if ch == nil {
		s.Reset()
		return
	}
	select {
	case ch <- inbound{s: s, rank: int(binary.LittleEndian.Uint32(b[4:]))}:
	default: // a second stream for the same link: refuse it
		s.Reset()
	}
}

// Connect opens this rank's links of the formed ring — a stream to its
// successor, and the one its predecessor opens — and returns them as a
// ring.Transport (nil for a ring of one). It waits until ctx ends.
func (l *RingLinks) Connect(ctx context.Context, f *Formation) (ring.Transport, error) {
	n := len(f.Members)
	if n == 1 {
		return nil, nil
	}
	succ := f.Members[(f.Rank+1)%n]
	predRank := (f.Rank - 1 + n) % n
	pred := f.Members[predRank]

	type result struct {
		s   network.Stream
		err error
	}
	out := make(chan result, 1)
	go func() {
		s, err := l.h.NewStream(ctx, succ, RingProtocol)
		if err == nil {
			var b [linkHello]byte
			binary.LittleEndian.PutUint32(b[0:], linkMagic)
			binary.LittleEndian.PutUint32(b[4:], uint32(f.Rank))
			binary.LittleEndian.PutUint64(b[8:], f.Generation)
			if _, err = s.Write(b[:]); err != nil {
				s.Reset()
			}
		}
		out <- result{s, err}
	}()

	k := linkKey{gen: f.Generation, from: pred}
	ch := l.slot(k)
	var in network.Stream
	var inErr error
	if ch == nil {
		inErr = fmt.Errorf("p2p: too many ring streams waiting")
	} else {
		select {
		case got := <-ch:
			in = got.s
			if got.rank != predRank {
				got.s.Reset()
				in, inErr = nil, fmt.Errorf("p2p: predecessor %s says it is rank %d, the ring has it at %d", pred, got.rank, predRank)
			}
		case <-ctx.Done():
			inErr = fmt.Errorf("p2p: waiting for the stream from rank %d (%s): %w", predRank, pred, ctx.Err())
		}
	}
	l.mu.Lock()
	delete(l.inbox, k)
	l.mu.Unlock()
	o := <-out
	if inErr != nil || o.err != nil {
		if in != nil {
			in.Reset()
		}
		if o.s != nil && o.err == nil {
			o.s.Reset()
		}
		if inErr != nil {
			return nil, inErr
		}
		return nil, fmt.Errorf("p2p: opening the stream to rank %d (%s): %w", (f.Rank+1)%n, succ, o.err)
	}
	// Close, not Reset, when the ring closes: Close still delivers what
	// was written (a neighbour may be reading the last frame), and it also
	// ends a Read in progress, which is what an abort needs.
	return ring.NewStreams(o.s, in), nil
}
