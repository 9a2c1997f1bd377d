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

// TestIm2col: every col entry is the input a direct convolution reads for
// that tap and output position (0 in the padding).
func TestIm2col(t *testing.T) {
	for _, g := range convs {
		x := make([]float32, g.C*g.H*g.W)
		for i := range x {
			x[i] = float32(i + 1)
		}
		col := make([]float32, g.ColRows()*g.ColCols())
		Host{}.Im2col(hostBuf(x), hostBuf(col), g)
		for c := range g.C {
			for ky := range g.K {
				for kx := range g.K {
					for oy := range g.OH {
						for ox := range g.OW {
							want := float32(0)
							if y, xx := oy+ky-g.Pad, ox+kx-g.Pad; y >= 0 && y < g.H && xx >= 0 && xx < g.W {
								want = x[(c*g.H+y)*g.W+xx]
							}
							r := (c*g.K+ky)*g.K + kx
							if got := col[r*g.ColCols()+oy*g.OW+ox]; got != want {
								t.Fatalf("%+v: col[tap %d,%d,%d][out %d,%d] = %v; want %v", g, c, ky, kx, oy, ox, got, want)
							}
						}
					}
				}
			}
		}
	}
}

// TestCol2imIsAdjoint: ⟨im2col(x), c⟩ = ⟨x, col2im(c)⟩ for random x and c,
// which is what makes col2im the gradient of im2col.
func TestCol2imIsAdjoint(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for _, g := range convs {
		x := make([]float32, g.C*g.H*g.W)
		c := make([]float32, g.ColRows()*g.ColCols())
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		for i := range c {
			c[i] = float32(rng.NormFloat64())
		}
		col := make([]float32, len(c))
		dx := make([]float32, len(x))
		Host{}.Im2col(hostBuf(x), hostBuf(col), g)
		Host{}.Col2im(hostBuf(c), hostBuf(dx), g)
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

// TestEveryKernelHasItsGoBody: each kernel in the PTX table has its Go twin
// in threads.go (im2col → im2colThread, bias_add → biasAddThread, …), which
// is what the host engine runs and these tests check.
func TestEveryKernelHasItsGoBody(t *testing.T) {
	src, err := os.ReadFile("threads.go")
	if err != nil {
		t.Fatal(err)
	}
	for name := range ptx.Kernels {
		parts := strings.Split(name, "_")
		for i := 1; i < len(parts); i++ {
			parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
		}
		fn := "func " + strings.Join(parts, "") + "Thread("
		if !strings.Contains(string(src), fn) {
			t.Errorf("kernel %s has no %s…) in threads.go", name, fn)
		}
	}
}
