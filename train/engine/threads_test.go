package engine

import (
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ringtrain/ringtrain/train/engine/ptx"
)

var convs = []Conv{
	NewConv(1, 28, 28, 5, 2), // cnn conv1
	NewConv(3, 5, 7, 3, 1),
	NewConv(2, 4, 4, 4, 0), // one output position
	NewConv(2, 3, 3, 1, 2), // pad larger than the kernel
}

// TestIm2colBatch: every col entry is the input a direct convolution reads
// for that tap, sample and output position (0 in the padding).
func TestIm2colBatch(t *testing.T) {
	for _, g := range convs {
		for _, batch := range []int{1, 3} {
			x := make([]float32, batch*g.C*g.H*g.W)
			for i := range x {
				x[i] = float32(i + 1)
			}
			P := g.ColCols()
			col := make([]float32, g.ColRows()*batch*P)
			Host{}.Im2colBatch(hostBuf(x), hostBuf(col), g, batch)
			for s := range batch {
				for c := range g.C {
					for ky := range g.K {
						for kx := range g.K {
							for oy := range g.OH {
								for ox := range g.OW {
									want := float32(0)
									if y, xx := oy+ky-g.Pad, ox+kx-g.Pad; y >= 0 && y < g.H && xx >= 0 && xx < g.W {
										want = x[((s*g.C+c)*g.H+y)*g.W+xx]
									}
									r := (c*g.K+ky)*g.K + kx
									if got := col[(r*batch+s)*P+oy*g.OW+ox]; got != want {
										t.Fatalf("%+v batch %d: col[tap %d,%d,%d][sample %d][out %d,%d] = %v; want %v", g, batch, c, ky, kx, s, oy, ox, got, want)
									}
								}
							}
						}
					}
				}
			}
		}
	}
}

// TestCol2imBatchIsAdjoint: ⟨im2col(x), c⟩ = ⟨x, col2im(c)⟩ for random x
// and c, which is what makes col2im the gradient of im2col.
func TestCol2imBatchIsAdjoint(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for _, g := range convs {
		const batch = 3
		x := randn(rng, batch*g.C*g.H*g.W)
		c := randn(rng, g.ColRows()*batch*g.ColCols())
		col := make([]float32, len(c))
		dx := make([]float32, len(x))
		Host{}.Im2colBatch(hostBuf(x), hostBuf(col), g, batch)
		Host{}.Col2imBatch(hostBuf(c), hostBuf(dx), g, batch)
		var a, b float64
		for i := range c {
			a += float64(col[i]) * float64(c[i])
		}
		for i := range x {
			b += float64(x[i]) * float64(dx[i])
		}
		if math.Abs(a-b) > 1e-4*(1+math.Abs(a)) {
			t.Errorf("%+v: <im2col x, c> = %v; <x, col2im c> = %v", g, a, b)
		}
	}
}

