package ring

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Encoding is how an allreduce's values travel on the wire. Sums are kept
// in float32 on every rank whatever the encoding; only what is sent is
// narrowed. Its values are part of the wire format.
type Encoding uint16

const (
	// F32 sends float32 values as they are (the default).
	F32 Encoding = 0
	// BF16 sends bfloat16: float32's range, 8 bits of precision, half
	// the bytes. Rounding to nearest even; NaN stays NaN.
	BF16 Encoding = 1
	// FP16 sends IEEE half precision: 11 bits of precision, but values
	// over 65504 become infinite — for gradients already scaled small.
	FP16 Encoding = 2
	// I8 sends blockwise int8: each block of I8Block values as a float32
	// scale (the block's largest magnitude over 127) and one signed byte
	// per value, rounded to nearest — a little over a quarter of float32's
	// bytes, with an error of at most half a step of the block's scale. A
	// block holding a NaN or an Inf goes as a NaN scale, so the whole block
	// arrives NaN and the step is caught, not applied. Blocks start at
	// multiples of I8Block in the caller's buffer (the ring aligns its
	// segments and frames to them), so Round, applied to the whole buffer,
	// rounds exactly as the ring's first hop does: what error feedback
	// needs.
	I8 Encoding = 3
)

// I8Block is the values per scale of the I8 encoding. 256 costs 1/64 of
// a byte per value for the scale; smaller blocks round more finely but
// cost more.
const I8Block = 256

// ParseEncoding reads an encoding's name: "", "none" or "f32", "bf16",
// "fp16", "int8".
func ParseEncoding(s string) (Encoding, error) {
	switch s {
	case "", "none", "f32":
		return F32, nil
	case "bf16":
		return BF16, nil
	case "fp16":
		return FP16, nil
	case "int8":
		return I8, nil
	}
	return 0, fmt.Errorf("ring: encoding %q; want none, bf16, fp16 or int8", s)
}

func (e Encoding) String() string {
	switch e {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	case FP16:
		return "fp16"
	case I8:
		return "int8"
	}
	return fmt.Sprintf("Encoding(%d)", uint16(e))
}

// known reports whether this version can send and read e.
func (e Encoding) known() bool { return e <= I8 }

// Size is the bytes n values take on the wire as e, when they start a
// block: an allreduce frame's payload, headers aside.
func (e Encoding) Size(n int) int {
	switch e {
	case BF16, FP16:
		return 2 * n
	case I8:
		return n + 4*((n+I8Block-1)/I8Block)
	}
	return 4 * n
}

// block is the values that share a scale: frames and segments start at
// its multiples.
func (e Encoding) block() int {
	if e == I8 {
		return I8Block
	}
	return 1
}

// Round replaces every value of buf with what it becomes on the wire as e:
// what a rank's own values become on the ring's first hop. Error feedback
// keeps the difference and adds it to the next step's values.
func (e Encoding) Round(buf []float32) {
	switch e {
	case BF16:
		for i, v := range buf {
			buf[i] = math.Float32frombits(uint32(bf16(v)) << 16)
		}
	case FP16:
		for i, v := range buf {
			buf[i] = fromFP16(fp16(v))
		}
	case I8:
		var b [I8Block + 4]byte
		for lo := 0; lo < len(buf); lo += I8Block {
			blk := buf[lo:min(lo+I8Block, len(buf))]
			e.encode(b[:], blk)
			e.decode(blk, b[:])
		}
	}
}

// encode writes src into dst (Size(len(src)) bytes), little-endian.
func (e Encoding) encode(dst []byte, src []float32) {
	switch e {
	case I8:
		for lo := 0; lo < len(src); lo += I8Block {
			blk := src[lo:min(lo+I8Block, len(src))]
			d := dst[lo+4*(lo/I8Block):]
			encodeI8(d[:4+len(blk)], blk)
		}
	case BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], bf16(v))
		}
	case FP16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], fp16(v))
		}
	}
}

