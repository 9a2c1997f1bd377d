package data

import (
	"encoding/json"
	"fmt"
	"image"
	"math/rand/v2"
	"slices"
	"strings"

	xdraw "golang.org/x/image/draw"
)

// TransformSpec is one entry of a data config's "transforms" list, in the
// form torchvision users write: a class name and its positional arguments.
type TransformSpec struct {
	Name string            `json:"name"`
	Args []json.RawMessage `json:"args"`
}

// Pipeline is a parsed list of transforms with torchvision's semantics.
// Transforms that work on images (Grayscale, Resize, RandomCrop,
// RandomHorizontalFlip) come before ToTensor, and Normalize after it, as in
// a classic torchvision pipeline on PIL images; ToTensor must be there.
type Pipeline struct {
	image     []imageOp       // before ToTensor, in order
	mean, std []float32       // Normalize after ToTensor; nil if none
	specs     []string        // for Describe
	luts      [3][256]float32 // ToTensor and Normalize per channel (images have 1 or 3)
}

// imageOp transforms an 8-bit HWC image. out is scratch the op may return
// (resized as needed); rng is the sample's own generator.
type imageOp interface {
	apply(in Image, out []uint8, rng *rand.Rand) (Image, error)
	// shape gives the output size for an input size; ok is false where
	// the output size depends on the draw (never for these ops).
	shape(h, w, c int) (int, int, int, error)
}

var transformNames = []string{"Grayscale", "Normalize", "RandomCrop", "RandomHorizontalFlip", "Resize", "ToTensor"}

// NewPipeline parses transform specs. Errors name the transform by its
// place in the list and say what was expected.
func NewPipeline(specs []TransformSpec) (*Pipeline, error) {
	p := &Pipeline{}
	tensor := false
	for i, s := range specs {
		where := fmt.Sprintf("transform %d (%s)", i, s.Name)
		args := argList{where: where, raw: s.Args}
		if s.Name != "ToTensor" && s.Name != "Normalize" && tensor && slices.Contains(transformNames, s.Name) {
			return nil, fmt.Errorf("data: %s comes after ToTensor; it works on images, so put it before: %w", where, ErrConfig)
		}
		var op imageOp
		switch s.Name {
		case "ToTensor":
			if err := args.count(0, 0); err != nil {
				return nil, err
			}
			if tensor {
				return nil, fmt.Errorf("data: %s: ToTensor given twice: %w", where, ErrConfig)
			}
			tensor = true
		case "Normalize":
			if !tensor {
				return nil, fmt.Errorf("data: %s comes before ToTensor; Normalize works on tensors, so put it after: %w", where, ErrConfig)
			}
			if p.mean != nil {
				return nil, fmt.Errorf("data: %s: Normalize given twice: %w", where, ErrConfig)
			}
			mean, std, err := normalizeOf(args)
			if err != nil {
				return nil, err
			}
			p.mean, p.std = mean, std
		case "Grayscale", "Resize", "RandomCrop", "RandomHorizontalFlip":
			var err error
			if op, err = imageOpOf(s, args); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("data: %s: unknown transform; known: %s: %w", where, strings.Join(transformNames, ", "), ErrConfig)
		}
		if op != nil {
			p.image = append(p.image, op)
		}
		p.specs = append(p.specs, describeSpec(s))
	}
	if !tensor {
		return nil, fmt.Errorf("data: the transforms have no ToTensor; add {\"name\": \"ToTensor\", \"args\": []}: %w", ErrConfig)
	}
	p.buildLUTs()
	return p, nil
}

