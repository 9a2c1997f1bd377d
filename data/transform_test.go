package data

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
)

// raw splits a JSON array into positional arguments.
func raw(s string) []json.RawMessage {
	var v []json.RawMessage
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		panic(err)
	}
	return v
}

func mustPipeline(t *testing.T, specs ...TransformSpec) *Pipeline {
	t.Helper()
	p, err := NewPipeline(specs)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func apply(t *testing.T, p *Pipeline, im Image, index int) ([]float32, int, int, int) {
	t.Helper()
	c, h, w, err := p.OutShape(im.H, im.W, im.C)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, c*h*w)
	var ws Workspace
	if err := p.Apply(&ws, im, out, 1, 0, index); err != nil {
		t.Fatal(err)
	}
	return out, c, h, w
}

func TestToTensorNormalize(t *testing.T) {
	im := Image{Pix: []uint8{0, 255, 51, 102, 255, 0}, H: 1, W: 2, C: 3} // HWC
	p := mustPipeline(t, TransformSpec{Name: "ToTensor"}, TransformSpec{Name: "Normalize", Args: raw(`[[0.5, 0, 0], [0.5, 1, 2]]`)})
	out, c, h, w := apply(t, p, im, 0)
	if c != 3 || h != 1 || w != 2 {
		t.Fatalf("shape %d×%d×%d; want 3×1×2", c, h, w)
	}
	// CHW: channel 0 = pixels 0 and 102, channel 1 = 255 and 255, channel 2 = 51 and 0.
	want := []float32{(0 - 0.5) / 0.5, (float32(102)/255 - 0.5) / 0.5, 1, 1, float32(51) / 255 / 2, 0}
	for i := range want {
		if math.Abs(float64(out[i]-want[i])) > 1e-6 {
			t.Fatalf("ToTensor+Normalize = %v; want %v", out, want)
		}
	}
}

func TestNormalizeChannels(t *testing.T) {
	gray := Image{Pix: []uint8{255}, H: 1, W: 1, C: 1}
	tests := []struct {
		name, args string
		ok         bool
	}{
		{"one value", `[0.5, 0.5]`, true},
		{"one-element lists", `[[0.5], [0.5]]`, true},
		{"three equal values on grayscale", `[[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]`, true},
		{"three different values on grayscale", `[[0.1, 0.2, 0.3], [0.5, 0.5, 0.5]]`, false},
		{"two values", `[[0.5, 0.5], [0.5, 0.5]]`, false},
	}
	for _, tt := range tests {
		p := mustPipeline(t, TransformSpec{Name: "ToTensor"}, TransformSpec{Name: "Normalize", Args: raw(tt.args)})
		_, _, _, err := p.OutShape(gray.H, gray.W, gray.C)
		if (err == nil) != tt.ok {
			t.Errorf("%s: OutShape = %v; want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "channel") {
			t.Errorf("%s: %v; want it to speak of channels", tt.name, err)
		}
	}
}

func TestGrayscale(t *testing.T) {
	im := Image{Pix: []uint8{255, 0, 0, 10, 200, 30}, H: 1, W: 2, C: 3}
	p := mustPipeline(t, TransformSpec{Name: "Grayscale"}, TransformSpec{Name: "ToTensor"})
	out, c, _, _ := apply(t, p, im, 0)
	// PIL: (R*19595 + G*38470 + B*7471 + 0x8000) >> 16
	want := []float32{float32((255*19595+0x8000)>>16) / 255, float32((10*19595+200*38470+30*7471+0x8000)>>16) / 255}
	if c != 1 || out[0] != want[0] || out[1] != want[1] {
		t.Errorf("Grayscale = %v (%d channels); want %v", out, c, want)
	}
	p3 := mustPipeline(t, TransformSpec{Name: "Grayscale", Args: raw(`[3]`)}, TransformSpec{Name: "ToTensor"})
	out3, c3, _, _ := apply(t, p3, im, 0)
	if c3 != 3 || out3[0] != out3[2] || out3[0] != out3[4] {
		t.Errorf("Grayscale(3) = %v; want three equal planes", out3)
	}
}

func TestResizeShape(t *testing.T) {
	tests := []struct {
		args       string
		h, w       int
		wantH, wan int
	}{
		{`[14]`, 28, 28, 14, 14},
		{`[14]`, 28, 56, 14, 28}, // smaller edge
		{`[14]`, 56, 28, 28, 14},
		{`[[10, 20]]`, 28, 28, 10, 20},
	}
	for _, tt := range tests {
		p := mustPipeline(t, TransformSpec{Name: "Resize", Args: raw(tt.args)}, TransformSpec{Name: "ToTensor"})
		im := Image{Pix: make([]uint8, tt.h*tt.w), H: tt.h, W: tt.w, C: 1}
		for i := range im.Pix {
			im.Pix[i] = 128
		}
		out, _, h, w := apply(t, p, im, 0)
		if h != tt.wantH || w != tt.wan {
			t.Errorf("Resize%s of %d×%d = %d×%d; want %d×%d", tt.args, tt.h, tt.w, h, w, tt.wantH, tt.wan)
		}
		for _, v := range out {
			if math.Abs(float64(v)-128.0/255) > 1.0/255 {
				t.Fatalf("Resize%s of a flat image gave %v; want it flat", tt.args, v)
			}
		}
	}
}

// TestRandomTransformsAreSeeded: the same (seed, epoch, index) gives the
// same draw, and different indices give different ones.
func TestRandomTransformsAreSeeded(t *testing.T) {
	im := Image{Pix: make([]uint8, 8*8), H: 8, W: 8, C: 1}
	for i := range im.Pix {
		im.Pix[i] = uint8(i * 3)
	}
	p := mustPipeline(t,
		TransformSpec{Name: "RandomCrop", Args: raw(`[6, 2]`)},
		TransformSpec{Name: "RandomHorizontalFlip"},
		TransformSpec{Name: "ToTensor"})
	seen := map[string]bool{}
	for index := range 20 {
		a, _, _, _ := apply(t, p, im, index)
		b, _, _, _ := apply(t, p, im, index)
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("index %d: two draws differ", index)
			}
		}
		key := ""
		for _, v := range a {
			key += string(rune(int(v*255) + 1))
		}
		seen[key] = true
	}
	if len(seen) < 5 {
		t.Errorf("20 indices gave %d distinct crops; want the draws to vary", len(seen))
	}
}

