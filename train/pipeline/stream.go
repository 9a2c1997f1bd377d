package pipeline

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// StreamLink is a Link over a stream that goes both ways (the p2p
// boundary links): frames to send wait in a bounded queue for its sender goroutine,
// so Send does not wait on the other end. Close stops it and closes the
// stream.
type StreamLink struct {
	rw    io.ReadWriteCloser
	br    *bufio.Reader
	queue chan []byte
	done  chan struct{}
	wg    sync.WaitGroup

	mu     sync.Mutex
	err    error // the first write error
	closed bool
}

// NewStreamLink sends and receives on rw; queue bounds the frames waiting
// to be sent (a step sends at most its micro-batches' frames each way
// before it waits on the other end, so that many never block).
func NewStreamLink(rw io.ReadWriteCloser, queue int) *StreamLink {
	l := &StreamLink{rw: rw, br: bufio.NewReaderSize(rw, 1<<16), queue: make(chan []byte, max(queue, 1)), done: make(chan struct{})}
	l.wg.Go(l.send)
	return l
}

func (l *StreamLink) send() {
	for {
		select {
		case b := <-l.queue:
			if _, err := l.rw.Write(b); err != nil {
				l.mu.Lock()
				if l.err == nil {
					l.err = err
				}
				l.mu.Unlock()
				return
			}
		case <-l.done:
			// Deliver what was queued before Close: the last gradients
			// of a step may be in it.
			for {
				select {
				case b := <-l.queue:
					if _, err := l.rw.Write(b); err != nil {
						return
					}
				default:
					return
				}
			}
		}
	}
}

// ErrLinkClosed means a boundary link was closed on this side.
var ErrLinkClosed = errors.New("pipeline: link closed")

// Send queues f's wire form.
func (l *StreamLink) Send(ctx context.Context, f *Frame) error {
	l.mu.Lock()
	err, closed := l.err, l.closed
	l.mu.Unlock()
	switch {
	case closed:
		return ErrLinkClosed
	case err != nil:
		return fmt.Errorf("pipeline: the link failed: %w", err)
	}
	select {
	case l.queue <- AppendFrame(nil, f):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-l.done:
		return ErrLinkClosed
	}
}

// Recv reads the next frame; ctx's end closes the stream it reads.
func (l *StreamLink) Recv(ctx context.Context, want Expect) (*Frame, error) {
	stop := context.AfterFunc(ctx, func() { l.rw.Close() })
	defer stop()
	f, err := ReadFrame(l.br, want)
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return f, err
}

// Close sends what is queued, waiting at most CloseWait for the other
// end to take it, then closes the stream.
func (l *StreamLink) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	close(l.done)
	sent := make(chan struct{})
	go func() { l.wg.Wait(); close(sent) }()
	t := time.NewTimer(CloseWait)
	defer t.Stop()
	select {
	case <-sent:
	case <-t.C: // the other end does not read: closing ends the write
	}
	err := l.rw.Close()
	<-sent
	return err
}

// CloseWait bounds how long Close waits for queued frames to be taken.
const CloseWait = 5 * time.Second
