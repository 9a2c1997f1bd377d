package p2p

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/libp2p/go-libp2p/core/protocol"
	msmux "github.com/multiformats/go-multistream"
)

func TestRedial(t *testing.T) {
	live := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	unsupported := fmt.Errorf("new stream: %w", msmux.ErrNotSupported[protocol.ID]{Protos: []protocol.ID{RingProtocol}})
	simultaneous := errors.New("failed to negotiate security protocol: tls: received unexpected handshake message of type *tls.clientHelloMsg when waiting for *tls.serverHelloMsg")
	tests := []struct {
		name     string
		ctx      context.Context
		err      error
		failures int
		want     bool
	}{
		{"success", live, nil, 0, false},
		{"not registered yet", live, unsupported, 0, true},
		{"not registered yet, long after", live, unsupported, 100, true},
		{"simultaneous open, first", live, simultaneous, 0, true},
		{"simultaneous open, last try", live, simultaneous, linkDialRetries - 1, true},
		{"failing for good", live, simultaneous, linkDialRetries, false},
		{"context ended", ended, unsupported, 0, false},
		{"context ended, other error", ended, simultaneous, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := redial(tt.ctx, tt.err, tt.failures); got != tt.want {
				t.Errorf("redial(%v, %d) = %v, want %v", tt.err, tt.failures, got, tt.want)
			}
		})
	}
}