func randn(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// TestUnbatchRebatch: unbatch moves t[c, s, p] to y[s, c, p] adding b[c],
// and rebatch moves it back.
func TestUnbatchRebatch(t *testing.T) {
	const batch, chans, inner = 3, 4, 5
	tm := randn(rand.New(rand.NewPCG(5, 5)), batch*chans*inner)
	b := []float32{10, 20, 30, 40}
	y := make([]float32, len(tm))
	Host{}.UnbatchBias(hostBuf(tm), hostBuf(b), hostBuf(y), batch, chans, inner)
	for s := range batch {
		for c := range chans {
			for p := range inner {
				if got, want := y[(s*chans+c)*inner+p], tm[(c*batch+s)*inner+p]+b[c]; got != want {
					t.Fatalf("y[%d,%d,%d] = %v; want %v", s, c, p, got, want)
				}
			}
		}
	}
	back := make([]float32, len(tm))
	Host{}.UnbatchBias(hostBuf(tm), hostBuf(make([]float32, chans)), hostBuf(y), batch, chans, inner)
	Host{}.Rebatch(hostBuf(y), hostBuf(back), batch, chans, inner)
	if !slices.Equal(back, tm) {
		t.Errorf("rebatch(unbatch(t)) = %v; want %v", back, tm)
	}
}

// TestBiasGrad: each channel's sum, over rows and inner positions, for
// shapes smaller and larger than a block and than a part; where inner is 1
// the host's row-by-row loop gives the bits of the kernel's one thread a
// column and part.
func TestBiasGrad(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	for _, sh := range [][3]int{{1, 3, 1}, {64, 10, 1}, {1, 32, 64 * 784}, {5, 7, 300}, {200, 5, 1}, {256, 4, 784}, {3, 2, 5000}, {9, 3, 2}} {
		rows, cols, inner := sh[0], sh[1], sh[2]
		dy := randn(rng, rows*cols*inner)
		db := make([]float32, cols)
		Host{}.BiasGrad(hostBuf(dy), hostBuf(db), rows, cols, inner)
		for j := range cols {
			want := 0.0
			for r := range rows {
				for k := range inner {
					want += float64(dy[(r*cols+j)*inner+k])
				}
			}
			if math.Abs(float64(db[j])-want) > 1e-5*float64(rows*inner) {
				t.Errorf("%v: db[%d] = %v; want %v", sh, j, db[j], want)
			}
		}
		if inner != 1 {
			continue
		}
		sp := NewBiasSplit(rows, inner)
		part, twin := make([]float32, sp.Parts*cols), make([]float32, cols)
		for i := range part {
			biasGradRowsThread(i, dy, part, rows, cols, sp.Seg)
		}
		for j := range cols {
			biasGradSumThread(j, part, twin, cols, sp.Parts)
		}
		if !slices.Equal(db, twin) {
			t.Errorf("%v: host %v; the kernels' threads %v", sh, db, twin)
		}
	}
}

// TestNonFinite: the flag is raised by a NaN or an Inf anywhere, and by
// nothing else.
func TestNonFinite(t *testing.T) {
	for _, tc := range []struct {
		v    float32
		want float32
	}{{1, 0}, {float32(math.NaN()), 1}, {float32(math.Inf(-1)), 1}, {math.MaxFloat32, 0}} {
		g := []float32{0, 1, -2, 3}
		g[2] = tc.v
		flag := []float32{0}
		Host{}.NonFinite(hostBuf(g), hostBuf(flag))
		if flag[0] != tc.want {
			t.Errorf("%v: flag %v; want %v", tc.v, flag[0], tc.want)
		}
	}
}

// TestMaxPoolBackward: the gradient goes to the first largest value of each
// window and nowhere else; a tail row and column outside every window get 0.
func TestMaxPoolBackward(t *testing.T) {
	g := NewPool(1, 5, 5, 2) // 2×2 output; row 4 and column 4 are dropped
	x := []float32{
		1, 3, 0, 0, 9,
		3, 2, 5, 1, 9,
		0, 0, 4, 4, 9,
		0, 7, 4, 1, 9,
		9, 9, 9, 9, 9,
	}
	y := make([]float32, 4)
	Host{}.MaxPool(hostBuf(x), hostBuf(y), g)
	if want := []float32{3, 5, 7, 4}; !slices.Equal(y, want) {
		t.Fatalf("max pool = %v; want %v", y, want)
	}
	dx := make([]float32, 25)
	Host{}.MaxPoolBackward(hostBuf(x), hostBuf([]float32{10, 20, 30, 40}), hostBuf(dx), g)
	want := make([]float32, 25)
	want[1], want[7], want[16], want[12] = 10, 20, 30, 40 // the first 3; the first 4 of the tie
	if !slices.Equal(dx, want) {
		t.Errorf("max pool backward = %v; want %v", dx, want)
	}
}

// TestLaunch: every element gets a thread, in as few blocks as that takes.
func TestLaunch(t *testing.T) {
	for _, n := range []int{0, 1, 255, 256, 257, 64 * 32 * 28 * 28, 1 << 31} {
		grid, block := Launch(n)
		if block != 256 || grid*block < n || (n > 0 && (grid-1)*block >= n) || (n == 0 && grid != 0) {
			t.Errorf("Launch(%d) = %d blocks of %d", n, grid, block)
		}
	}
}

// TestEmbedGradByLists: the embedding's gradient from each token's list of
// rows is the gather's, bit for bit — rows over several of token_rows'
// chunks, a token that never comes, one that comes in most rows.
func TestEmbedGradByLists(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	const V, dim = 11, 5
	for _, rows := range []int{1, 12, 256, 600} {
		tok := make([]float32, rows)
		for r := range tok {
			switch k := rng.IntN(10); {
			case k < 6:
				tok[r] = 3 // most rows
			default:
				tok[r] = float32(rng.IntN(V - 1)) // never V-1
			}
		}
		dy := make([]float32, rows*dim)
		for i := range dy {
			dy[i] = float32(rng.NormFloat64())
		}
		want, got := make([]float32, V*dim), make([]float32, V*dim)
		for i := range want {
			embedGradThread(i, tok, dy, want, rows, dim)
		}
		lists, counts := make([]float32, V*rows), make([]float32, V)
		for v := range V {
			tokenRowsBlock(v, tok, lists, counts, rows)
		}
		total := 0
		for v := range V {
			total += int(math.Float32bits(counts[v]))
		}
		for i := range got {
			embedGradListsThread(i, lists, counts, dy, got, rows, dim)
		}
		if total != rows || !slices.Equal(got, want) {
			t.Errorf("%d rows: %d rows listed; gradients by lists equal the gather's: %v", rows, total, slices.Equal(got, want))
		}
	}
}

// TestEveryKernelHasItsGoBody: each kernel in the PTX table has its Go twin
// in threads.go (im2col_batch → im2colBatchThread, bias_add →
// biasAddThread, …; a kernel whose threads cooperate, a …Block), which is
// what the host engine runs and these tests check.
func TestEveryKernelHasItsGoBody(t *testing.T) {
	src, err := os.ReadFile("threads.go")
	if os.IsNotExist(err) {
		t.Skip("threads.go is not here (a test binary run away from the source)")
	}
	if err != nil {
		t.Fatal(err)
	}
	for name := range ptx.Kernels {
		parts := strings.Split(name, "_")
		for i := 1; i < len(parts); i++ {
			parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
		}
		fn := "func " + strings.Join(parts, "")
		if !strings.Contains(string(src), fn+"Thread(") && !strings.Contains(string(src), fn+"Block(") {
			t.Errorf("kernel %s has no %sThread(…) or %sBlock(…) in threads.go", name, fn, fn)
		}
	}
}
