package data

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	_ "image/jpeg" // decoders for the formats ImageFolder takes
	_ "image/png"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ReadFolder reads an image folder in torchvision's ImageFolder layout:
// root/<class>/<image>.png|jpg|jpeg, classes sorted by name and numbered
// from 0. Grayscale images keep one channel; any other colour model becomes
// three (RGB). Images may differ in size; the transforms must then bring
// them to one (see Pipeline).
func ReadFolder(root string) (*Dataset, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	d := &Dataset{Source: root}
	for _, e := range entries {
		if e.IsDir() {
			d.Classes = append(d.Classes, e.Name())
		}
	}
	slices.Sort(d.Classes)
	if len(d.Classes) == 0 {
		return nil, fmt.Errorf("data: %s has no class folders (want <class>/<image>.png|jpg|jpeg) and no IDX files: %w", root, ErrFormat)
	}
	for label, class := range d.Classes {
		dir := filepath.Join(root, class)
		files, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		for _, f := range files {
			switch strings.ToLower(filepath.Ext(f.Name())) {
			case ".png", ".jpg", ".jpeg":
			default:
				continue
			}
			path := filepath.Join(dir, f.Name())
			img, err := ReadImageFile(path)
			if err != nil {
				return nil, err
			}
			d.add(img, label, path)
		}
	}
	if d.Len() == 0 {
		return nil, fmt.Errorf("data: %s: no .png, .jpg or .jpeg images in its class folders: %w", root, ErrFormat)
	}
	return d, nil
}

// MaxImagePixels bounds an image's width × height, read from its header
// before any pixel is: a 40-byte PNG can claim 2³¹ × 2³¹.
const MaxImagePixels = 1 << 26

// ReadImageFile decodes a PNG or JPEG file, refusing one whose header
// claims more than MaxImagePixels before allocating for it.
func ReadImageFile(path string) (Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return Image{}, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Image{}, fmt.Errorf("data: %w", err)
	}
	if st.Size() == 0 {
		return Image{}, fmt.Errorf("data: %s is empty: %w", path, ErrFormat)
	}
	cfg, _, err := image.DecodeConfig(f)
	if err != nil {
		return Image{}, fmt.Errorf("data: %s: %w: %w", path, err, ErrFormat)
	}
	if cfg.Width <= 0 || cfg.Height <= 0 || cfg.Width > MaxImagePixels/cfg.Height {
		return Image{}, fmt.Errorf("data: %s: a %d×%d image; at most %d pixels are read: %w", path, cfg.Width, cfg.Height, MaxImagePixels, ErrFormat)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Image{}, fmt.Errorf("data: %w", err)
	}
	m, _, err := image.Decode(f)
	if err != nil {
		return Image{}, fmt.Errorf("data: %s: %w: %w", path, err, ErrFormat)
	}
	return FromImage(m), nil
}

// FromImage converts a decoded image: grayscale models to one channel,
// everything else to RGB (alpha dropped, as PIL's convert("RGB") does).
func FromImage(m image.Image) Image {
	b := m.Bounds()
	h, w := b.Dy(), b.Dx()
	switch m.ColorModel() {
	case color.GrayModel, color.Gray16Model:
		g := image.NewGray(image.Rect(0, 0, w, h))
		draw.Draw(g, g.Bounds(), m, b.Min, draw.Src)
		return Image{Pix: g.Pix, H: h, W: w, C: 1}
	}
	rgba := image.NewNRGBA(image.Rect(0, 0, w, h))
	draw.Draw(rgba, rgba.Bounds(), m, b.Min, draw.Src)
	pix := make([]uint8, 0, h*w*3)
	for i := 0; i < len(rgba.Pix); i += 4 {
		pix = append(pix, rgba.Pix[i], rgba.Pix[i+1], rgba.Pix[i+2])
	}
	return Image{Pix: pix, H: h, W: w, C: 3}
}

// ToImage converts back to an image.Image (Gray or NRGBA).
func (im Image) ToImage() image.Image {
	r := image.Rect(0, 0, im.W, im.H)
	if im.C == 1 {
		return &image.Gray{Pix: im.Pix, Stride: im.W, Rect: r}
	}
	out := image.NewNRGBA(r)
	for i, j := 0, 0; j < len(im.Pix); i, j = i+4, j+3 {
		out.Pix[i], out.Pix[i+1], out.Pix[i+2], out.Pix[i+3] = im.Pix[j], im.Pix[j+1], im.Pix[j+2], 255
	}
	return out
}
