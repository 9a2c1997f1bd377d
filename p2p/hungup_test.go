package p2p

import (
	"fmt"
	"io"
	"os"
	"syscall"
	"testing"

	"github.com/libp2p/go-libp2p/core/network"
)

// TestHungUp: a peer that went (its stream ended before a byte, or was
// reset, or its connection was) is told apart from one whose hello was
// cut short, malformed or too slow, which is struck.
func TestHungUp(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("reading hello length: %w", io.EOF), true},
		{fmt.Errorf("reading hello length: %w", network.ErrReset), true},
		{fmt.Errorf("reading hello length: %w", &network.StreamError{ErrorCode: 0, Remote: true}), true},
		{fmt.Errorf("write: %w", syscall.ECONNRESET), true},
		{fmt.Errorf("reading 40-byte hello: %w", io.ErrUnexpectedEOF), false},
		{fmt.Errorf("hello: junk: %w", ErrBadHello), false},
		{fmt.Errorf("reading hello length: %w", os.ErrDeadlineExceeded), false},
	} {
		if got := hungUp(tc.err); got != tc.want {
			t.Errorf("hungUp(%v) = %v; want %v", tc.err, got, tc.want)
		}
	}
}
