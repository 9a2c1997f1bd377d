package sparse

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

func randVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// TestTopK: the selection is the k entries largest in magnitude, in index
// order, ties to the lower index, for every k.
func TestTopK(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// Past 16384 entries the selection starts from a sample: the long
	// vectors are random, mostly zeros (ties at the threshold), and large
	// only where the sample's stride never looks.
	sparse := func(n int) []float32 {
		u := make([]float32, n)
		for i := range u {
			if i%97 == 0 {
				u[i] = float32(rng.NormFloat64())
			}
		}
		return u
	}
	offStride := func(n int) []float32 {
		u := randVec(rng, n)
		for i := range u {
			if i%(n/4096) == 0 {
				u[i] /= 1000
			} else {
				u[i] *= 1000
			}
		}
		return u
	}
	onStride := func(n int) []float32 {
		u := offStride(n)
		for i := range u {
			u[i] = 1 / u[i]
		}
		return u
	}
	long := map[int]func(int) []float32{20000: func(n int) []float32 { return randVec(rng, n) }, 20001: sparse, 50000: offStride, 50001: onStride}
	for _, n := range []int{1, 2, 7, 100, 1001, 20000, 20001, 50000, 50001} {
		u := randVec(rng, n)
		if f := long[n]; f != nil {
			u = f(n)
		}
		if n > 3 {
			u[1], u[2] = 0.5, -0.5 // a tie in magnitude
		}
		for _, k := range []int{1, 2, n / 20, n / 3, n} {
			if k < 1 || k > n {
				continue
			}
			mag := make([]float32, n)
			for i, x := range u {
				mag[i] = abs(x)
			}
			got := topK(nil, mag, make([]float32, n), k)
			order := make([]int, n)
			for i := range order {
				order[i] = i
			}
			sort.SliceStable(order, func(a, b int) bool { return abs(u[order[a]]) > abs(u[order[b]]) })
			want := slices.Clone(order[:k])
			slices.Sort(want)
			gi := make([]int, len(got))
			for i, x := range got {
				gi[i] = int(x)
			}
			if !slices.Equal(gi, want) {
				t.Fatalf("n=%d k=%d: topK %v, want %v", n, k, gi, want)
			}
		}
	}
}

// TestRoundTrip: a payload decodes to the quantized values of the top-k
// entries at their indices and zero elsewhere; every sent value is within
// half a quantization step of what was coded, and the error feedback
// holds exactly the rest (so decoding by the levels' table gives the
// coder's bits); AppendEntries reads the same values.
func TestRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, bits := range []int{2, 4} {
		for _, n := range []int{1, 10, 1000, 4097} {
			cfg := Config{Fraction: 0.03, Bits: bits}
			c, err := NewCoder(cfg, n)
			if err != nil {
				t.Fatal(err)
			}
			v := randVec(rng, n)
			p, err := c.Encode(v)
			if err != nil {
				t.Fatal(err)
			}
			if len(p) > cfg.MaxPayload(n) {
				t.Errorf("bits %d n %d: payload %d bytes, over MaxPayload %d", bits, n, len(p), cfg.MaxPayload(n))
			}
			dst := make([]float32, n)
			if err := Decode(dst, p, 1); err != nil {
				t.Fatalf("bits %d n %d: %v", bits, n, err)
			}
			checkEntries(t, []int{n}, AppendPart(nil, p)) // the entries read as Decode adds them, odd counts too
			sent := 0
			var scale float32
			for i := range v {
				if dst[i] != 0 {
					sent++
					scale = max(scale, abs(v[i]))
				}
			}
			if sent > cfg.K(n) {
				t.Errorf("bits %d n %d: %d entries sent, want at most %d", bits, n, sent, cfg.K(n))
			}
			step := 2 * scale / float32(int(1)<<bits-1)
			c.Commit()
			for i := range v {
				if dst[i] != 0 && abs(dst[i]-v[i]) > step/2*1.0001 {
					t.Fatalf("bits %d n %d: entry %d decoded %v from %v, more than half a step (%v) off", bits, n, i, dst[i], v[i], step/2)
				}
				if r := c.Residual()[i]; r != v[i]-dst[i] {
					t.Fatalf("bits %d n %d: entry %d: feedback %v, want %v − %v", bits, n, i, r, v[i], dst[i])
				}
			}
		}
	}
}

