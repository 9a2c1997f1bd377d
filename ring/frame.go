package ring

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
)

// HeaderSize is the size in bytes of a frame header on the wire.
const HeaderSize = 56

// magic opens every frame ("RTF1", little-endian), so a stream that carries
// something else is caught on its first frame.
const magic uint32 = 0x31465452

// Op names the collective a frame belongs to.
type Op uint32

// The collectives. Their values are part of the wire format.
const (
	OpAllreduceSum  Op = 1
	OpAllreduceMean Op = 2
	OpBroadcast     Op = 3
	OpBarrier       Op = 4
	OpAllgather     Op = 5
)

func (o Op) String() string {
	switch o {
	case OpAllreduceSum:
		return "AllreduceSum"
	case OpAllreduceMean:
		return "AllreduceMean"
	case OpBroadcast:
		return "Broadcast"
	case OpBarrier:
		return "Barrier"
	case OpAllgather:
		return "Allgather"
	}
	return fmt.Sprintf("Op(%d)", uint32(o))
}

// Header is the fixed part of a frame. Every frame repeats the whole
// description of its call (op, element count, root), so a peer that called a
// different collective is caught on the first frame it sends, not after a
// payload of the wrong size has been misread.
//
// Wire layout, little-endian:
//
//	0 magic u32 | 4 op u16 | 6 encoding u16 | 8 generation u64 | 16 seq u64 |
//	24 count u64 | 32 root u32 | 36 step u32 | 40 segment u32 | 44 length u32 |
//	48 offset u64
//
// The encoding took the op's upper half, always zero before: a float32
// frame is the same bytes as it was.
type Header struct {
	Op         Op
	Encoding   Encoding // how the payload's values are written
	Generation uint64   // ring formation the frame belongs to
	Seq        uint64   // collective call number on this ring, from 1
	Count      uint64   // elements in the caller's buffer
	Root       uint32   // Broadcast root; 0 for other ops
	Step       uint32   // step within the call
	Segment    uint32   // segment of the buffer the payload belongs to
	Length     uint32   // payload bytes that follow the header
	Offset     uint64   // index of the payload's first element in the buffer
}

// putHeader encodes h into b, which must hold HeaderSize bytes.
func putHeader(b []byte, h *Header) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], magic)
	le.PutUint16(b[4:], uint16(h.Op))
	le.PutUint16(b[6:], uint16(h.Encoding))
	le.PutUint64(b[8:], h.Generation)
	le.PutUint64(b[16:], h.Seq)
	le.PutUint64(b[24:], h.Count)
	le.PutUint32(b[32:], h.Root)
	le.PutUint32(b[36:], h.Step)
	le.PutUint32(b[40:], h.Segment)
	le.PutUint32(b[44:], h.Length)
	le.PutUint64(b[48:], h.Offset)
}

// parseHeader decodes a header. It checks only what can be checked without
// knowing what the receiver expects: the magic number.
func parseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("header of %d bytes, want %d: %w", len(b), HeaderSize, ErrBadFrame)
	}
	le := binary.LittleEndian
	if m := le.Uint32(b[0:]); m != magic {
		return Header{}, fmt.Errorf("magic %#08x, want %#08x: %w", m, magic, ErrBadFrame)
	}
	return Header{
		Op:         Op(le.Uint16(b[4:])),
		Encoding:   Encoding(le.Uint16(b[6:])),
		Generation: le.Uint64(b[8:]),
		Seq:        le.Uint64(b[16:]),
		Count:      le.Uint64(b[24:]),
		Root:       le.Uint32(b[32:]),
		Step:       le.Uint32(b[36:]),
		Segment:    le.Uint32(b[40:]),
		Length:     le.Uint32(b[44:]),
		Offset:     le.Uint64(b[48:]),
	}, nil
}