// decode reads len(dst) values from src.
func (e Encoding) decode(dst []float32, src []byte) {
	switch e {
	case I8:
		decodeI8(dst, src, false)
	case BF16:
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		}
	case FP16:
		for i := range dst {
			dst[i] = fromFP16(binary.LittleEndian.Uint16(src[2*i:]))
		}
	}
}

// decodeAdd adds len(dst) values read from src into dst.
func (e Encoding) decodeAdd(dst []float32, src []byte) {
	switch e {
	case I8:
		decodeI8(dst, src, true)
	case BF16:
		for i := range dst {
			dst[i] += math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		}
	case FP16:
		for i := range dst {
			dst[i] += fromFP16(binary.LittleEndian.Uint16(src[2*i:]))
		}
	}
}

// encodeI8 writes one block: its scale, then a signed byte per value.
func encodeI8(dst []byte, blk []float32) {
	var amax float32
	for _, v := range blk {
		a := float32(math.Abs(float64(v)))
		if !(a <= math.MaxFloat32) { // NaN or Inf: the block goes as NaN
			binary.LittleEndian.PutUint32(dst, 0x7fc00000)
			clear(dst[4:])
			return
		}
		amax = max(amax, a)
	}
	scale := amax / 127
	binary.LittleEndian.PutUint32(dst, math.Float32bits(scale))
	if scale == 0 { // all zero, or too small for a normal scale
		clear(dst[4:])
		return
	}
	for i, v := range blk {
		q := math.RoundToEven(float64(v / scale))
		dst[4+i] = byte(int8(max(-127, min(127, q))))
	}
}

// decodeI8 reads len(dst) values of int8 blocks from src into dst, or adds
// them to it.
func decodeI8(dst []float32, src []byte, add bool) {
	for lo := 0; lo < len(dst); lo += I8Block {
		blk := dst[lo:min(lo+I8Block, len(dst))]
		s := src[lo+4*(lo/I8Block):]
		scale := math.Float32frombits(binary.LittleEndian.Uint32(s))
		q := s[4 : 4+len(blk)]
		if add {
			for i := range blk {
				blk[i] += float32(int8(q[i])) * scale
			}
		} else {
			for i := range blk {
				blk[i] = float32(int8(q[i])) * scale
			}
		}
	}
}

// bf16 rounds v to bfloat16, to nearest even; a NaN stays a (quiet) NaN
// rather than rounding into an infinity.
func bf16(v float32) uint16 {
	u := math.Float32bits(v)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// fp16 rounds v to IEEE half precision, to nearest even: past 65504 (from
// 65520, the midpoint to 65536, on) to infinity, below 2^-14 to a
// subnormal. Written here, as ring imports only the standard library.
func fp16(v float32) uint16 {
	u := math.Float32bits(v)
	sign := uint16(u>>16) & 0x8000
	a := u & 0x7fffffff
	switch {
	case a > 0x7f800000: // NaN
		return sign | 0x7e00
	case a >= 0x477ff000: // 65520 and up, and infinity
		return sign | 0x7c00
	case a < 0x33000000: // under 2^-25: rounds to zero
		return sign
	case a < 0x38800000: // under 2^-14: a subnormal, in units of 2^-24
		e := a >> 23
		m := a&0x7fffff | 0x800000
		shift := 126 - e
		q := m >> shift
		rem, half := m&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > half || rem == half && q&1 == 1 {
			q++
		}
		return sign | uint16(q)
	}
	r := a - 112<<23 // float32's exponent bias 127, half's 15
	r += 0xfff + (r>>13)&1
	return sign | uint16(r>>13)
}

// fromFP16 widens a half to float32, exactly.
func fromFP16(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	e := uint32(h>>10) & 0x1f
	m := uint32(h & 0x3ff)
	switch e {
	case 0x1f: // infinity, NaN
		return math.Float32frombits(sign | 0x7f800000 | m<<13)
	case 0: // zero, subnormal: m × 2^-24
		f := float32(m) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (e+112)<<23 | m<<13)
}
