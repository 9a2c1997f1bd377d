package p2p

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// HelloProtocol is the protocol of the agreement exchange.
const HelloProtocol = "/ringtrain/hello/1.0.0"

// ProtocolVersion is what peers must share to form a ring.
const ProtocolVersion = 1

// maxHelloBytes bounds a hello on the wire; a peer list of hundreds of
// members with a few addresses each fits with room to spare.
const maxHelloBytes = 256 << 10

// ErrBadHello means a peer sent a hello that is malformed or too large.
var ErrBadHello = errors.New("p2p: bad hello")

// Member is a peer a hello vouches for, with where to dial it.
type Member struct {
	ID    string   `json:"id"`
	Addrs []string `json:"addrs,omitempty"`
}

// Hello is what peers exchange to agree on a ring. A request and its
// response are both Hellos.
type Hello struct {
	Version    int    `json:"version"`
	Job        string `json:"job"`
	ConfigHash string `json:"config_hash"` // hex SHA-256 of the canonical job config
	WorldSize  int    `json:"world_size"`
	// Members are the peers of this job the sender has verified,
	// itself included. Receivers dial the ones they did not know, so a
	// swarm that started in pieces ends as one.
	Members []Member `json:"members"`
	// Proposal is the ring the sender proposes: world_size peer IDs in
	// rank order; empty until it knows enough members.
	Proposal []string `json:"proposal,omitempty"`
	// Ready: the sender has seen every member propose Proposal and will
	// not change it; the ring forms when all members are ready.
	Ready bool `json:"ready,omitempty"`
	// Generation of the proposed ring.
	Generation uint64 `json:"generation"`
	// Formed: the sender's ring has formed and is training; a peer not in
	// its Proposal is late, and waits as a standby.
	Formed bool `json:"formed,omitempty"`
	// Refused, in a response, says why the responder will not form a
	// ring with the sender (another config, version or job).
	Refused string `json:"refused,omitempty"`
}

// writeHello writes h as a 4-byte big-endian length and JSON.
func writeHello(w io.Writer, h *Hello) error {
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	if len(b) > maxHelloBytes {
		return fmt.Errorf("p2p: hello of %d bytes is over the %d-byte limit", len(b), maxHelloBytes)
	}
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := w.Write(append(n[:], b...)); err != nil {
		return err
	}
	return nil
}

// readHello reads one hello, refusing a length over the limit before
// allocating anything, and an unknown field.
func readHello(r io.Reader) (*Hello, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, fmt.Errorf("reading hello length: %w", err)
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxHelloBytes {
		return nil, fmt.Errorf("hello of %d bytes, limit %d: %w", size, maxHelloBytes, ErrBadHello)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("reading %d-byte hello: %w", size, err)
	}
	return decodeHello(b)
}

func decodeHello(b []byte) (*Hello, error) {
	var h Hello
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("hello: %v: %w", err, ErrBadHello)
	}
	if h.WorldSize < 0 || len(h.Proposal) > max(h.WorldSize, 0) || len(h.Members) > 4096 {
		return nil, fmt.Errorf("hello with world size %d, %d members, proposal of %d: %w", h.WorldSize, len(h.Members), len(h.Proposal), ErrBadHello)
	}
	return &h, nil
}
