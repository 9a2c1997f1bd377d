package ring

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testChunk is small so that short test buffers still span many frames.
const testChunk = 16

type transportKind struct {
	name string
	make func(t *testing.T, n int, gen uint64) []Transport
}

var transportKinds = []transportKind{
	{"mem", func(t *testing.T, n int, gen uint64) []Transport { return MemRing(n) }},
	{"tcp", func(t *testing.T, n int, gen uint64) []Transport {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ts, err := LoopbackTCP(ctx, n, gen)
		if err != nil {
			t.Fatalf("LoopbackTCP(%d): %v", n, err)
		}
		return ts
	}},
}

// newRings builds one Ring per rank on the given transports and closes them
// when the test ends.
func newRings(t *testing.T, ts []Transport, chunkBytes int) []*Ring {
	t.Helper()
	rs := make([]*Ring, len(ts))
	for i, tr := range ts {
		r, err := New(tr, Config{Rank: i, Size: len(ts), Generation: 7, ChunkBytes: chunkBytes})
		if err != nil {
			t.Fatalf("New(rank %d): %v", i, err)
		}
		rs[i] = r
		t.Cleanup(func() { r.Close() })
	}
	return rs
}

// onAll runs f for every rank at once and returns the errors by rank.
func onAll(n int, f func(rank int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f(i) })
	}
	wg.Wait()
	return errs
}

func randomBuffers(rng *rand.Rand, n, length int) [][]float32 {
	bufs := make([][]float32, n)
	for i := range bufs {
		bufs[i] = make([]float32, length)
		for j := range bufs[i] {
			bufs[i][j] = float32(rng.NormFloat64() * 100)
		}
	}
	return bufs
}

// checkAllreduce compares every rank's result with a float64 reference and
// requires all ranks to hold the same bits.
func checkAllreduce(t *testing.T, op Op, in, out [][]float32) {
	t.Helper()
	n := len(in)
	for j := range in[0] {
		var sum, abs float64
		for i := range n {
			sum += float64(in[i][j])
			abs += math.Abs(float64(in[i][j]))
		}
		tol := float64(n) * abs * 1.2e-7 // n float32 roundings of partial sums
		if op == OpAllreduceMean {
			sum /= float64(n)
			tol = tol/float64(n) + math.Abs(sum)*1.2e-7
		}
		if got := float64(out[0][j]); math.Abs(got-sum) > tol {
			t.Fatalf("%v n=%d len=%d: element %d = %v; want %v (±%g)", op, n, len(in[0]), j, got, sum, tol)
		}
		for i := 1; i < n; i++ {
			if math.Float32bits(out[i][j]) != math.Float32bits(out[0][j]) {
				t.Fatalf("%v n=%d len=%d: rank %d element %d = %v, rank 0 has %v; want identical bits",
					op, n, len(in[0]), i, j, out[i][j], out[0][j])
			}
		}
	}
}

func clone(bufs [][]float32) [][]float32 {
	out := make([][]float32, len(bufs))
	for i, b := range bufs {
		out[i] = append([]float32(nil), b...)
	}
	return out
}

// TestAllreduce runs, on one ring per (transport, n), back-to-back calls of
// both ops over the awkward lengths: empty, one element, fewer elements than
// ranks, not divisible by ranks, chunk boundaries, and a few hundred frames.
func TestAllreduce(t *testing.T) {
	for _, tk := range transportKinds {
		for n := 1; n <= 8; n++ {
			t.Run(fmt.Sprintf("%s/n=%d", tk.name, n), func(t *testing.T) {
				rs := newRings(t, tk.make(t, n, 7), testChunk)
				rng := rand.New(rand.NewSource(int64(n)))
				lengths := []int{0, 1, n - 1, n, n + 1, 3*n + 2, 4*n*testChunk/4 + 1, 1000 + n}
				for _, length := range lengths {
					for _, op := range []Op{OpAllreduceSum, OpAllreduceMean} {
						in := randomBuffers(rng, n, length)
						out := clone(in)
						errs := onAll(n, func(i int) error {
							if op == OpAllreduceSum {
								return rs[i].AllreduceSum(context.Background(), out[i])
							}
							return rs[i].AllreduceMean(context.Background(), out[i])
						})
						if err := errors.Join(errs...); err != nil {
							t.Fatalf("%v len=%d: %v", op, length, err)
						}
						if length > 0 {
							checkAllreduce(t, op, in, out)
						}
					}
				}
			})
		}
	}
}