func TestRandomCropPadsWithZeros(t *testing.T) {
	im := Image{Pix: []uint8{255, 255, 255, 255}, H: 2, W: 2, C: 1}
	// A 6×6 crop of a 2×2 image padded by 2 on every side is the whole
	// padded image: the image in the middle, zeros around it.
	p := mustPipeline(t, TransformSpec{Name: "RandomCrop", Args: raw(`[6, 2]`)}, TransformSpec{Name: "ToTensor"})
	out, _, h, w := apply(t, p, im, 0)
	for y := range h {
		for x := range w {
			want := float32(0)
			if y >= 2 && y < 4 && x >= 2 && x < 4 {
				want = 1
			}
			if out[y*w+x] != want {
				t.Fatalf("padded crop at (%d,%d) = %v; want %v", y, x, out[y*w+x], want)
			}
		}
	}
}

func TestFlip(t *testing.T) {
	im := Image{Pix: []uint8{0, 255}, H: 1, W: 2, C: 1}
	always := mustPipeline(t, TransformSpec{Name: "RandomHorizontalFlip", Args: raw(`[1]`)}, TransformSpec{Name: "ToTensor"})
	never := mustPipeline(t, TransformSpec{Name: "RandomHorizontalFlip", Args: raw(`[0]`)}, TransformSpec{Name: "ToTensor"})
	if out, _, _, _ := apply(t, always, im, 0); out[0] != 1 || out[1] != 0 {
		t.Errorf("flip p=1 = %v; want [1 0]", out)
	}
	if out, _, _, _ := apply(t, never, im, 0); out[0] != 0 || out[1] != 1 {
		t.Errorf("flip p=0 = %v; want [0 1]", out)
	}
}

func TestPipelineErrors(t *testing.T) {
	tt := func(name, args string) TransformSpec { return TransformSpec{Name: name, Args: raw(args)} }
	toTensor := tt("ToTensor", `[]`)
	tests := []struct {
		name  string
		specs []TransformSpec
		words string
	}{
		{"unknown name", []TransformSpec{tt("ColorJitter", `[]`), toTensor}, "transform 0 (ColorJitter): unknown transform"},
		{"too many args", []TransformSpec{tt("ToTensor", `[1]`)}, "1 arguments; want 0"},
		{"Normalize one arg", []TransformSpec{toTensor, tt("Normalize", `[[0.5]]`)}, "1 arguments; want 2"},
		{"Normalize wrong type", []TransformSpec{toTensor, tt("Normalize", `["a", "b"]`)}, "argument 0 (mean)"},
		{"Normalize lengths differ", []TransformSpec{toTensor, tt("Normalize", `[[0.5, 0.5], [0.5]]`)}, "2 means and 1 stds"},
		{"Normalize zero std", []TransformSpec{toTensor, tt("Normalize", `[[0.5], [0]]`)}, "std of 0"},
		{"Normalize before ToTensor", []TransformSpec{tt("Normalize", `[0.5, 0.5]`), toTensor}, "before ToTensor"},
		{"crop after ToTensor", []TransformSpec{toTensor, tt("RandomCrop", `[28]`)}, "after ToTensor"},
		{"no ToTensor", []TransformSpec{tt("Resize", `[28]`)}, "no ToTensor"},
		{"Resize bad size", []TransformSpec{tt("Resize", `[[1, 2, 3]]`), toTensor}, "want a positive int or [height, width]"},
		{"Resize negative", []TransformSpec{tt("Resize", `[-3]`), toTensor}, "positive size"},
		{"crop bad padding", []TransformSpec{tt("RandomCrop", `[28, [1, 2, 3]]`), toTensor}, "padding [1 2 3]"},
		{"flip p out of range", []TransformSpec{tt("RandomHorizontalFlip", `[2]`), toTensor}, "p must be one number in [0, 1]"},
		{"grayscale channels", []TransformSpec{tt("Grayscale", `[2]`), toTensor}, "num_output_channels 2"},
	}
	for _, tc := range tests {
		_, err := NewPipeline(tc.specs)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.words) {
			t.Errorf("%s: NewPipeline = %v; want ErrConfig saying %q", tc.name, err, tc.words)
		}
	}
	p := mustPipeline(t, tt("RandomCrop", `[32]`), toTensor)
	if _, _, _, err := p.OutShape(28, 28, 1); err == nil || !strings.Contains(err.Error(), "does not fit") {
		t.Errorf("RandomCrop(32) of 28×28: %v; want an error saying it does not fit", err)
	}
}
