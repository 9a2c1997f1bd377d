package engine

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ringtrain/ringtrain/train"
)

// directHost is Host with a convolver: each convolution by its definition,
// a sum over the kernel's window, as cuDNN computes it on a GPU. It lets
// the tests here check Net's direct path — plans, the bias beside the
// convolution, which buffers each call reads — without one.
type directHost struct {
	Host
	plans []convPlan
	calls map[string]int
	fail  int // ConvPlan refuses from its fail-th call on (0: never)
}

type convPlan struct {
	g          Conv
	out, batch int
}

func (d *directHost) ConvPlan(g Conv, out, batch int) (int, error) {
	if d.fail > 0 && len(d.plans)+1 >= d.fail {
		return 0, errors.New("no algorithm for this shape")
	}
	d.plans = append(d.plans, convPlan{g, out, batch})
	return len(d.plans) - 1, nil
}

// each calls f for every (sample, out channel, output place, in channel,
// ky, kx) whose input place lies inside the image, with the flat indices
// of x, w and y.
func (p convPlan) each(f func(xi, wi, yi int)) {
	g := p.g
	for s := range p.batch {
		for o := range p.out {
			for oy := range g.OH {
				for ox := range g.OW {
					yi := ((s*p.out+o)*g.OH+oy)*g.OW + ox
					for c := range g.C {
						for ky := range g.K {
							for kx := range g.K {
								iy, ix := oy+ky-g.Pad, ox+kx-g.Pad
								if iy < 0 || iy >= g.H || ix < 0 || ix >= g.W {
									continue
								}
								f(((s*g.C+c)*g.H+iy)*g.W+ix, ((o*g.C+c)*g.K+ky)*g.K+kx, yi)
							}
						}
					}
				}
			}
		}
	}
}

func (d *directHost) plan(k int, call string, bufs ...Buf) (convPlan, error) {
	if k < 0 || k >= len(d.plans) {
		return convPlan{}, fmt.Errorf("%s: plan %d of %d", call, k, len(d.plans))
	}
	p := d.plans[k]
	want := []int{p.batch * p.g.C * p.g.H * p.g.W, p.out * p.g.ColRows(), p.batch * p.out * p.g.ColCols()}
	for i, b := range bufs {
		if b.Len() != want[i] {
			return p, fmt.Errorf("%s: buffer %d has %d values; the plan's shape wants %d", call, i, b.Len(), want[i])
		}
	}
	if d.calls == nil {
		d.calls = map[string]int{}
	}
	d.calls[call]++
	return p, nil
}

func (d *directHost) ConvForward(k int, x, w, y Buf) error {
	p, err := d.plan(k, "forward", x, w, y)
	if err != nil {
		return err
	}
	xs, ws, ys := f32(x), f32(w), f32(y)
	clear(ys)
	p.each(func(xi, wi, yi int) { ys[yi] += xs[xi] * ws[wi] })
	return nil
}

func (d *directHost) ConvBackwardFilter(k int, x, dy, dw Buf) error {
	p, err := d.plan(k, "filter", x, dw, dy)
	if err != nil {
		return err
	}
	xs, dys, dws := f32(x), f32(dy), f32(dw)
	clear(dws)
	p.each(func(xi, wi, yi int) { dws[wi] += xs[xi] * dys[yi] })
	return nil
}

func (d *directHost) ConvBackwardData(k int, w, dy, dx Buf) error {
	p, err := d.plan(k, "data", dx, w, dy)
	if err != nil {
		return err
	}
	ws, dys, dxs := f32(w), f32(dy), f32(dx)
	clear(dxs)
	p.each(func(xi, wi, yi int) { dxs[xi] += ws[wi] * dys[yi] })
	return nil
}

var _ convolver = (*directHost)(nil)