// imageOpOf parses s, an image transform (Grayscale, Resize, RandomCrop,
// RandomHorizontalFlip), whose arguments are args.
func imageOpOf(s TransformSpec, args argList) (imageOp, error) {
	where := args.where
	switch s.Name {
	case "Grayscale":
		if err := args.count(0, 1); err != nil {
			return nil, err
		}
		out := 1
		if len(s.Args) == 1 {
			var err error
			if out, err = args.int(0, "num_output_channels"); err != nil {
				return nil, err
			}
			if out != 1 && out != 3 {
				return nil, fmt.Errorf("data: %s: num_output_channels %d; want 1 or 3: %w", where, out, ErrConfig)
			}
		}
		return grayscale{out: out}, nil
	case "Resize":
		if err := args.count(1, 1); err != nil {
			return nil, err
		}
		h, w, err := args.size(0, "size", false)
		if err != nil {
			return nil, err
		}
		return resize{h: h, w: w}, nil
	case "RandomCrop":
		if err := args.count(1, 3); err != nil {
			return nil, err
		}
		c := randomCrop{}
		var err error
		if c.h, c.w, err = args.size(0, "size", true); err != nil {
			return nil, err
		}
		if len(s.Args) > 1 && string(s.Args[1]) != "null" {
			if c.pad, err = args.padding(1); err != nil {
				return nil, err
			}
		}
		if len(s.Args) > 2 {
			if err := args.decode(2, "pad_if_needed", &c.padIfNeeded); err != nil {
				return nil, err
			}
		}
		return c, nil
	case "RandomHorizontalFlip":
		if err := args.count(0, 1); err != nil {
			return nil, err
		}
		f := flip{p: 0.5}
		if len(s.Args) == 1 {
			v, err := args.floats(0, "p")
			if err != nil || len(v) != 1 || v[0] < 0 || v[0] > 1 {
				return nil, fmt.Errorf("data: %s: p must be one number in [0, 1]: %w", where, ErrConfig)
			}
			f.p = float64(v[0])
		}
		return f, nil
	}
	return nil, fmt.Errorf("data: %s: not an image transform: %w", where, ErrConfig)
}

// normalizeOf parses Normalize's arguments: a mean and a std per channel,
// none of the stds 0.
func normalizeOf(args argList) (mean, std []float32, err error) {
	where := args.where
	if err := args.count(2, 2); err != nil {
		return nil, nil, err
	}
	if mean, err = args.floats(0, "mean"); err != nil {
		return nil, nil, err
	}
	if std, err = args.floats(1, "std"); err != nil {
		return nil, nil, err
	}
	if len(mean) != len(std) || len(mean) == 0 {
		return nil, nil, fmt.Errorf("data: %s: %d means and %d stds; want the same number, one per channel: %w", where, len(mean), len(std), ErrConfig)
	}
	for _, v := range std {
		if v == 0 {
			return nil, nil, fmt.Errorf("data: %s: a std of 0 would divide by zero: %w", where, ErrConfig)
		}
	}
	return mean, std, nil
}

func describeSpec(s TransformSpec) string {
	args := make([]string, len(s.Args))
	for i, a := range s.Args {
		args[i] = string(a)
	}
	return s.Name + "(" + strings.Join(args, ", ") + ")"
}

// Describe lists the transforms as given.
func (p *Pipeline) Describe() string { return strings.Join(p.specs, " → ") }

// OutShape returns the C, H, W of the tensor an H×W×C image becomes, and
// checks that Normalize fits its channels. Normalize with one value applies
// it to every channel, as torch's broadcasting does; with three equal
// values on a one-channel image it applies that value, so the usual
// (0.5, 0.5, 0.5) configs also work on grayscale data.
func (p *Pipeline) OutShape(h, w, c int) (int, int, int, error) {
	for _, op := range p.image {
		var err error
		if h, w, c, err = op.shape(h, w, c); err != nil {
			return 0, 0, 0, err
		}
	}
	if p.mean != nil && len(p.mean) != 1 && len(p.mean) != c && !(c == 1 && len(p.mean) == 3 && allEqual(p.mean) && allEqual(p.std)) {
		return 0, 0, 0, fmt.Errorf("data: Normalize has %d means and stds but the images have %d channel(s) at that point: %w", len(p.mean), c, ErrConfig)
	}
	return c, h, w, nil
}

func allEqual(v []float32) bool {
	for _, x := range v {
		if x != v[0] {
			return false
		}
	}
	return true
}