// TestErrorFeedbackLosesNothing: over many rounds, what the payloads
// carried plus the feedback left equals everything coded — to float
// rounding — however little each round sends; and a round not committed
// leaves the feedback as it was.
func TestErrorFeedbackLosesNothing(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const n, rounds = 500, 200
	for _, cfg := range []Config{{0.01, 2}, {0.05, 4}, {1, 2}} {
		c, _ := NewCoder(cfg, n)
		in := make([]float64, n)
		out := make([]float64, n)
		for range rounds {
			v := randVec(rng, n)
			p, err := c.Encode(v)
			if err != nil {
				t.Fatal(err)
			}
			dst := make([]float32, n)
			if err := Decode(dst, p, 1); err != nil {
				t.Fatal(err)
			}
			for i := range v {
				in[i] += float64(v[i])
				out[i] += float64(dst[i])
			}
			c.Commit()
		}
		before := slices.Clone(c.Residual())
		if _, err := c.Encode(randVec(rng, n)); err != nil { // a round every rank skips
			t.Fatal(err)
		}
		if !slices.Equal(c.Residual(), before) {
			t.Fatalf("%+v: an uncommitted round changed the error feedback", cfg)
		}
		for i := range in {
			if got := out[i] + float64(c.Residual()[i]); math.Abs(got-in[i]) > 1e-3 {
				t.Fatalf("%+v: entry %d: sent %v + feedback %v = %v, want %v", cfg, i, out[i], c.Residual()[i], got, in[i])
			}
		}
		if cfg.Fraction < 1 && slices.Equal(in, out) {
			t.Fatalf("%+v: everything was sent: the test cannot tell feedback from none", cfg)
		}
	}
}

// TestPayloadSize: at 1% and 2 bits a payload is about a tenth of a bit
// an entry — hundreds of times smaller than float32.
func TestPayloadSize(t *testing.T) {
	const n = 100_000
	c, _ := NewCoder(Config{Fraction: 0.01, Bits: 2}, n)
	p, err := c.Encode(randVec(rand.New(rand.NewPCG(7, 8)), n))
	if err != nil {
		t.Fatal(err)
	}
	if ratio := float64(4*n) / float64(len(p)); ratio < 250 {
		t.Errorf("payload %d bytes for %d entries: %.0f× smaller than float32, want ≥ 250×", len(p), n, ratio)
	}
}

// TestBadPayloads: each malformed payload is refused with ErrBadPayload
// and adds nothing.
func TestBadPayloads(t *testing.T) {
	const n = 40
	c, _ := NewCoder(Config{Fraction: 0.1, Bits: 4}, n)
	v := randVec(rand.New(rand.NewPCG(9, 10)), n)
	good, _ := c.Encode(v)
	good = slices.Clone(good)
	mod := func(f func(p []byte) []byte) []byte { return f(slices.Clone(good)) }
	cases := []struct {
		name string
		p    []byte
		n    int
	}{
		{"empty", nil, n},
		{"another version", mod(func(p []byte) []byte { p[0] = 9; return p }), n},
		{"3 bits", mod(func(p []byte) []byte { p[1] = 3; return p }), n},
		{"another length", good, n + 1},
		{"more entries than the vector", []byte{version, 2, n, n + 1, 0, 0, 0, 0}, n},
		{"a NaN scale", []byte{version, 2, n, 0, 0, 0, 0xc0, 0x7f}, n},
		{"a negative scale", []byte{version, 2, n, 0, 0, 0, 0x80, 0xbf}, n},
		{"an index past the end", []byte{version, 2, n, 1, 0, 0, 0x80, 0x3f, n, 0}, n},
		{"a byte short", good[:len(good)-1], n},
		{"a byte over", append(slices.Clone(good), 0), n},
		{"cut in the header", good[:4], n},
	}
	for _, tc := range cases {
		dst := make([]float32, tc.n)
		if err := Decode(dst, tc.p, 1); !errors.Is(err, ErrBadPayload) {
			t.Errorf("%s: %v, want ErrBadPayload", tc.name, err)
		}
		if slices.ContainsFunc(dst, func(x float32) bool { return x != 0 }) {
			t.Errorf("%s: added to dst though refused", tc.name)
		}
	}
	if err := Decode(make([]float32, n), good, 1); err != nil {
		t.Fatalf("the good payload: %v", err)
	}
	bad := slices.Clone(v)
	bad[3] = float32(math.Inf(1))
	if _, err := c.Encode(bad); err == nil {
		t.Error("encoding an Inf: no error")
	}
}

