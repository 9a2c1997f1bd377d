package pipeline

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/ringtrain/ringtrain/ring"
)

// Encoding is how a frame's values travel: F32 or BF16.
type Encoding = ring.Encoding

// The encodings a boundary may use.
const (
	F32  = ring.F32
	BF16 = ring.BF16
)

// FrameKind says what a frame carries.
type FrameKind uint8

// Frame kinds.
const (
	// Activations go forward: a micro-batch's activation and the saved
	// outputs carried on.
	Activations FrameKind = 1
	// Gradients go backward: the gradients of what Activations carried,
	// and the micro-batch's loss.
	Gradients FrameKind = 2
	// Results go backward in evaluation: the micro-batch's logits and
	// loss, so every stage reports what the last one computed.
	Results FrameKind = 3
	// Params go backward once training is done: the parameters of every
	// later stage, gathered into one model on the first.
	Params FrameKind = 4
)

func (k FrameKind) String() string {
	switch k {
	case Activations:
		return "activations"
	case Gradients:
		return "gradients"
	case Results:
		return "results"
	case Params:
		return "params"
	}
	return fmt.Sprintf("FrameKind(%d)", uint8(k))
}

// ErrFrame means a boundary frame was not the one expected: malformed,
// from another generation, stage, step or micro-batch, or of the wrong
// shape. The message names the field.
var ErrFrame = errors.New("pipeline: bad boundary frame")

// Frame is what crosses a stage boundary for one micro-batch.
type Frame struct {
	Kind  FrameKind
	Enc   Encoding
	Stage int    // the sender's stage
	Gen   uint64 // the generation of the ring the sender is in
	Step  uint64 // the sender's step (ForwardBackward or Forward call)
	MB    int    // the micro-batch
	Rows  int    // samples in it
	Loss  float32
	// Stop says the sender's column stops after this step: a peer of it
	// was asked to leave (Pipe.Stop) or heard of it in a frame.
	Stop    bool
	Tensors [][]float32 // Rows × values each
}

// frameHeader is the fixed part of a frame on the wire: kind, encoding,
// stage, generation, step, micro-batch, rows, loss, tensor count, flags.
const frameHeader = 1 + 1 + 2 + 8 + 8 + 4 + 4 + 4 + 2 + 1

// flagStop is Frame.Stop in the flags byte; no other bit may be set.
const flagStop = 1

// Expect is what a receiver knows a frame must be. Sizes are the values
// per sample of each tensor; Rows the samples.
type Expect struct {
	Kind  FrameKind
	Enc   Encoding
	Stage int
	Gen   uint64
	Step  uint64
	MB    int
	Rows  int
	Sizes []int
}

// AppendFrame appends f's wire form to dst. BF16 rounds each value to the
// nearest bfloat16.
func AppendFrame(dst []byte, f *Frame) []byte {
	var h [frameHeader]byte
	h[0], h[1] = byte(f.Kind), byte(f.Enc)
	binary.LittleEndian.PutUint16(h[2:], uint16(f.Stage))
	binary.LittleEndian.PutUint64(h[4:], f.Gen)
	binary.LittleEndian.PutUint64(h[12:], f.Step)
	binary.LittleEndian.PutUint32(h[20:], uint32(f.MB))
	binary.LittleEndian.PutUint32(h[24:], uint32(f.Rows))
	binary.LittleEndian.PutUint32(h[28:], math.Float32bits(f.Loss))
	binary.LittleEndian.PutUint16(h[32:], uint16(len(f.Tensors)))
	if f.Stop {
		h[34] = flagStop
	}
	dst = append(dst, h[:]...)
	for _, t := range f.Tensors {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(t)))
		if f.Enc != BF16 {
			for _, v := range t {
				dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
			}
			continue
		}
		r := append([]float32(nil), t...)
		BF16.Round(r)
		for _, v := range r {
			dst = binary.LittleEndian.AppendUint16(dst, uint16(math.Float32bits(v)>>16))
		}
	}
	return dst
}

// ReadFrame reads one frame from r and checks every field against want
// before it reads (or allocates for) the values: a frame that is not the
// one expected is an ErrFrame saying which field differs.
func ReadFrame(r io.Reader, want Expect) (*Frame, error) {
	var h [frameHeader]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, fmt.Errorf("pipeline: reading a frame header: %w", err)
	}
	f := &Frame{
		Kind: FrameKind(h[0]), Enc: Encoding(h[1]),
		Stage: int(binary.LittleEndian.Uint16(h[2:])),
		Gen:   binary.LittleEndian.Uint64(h[4:]), Step: binary.LittleEndian.Uint64(h[12:]),
		MB:   int(binary.LittleEndian.Uint32(h[20:])),
		Rows: int(binary.LittleEndian.Uint32(h[24:])),
		Loss: math.Float32frombits(binary.LittleEndian.Uint32(h[28:])),
		Stop: h[34] == flagStop,
	}
	n := int(binary.LittleEndian.Uint16(h[32:]))
	bad := func(field string, got, wanted any) error {
		return fmt.Errorf("%v frame: %s %v; want %v: %w", want.Kind, field, got, wanted, ErrFrame)
	}
	switch {
	case f.Kind != want.Kind:
		return nil, bad("kind", f.Kind, want.Kind)
	case f.Enc != want.Enc:
		return nil, bad("encoding", f.Enc, want.Enc)
	case f.Gen != want.Gen:
		return nil, bad("generation", f.Gen, want.Gen)
	case f.Stage != want.Stage:
		return nil, bad("stage", f.Stage, want.Stage)
	case f.Step != want.Step:
		return nil, bad("step", f.Step, want.Step)
	case f.MB != want.MB:
		return nil, bad("micro-batch", f.MB, want.MB)
	case f.Rows != want.Rows:
		return nil, bad("rows", f.Rows, want.Rows)
	case n != len(want.Sizes):
		return nil, bad("tensors", n, len(want.Sizes))
	case h[34] > flagStop:
		return nil, bad("flags", h[34], "0 or 1")
	}
	width := 4
	if f.Enc == BF16 {
		width = 2
	}
	f.Tensors = make([][]float32, n)
	var buf []byte
	for k, size := range want.Sizes {
		var c [4]byte
		if _, err := io.ReadFull(r, c[:]); err != nil {
			return nil, fmt.Errorf("pipeline: reading tensor %d of a %s frame: %w", k, f.Kind, err)
		}
		if got := binary.LittleEndian.Uint32(c[:]); uint64(got) != uint64(want.Rows)*uint64(size) {
			return nil, bad(fmt.Sprintf("tensor %d values", k), got, want.Rows*size)
		}
		t := make([]float32, want.Rows*size)
		if cap(buf) < len(t)*width {
			buf = make([]byte, len(t)*width)
		}
		b := buf[:len(t)*width]
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, fmt.Errorf("pipeline: reading tensor %d of a %s frame: %w", k, f.Kind, err)
		}
		for i := range t {
			if width == 2 {
				t[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
			} else {
				t[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
			}
		}
		f.Tensors[k] = t
	}
	return f, nil
}
