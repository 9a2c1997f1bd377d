package data

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Errors callers branch on.
var (
	// ErrFormat means a file is not what its name or place says: a wrong
	// magic number, a truncated body, a corrupt gzip stream, a bad row.
	ErrFormat = errors.New("data: bad format")
	// ErrConfig means the data config is wrong: an unknown field or
	// transform, arguments of the wrong count or type.
	ErrConfig = errors.New("data: bad config")
)

// FashionMNISTClasses are Fashion-MNIST's labels 0–9, in order.
var FashionMNISTClasses = []string{
	"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
	"Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
}

// digitClasses are MNIST's labels.
var digitClasses = []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}

// Image is one image as 8-bit samples in height × width × channels order,
// as decoders and PIL hold them. Pix may alias a Dataset's storage.
type Image struct {
	Pix     []uint8
	H, W, C int
}

// Dataset is a set of labelled images held in memory as uint8, one
// contiguous block, so 60,000 Fashion-MNIST images take 47 MB.
type Dataset struct {
	// Source describes where the images came from, for messages.
	Source string
	// Classes names the labels: label i is Classes[i].
	Classes []string

	pix    []uint8
	index  []imageRef
	labels []int32
	names  []string // per image file, for folder datasets; else nil
}

type imageRef struct {
	off     int
	h, w, c int32
}

// Len returns the number of images.
func (d *Dataset) Len() int { return len(d.index) }

// Image returns image i, aliasing the dataset's storage.
func (d *Dataset) Image(i int) Image {
	r := d.index[i]
	n := int(r.h) * int(r.w) * int(r.c)
	return Image{Pix: d.pix[r.off : r.off+n : r.off+n], H: int(r.h), W: int(r.w), C: int(r.c)}
}

// Label returns the label of image i.
func (d *Dataset) Label(i int) int { return int(d.labels[i]) }

// Name says where image i came from: its file, or the source and index.
func (d *Dataset) Name(i int) string {
	if d.names != nil {
		return d.names[i]
	}
	return fmt.Sprintf("%s[%d]", d.Source, i)
}

// add appends one image; the builder functions use it.
func (d *Dataset) add(img Image, label int, name string) {
	d.index = append(d.index, imageRef{off: len(d.pix), h: int32(img.H), w: int32(img.W), c: int32(img.C)})
	d.pix = append(d.pix, img.Pix...)
	d.labels = append(d.labels, int32(label))
	if name != "" {
		d.names = append(d.names, name)
	}
}

// checkLabels makes sure every label names a class.
func (d *Dataset) checkLabels() error {
	for i, l := range d.labels {
		if l < 0 || int(l) >= len(d.Classes) {
			return fmt.Errorf("%s: label %d of image %d is outside [0, %d): %w", d.Source, l, i, len(d.Classes), ErrFormat)
		}
	}
	return nil
}

// Counts returns how many images each class has; labels outside the
// class names (a dataset not yet checked) are not counted.
func (d *Dataset) Counts() []int {
	c := make([]int, len(d.Classes))
	for _, l := range d.labels {
		if l >= 0 && int(l) < len(c) {
			c[l]++
		}
	}
	return c
}

// Describe says what a user wants to see on load: where from, how many
// images of what size, and how many per class.
func (d *Dataset) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d images", d.Source, d.Len())
	type shape struct{ h, w, c int32 }
	var shapes []shape
	count := map[shape]int{}
	for _, r := range d.index {
		k := shape{r.h, r.w, r.c}
		if count[k] == 0 {
			shapes = append(shapes, k)
		}
		count[k]++
	}
	for i, k := range shapes {
		sep := ", "
		if i == 0 {
			sep = " of "
		}
		if i == 3 {
			fmt.Fprintf(&b, ", %d more sizes", len(shapes)-3)
			break
		}
		fmt.Fprintf(&b, "%s%d×%d×%d", sep, k.h, k.w, k.c)
		if len(shapes) > 1 {
			fmt.Fprintf(&b, " (%d)", count[k])
		}
	}
	fmt.Fprintf(&b, ", %d classes:", len(d.Classes))
	named := 0
	for i, n := range d.Counts() {
		fmt.Fprintf(&b, " %s=%d", d.Classes[i], n)
		named += n
	}
	if rest := d.Len() - named; rest > 0 {
		fmt.Fprintf(&b, "; %d images have labels outside those %d names", rest, len(d.Classes))
	}
	return b.String()
}

// Open loads the dataset at path, choosing the reader by what is there:
//   - a folder holding MNIST-style IDX files (gzipped or raw), or the path of
//     an images file itself; split ("train" or "test") picks train-* or t10k-*
//     from a folder;
//   - a .csv file in label,pixel1,…,pixelN layout with a header;
//   - a folder of class folders of PNG and JPEG images (ImageFolder).
//
// classes, if not empty, names the labels; otherwise IDX data takes
// Fashion-MNIST's names when its path mentions fashion and digits when not,
// CSV takes "0".."max label", and folders take the folder names.
func Open(path, split string, classes []string) (*Dataset, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	var d *Dataset
	isIDX := false
	switch {
	case !st.IsDir() && strings.EqualFold(filepath.Ext(path), ".csv"):
		d, err = ReadCSVFile(path)
	case !st.IsDir():
		isIDX = true
		d, err = ReadIDXFiles(path, idxLabelsPath(path))
	default:
		if images, ok := findIDX(path, split); ok {
			isIDX = true
			d, err = ReadIDXFiles(images, idxLabelsPath(images))
		} else {
			d, err = ReadFolder(path)
		}
	}
	if err != nil {
		return nil, err
	}
	switch {
	case len(classes) > 0:
		d.Classes = classes
	case isIDX && strings.Contains(strings.ToLower(path), "fashion"):
		d.Classes = FashionMNISTClasses
	case d.Classes == nil:
		d.Classes = defaultClasses(d.labels)
	}
	if err := d.checkLabels(); err != nil {
		return nil, err
	}
	return d, nil
}

// defaultClasses names labels "0".."max" when nothing else names them.
func defaultClasses(labels []int32) []string {
	hi := int32(9)
	for _, l := range labels {
		hi = max(hi, l)
	}
	if hi < 10 {
		return digitClasses
	}
	c := make([]string, hi+1)
	for i := range c {
		c[i] = fmt.Sprint(i)
	}
	return c
}

// NewDataset builds a dataset from images and their labels, copying the
// pixels into one block.
func NewDataset(source string, classes []string, images []Image, labels []int) *Dataset {
	d := &Dataset{Source: source, Classes: classes}
	for i, im := range images {
		d.add(im, labels[i], "")
	}
	return d
}