// TestAllreduceLargeFrames uses the default chunk, so that one frame is read
// and added in several pieces.
func TestAllreduceLargeFrames(t *testing.T) {
	const n, length = 3, 3*addPiece*2 + 1001
	for _, op := range []Op{OpAllreduceSum, OpAllreduceMean} {
		rs := newRings(t, MemRing(n), 0)
		in := randomBuffers(rand.New(rand.NewSource(5)), n, length)
		out := clone(in)
		errs := onAll(n, func(i int) error { return rs[i].allreduce(context.Background(), op, out[i]) })
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		checkAllreduce(t, op, in, out)
	}
}

func TestBroadcastFromEveryRoot(t *testing.T) {
	for _, tk := range transportKinds {
		for _, n := range []int{1, 2, 3, 5} {
			t.Run(fmt.Sprintf("%s/n=%d", tk.name, n), func(t *testing.T) {
				rs := newRings(t, tk.make(t, n, 7), testChunk)
				rng := rand.New(rand.NewSource(42))
				for root := range n {
					for _, length := range []int{0, 1, 7, 100} {
						bufs := randomBuffers(rng, n, length)
						want := append([]float32(nil), bufs[root]...)
						errs := onAll(n, func(i int) error { return rs[i].Broadcast(context.Background(), bufs[i], root) })
						if err := errors.Join(errs...); err != nil {
							t.Fatalf("Broadcast(root %d, len %d): %v", root, length, err)
						}
						for i := range n {
							for j := range want {
								if math.Float32bits(bufs[i][j]) != math.Float32bits(want[j]) {
									t.Fatalf("Broadcast(root %d, len %d): rank %d element %d = %v; want %v", root, length, i, j, bufs[i][j], want[j])
								}
							}
						}
					}
				}
			})
		}
	}
}

// signalFirstWrite tells, once, that its rank has put its first frame on the
// wire, i.e. that the rank is inside a collective.
type signalFirstWrite struct {
	Transport
	once sync.Once
	ch   chan<- int
	rank int
}

func (s *signalFirstWrite) Write(p []byte) (int, error) {
	s.once.Do(func() { s.ch <- s.rank })
	return s.Transport.Write(p)
}

