package ring

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"slices"
	"testing"
)

// TestHalfConversions: every half widens to the float64 value its bits
// say and narrows back to itself; random float32s narrow to the nearest
// half (bfloat16) — ties to even, NaN kept a NaN, overflow infinite.
func TestHalfConversions(t *testing.T) {
	halfValue := func(h uint16) float64 {
		e, m := int(h>>10&0x1f), float64(h&0x3ff)
		v := math.Ldexp(m, -24)
		if e > 0 {
			v = math.Ldexp(1024+m, e-25)
		}
		if h&0x8000 != 0 {
			v = -v
		}
		return v
	}
	for h := range 1 << 16 {
		h := uint16(h)
		f := fromFP16(h)
		if h&0x7c00 == 0x7c00 {
			if h&0x3ff != 0 && !math.IsNaN(float64(f)) || h&0x3ff == 0 && !math.IsInf(float64(f), 0) || fp16(f)&0x7c00 != 0x7c00 {
				t.Fatalf("half %#04x widens to %v, narrows to %#04x", h, f, fp16(f))
			}
			continue
		}
		if float64(f) != halfValue(h) || fp16(f) != h {
			t.Fatalf("half %#04x widens to %v (want %v), narrows back to %#04x", h, f, halfValue(h), fp16(f))
		}
	}
	rng := rand.New(rand.NewSource(1))
	nearest := func(v float64, got uint16, value func(uint16) float64, next func(uint16) uint16, prev func(uint16) uint16) bool {
		d := math.Abs(v - value(got))
		for _, o := range []uint16{next(got), prev(got)} {
			od := math.Abs(v - value(o))
			if od < d || od == d && o&1 == 0 && got&1 == 1 {
				return false
			}
		}
		return true
	}
	bfValue := func(b uint16) float64 { return float64(math.Float32frombits(uint32(b) << 16)) }
	for range 200000 {
		v := math.Float32frombits(rng.Uint32())
		if math.IsNaN(float64(v)) {
			if !math.IsNaN(bfValue(bf16(v))) || !math.IsNaN(float64(fromFP16(fp16(v)))) {
				t.Fatalf("NaN %#08x rounds to bf16 %#04x, fp16 %#04x", math.Float32bits(v), bf16(v), fp16(v))
			}
			continue
		}
		inc := func(h uint16) uint16 { return h + 1 }
		dec := func(h uint16) uint16 { return h - 1 }
		if b := bf16(v); !math.IsInf(bfValue(b), 0) && !nearest(float64(v), b, bfValue, inc, dec) {
			t.Fatalf("%v rounds to bf16 %#04x = %v, not the nearest", v, b, bfValue(b))
		}
		small := v * 1e-34 // into half's range, subnormals included
		if h := fp16(small); h&0x7fff != 0 && h&0x7fff < 0x7bff && !nearest(float64(small), h, halfValue, inc, dec) {
			t.Fatalf("%v rounds to fp16 %#04x = %v, not the nearest", small, h, halfValue(h))
		}
	}
	for _, tc := range []struct {
		v    float32
		want uint16
	}{{65504, 0x7bff}, {65519, 0x7bff}, {65520, 0x7c00}, {-1e9, 0xfc00}, {float32(math.Ldexp(1, -25)), 0}, {float32(math.Ldexp(1.5, -25)), 1}, {float32(math.Ldexp(1, -14)), 0x0400}} {
		if got := fp16(tc.v); got != tc.want {
			t.Errorf("fp16(%v) = %#04x; want %#04x", tc.v, got, tc.want)
		}
	}
}

