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
)

// ParseEncoding reads an encoding's name: "", "none" or "f32", "bf16",
// "fp16".
func ParseEncoding(s string) (Encoding, error) {
	switch s {
	case "", "none", "f32":
		return F32, nil
	case "bf16":
		return BF16, nil
	case "fp16":
		return FP16, nil
	}
	return 0, fmt.Errorf("ring: encoding %q; want none, bf16 or fp16", s)
}

func (e Encoding) String() string {
	switch e {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	case FP16:
		return "fp16"
	}
	return fmt.Sprintf("Encoding(%d)", uint16(e))
}

// width is the bytes one value takes on the wire, or 0 for an encoding
// this version does not know.
func (e Encoding) width() int {
	switch e {
	case F32:
		return 4
	case BF16, FP16:
		return 2
	}
	return 0
}

// encode writes src into dst (width bytes per value), little-endian.
func (e Encoding) encode(dst []byte, src []float32) {
	switch e {
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