// TestConfig: the settings a job may give.
func TestConfig(t *testing.T) {
	for _, c := range []struct {
		cfg Config
		ok  bool
	}{{Config{0.01, 2}, true}, {Config{1, 4}, true}, {Config{0, 2}, false}, {Config{1.5, 2}, false}, {Config{0.1, 3}, false}, {Config{math.NaN(), 2}, false}} {
		if err := c.cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok %v", c.cfg, err, c.ok)
		}
	}
	if k := (Config{Fraction: 0.001, Bits: 2}).K(10); k != 1 {
		t.Errorf("K: %d of 10 at 0.1%%, want at least 1", k)
	}
}

// FuzzDecode: any bytes decode or are refused, without panic, and a
// refused payload adds nothing.
func FuzzDecode(f *testing.F) {
	c, _ := NewCoder(Config{Fraction: 0.2, Bits: 2}, 16)
	p, _ := c.Encode(randVec(rand.New(rand.NewPCG(11, 12)), 16))
	f.Add(slices.Clone(p), uint8(16))
	f.Add([]byte{version, 4, 3, 1, 0, 0, 0x80, 0x3f, 2, 0xf}, uint8(3))
	f.Fuzz(func(t *testing.T, p []byte, n uint8) {
		dst := make([]float32, n)
		if err := Decode(dst, p, 1); err != nil && slices.ContainsFunc(dst, func(x float32) bool { return x != 0 }) {
			t.Fatalf("refused (%v), yet added", err)
		}
	})
}

// TestDecodeParts: parts decode each into its own vector, as their own
// payloads would; a part cut short, a length past the end, bytes left
// over or too few parts add nothing.
func TestDecodeParts(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	cfg := Config{Fraction: 0.25, Bits: 4}
	sizes := []int{7, 16, 1}
	var payload []byte
	want := make([][]float32, len(sizes))
	for k, n := range sizes {
		c, err := NewCoder(cfg, n)
		if err != nil {
			t.Fatal(err)
		}
		p, err := c.Encode(randVec(rng, n))
		if err != nil {
			t.Fatal(err)
		}
		want[k] = make([]float32, n)
		if err := Decode(want[k], p, 0.5); err != nil {
			t.Fatal(err)
		}
		payload = AppendPart(payload, p)
	}
	if len(payload) > cfg.MaxParts(sizes) {
		t.Errorf("%d bytes, more than MaxParts's %d", len(payload), cfg.MaxParts(sizes))
	}
	got := make([][]float32, len(sizes))
	for k, n := range sizes {
		got[k] = make([]float32, n)
	}
	if err := DecodeParts(got, payload, 0.5); err != nil {
		t.Fatal(err)
	}
	for k := range sizes {
		if !slices.Equal(got[k], want[k]) {
			t.Errorf("part %d: %v, want %v", k, got[k], want[k])
		}
	}
	checkEntries(t, sizes, payload)
	for _, tc := range []struct {
		name    string
		payload []byte
		parts   int
	}{
		{"cut short", payload[:len(payload)-1], 3},
		{"a byte left over", append(slices.Clone(payload), 0), 3},
		{"a length past the end", append([]byte{0xff, 0x7f}, payload...), 3},
		{"no length", nil, 1},
		{"more parts than sent", payload, 4},
	} {
		dst := make([][]float32, tc.parts)
		for k := range dst {
			n := 1
			if k < len(sizes) {
				n = sizes[k]
			}
			dst[k] = make([]float32, n)
		}
		err := DecodeParts(dst, tc.payload, 1)
		if !errors.Is(err, ErrBadPayload) {
			t.Errorf("%s: %v; want ErrBadPayload", tc.name, err)
		}
		partSizes := make([]int, len(dst))
		for k := range dst {
			partSizes[k] = len(dst[k])
		}
		if idx, val, err := AppendEntries([]int32{7}, []float32{1}, partSizes, tc.payload); !errors.Is(err, ErrBadPayload) || len(idx) != 1 || len(val) != 1 {
			t.Errorf("%s: entries %v %v, %v; want ErrBadPayload and nothing appended", tc.name, idx, val, err)
		}
		for k := range dst {
			if slices.ContainsFunc(dst[k], func(x float32) bool { return x != 0 }) {
				t.Errorf("%s: refused, yet part %d added", tc.name, k)
			}
		}
	}
}