// TestAllreduceMeanAs: with bf16 or fp16 on the wire, the mean is within
// the encoding's error of a float64 reference, and every rank holds the
// same bits; a frame carries half the bytes.
func TestAllreduceMeanAs(t *testing.T) {
	for _, tc := range []struct {
		enc Encoding
		eps float64 // relative error of one rounding
	}{{BF16, 1.0 / 256}, {FP16, 1.0 / 2048}} {
		for _, tk := range transportKinds {
			for _, n := range []int{1, 2, 3, 5} {
				t.Run(fmt.Sprintf("%v/%s/n=%d", tc.enc, tk.name, n), func(t *testing.T) {
					rs := newRings(t, tk.make(t, n, 7), testChunk)
					rng := rand.New(rand.NewSource(int64(n)))
					for _, length := range []int{1, n + 1, 4*testChunk + 3, 1000} {
						in := randomBuffers(rng, n, length)
						out := clone(in)
						errs := onAll(n, func(i int) error { return rs[i].AllreduceMeanAs(context.Background(), out[i], tc.enc) })
						if err := errors.Join(errs...); err != nil {
							t.Fatalf("len=%d: %v", length, err)
						}
						for j := range length {
							var sum, abs float64
							for i := range n {
								sum += float64(in[i][j])
								abs += math.Abs(float64(in[i][j]))
							}
							// Each of the n-1 hops and the final narrowing
							// rounds once.
							tol := float64(n+1)*tc.eps*abs/float64(n) + 1e-6
							if n == 1 {
								tol = 0
							}
							if got := float64(out[0][j]); math.Abs(got-sum/float64(n)) > tol {
								t.Fatalf("len=%d element %d = %v; want %v (±%g)", length, j, got, sum/float64(n), tol)
							}
							for i := 1; i < n; i++ {
								if math.Float32bits(out[i][j]) != math.Float32bits(out[0][j]) {
									t.Fatalf("len=%d: rank %d element %d = %v, rank 0 %v; want the same bits", length, i, j, out[i][j], out[0][j])
								}
							}
						}
					}
				})
			}
		}
	}
}

// TestNarrowFramesHalveTheBytes: a bf16 allreduce sends half the bytes of
// a float32 one, headers aside.
func TestNarrowFramesHalveTheBytes(t *testing.T) {
	const n, length = 3, 100000
	sent := map[Encoding]int64{}
	for _, enc := range []Encoding{F32, BF16} {
		rs := newRings(t, MemRing(n), 0)
		bufs := randomBuffers(rand.New(rand.NewSource(1)), n, length)
		if err := errors.Join(onAll(n, func(i int) error { return rs[i].AllreduceMeanAs(context.Background(), bufs[i], enc) })...); err != nil {
			t.Fatal(err)
		}
		sent[enc] = rs[0].Stats().BytesSent
	}
	if r := float64(sent[BF16]) / float64(sent[F32]); r < 0.49 || r > 0.51 {
		t.Errorf("bf16 sent %d bytes, float32 %d: ratio %.3f; want 0.5", sent[BF16], sent[F32], r)
	}
}

// TestAllreduceMeanI8: with blockwise int8 on the wire, the mean is within
// the rounding error of each block's scale at every hop, and every rank
// holds the same bits.
func TestAllreduceMeanI8(t *testing.T) {
	for _, tk := range transportKinds {
		for _, n := range []int{1, 2, 3, 5} {
			t.Run(fmt.Sprintf("%s/n=%d", tk.name, n), func(t *testing.T) {
				rs := newRings(t, tk.make(t, n, 7), testChunk)
				rng := rand.New(rand.NewSource(int64(n)))
				for _, length := range []int{1, n + 1, I8Block - 1, 3*I8Block + 5, 10*I8Block*n + 17} {
					in := randomBuffers(rng, n, length)
					out := clone(in)
					errs := onAll(n, func(i int) error { return rs[i].AllreduceMeanAs(context.Background(), out[i], I8) })
					if err := errors.Join(errs...); err != nil {
						t.Fatalf("len=%d: %v", length, err)
					}
					for b := 0; b < length; b += I8Block {
						// A partial sum in this block is at most absSum in
						// magnitude; each of the n-1 hops and the final
						// rounding err by half a scale (absSum/127/2) at most.
						var absSum float64
						for j := b; j < min(b+I8Block, length); j++ {
							var s float64
							for i := range n {
								s += math.Abs(float64(in[i][j]))
							}
							absSum = max(absSum, s)
						}
						tol := float64(n+1)*absSum/254/float64(n) + 1e-6
						if n == 1 {
							tol = 0
						}
						for j := b; j < min(b+I8Block, length); j++ {
							var sum float64
							for i := range n {
								sum += float64(in[i][j])
							}
							if got := float64(out[0][j]); math.Abs(got-sum/float64(n)) > tol {
								t.Fatalf("len=%d element %d = %v; want %v (±%g)", length, j, got, sum/float64(n), tol)
							}
							for i := 1; i < n; i++ {
								if math.Float32bits(out[i][j]) != math.Float32bits(out[0][j]) {
									t.Fatalf("len=%d: rank %d element %d = %v, rank 0 %v; want the same bits", length, i, j, out[i][j], out[0][j])
								}
							}
						}
					}
				}
			})
		}
	}
}