// TestBarrierWaits holds rank 0 back until every other rank is inside the
// barrier; none of them may leave before rank 0 has entered.
func TestBarrierWaits(t *testing.T) {
	for _, n := range []int{2, 3, 6} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			ts := MemRing(n)
			inside := make(chan int, n)
			for i := 1; i < n; i++ {
				ts[i] = &signalFirstWrite{Transport: ts[i], ch: inside, rank: i}
			}
			rs := newRings(t, ts, testChunk)
			var rank0Entered atomic.Bool
			errs := onAll(n, func(i int) error {
				if i == 0 {
					for range n - 1 {
						<-inside
					}
					rank0Entered.Store(true)
					return rs[0].Barrier(context.Background())
				}
				if err := rs[i].Barrier(context.Background()); err != nil {
					return err
				}
				if !rank0Entered.Load() {
					return fmt.Errorf("rank %d left the barrier before rank 0 entered it", i)
				}
				return nil
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// trip runs f once, after its rank has read or written past a byte count.
type trip struct {
	Transport
	readAfter, writeAfter int64
	read, written         atomic.Int64
	once                  sync.Once
	f                     func()
}

func (tr *trip) Read(p []byte) (int, error) {
	n, err := tr.Transport.Read(p)
	if tr.readAfter > 0 && tr.read.Add(int64(n)) >= tr.readAfter {
		tr.once.Do(tr.f)
	}
	return n, err
}

func (tr *trip) Write(p []byte) (int, error) {
	n, err := tr.Transport.Write(p)
	if tr.writeAfter > 0 && tr.written.Add(int64(n)) >= tr.writeAfter {
		tr.once.Do(tr.f)
	}
	return n, err
}

// TestFailureMidCall breaks one rank in the middle of an allreduce — its
// context cancelled, or its connections closed under it — and requires every
// rank to return an error, and the broken ring to refuse further calls.
// goleak (TestMain) checks that no goroutine is left behind.
func TestFailureMidCall(t *testing.T) {
	const n, victim, length = 4, 2, 4000
	tests := []struct {
		name       string
		kind       transportKind
		cancel     bool // else close the victim's transport
		wantVictim error
	}{
		{"mem/cancel", transportKinds[0], true, context.Canceled},
		{"tcp/cancel", transportKinds[1], true, context.Canceled},
		{"mem/close", transportKinds[0], false, ErrPeerLost},
		{"tcp/close", transportKinds[1], false, ErrPeerLost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := tt.kind.make(t, n, 7)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			inner := ts[victim]
			tr := &trip{Transport: inner, readAfter: 3 * (HeaderSize + testChunk)}
			if tt.cancel {
				tr.f = cancel
			} else {
				tr.f = func() { inner.Close() }
			}
			ts[victim] = tr
			rs := newRings(t, ts, testChunk)
			bufs := randomBuffers(rand.New(rand.NewSource(1)), n, length)
			errs := onAll(n, func(i int) error {
				c := context.Background()
				if i == victim {
					c = ctx
				}
				return rs[i].AllreduceSum(c, bufs[i])
			})
			for i, err := range errs {
				want := ErrPeerLost
				if i == victim {
					want = tt.wantVictim
				}
				if !errors.Is(err, want) {
					t.Errorf("rank %d: AllreduceSum = %v; want %v", i, err, want)
				}
			}
			if err := rs[0].AllreduceSum(context.Background(), bufs[0]); !errors.Is(err, ErrClosed) {
				t.Errorf("call after failure = %v; want ErrClosed", err)
			}
		})
	}
}

// TestMismatchedCalls: ranks that disagree on the call fail with a reason.
func TestMismatchedCalls(t *testing.T) {
	tests := []struct {
		name  string
		calls [2]func(r *Ring) error
		want  string
	}{
		{"length", [2]func(r *Ring) error{
			func(r *Ring) error { return r.AllreduceSum(context.Background(), make([]float32, 10)) },
			func(r *Ring) error { return r.AllreduceSum(context.Background(), make([]float32, 12)) },
		}, "element count"},
		{"empty vs not", [2]func(r *Ring) error{
			func(r *Ring) error { return r.AllreduceSum(context.Background(), nil) },
			func(r *Ring) error { return r.AllreduceSum(context.Background(), make([]float32, 5)) },
		}, "element count"},
		{"op", [2]func(r *Ring) error{
			func(r *Ring) error { return r.AllreduceSum(context.Background(), make([]float32, 10)) },
			func(r *Ring) error { return r.AllreduceMean(context.Background(), make([]float32, 10)) },
		}, "peer sent"},
		{"encoding", [2]func(r *Ring) error{
			func(r *Ring) error { return r.AllreduceMeanAs(context.Background(), make([]float32, 10), BF16) },
			func(r *Ring) error { return r.AllreduceMean(context.Background(), make([]float32, 10)) },
		}, "values"},
		{"bf16 vs fp16", [2]func(r *Ring) error{
			func(r *Ring) error { return r.AllreduceMeanAs(context.Background(), make([]float32, 10), BF16) },
			func(r *Ring) error { return r.AllreduceMeanAs(context.Background(), make([]float32, 10), FP16) },
		}, "values"},
		{"root", [2]func(r *Ring) error{
			func(r *Ring) error { return r.Broadcast(context.Background(), make([]float32, 10), 0) },
			func(r *Ring) error { return r.Broadcast(context.Background(), make([]float32, 10), 1) },
		}, "root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs := newRings(t, MemRing(2), testChunk)
			errs := onAll(2, func(i int) error { return tt.calls[i](rs[i]) })
			var sawMismatch bool
			for i, err := range errs {
				if err == nil {
					t.Errorf("rank %d: nil error; want one", i)
					continue
				}
				if errors.Is(err, ErrMismatch) {
					sawMismatch = true
					if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "from rank") {
						t.Errorf("rank %d: %v; want it to name %q and the sending rank", i, err, tt.want)
					}
				}
			}
			if !sawMismatch {
				t.Errorf("errors %v; want one to be ErrMismatch", errs)
			}
		})
	}
}