// TestNetConvolvesDirectly: on an Ops that convolves directly, Net plans
// each conv2d once, runs it there instead of im2col — no im2col buffers
// in its arena — and gives the gorgonia model's loss and gradients (a
// conv net with padding, strideless 2×2 kernels and a short batch; the
// built-in cnn); a layer the Ops cannot plan keeps im2col beside one it
// can, and Device says so.
func TestNetConvolvesDirectly(t *testing.T) {
	cnn, err := train.BuiltinSpec("cnn", 1, 28, 28, 10)
	if err != nil {
		t.Fatal(err)
	}
	small := train.Spec{Input: []int{2, 6, 6}, Layers: []train.Layer{
		{Type: "conv2d", Out: 3, Kernel: 3, Pad: 1}, {Type: "relu"}, {Type: "maxpool2d", Kernel: 2},
		{Type: "conv2d", Out: 4, Kernel: 2}, {Type: "relu"},
		{Type: "flatten"}, {Type: "linear", Out: 4},
	}}
	for _, tt := range []struct {
		name       string
		spec       train.Spec
		batch, n   int
		fail       int
		plans      int
		deviceSays string
	}{
		{"conv", small, 3, 2, 0, 2, "host, convolutions direct"},
		{"cnn", cnn, 2, 2, 0, 2, "host, convolutions direct"},
		{"second layer refused", small, 3, 3, 2, 1, "host, 1 of 2 convolutions direct, the rest by im2col (layer 3: no algorithm for this shape)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := train.ModelConfig{Spec: tt.spec, Batch: tt.batch, Seed: 3}
			ref, err := train.NewModel(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			d := &directHost{fail: tt.fail}
			net, err := New(d, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer net.Close()
			if len(d.plans) != tt.plans || net.Device() != tt.deviceSays {
				t.Fatalf("%d plans, Device %q; want %d, %q", len(d.plans), net.Device(), tt.plans, tt.deviceSays)
			}
			for k, ly := range net.layers {
				if direct := net.plans[k] >= 0; direct != (net.cols[k] == nil) && ly.kind == train.LayerConv2D {
					t.Errorf("layer %d: planned %v, im2col buffer %v", k, direct, net.cols[k] != nil)
				}
			}
			rng := rand.New(rand.NewPCG(1, 2))
			x, y := batchOf(rng, tt.n, len(net.xPin)/tt.batch, 4)
			lossNearGorgonia(t, net, ref, x, y, tt.n)
			gradsNearGorgonia(t, net, ref)
			// The first layer's input is the data: no gradient of it.
			wantCalls := map[string]int{"forward": tt.plans, "filter": tt.plans, "data": tt.plans - 1}
			if tt.fail > 0 {
				wantCalls["data"] = 0
			}
			for k, v := range wantCalls {
				if d.calls[k] != v {
					t.Errorf("%d %s calls; want %d (all: %v)", d.calls[k], k, v, d.calls)
				}
			}
		})
	}
}

// TestDirectHostIsIm2col: the test's direct convolution is the im2col
// one's, so that TestNetConvolvesDirectly checks Net and not the twin.
func TestDirectHostIsIm2col(t *testing.T) {
	g := NewConv(3, 5, 4, 3, 1)
	const out, batch = 2, 2
	rng := rand.New(rand.NewPCG(4, 4))
	rnd := func(n int) hostBuf {
		v := make(hostBuf, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	x, w := rnd(batch*g.C*g.H*g.W), rnd(out*g.ColRows())
	d := &directHost{}
	p, _ := d.ConvPlan(g, out, batch)
	y := make(hostBuf, batch*out*g.ColCols())
	if err := d.ConvForward(p, x, w, y); err != nil {
		t.Fatal(err)
	}
	col, tmp, want := make(hostBuf, g.ColRows()*batch*g.ColCols()), make(hostBuf, out*batch*g.ColCols()), make(hostBuf, len(y))
	h := Host{}
	if err := h.Im2colBatch(x, col, g, batch); err != nil {
		t.Fatal(err)
	}
	if err := h.Gemm(false, false, out, batch*g.ColCols(), g.ColRows(), w, col, 0, tmp); err != nil {
		t.Fatal(err)
	}
	if err := h.UnbatchBias(tmp, make(hostBuf, out), want, batch, out, g.ColCols()); err != nil {
		t.Fatal(err)
	}
	for i := range y {
		if math.Abs(float64(y[i]-want[i])) > 1e-5 {
			t.Fatalf("y[%d] = %v; im2col %v", i, y[i], want[i])
		}
	}
	if err := d.ConvForward(p, x[1:], w, y); err == nil {
		t.Errorf("a short x: %v; want an error", err)
	}
}
