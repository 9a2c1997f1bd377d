package pipeline

import (
	"bytes"
	"context"
	"fmt"
)

// Link is one end of a boundary between adjacent stages of a column: a
// stage's link to the stage before it or after it.
type Link interface {
	// Send sends f to the other end. It does not wait for the other end
	// to read (both ends send at once: activations one way, gradients
	// the other), and keeps nothing of f after it returns.
	Send(ctx context.Context, f *Frame) error
	// Recv returns the next frame from the other end, checked against
	// want.
	Recv(ctx context.Context, want Expect) (*Frame, error)
}

// MemLinks returns the two ends of an in-memory boundary that holds up
// to queue frames each way. Frames cross in their wire form, so the codec
// is the one the network uses.
func MemLinks(queue int) (Link, Link) {
	ab, ba := make(chan []byte, queue), make(chan []byte, queue)
	return memLink{send: ab, recv: ba}, memLink{send: ba, recv: ab}
}

type memLink struct {
	send chan<- []byte
	recv <-chan []byte
}

func (l memLink) Send(ctx context.Context, f *Frame) error {
	select {
	case l.send <- AppendFrame(nil, f):
		return nil
	case <-ctx.Done():
		return fmt.Errorf("pipeline: sending %v: %w", f.Kind, ctx.Err())
	default:
		return fmt.Errorf("pipeline: sending %v: the in-memory link's queue is full", f.Kind)
	}
}

func (l memLink) Recv(ctx context.Context, want Expect) (*Frame, error) {
	select {
	case b := <-l.recv:
		return ReadFrame(bytes.NewReader(b), want)
	case <-ctx.Done():
		return nil, fmt.Errorf("pipeline: waiting for %v of micro-batch %d: %w", want.Kind, want.MB, ctx.Err())
	}
}