// TestBadFrames puts a fake predecessor in front of rank 0 of a two-rank
// ring and feeds it frames that are wrong in one way each.
func TestBadFrames(t *testing.T) {
	// Rank 0 of 2 first receives segment 1, which is element 1 of 2.
	good := Header{Op: OpAllreduceSum, Generation: 7, Seq: 1, Count: 2, Step: 0, Segment: 1, Length: 4, Offset: 1}
	frame := func(mod func(h *Header), payload int) []byte {
		h := good
		if mod != nil {
			mod(&h)
		}
		b := make([]byte, HeaderSize+payload)
		putHeader(b, &h)
		return b
	}
	tests := []struct {
		name  string
		bytes []byte
		want  error
		words string
	}{
		{"magic", append([]byte("GET / HTTP/1.1\r\n"), make([]byte, HeaderSize)...), ErrBadFrame, "magic"},
		{"generation", frame(func(h *Header) { h.Generation = 6 }, 4), ErrBadFrame, "generation 6, want 7"},
		{"sequence", frame(func(h *Header) { h.Seq = 9 }, 4), ErrBadFrame, "sequence 9, want 1"},
		{"op", frame(func(h *Header) { h.Op = 99 }, 4), ErrMismatch, "Op(99)"},
		{"step", frame(func(h *Header) { h.Step = 1 }, 4), ErrBadFrame, "step 1, want 0"},
		{"segment", frame(func(h *Header) { h.Segment = 0 }, 4), ErrBadFrame, "segment 0, want 1"},
		{"offset", frame(func(h *Header) { h.Offset = 0 }, 4), ErrBadFrame, "offset 0, want 1"},
		{"huge length", frame(func(h *Header) { h.Length = math.MaxUint32 }, 0), ErrBadFrame, "length 4294967295, want 4"},
		{"short header", frame(nil, 0)[:HeaderSize-3], ErrPeerLost, "reading frame header"},
		{"short payload", frame(nil, 4)[:HeaderSize+2], ErrPeerLost, "4 bytes of payload"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := MemRing(2)
			r, err := New(ts[0], Config{Rank: 0, Size: 2, Generation: 7, ChunkBytes: testChunk})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			fake := ts[1]
			var wg sync.WaitGroup
			defer wg.Wait()
			defer fake.Close()
			wg.Go(func() { // drain what rank 0 sends
				b := make([]byte, 1024)
				for {
					if _, err := fake.Read(b); err != nil {
						return
					}
				}
			})
			wg.Go(func() {
				fake.Write(tt.bytes)
				fake.Close()
			})
			err = r.AllreduceSum(context.Background(), []float32{1, 2})
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.words) || !strings.Contains(err.Error(), "from rank 1") {
				t.Errorf("AllreduceSum with %s frame = %v; want %v naming %q and rank 1", tt.name, err, tt.want, tt.words)
			}
		})
	}
}

// TestExtraMemoryIsChunks: an allreduce allocates a few chunks at most,
// never a copy of the buffer.
func TestExtraMemoryIsChunks(t *testing.T) {
	const n, length, chunkBytes = 4, 1 << 20, 64 << 10 // 4 MiB buffers
	rs := newRings(t, MemRing(n), chunkBytes)
	bufs := randomBuffers(rand.New(rand.NewSource(3)), n, length)
	call := func() {
		if err := errors.Join(onAll(n, func(i int) error { return rs[i].AllreduceMean(context.Background(), bufs[i]) })...); err != nil {
			t.Fatal(err)
		}
	}
	call() // first call sizes the scratch chunk
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	call()
	runtime.ReadMemStats(&after)
	if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(n*chunkBytes); got > limit {
		t.Errorf("allreduce of %d × %d bytes allocated %d bytes; want at most %d (one chunk per rank)", n, 4*length, got, limit)
	}
}

