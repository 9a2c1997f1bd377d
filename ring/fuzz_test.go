package ring

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
)

type discard struct{ io.Writer }

func (discard) Close() error { return nil }

// fuzzPeerStream returns what a correct predecessor sends rank 0 of a ring
// of two for one AllreduceSum of count elements in chunks of chunkBytes.
func fuzzPeerStream(count, chunkBytes int) []byte {
	var b bytes.Buffer
	chunk := chunkBytes / 4
	payload := make([]float32, count)
	for i := range payload {
		payload[i] = float32(i)
	}
	for s := range 2 {
		seg := mod(0-s-1, 2)
		start, length := segment(uint64(count), 2, seg)
		for c := range frames(length, chunk) {
			lo := start + uint64(c*chunk)
			hi := min(lo+uint64(chunk), start+length)
			h := Header{Op: OpAllreduceSum, Generation: 3, Seq: 1, Count: uint64(count),
				Step: uint32(s), Segment: uint32(seg), Offset: lo, Length: uint32(4 * (hi - lo))}
			var hdr [HeaderSize]byte
			putHeader(hdr[:], &h)
			b.Write(hdr[:])
			b.Write(asBytes(payload[lo:hi]))
		}
	}
	return b.Bytes()
}

// FuzzRecv feeds arbitrary bytes to rank 0 of a two-rank ring as if its
// predecessor had sent them. Whatever the bytes, the call returns: nil for a
// correct stream, otherwise an error wrapping one of the package's
// sentinels. It must never panic or hang.
func FuzzRecv(f *testing.F) {
	f.Add(fuzzPeerStream(5, 8))
	f.Add(fuzzPeerStream(0, 8))
	f.Add(fuzzPeerStream(5, 8)[:HeaderSize+3])
	f.Add([]byte("RTF1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		recvFuzzed(t, data, func(r *Ring) error { return r.AllreduceSum(context.Background(), make([]float32, 5)) })
	})
}

// recvFuzzed runs call on rank 0 of a two-rank ring whose predecessor sent
// data, and requires nil or an error wrapping a ring sentinel.
func recvFuzzed(t *testing.T, data []byte, call func(r *Ring) error) {
	tr := NewStreams(discard{io.Discard}, io.NopCloser(bytes.NewReader(data)))
	r, err := New(tr, Config{Rank: 0, Size: 2, Generation: 3, ChunkBytes: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := call(r); err != nil && !errors.Is(err, ErrBadFrame) && !errors.Is(err, ErrMismatch) && !errors.Is(err, ErrPeerLost) {
		t.Fatalf("a collective on a fuzzed stream = %v; want nil or a ring sentinel", err)
	}
}

// FuzzRecvNarrow is FuzzRecv for a bf16 allreduce, whose payloads are
// decoded from two bytes a value.
func FuzzRecvNarrow(f *testing.F) {
	f.Add(fuzzPeerStream(5, 8))
	stream := fuzzPeerStream(5, 8)
	stream[6] = byte(BF16) // the encoding, right after the op
	f.Add(stream)
	f.Fuzz(func(t *testing.T, data []byte) {
		recvFuzzed(t, data, func(r *Ring) error { return r.AllreduceMeanAs(context.Background(), make([]float32, 5), BF16) })
	})
}

// FuzzRecvI8 is FuzzRecv for an int8 allreduce, whose payloads are a
// scale and a byte a value per block.
func FuzzRecvI8(f *testing.F) {
	f.Add(fuzzPeerStream(5, 8))
	stream := fuzzPeerStream(5, 8)
	stream[6] = byte(I8)
	f.Add(stream)
	f.Fuzz(func(t *testing.T, data []byte) {
		recvFuzzed(t, data, func(r *Ring) error { return r.AllreduceMeanAs(context.Background(), make([]float32, 5), I8) })
	})
}

func TestFuzzSeedIsValid(t *testing.T) {
	tr := NewStreams(discard{io.Discard}, io.NopCloser(bytes.NewReader(fuzzPeerStream(5, 8))))
	r, err := New(tr, Config{Rank: 0, Size: 2, Generation: 3, ChunkBytes: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	buf := []float32{10, 20, 30, 40, 50}
	if err := r.AllreduceSum(context.Background(), buf); err != nil {
		t.Fatalf("AllreduceSum on a correct stream: %v", err)
	}
	// Rank 0 adds the peer's segment 1 ([3,5)) to its own, then takes
	// segment 0 ([0,3)) as the peer sends it back, reduced.
	want := []float32{0, 1, 2, 43, 54}
	for i := range want {
		if buf[i] != want[i] {
			t.Fatalf("buf = %v; want %v", buf, want)
		}
	}
}
