package data

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	testIDX    = "../testdata/fashion-mnist"
	testCSV    = "../testdata/fashion-mnist.csv"
	testFolder = "../testdata/fashion-folder"
)

func TestOpenIDXFolder(t *testing.T) {
	tests := []struct {
		split string
		want  int
	}{{"train", 2000}, {"test", 500}}
	for _, tt := range tests {
		d, err := Open(testIDX, tt.split, nil)
		if err != nil {
			t.Fatalf("Open(%s): %v", tt.split, err)
		}
		if d.Len() != tt.want {
			t.Errorf("Open(%s) has %d images; want %d", tt.split, d.Len(), tt.want)
		}
		if im := d.Image(0); im.H != 28 || im.W != 28 || im.C != 1 {
			t.Errorf("Open(%s) image 0 is %d×%d×%d; want 28×28×1", tt.split, im.H, im.W, im.C)
		}
		if d.Classes[0] != "T-shirt/top" {
			t.Errorf("Open(%s) classes %v; want Fashion-MNIST's names", tt.split, d.Classes)
		}
		if !strings.Contains(d.Describe(), "Ankle boot=") {
			t.Errorf("Describe() = %q; want per-class counts", d.Describe())
		}
	}
}

// gunzip returns the raw bytes of a gzipped test file.
func gunzip(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

func TestReadIDXRawEqualsGzip(t *testing.T) {
	images := gunzip(t, filepath.Join(testIDX, "t10k-images-idx3-ubyte.gz"))
	labels := gunzip(t, filepath.Join(testIDX, "t10k-labels-idx1-ubyte.gz"))
	raw, err := ReadIDX(bytes.NewReader(images), "images", bytes.NewReader(labels), "labels")
	if err != nil {
		t.Fatal(err)
	}
	gz, err := Open(testIDX, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw.pix, gz.pix) || raw.Len() != gz.Len() {
		t.Fatal("raw and gzipped IDX differ")
	}
}

func TestReadIDXBadInput(t *testing.T) {
	images := gunzip(t, filepath.Join(testIDX, "t10k-images-idx3-ubyte.gz"))
	labels := gunzip(t, filepath.Join(testIDX, "t10k-labels-idx1-ubyte.gz"))
	mod := func(b []byte, f func([]byte) []byte) []byte { return f(append([]byte(nil), b...)) }
	corrupt := mod(gzipped(images), func(b []byte) []byte { b[len(b)/2] ^= 0xff; return b })
	tests := []struct {
		name           string
		images, labels []byte
		words          string
	}{
		{"wrong magic", mod(images, func(b []byte) []byte { b[3] = 0x02; return b }), labels, "magic"},
		{"labels as images", labels, labels, "magic"},
		{"truncated body", images[:len(images)-100], labels, "header announces"},
		{"trailing bytes", append(append([]byte(nil), images...), 1, 2, 3), labels, "longer"},
		{"truncated gzip", gzipped(images)[:5000], labels, "unexpected EOF"},
		{"corrupt gzip", corrupt, labels, "gzip"},
		{"counts differ", images, mod(labels, func(b []byte) []byte {
			binary.BigEndian.PutUint32(b[4:], 499)
			return b[:len(b)-1]
		}), "500 images but"},
		{"huge header", mod(images, func(b []byte) []byte { binary.BigEndian.PutUint32(b[4:], 1<<30); return b[:16] }), labels, "dimensions"},
		{"empty", nil, labels, "magic"},
	}
	for _, tt := range tests {
		_, err := ReadIDX(bytes.NewReader(tt.images), "img.idx", bytes.NewReader(tt.labels), "lab.idx")
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tt.words) || !strings.Contains(err.Error(), ".idx") {
			t.Errorf("%s: ReadIDX = %v; want ErrFormat naming the file and %q", tt.name, err, tt.words)
		}
	}
}

func TestLabelOutOfRange(t *testing.T) {
	dir := t.TempDir()
	images := gunzip(t, filepath.Join(testIDX, "t10k-images-idx3-ubyte.gz"))
	labels := gunzip(t, filepath.Join(testIDX, "t10k-labels-idx1-ubyte.gz"))
	labels[8+17] = 10 // image 17 gets label 10 of 0–9
	os.WriteFile(filepath.Join(dir, "t10k-images-idx3-ubyte"), images, 0o644)
	os.WriteFile(filepath.Join(dir, "t10k-labels-idx1-ubyte"), labels, 0o644)
	_, err := Open(dir, "test", nil)
	if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "label 10 of image 17") {
		t.Errorf("Open with label 10 = %v; want ErrFormat naming image 17", err)
	}
}

