package pipeline

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/ringtrain/ringtrain/train"
)

func goodFrame() (*Frame, Expect) {
	f := &Frame{Kind: Activations, Enc: F32, Stage: 1, Gen: 7, Step: 42, MB: 3, Rows: 2, Loss: 0.5,
		Tensors: [][]float32{{1, 2, 3, 4, 5, 6}, {-1, 0.25}}}
	return f, Expect{Kind: Activations, Enc: F32, Stage: 1, Gen: 7, Step: 42, MB: 3, Rows: 2, Sizes: []int{3, 1}}
}

func TestFrameRoundTrip(t *testing.T) {
	for _, enc := range []Encoding{F32, BF16} {
		f, want := goodFrame()
		f.Enc, want.Enc = enc, enc
		f.Tensors[0][0] = 1.00390625 + 1.0/1024 // not a bfloat16
		got, err := ReadFrame(bytes.NewReader(AppendFrame(nil, f)), want)
		if err != nil {
			t.Fatal(err)
		}
		if got.Loss != f.Loss || got.MB != f.MB || len(got.Tensors) != 2 {
			t.Fatalf("%v: %+v", enc, got)
		}
		for k := range f.Tensors {
			r := append([]float32(nil), f.Tensors[k]...)
			enc.Round(r)
			for i := range r {
				if math.Float32bits(got.Tensors[k][i]) != math.Float32bits(r[i]) {
					t.Errorf("%v: tensor %d[%d] = %v; want %v", enc, k, i, got.Tensors[k][i], r[i])
				}
			}
		}
	}
}

// A frame that is not the one expected is refused, saying which field
// differs, before its values are read.
func TestFrameRefused(t *testing.T) {
	tests := []struct {
		name   string
		change func(f *Frame, w *Expect)
		want   string
	}{
		{"old generation", func(f *Frame, w *Expect) { f.Gen = 6 }, "generation 6; want 7"},
		{"wrong stage", func(f *Frame, w *Expect) { f.Stage = 2 }, "stage 2; want 1"},
		{"wrong step", func(f *Frame, w *Expect) { f.Step = 41 }, "step 41; want 42"},
		{"wrong micro-batch", func(f *Frame, w *Expect) { f.MB = 4 }, "micro-batch 4; want 3"},
		{"wrong kind", func(f *Frame, w *Expect) { f.Kind = Gradients }, "kind gradients; want activations"},
		{"wrong encoding", func(f *Frame, w *Expect) { f.Enc = BF16 }, "encoding bf16; want f32"},
		{"wrong rows", func(f *Frame, w *Expect) { f.Rows = 3 }, "rows 3; want 2"},
		{"missing tensor", func(f *Frame, w *Expect) { f.Tensors = f.Tensors[:1] }, "tensors 1; want 2"},
		{"tensor too long", func(f *Frame, w *Expect) { f.Tensors[1] = []float32{1, 2, 3} }, "tensor 1 values 3; want 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, want := goodFrame()
			tt.change(f, &want)
			_, err := ReadFrame(bytes.NewReader(AppendFrame(nil, f)), want)
			if !errors.Is(err, ErrFrame) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%v; want ErrFrame saying %q", err, tt.want)
			}
		})
	}
	f, want := goodFrame()
	b := AppendFrame(nil, f)
	flags := append([]byte(nil), b...)
	flags[frameHeader-1] = 2
	if _, err := ReadFrame(bytes.NewReader(flags), want); !errors.Is(err, ErrFrame) || !strings.Contains(err.Error(), "flags 2") {
		t.Errorf("unknown flags: %v; want ErrFrame saying flags 2", err)
	}
	for cut := range len(b) {
		if _, err := ReadFrame(bytes.NewReader(b[:cut]), want); err == nil {
			t.Fatalf("a frame cut to %d of %d bytes was read", cut, len(b))
		}
	}
}