// TestI8Block: a block's scale is its largest magnitude over 127, values
// round to nearest, a NaN or an Inf makes the whole block NaN, and zeros
// stay zero.
func TestI8Block(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      []float32
		want    []float32
		wantNaN bool
	}{
		{"exact steps", []float32{127, -127, 1, 0, -3}, []float32{127, -127, 1, 0, -3}, false},
		{"rounds to nearest", []float32{254, 2.9, -1.1, 1}, []float32{254, 2, -2, 0}, false},
		{"all zero", []float32{0, 0, 0}, []float32{0, 0, 0}, false},
		{"nan", []float32{1, float32(math.NaN()), 2}, nil, true},
		{"inf", []float32{1, float32(math.Inf(-1))}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := slices.Clone(tc.in)
			I8.Round(got)
			for i, v := range got {
				if tc.wantNaN {
					if !math.IsNaN(float64(v)) {
						t.Fatalf("Round(%v) = %v; want all NaN", tc.in, got)
					}
				} else if v != tc.want[i] {
					t.Fatalf("Round(%v) = %v; want %v", tc.in, got, tc.want)
				}
			}
		})
	}
}

// TestRoundMatchesTheRing: Round rounds a buffer as the ring's first hop
// does, block for block — segments and frames start on block boundaries —
// which error feedback depends on. With the other rank sending zeros, the
// mean of two ranks is half the rounded buffer.
func TestRoundMatchesTheRing(t *testing.T) {
	const n = 2
	rs := newRings(t, MemRing(n), 4*1000) // frames of 1000 values: not a multiple of the block
	rng := rand.New(rand.NewSource(3))
	for _, length := range []int{5, I8Block + 1, 7*I8Block + 100, 40 * I8Block} {
		v := randomBuffers(rng, 1, length)[0]
		for i := range v { // blocks of very different magnitudes
			v[i] *= float32(math.Pow(10, float64((i/I8Block)%5-2)))
		}
		bufs := [][]float32{slices.Clone(v), make([]float32, length)}
		if err := errors.Join(onAll(n, func(i int) error { return rs[i].AllreduceMeanAs(context.Background(), bufs[i], I8) })...); err != nil {
			t.Fatal(err)
		}
		want := slices.Clone(v)
		I8.Round(want)
		for j := range want {
			if got := 2 * bufs[1][j]; math.Abs(float64(got-want[j])) > 1e-6*math.Abs(float64(want[j])) {
				t.Fatalf("len=%d element %d: the ring's mean ×2 = %v, Round = %v (from %v)", length, j, got, want[j], v[j])
			}
		}
	}
}

// TestI8FramesQuarterTheBytes: an int8 allreduce sends a little over a
// quarter of a float32 one's bytes: a byte a value and a scale a block.
func TestI8FramesQuarterTheBytes(t *testing.T) {
	const n, length = 3, 100000
	sent := map[Encoding]int64{}
	for _, enc := range []Encoding{F32, I8} {
		rs := newRings(t, MemRing(n), 0)
		bufs := randomBuffers(rand.New(rand.NewSource(1)), n, length)
		if err := errors.Join(onAll(n, func(i int) error { return rs[i].AllreduceMeanAs(context.Background(), bufs[i], enc) })...); err != nil {
			t.Fatal(err)
		}
		sent[enc] = rs[0].Stats().BytesSent
	}
	want := (1 + 4.0/I8Block) / 4
	if r := float64(sent[I8]) / float64(sent[F32]); r < want-0.005 || r > want+0.005 {
		t.Errorf("int8 sent %d bytes, float32 %d: ratio %.4f; want %.4f", sent[I8], sent[F32], r, want)
	}
}

// TestRoundIsTheWire: Round gives each value what encoding and decoding it
// gives, for every narrow encoding.
func TestRoundIsTheWire(t *testing.T) {
	v := randomBuffers(rand.New(rand.NewSource(9)), 1, 3*I8Block+7)[0]
	v[5] = float32(math.NaN())
	for _, enc := range []Encoding{BF16, FP16, I8} {
		want := slices.Clone(v)
		wire := make([]byte, enc.Size(len(v)))
		enc.encode(wire, want)
		enc.decode(want, wire)
		got := slices.Clone(v)
		enc.Round(got)
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want[i]))) {
				t.Fatalf("%v: Round gives value %d %v; the wire %v", enc, i, got[i], want[i])
			}
		}
	}
}