// Workspace holds one worker's scratch for Apply, so that transforming a
// sample allocates nothing once the workspace has grown.
type Workspace struct {
	bufs [2][]uint8
	next int // bufs[next] is free for the next op's output
	pcg  rand.PCG
	rng  *rand.Rand
}

// sampleSeed mixes (seed, epoch, index) so that every sample of every epoch
// draws its own numbers, whichever peer or worker transforms it.
func sampleSeed(seed uint64, epoch, index int) (uint64, uint64) {
	return splitmix(seed ^ splitmix(uint64(epoch))), splitmix(uint64(index) + 0x9e3779b97f4a7c15)
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Apply transforms im into dst, which must hold exactly the C×H×W floats
// OutShape gives. seed, epoch and index seed the random transforms.
func (p *Pipeline) Apply(ws *Workspace, im Image, dst []float32, seed uint64, epoch, index int) error {
	if ws.rng == nil {
		ws.rng = rand.New(&ws.pcg)
	}
	if len(p.image) > 0 {
		ws.pcg.Seed(sampleSeed(seed, epoch, index))
	}
	for _, op := range p.image {
		out, err := op.apply(im, ws.bufs[ws.next], ws.rng)
		if err != nil {
			return err
		}
		if !samePix(out.Pix, im.Pix) {
			// The output is in scratch; the input's buffer, if it was
			// ours, is free now.
			ws.bufs[ws.next] = out.Pix[:cap(out.Pix)]
			ws.next ^= 1
		}
		im = out
	}
	if len(dst) != len(im.Pix) {
		return fmt.Errorf("data: transformed image is %d×%d×%d, the batch wants %d values", im.H, im.W, im.C, len(dst))
	}
	p.toTensor(im, dst)
	return nil
}

func samePix(a, b []uint8) bool {
	return len(a) > 0 && len(b) > 0 && &a[0] == &b[0]
}

// toTensor is ToTensor (HWC 0–255 → CHW 0–1) and Normalize in one pass,
// through the tables luts builds.
func (p *Pipeline) toTensor(im Image, dst []float32) {
	plane := im.H * im.W
	for c := range im.C {
		lut := &p.luts[c]
		out := dst[c*plane : (c+1)*plane]
		if im.C == 1 {
			for i, v := range im.Pix[:plane] {
				out[i] = lut[v]
			}
			continue
		}
		for i := range out {
			out[i] = lut[im.Pix[i*im.C+c]]
		}
	}
}

// buildLUTs maps every uint8 value of each channel to its float: x/255,
// then (x-mean)/std, in float32 as torch computes them.
func (p *Pipeline) buildLUTs() {
	for c := range p.luts {
		for v := range p.luts[c] {
			x := float32(v) / 255
			if p.mean != nil {
				m, s := p.mean[0], p.std[0]
				if c < len(p.mean) {
					m, s = p.mean[c], p.std[c]
				}
				x = (x - m) / s
			}
			p.luts[c][v] = x
		}
	}
}

// grow returns b with length n, reusing its storage when it can.
func grow(b []uint8, n int) []uint8 {
	if cap(b) < n {
		return make([]uint8, n)
	}
	return b[:n]
}

type grayscale struct{ out int }

func (g grayscale) shape(h, w, c int) (int, int, int, error) { return h, w, g.out, nil }

func (g grayscale) apply(in Image, out []uint8, _ *rand.Rand) (Image, error) {
	n := in.H * in.W
	out = grow(out, n*g.out)
	for i := range n {
		var l uint8
		if in.C == 1 {
			l = in.Pix[i]
		} else {
			// PIL's convert("L"): ITU-R 601-2 luma in fixed point.
			r, gg, b := uint32(in.Pix[3*i]), uint32(in.Pix[3*i+1]), uint32(in.Pix[3*i+2])
			l = uint8((r*19595 + gg*38470 + b*7471 + 0x8000) >> 16)
		}
		for k := range g.out {
			out[i*g.out+k] = l
		}
	}
	return Image{Pix: out, H: in.H, W: in.W, C: g.out}, nil
}

// resize is torchvision's Resize: h×w, or with w == 0 the smaller edge
// becomes h and the other keeps the aspect ratio. Bilinear, antialiased
// when shrinking, as PIL does.
type resize struct{ h, w int }

func (r resize) shape(h, w, c int) (int, int, int, error) {
	if r.w > 0 {
		return r.h, r.w, c, nil
	}
	if h <= w {
		return r.h, r.h * w / h, c, nil
	}
	return r.h * h / w, r.h, c, nil
}

func (r resize) apply(in Image, out []uint8, _ *rand.Rand) (Image, error) {
	h, w, c, _ := r.shape(in.H, in.W, in.C)
	if h == in.H && w == in.W {
		return in, nil
	}
	dst := Image{H: h, W: w, C: c}
	rect := image.Rect(0, 0, w, h)
	if c == 1 {
		g := &image.Gray{Pix: grow(out, h*w), Stride: w, Rect: rect}
		xdraw.BiLinear.Scale(g, rect, in.ToImage(), image.Rect(0, 0, in.W, in.H), xdraw.Src, nil)
		dst.Pix = g.Pix
		return dst, nil
	}
	m := image.NewNRGBA(rect)
	xdraw.BiLinear.Scale(m, rect, in.ToImage(), image.Rect(0, 0, in.W, in.H), xdraw.Src, nil)
	dst.Pix = grow(out, h*w*3)
	for i, j := 0, 0; i < len(m.Pix); i, j = i+4, j+3 {
		dst.Pix[j], dst.Pix[j+1], dst.Pix[j+2] = m.Pix[i], m.Pix[i+1], m.Pix[i+2]
	}
	return dst, nil
}

// randomCrop is torchvision's RandomCrop: pad with zeros (left, top, right,
// bottom), pad more where the image is still smaller than the crop if
// padIfNeeded, then cut an h×w window at a uniformly drawn place.
type randomCrop struct {
	h, w        int
	pad         [4]int
	padIfNeeded bool
}

func (rc randomCrop) padded(h, w int) (ph, pw, top, left int) {
	top, left = rc.pad[1], rc.pad[0]
	ph, pw = h+rc.pad[1]+rc.pad[3], w+rc.pad[0]+rc.pad[2]
	if rc.padIfNeeded && ph < rc.h {
		top += rc.h - ph
		ph = rc.h + (rc.h - ph)
	}
	if rc.padIfNeeded && pw < rc.w {
		left += rc.w - pw
		pw = rc.w + (rc.w - pw)
	}
	return ph, pw, top, left
}

func (rc randomCrop) shape(h, w, c int) (int, int, int, error) {
	if ph, pw, _, _ := rc.padded(h, w); ph < rc.h || pw < rc.w {
		return 0, 0, 0, fmt.Errorf("data: RandomCrop of %d×%d does not fit a %d×%d image padded to %d×%d: %w", rc.h, rc.w, h, w, ph, pw, ErrConfig)
	}
	return rc.h, rc.w, c, nil
}

func (rc randomCrop) apply(in Image, out []uint8, rng *rand.Rand) (Image, error) {
	ph, pw, top, left := rc.padded(in.H, in.W)
	if ph < rc.h || pw < rc.w {
		_, _, _, err := rc.shape(in.H, in.W, in.C)
		return Image{}, err
	}
	y0 := rng.IntN(ph - rc.h + 1)
	x0 := rng.IntN(pw - rc.w + 1)
	c := in.C
	out = grow(out, rc.h*rc.w*c)
	for y := range rc.h {
		sy := y0 + y - top // row in the unpadded image
		row := out[y*rc.w*c : (y+1)*rc.w*c]
		if sy < 0 || sy >= in.H {
			clear(row)
			continue
		}
		for x := range rc.w {
			sx := x0 + x - left
			px := row[x*c : (x+1)*c]
			if sx < 0 || sx >= in.W {
				clear(px)
				continue
			}
			copy(px, in.Pix[(sy*in.W+sx)*c:])
		}
	}
	return Image{Pix: out, H: rc.h, W: rc.w, C: c}, nil
}

type flip struct{ p float64 }

func (f flip) shape(h, w, c int) (int, int, int, error) { return h, w, c, nil }

func (f flip) apply(in Image, out []uint8, rng *rand.Rand) (Image, error) {
	if rng.Float64() >= f.p {
		return in, nil
	}
	c := in.C
	out = grow(out, len(in.Pix))
	for y := range in.H {
		row := in.Pix[y*in.W*c : (y+1)*in.W*c]
		orow := out[y*in.W*c : (y+1)*in.W*c]
		for x := range in.W {
			copy(orow[(in.W-1-x)*c:(in.W-x)*c], row[x*c:(x+1)*c])
		}
	}
	return Image{Pix: out, H: in.H, W: in.W, C: c}, nil
}

// argList decodes positional JSON arguments, naming the transform and the
// argument in every error.
type argList struct {
	where string
	raw   []json.RawMessage
}

func (a argList) count(lo, hi int) error {
	if n := len(a.raw); n < lo || n > hi {
		want := fmt.Sprintf("%d", lo)
		if hi != lo {
			want = fmt.Sprintf("%d to %d", lo, hi)
		}
		return fmt.Errorf("data: %s: %d arguments; want %s: %w", a.where, n, want, ErrConfig)
	}
	return nil
}

func (a argList) decode(i int, name string, v any) error {
	if err := json.Unmarshal(a.raw[i], v); err != nil {
		return fmt.Errorf("data: %s: argument %d (%s) is %s: %v: %w", a.where, i, name, a.raw[i], err, ErrConfig)
	}
	return nil
}

func (a argList) int(i int, name string) (int, error) {
	var v int
	err := a.decode(i, name, &v)
	return v, err
}

// floats takes a number or a list of numbers.
func (a argList) floats(i int, name string) ([]float32, error) {
	var one float32
	if json.Unmarshal(a.raw[i], &one) == nil {
		return []float32{one}, nil
	}
	var v []float32
	err := a.decode(i, name, &v)
	return v, err
}

// size takes an int or [h, w]. A lone int means a square if square is set,
// else "the smaller edge" (returned as w = 0), as Resize reads it.
func (a argList) size(i int, name string, square bool) (int, int, error) {
	var one int
	if json.Unmarshal(a.raw[i], &one) == nil {
		if one <= 0 {
			return 0, 0, fmt.Errorf("data: %s: %s %d; want a positive size: %w", a.where, name, one, ErrConfig)
		}
		if square {
			return one, one, nil
		}
		return one, 0, nil
	}
	var hw []int
	if err := a.decode(i, name, &hw); err != nil {
		return 0, 0, err
	}
	if len(hw) != 2 || hw[0] <= 0 || hw[1] <= 0 {
		return 0, 0, fmt.Errorf("data: %s: %s %v; want a positive int or [height, width]: %w", a.where, name, hw, ErrConfig)
	}
	return hw[0], hw[1], nil
}

// padding takes torchvision's forms: p (all sides), [lr, tb] or [l, t, r, b].
func (a argList) padding(i int) ([4]int, error) {
	var p [4]int
	var one int
	if json.Unmarshal(a.raw[i], &one) == nil {
		p = [4]int{one, one, one, one}
	} else {
		var v []int
		if err := a.decode(i, "padding", &v); err != nil {
			return p, err
		}
		switch len(v) {
		case 2:
			p = [4]int{v[0], v[1], v[0], v[1]}
		case 4:
			p = [4]int{v[0], v[1], v[2], v[3]}
		default:
			return p, fmt.Errorf("data: %s: padding %v; want p, [left/right, top/bottom] or [left, top, right, bottom]: %w", a.where, v, ErrConfig)
		}
	}
	for _, x := range p {
		if x < 0 || x > 4096 {
			return p, fmt.Errorf("data: %s: padding %v; want values in [0, 4096]: %w", a.where, p, ErrConfig)
		}
	}
	return p, nil
}