func FuzzReadFrame(f *testing.F) {
	good, want := goodFrame()
	f.Add(AppendFrame(nil, good))
	good.Enc = BF16
	f.Add(AppendFrame(nil, good))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ReadFrame(bytes.NewReader(b), want)
		if err != nil {
			return
		}
		if len(got.Tensors) != len(want.Sizes) {
			t.Fatalf("%d tensors", len(got.Tensors))
		}
		for k, n := range want.Sizes {
			if len(got.Tensors[k]) != n*want.Rows {
				t.Fatalf("tensor %d: %d values", k, len(got.Tensors[k]))
			}
		}
	})
}

// A stage handed frames of another generation, or from the wrong stage,
// fails the step with ErrFrame and uses nothing of them.
func TestPipeRefusesStrangeFrames(t *testing.T) {
	model := train.ModelConfig{Spec: residualSpec(), Batch: 8, Seed: 5}
	cfg := Config{Stages: 2, MicroBatches: 2, Split: []int{5}}
	xs, ys := batches(3, 2, 8, 12, 5)
	for _, tt := range []struct {
		name  string
		frame Frame
		want  string
	}{
		{"old generation", Frame{Kind: Activations, Stage: 0, Gen: 1, Step: 1, MB: 0, Rows: 4}, "generation 1; want 2"},
		{"wrong stage", Frame{Kind: Activations, Stage: 1, Gen: 2, Step: 1, MB: 0, Rows: 4}, "stage 1; want 0"},
		{"a later micro-batch", Frame{Kind: Activations, Stage: 0, Gen: 2, Step: 1, MB: 1, Rows: 4}, "micro-batch 1; want 0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			prev, mine := MemLinks(4)
			p, err := New(ctx, cfg, model, 1, mine, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			p.SetGeneration(2)
			f := tt.frame
			f.Tensors = [][]float32{make([]float32, 4*16), make([]float32, 4*16), make([]float32, 4*16)}
			if err := prev.Send(ctx, &f); err != nil {
				t.Fatal(err)
			}
			before := append([]float32(nil), p.Params()[0]...)
			_, err = p.ForwardBackward(xs[0], ys[0], 8)
			if !errors.Is(err, ErrFrame) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%v; want ErrFrame saying %q", err, tt.want)
			}
			for _, g := range p.Grads() {
				for _, v := range g {
					if v != 0 {
						t.Fatal("gradients from a refused frame")
					}
				}
			}
			sameBits(t, "params", p.Params()[0], before)
		})
	}
}

// 1F1B holds at most S−s micro-batches on stage s; GPipe all M.
func TestPeakInFlight(t *testing.T) {
	model := train.ModelConfig{Spec: residualSpec(), Batch: 8, Seed: 5}
	for _, tt := range []struct {
		sched Kind
		want  []int
	}{{OneFOneB, []int{3, 2, 1}}, {GPipe, []int{8, 8, 1}}} {
		ctx := context.Background()
		cfg := Config{Stages: 3, MicroBatches: 8, Schedule: tt.sched, Split: []int{2, 8}}
		a1, b1 := MemLinks(64)
		a2, b2 := MemLinks(64)
		links := [][2]Link{{nil, a1}, {b1, a2}, {b2, nil}}
		pipes := make([]*Pipe, 3)
		for s := range 3 {
			p, err := New(ctx, cfg, model, s, links[s][0], links[s][1])
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			pipes[s] = p
		}
		xs, ys := batches(3, 2, 8, 12, 5)
		errs := make(chan error, 3)
		for _, p := range pipes {
			go func() { _, err := p.ForwardBackward(xs[0], ys[0], 8); errs <- err }()
		}
		for range 3 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		for s, p := range pipes {
			st := p.Stats()
			if st.PeakInFlight != tt.want[s] {
				t.Errorf("%s stage %d: %d micro-batches in flight; want %d", tt.sched, s, st.PeakInFlight, tt.want[s])
			}
			t.Logf("%s stage %d: peak %d micro-batches, %d bytes of inputs", tt.sched, s, st.PeakInFlight, st.PeakBytes)
		}
	}
}