func TestSegmentsCoverBuffer(t *testing.T) {
	for _, tt := range []struct{ count, size int }{{0, 3}, {1, 4}, {5, 8}, {8, 8}, {9, 8}, {1000, 7}} {
		var next uint64
		for k := range tt.size {
			start, length := segment(uint64(tt.count), tt.size, k)
			if start != next {
				t.Errorf("segment(%d, %d, %d) starts at %d; want %d", tt.count, tt.size, k, start, next)
			}
			if lo, hi := uint64(tt.count/tt.size), uint64((tt.count+tt.size-1)/tt.size); length < lo || length > hi {
				t.Errorf("segment(%d, %d, %d) has %d elements; want %d to %d", tt.count, tt.size, k, length, lo, hi)
			}
			next = start + length
		}
		if next != uint64(tt.count) {
			t.Errorf("segments of (%d, %d) end at %d; want %d", tt.count, tt.size, next, tt.count)
		}
	}
}

// TestBlockSegmentsCoverBuffer: segments of a blockwise encoding cover the
// buffer in order, each starting on a block and ending on one or at the end.
func TestBlockSegmentsCoverBuffer(t *testing.T) {
	const blk = 4
	for _, tt := range []struct{ count, size int }{{0, 3}, {1, 4}, {5, 8}, {8, 2}, {9, 2}, {33, 3}, {1000, 7}} {
		var next uint64
		for k := range tt.size {
			start, length := segmentOf(uint64(tt.count), tt.size, k, blk)
			if start != next {
				t.Errorf("segmentOf(%d, %d, %d) starts at %d; want %d", tt.count, tt.size, k, start, next)
			}
			if end := start + length; start%blk != 0 && length > 0 || end%blk != 0 && end != uint64(tt.count) {
				t.Errorf("segmentOf(%d, %d, %d) = [%d, %d); want block boundaries", tt.count, tt.size, k, start, end)
			}
			next = start + length
		}
		if next != uint64(tt.count) {
			t.Errorf("segments of (%d, %d) end at %d; want %d", tt.count, tt.size, next, tt.count)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	tr := MemRing(1)[0]
	tests := []struct {
		name string
		t    Transport
		cfg  Config
	}{
		{"size 0", tr, Config{Size: 0}},
		{"rank too big", tr, Config{Rank: 2, Size: 2}},
		{"negative rank", tr, Config{Rank: -1, Size: 2}},
		{"odd chunk", tr, Config{Size: 2, ChunkBytes: 6}},
		{"huge chunk", tr, Config{Size: 2, ChunkBytes: 1 << 30}},
		{"no transport", nil, Config{Size: 2}},
	}
	for _, tt := range tests {
		if _, err := New(tt.t, tt.cfg); err == nil {
			t.Errorf("New(%s) = nil error; want one", tt.name)
		}
	}
	tr.Close()
}

func TestBroadcastRejectsBadRoot(t *testing.T) {
	r, err := New(nil, Config{Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Broadcast(context.Background(), nil, 1); err == nil {
		t.Error("Broadcast(root 1) on a ring of 1 = nil; want an error")
	}
}

// TestMixedCalls runs different collectives back to back on one ring.
func TestMixedCalls(t *testing.T) {
	const n = 3
	for _, tk := range transportKinds {
		t.Run(tk.name, func(t *testing.T) {
			rs := newRings(t, tk.make(t, n, 7), testChunk)
			rng := rand.New(rand.NewSource(9))
			for round := range 3 {
				sum := randomBuffers(rng, n, 10+round)
				sumIn := clone(sum)
				bc := randomBuffers(rng, n, 5)
				mean := randomBuffers(rng, n, 100)
				meanIn := clone(mean)
				root := round % n
				want := append([]float32(nil), bc[root]...)
				errs := onAll(n, func(i int) error {
					ctx := context.Background()
					return errors.Join(
						rs[i].AllreduceSum(ctx, sum[i]),
						rs[i].Broadcast(ctx, bc[i], root),
						rs[i].Barrier(ctx),
						rs[i].AllreduceMean(ctx, mean[i]),
						rs[i].AllreduceSum(ctx, nil),
					)
				})
				if err := errors.Join(errs...); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				checkAllreduce(t, OpAllreduceSum, sumIn, sum)
				checkAllreduce(t, OpAllreduceMean, meanIn, mean)
				for i := range n {
					for j := range want {
						if bc[i][j] != want[j] {
							t.Fatalf("round %d: Broadcast(root %d) rank %d element %d = %v; want %v", round, root, i, j, bc[i][j], want[j])
						}
					}
				}
			}
		})
	}
}

// TestAddMatchesPlainLoop: the assembly gives the plain loop's bits at every
// length around its block size.
func TestAddMatchesPlainLoop(t *testing.T) {
	rng := rand.New(rand.NewSource(11))
	for length := range 70 {
		dst := randomBuffers(rng, 1, length)[0]
		src := randomBuffers(rng, 1, length+3)[0] // longer src must be fine
		want := append([]float32(nil), dst...)
		for i := range want {
			want[i] += src[i]
		}
		add(dst, src)
		for i := range want {
			if math.Float32bits(dst[i]) != math.Float32bits(want[i]) {
				t.Fatalf("add, length %d: element %d = %v; want %v", length, i, dst[i], want[i])
			}
		}
	}
}

// TestScaleIsDivision: the mean's scaling gives exactly x/n, whichever
// way it computes it — normal, subnormal, huge and special values alike.
func TestScaleIsDivision(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	vals := []float32{0, -0, 1, -1, math.MaxFloat32, math.SmallestNonzeroFloat32, 3e-39, -5e-39,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	for range 10000 {
		vals = append(vals, math.Float32frombits(rng.Uint32()))
	}
	for _, n := range []int{1, 2, 3, 4, 5, 6, 8, 16, 64, 1024} {
		got := append([]float32(nil), vals...)
		scale(got, n)
		for i, v := range vals {
			want := v / float32(n)
			if math.Float32bits(got[i]) != math.Float32bits(want) && !(math.IsNaN(float64(want)) && math.IsNaN(float64(got[i]))) {
				t.Fatalf("n=%d: scale(%g) = %g; want %g", n, v, got[i], want)
			}
		}
	}
}

func BenchmarkScale(b *testing.B) {
	buf := make([]float32, 1<<20)
	for _, n := range []int{2, 3} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(4 << 20)
			for b.Loop() {
				scale(buf, n)
			}
		})
	}
}

// TestStats: an allreduce counts the bytes it sends, and the rank that got
// there first records the time it waited for the other.
func TestStats(t *testing.T) {
	ts := MemRing(2)
	rs := make([]*Ring, 2)
	for i := range rs {
		r, err := New(ts[i], Config{Rank: i, Size: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		rs[i] = r
	}
	const n, late = 1 << 16, 50 * time.Millisecond
	errs := make(chan error, 2)
	started := make(chan struct{})
	go func() {
		close(started)
		errs <- rs[0].AllreduceMean(context.Background(), make([]float32, n))
	}()
	go func() {
		// Rank 1 is late counting from rank 0's start, not from its own
		// goroutine's, which a loaded machine may run first.
		<-started
		time.Sleep(late)
		errs <- rs[1].AllreduceMean(context.Background(), make([]float32, n))
	}()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	s0, s1 := rs[0].Stats(), rs[1].Stats()
	// Half the lateness: rank 0 may itself be descheduled between its start
	// and its call; a rank that records no wait, or the late rank's, fails.
	if s0.LastWait < late/2 || s0.LastWait <= s1.LastWait {
		t.Errorf("rank 0 waited %v and rank 1 %v, with rank 1 %v late", s0.LastWait, s1.LastWait, late)
	}
	for i, s := range []Stats{s0, s1} {
		if s.BytesSent < 4*n || s.BytesSent > 4*n+64*HeaderSize {
			t.Errorf("rank %d sent %d bytes for a %d-byte allreduce of 2", i, s.BytesSent, 4*n)
		}
	}
}