// FuzzDecodeParts: any bytes decode in parts or are refused, without
// panic, and a refused payload adds nothing.
func FuzzDecodeParts(f *testing.F) {
	c, _ := NewCoder(Config{Fraction: 0.2, Bits: 2}, 16)
	p, _ := c.Encode(randVec(rand.New(rand.NewPCG(11, 12)), 16))
	f.Add(AppendPart(AppendPart(nil, p), p), uint8(16), uint8(2))
	f.Fuzz(func(t *testing.T, p []byte, n, parts uint8) {
		dst := make([][]float32, parts%8)
		for k := range dst {
			dst[k] = make([]float32, n)
		}
		if err := DecodeParts(dst, p, 1); err != nil {
			for _, d := range dst {
				if slices.ContainsFunc(d, func(x float32) bool { return x != 0 }) {
					t.Fatalf("refused (%v), yet added", err)
				}
			}
			sizes := make([]int, len(dst))
			for k := range sizes {
				sizes[k] = int(n)
			}
			if idx, val, err2 := AppendEntries(nil, nil, sizes, p); err2 == nil || len(idx)+len(val) > 0 {
				t.Fatalf("DecodeParts refused (%v), AppendEntries gave %d entries, %v", err, len(idx), err2)
			}
			return
		}
		sizes := make([]int, len(dst))
		for k := range sizes {
			sizes[k] = int(n)
		}
		checkEntries(t, sizes, p)
	})
}

// checkEntries checks that AppendEntries gives a good payload's entries
// in one ascending run, each value what DecodeParts adds there at weight 1
// (to +0, so a −0 entry is +0 there).
func checkEntries(t *testing.T, sizes []int, payload []byte) {
	t.Helper()
	dst := make([][]float32, len(sizes))
	total := 0
	for k, n := range sizes {
		dst[k] = make([]float32, n)
		total += n
	}
	if err := DecodeParts(dst, payload, 1); err != nil {
		t.Fatal(err)
	}
	idx, val, err := AppendEntries([]int32{-1}, []float32{0}, sizes, payload)
	if err != nil {
		t.Fatal(err)
	}
	flat := make([]float32, total)
	for i, j := range idx[1:] {
		if j <= idx[i] || int(j) >= total {
			t.Fatalf("entry %d at %d after %d, of %d: not ascending within the vector", i, j, idx[i], total)
		}
		flat[j] = val[i+1]
	}
	want := slices.Concat(dst...)
	for j := range want {
		if flat[j] != want[j] { // ±0 alike: DecodeParts adds to +0
			t.Fatalf("entry at %d: %v, DecodeParts %v", j, flat[j], want[j])
		}
	}
}

// BenchmarkEncode: the mlp's pseudo-gradient (235,146 entries), top 5%
// in 4 bits.
func BenchmarkEncode(b *testing.B) {
	const n = 235146
	c, err := NewCoder(Config{Fraction: 0.05, Bits: 4}, n)
	if err != nil {
		b.Fatal(err)
	}
	v := randVec(rand.New(rand.NewPCG(1, 2)), n)
	for b.Loop() {
		if _, err := c.Encode(v); err != nil {
			b.Fatal(err)
		}
	}
}