// TestCSVMatchesIDX: the CSV in testdata holds the first 100 test images,
// so the two readers must agree pixel for pixel.
func TestCSVMatchesIDX(t *testing.T) {
	c, err := Open(testCSV, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	x, err := Open(testIDX, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Len() != 100 {
		t.Fatalf("CSV has %d images; want 100", c.Len())
	}
	for i := range c.Len() {
		if !bytes.Equal(c.Image(i).Pix, x.Image(i).Pix) || c.Label(i) != x.Label(i) {
			t.Fatalf("CSV image %d differs from IDX image %d", i, i)
		}
	}
}

func TestReadCSVBadInput(t *testing.T) {
	header := "label,p1,p2,p3,p4\n"
	tests := []struct{ name, in, words string }{
		{"pixel not a number", header + "1,0,x,0,0\n", `line 2 column 3: pixel "x"`},
		{"pixel over 255", header + "1,0,0,256,0\n", `pixel "256"`},
		{"negative label", header + "-1,0,0,0,0\n", `label "-1"`},
		{"short row", header + "1,0,0,0\n", "wrong number of fields"},
		{"not square", "label,p1,p2,p3,p4,p5\n1,0,0,0,0,0\n", "square"},
		{"no header", "", "header"},
	}
	for _, tt := range tests {
		_, err := ReadCSV(strings.NewReader(tt.in), "x.csv")
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tt.words) || !strings.Contains(err.Error(), "x.csv") {
			t.Errorf("%s: ReadCSV = %v; want ErrFormat naming x.csv and %q", tt.name, err, tt.words)
		}
	}
}

func TestReadFolder(t *testing.T) {
	d, err := Open(filepath.Join(testFolder, "train"), "train", nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Len() != 40 || len(d.Classes) != 10 || d.Classes[0] != "Ankle-boot" {
		t.Fatalf("folder: %d images, classes %v; want 40 images in 10 sorted classes", d.Len(), d.Classes)
	}
	var gray, colour int
	for i := range d.Len() {
		switch d.Image(i).C {
		case 1:
			gray++
		case 3:
			colour++
		}
		if !strings.HasPrefix(d.Name(i), filepath.Join(testFolder, "train", d.Classes[d.Label(i)])) {
			t.Errorf("image %d (%s) has label %d (%s)", i, d.Name(i), d.Label(i), d.Classes[d.Label(i)])
		}
	}
	if gray != 20 || colour != 20 {
		t.Errorf("folder: %d grayscale and %d colour images; want 20 of each", gray, colour)
	}
}

func writePNG(t *testing.T, path string, w, h int) {
	t.Helper()
	os.MkdirAll(filepath.Dir(path), 0o755)
	var b bytes.Buffer
	m := image.NewGray(image.Rect(0, 0, w, h))
	m.Set(0, 0, color.Gray{200})
	png.Encode(&b, m)
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestFolderBadInput(t *testing.T) {
	toTensor := []TransformSpec{{Name: "ToTensor"}}
	resize := []TransformSpec{{Name: "Resize", Args: raw(`[[28, 28]]`)}, {Name: "ToTensor"}}
	tests := []struct {
		name   string
		setup  func(t *testing.T, root string)
		specs  []TransformSpec
		words  string
		wantOK bool
	}{
		{"zero-size image", func(t *testing.T, root string) {
			os.MkdirAll(filepath.Join(root, "a"), 0o755)
			os.WriteFile(filepath.Join(root, "a", "empty.png"), nil, 0o644)
		}, toTensor, "empty.png is empty", false},
		{"corrupt image", func(t *testing.T, root string) {
			writePNG(t, filepath.Join(root, "a", "ok.png"), 28, 28)
			b, _ := os.ReadFile(filepath.Join(root, "a", "ok.png"))
			os.WriteFile(filepath.Join(root, "a", "bad.png"), b[:len(b)/2], 0o644)
		}, toTensor, "bad.png", false},
		{"odd size without Resize", func(t *testing.T, root string) {
			writePNG(t, filepath.Join(root, "a", "1.png"), 28, 28)
			writePNG(t, filepath.Join(root, "b", "2.png"), 30, 28)
		}, toTensor, "2.png is 28×30×1", false},
		{"odd size with Resize", func(t *testing.T, root string) {
			writePNG(t, filepath.Join(root, "a", "1.png"), 28, 28)
			writePNG(t, filepath.Join(root, "b", "2.png"), 30, 28)
		}, resize, "", true},
		{"no class folders", func(t *testing.T, root string) {}, toTensor, "no class folders", false},
	}
	for _, tt := range tests {
		root := t.TempDir()
		tt.setup(t, root)
		p, err := NewPipeline(tt.specs)
		if err != nil {
			t.Fatal(err)
		}
		d, err := Open(root, "train", nil)
		if err == nil {
			_, err = NewSplit(d, p)
		}
		if tt.wantOK {
			if err != nil {
				t.Errorf("%s: %v; want no error", tt.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.words) {
			t.Errorf("%s: %v; want an error naming %q", tt.name, err, tt.words)
		}
	}
}

func TestConfig(t *testing.T) {
	c, err := LoadConfig("../testdata/data-config.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Load("train")
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 2000 || s.C != 1 || s.H != 28 || s.W != 28 {
		t.Errorf("train split: %d samples of %d×%d×%d; want 2000 of 1×28×28", s.Len(), s.C, s.H, s.W)
	}
	if !strings.Contains(s.Describe(), "Normalize") {
		t.Errorf("Describe() = %q; want the transforms", s.Describe())
	}
	folder, err := LoadConfig("../testdata/data-config-folder.json")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := folder.Load("test"); err != nil {
		t.Errorf("folder config, test split: %v", err)
	}

	bad := []struct{ name, json, words string }{
		{"unknown field", `{"transforms": [{"name": "ToTensor", "args": []}], "dataset_path": {"train": "x"}, "epochs": 3}`, `unknown field "epochs"`},
		{"unknown nested field", `{"transforms": [{"name": "ToTensor", "arg": []}], "dataset_path": {"train": "x"}}`, `unknown field "arg"`},
		{"no train path", `{"transforms": [{"name": "ToTensor", "args": []}], "dataset_path": {}}`, "dataset_path.train"},
		{"not JSON", `{"transforms": [`, "config"},
	}
	for _, tt := range bad {
		_, err := ParseConfig(strings.NewReader(tt.json), "")
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.words) {
			t.Errorf("%s: ParseConfig = %v; want ErrConfig naming %q", tt.name, err, tt.words)
		}
	}
	if _, err := (&Config{DatasetPath: Paths{Train: "../testdata/nowhere"}, Transforms: []TransformSpec{{Name: "ToTensor"}}}).Load("train"); err == nil || !strings.Contains(err.Error(), "nowhere") {
		t.Errorf("Load of a missing path = %v; want an error naming it", err)
	}
}

// TestDescribeBeforeLabelsAreChecked: a dataset straight from a reader —
// a CSV's, which has no class names yet, or an IDX file whose labels run
// past the ten names — describes itself instead of panicking.
func TestDescribeBeforeLabelsAreChecked(t *testing.T) {
	d, err := ReadCSV(strings.NewReader("label,p1,p2,p3,p4\n3,0,0,0,0\n12,1,2,3,4\n"), "x.csv")
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Describe(); !strings.Contains(got, "2 images have labels outside") {
		t.Errorf("CSV Describe() = %q; want it to count the unnamed labels", got)
	}
	d.Classes = digitClasses
	if got := d.Describe(); !strings.Contains(got, "3=1") || !strings.Contains(got, "1 images have labels outside those 10") {
		t.Errorf("IDX-style Describe() = %q; want 3=1 and one label outside the ten names", got)
	}
}

// TestHugeImageHeaderIsRefused: a PNG whose header claims 100000×100000
// pixels is refused from the header, before anything is allocated for it.
func TestHugeImageHeaderIsRefused(t *testing.T) {
	var b bytes.Buffer
	png.Encode(&b, image.NewGray(image.Rect(0, 0, 1, 1)))
	raw := b.Bytes()
	// IHDR's width and height follow the 8-byte signature, the chunk's
	// length and type; its CRC (over type and data) is made to match.
	binary.BigEndian.PutUint32(raw[16:], 100000)
	binary.BigEndian.PutUint32(raw[20:], 100000)
	binary.BigEndian.PutUint32(raw[29:], crc32.ChecksumIEEE(raw[12:29]))
	path := filepath.Join(t.TempDir(), "huge.png")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadImageFile(path); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "100000×100000") {
		t.Errorf("ReadImageFile of a 100000² header = %v; want ErrFormat naming the size", err)
	}
}