// check compares a received header with the one the receiver expects and
// names the first field that differs. Fields that describe the call (op,
// count, root) differ when the peer called another collective: that is
// ErrMismatch. Any other difference is a frame out of place: ErrBadFrame.
func (h *Header) check(want *Header) error {
	type field struct {
		name      string
		got, want uint64
		sentinel  error
	}
	for _, f := range [...]field{
		{"generation", h.Generation, want.Generation, ErrBadFrame},
		{"sequence", h.Seq, want.Seq, ErrBadFrame},
		{"op", uint64(h.Op), uint64(want.Op), ErrMismatch},
		{"encoding", uint64(h.Encoding), uint64(want.Encoding), ErrMismatch},
		{"element count", h.Count, want.Count, ErrMismatch},
		{"root", uint64(h.Root), uint64(want.Root), ErrMismatch},
		{"step", uint64(h.Step), uint64(want.Step), ErrBadFrame},
		{"segment", uint64(h.Segment), uint64(want.Segment), ErrBadFrame},
		{"offset", h.Offset, want.Offset, ErrBadFrame},
		{"length", uint64(h.Length), uint64(want.Length), ErrBadFrame},
	} {
		if f.got == f.want {
			continue
		}
		if f.name == "op" {
			return fmt.Errorf("peer sent %v, this rank called %v: %w", h.Op, want.Op, f.sentinel)
		}
		if f.name == "encoding" {
			return fmt.Errorf("peer sent %v values, this rank expects %v: %w", h.Encoding, want.Encoding, f.sentinel)
		}
		return fmt.Errorf("%s %d, want %d: %w", f.name, f.got, f.want, f.sentinel)
	}
	return nil
}

// frameReader reads frames whose every field the caller knows in advance.
// It never allocates: the header goes into a fixed array and the payload into
// a slice the caller sized, after the header has been checked.
type frameReader struct {
	r   *heldReader
	hdr [HeaderSize]byte
}

// heldReader is the predecessor's stream with room for one byte read
// ahead: AwaitIncoming reads a collective's first byte before the
// collective itself runs, and the collective's first read gets it back.
// Its lock orders those two readers: a collective's reads come from one
// goroutine, and an AwaitIncoming left blocked (its caller went on to
// call the collective) finishes once the predecessor sends, after which
// the collective reads on.
type heldReader struct {
	mu   sync.Mutex
	r    io.Reader
	held [1]byte
	n    int   // 1 when held holds the next byte
	err  error // the error that ended the read ahead, returned to the next reader
}

func (h *heldReader) Read(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case len(p) == 0:
		return 0, nil
	case h.n > 0:
		p[0], h.n = h.held[0], 0
		return 1, nil
	case h.err != nil:
		return 0, h.err
	}
	return h.r.Read(p)
}

// await blocks until the next byte has arrived, or the stream has ended
// (whose error it returns), and keeps it for the next Read.
func (h *heldReader) await() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for h.n == 0 && h.err == nil {
		n, err := h.r.Read(h.held[:])
		h.n = n
		if n == 0 && err != nil {
			h.err = err
		}
	}
	return h.err
}

// readHeader reads one frame header and checks it against want. The
// want.Length payload bytes that follow are the caller's to read.
func (fr *frameReader) readHeader(want *Header) error {
	if _, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		return fmt.Errorf("reading frame header: %w", readErr(err))
	}
	h, err := parseHeader(fr.hdr[:])
	if err != nil {
		return err
	}
	return h.check(want)
}

// readPayload reads exactly len(p) payload bytes.
func (fr *frameReader) readPayload(p []byte) error {
	if _, err := io.ReadFull(fr.r, p); err != nil {
		return fmt.Errorf("reading %d bytes of payload: %w", len(p), readErr(err))
	}
	return nil
}

// read reads one frame whose header must equal want, and its payload into
// dst, which the caller sized to want.Length bytes.
func (fr *frameReader) read(want *Header, dst []byte) error {
	if err := fr.readHeader(want); err != nil {
		return err
	}
	return fr.readPayload(dst)
}

// readErr turns the end of a stream into ErrPeerLost: on a ring, a stream
// that ends mid-call means the neighbour went away.
func readErr(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return fmt.Errorf("stream ended (%v): %w", err, ErrPeerLost)
	}
	return fmt.Errorf("%w: %w", ErrPeerLost, err)
}
