package data

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// IDX magic numbers: two zero bytes, the element type (0x08 = unsigned
// byte) and the number of dimensions.
const (
	idxImagesMagic = 0x00000803
	idxLabelsMagic = 0x00000801
)

// maxIDXBytes bounds what an IDX header may announce, so a hostile header
// cannot make the reader allocate more than any real dataset needs.
const maxIDXBytes = 1 << 31

// ReadIDX reads an IDX images stream (magic 0x803: count, rows, cols) and
// an IDX labels stream (magic 0x801: count), each gzipped or raw.
// imagesName and labelsName are used in errors.
func ReadIDX(images io.Reader, imagesName string, labels io.Reader, labelsName string) (*Dataset, error) {
	img, err := decompressed(images)
	if err != nil {
		return nil, fmt.Errorf("data: %s: %w", imagesName, err)
	}
	dims, pix, err := readIDX(img, idxImagesMagic)
	if err != nil {
		return nil, fmt.Errorf("data: %s: %w", imagesName, err)
	}
	lab, err := decompressed(labels)
	if err != nil {
		return nil, fmt.Errorf("data: %s: %w", labelsName, err)
	}
	ldims, lbytes, err := readIDX(lab, idxLabelsMagic)
	if err != nil {
		return nil, fmt.Errorf("data: %s: %w", labelsName, err)
	}
	if dims[0] != ldims[0] {
		return nil, fmt.Errorf("data: %s has %d images but %s has %d labels: %w", imagesName, dims[0], labelsName, ldims[0], ErrFormat)
	}
	n, h, w := dims[0], dims[1], dims[2]
	d := &Dataset{
		Source:  imagesName,
		Classes: digitClasses,
		pix:     pix,
		index:   make([]imageRef, n),
		labels:  make([]int32, n),
	}
	for i := range n {
		d.index[i] = imageRef{off: i * h * w, h: int32(h), w: int32(w), c: 1}
		d.labels[i] = int32(lbytes[i])
	}
	return d, nil
}

// readIDX reads one IDX stream of unsigned bytes whose magic must be want,
// returning its dimensions and its body. The body must be exactly as long
// as the dimensions say.
func readIDX(r io.Reader, want uint32) ([]int, []byte, error) {
	var magic uint32
	if err := binary.Read(r, binary.BigEndian, &magic); err != nil {
		return nil, nil, fmt.Errorf("reading IDX magic: %w: %w", err, ErrFormat)
	}
	if magic != want {
		return nil, nil, fmt.Errorf("IDX magic %#08x, want %#08x: %w", magic, want, ErrFormat)
	}
	dims := make([]int, want&0xff)
	total := 1
	for i := range dims {
		var d uint32
		if err := binary.Read(r, binary.BigEndian, &d); err != nil {
			return nil, nil, fmt.Errorf("reading IDX dimension %d: %w: %w", i, err, ErrFormat)
		}
		dims[i] = int(d)
		total *= max(int(d), 1)
		if d == 0 && i > 0 || total > maxIDXBytes {
			return nil, nil, fmt.Errorf("IDX dimensions %v: %w", dims[:i+1], ErrFormat)
		}
	}
	if dims[0] == 0 {
		total = 0
	}
	// Read in pieces rather than allocate what the header announced: a
	// short file then costs only what it holds.
	var body bytes.Buffer
	if n, err := io.CopyN(&body, r, int64(total)); err != nil {
		return nil, nil, fmt.Errorf("body has %d bytes, header announces %d (dimensions %v): %w: %w", n, total, dims, readFail(err), ErrFormat)
	}
	if n, err := r.Read(make([]byte, 1)); n > 0 || err != nil && err != io.EOF {
		if err != nil {
			return nil, nil, fmt.Errorf("after the body: %w: %w", readFail(err), ErrFormat)
		}
		return nil, nil, fmt.Errorf("body is longer than dimensions %v say: %w", dims, ErrFormat)
	}
	return dims, body.Bytes(), nil
}

func readFail(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// decompressed returns r itself, or a gzip reader on it if r starts with
// the gzip magic.
func decompressed(r io.Reader) (io.Reader, error) {
	br := bufio.NewReader(r)
	head, _ := br.Peek(2)
	if len(head) == 2 && head[0] == 0x1f && head[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w: %w", err, ErrFormat)
		}
		return gzipReader{zr}, nil
	}
	return br, nil
}

// gzipReader marks errors from inside a gzip stream as format errors.
type gzipReader struct{ zr *gzip.Reader }

func (g gzipReader) Read(p []byte) (int, error) {
	n, err := g.zr.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("gzip: %w", err)
	}
	return n, err
}

// ReadIDXFiles reads an images file and a labels file (gzipped or raw).
func ReadIDXFiles(imagesPath, labelsPath string) (*Dataset, error) {
	fi, err := os.Open(imagesPath)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer fi.Close()
	fl, err := os.Open(labelsPath)
	if err != nil {
		return nil, fmt.Errorf("data: labels for %s: %w", imagesPath, err)
	}
	defer fl.Close()
	return ReadIDX(fi, imagesPath, fl, labelsPath)
}

// idxLabelsPath derives the labels file from the images file by the
// standard naming: train-images-idx3-ubyte → train-labels-idx1-ubyte.
func idxLabelsPath(images string) string {
	dir, base := filepath.Split(images)
	return filepath.Join(dir, strings.Replace(base, "images-idx3", "labels-idx1", 1))
}

// findIDX looks in dir for the split's standard images file.
func findIDX(dir, split string) (string, bool) {
	prefix := "train"
	if split == "test" {
		prefix = "t10k"
	}
	for _, name := range []string{prefix + "-images-idx3-ubyte.gz", prefix + "-images-idx3-ubyte"} {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			return p, true
		}
	}
	return "", false
}

// WriteIDX writes images (all H×W, one channel) and their labels as two
// gzipped IDX streams, the format ReadIDX reads.
func WriteIDX(images, labels io.Writer, d *Dataset) error {
	n := d.Len()
	h, w := 0, 0
	if n > 0 {
		im := d.Image(0)
		h, w = im.H, im.W
	}
	zi := gzip.NewWriter(images)
	hdr := []uint32{idxImagesMagic, uint32(n), uint32(h), uint32(w)}
	if err := binary.Write(zi, binary.BigEndian, hdr); err != nil {
		return err
	}
	for i := range n {
		im := d.Image(i)
		if im.H != h || im.W != w || im.C != 1 {
			return fmt.Errorf("data: WriteIDX: image %d is %d×%d×%d, want %d×%d×1", i, im.H, im.W, im.C, h, w)
		}
		if _, err := zi.Write(im.Pix); err != nil {
			return err
		}
	}
	if err := zi.Close(); err != nil {
		return err
	}
	zl := gzip.NewWriter(labels)
	if err := binary.Write(zl, binary.BigEndian, []uint32{idxLabelsMagic, uint32(n)}); err != nil {
		return err
	}
	for i := range n {
		if _, err := zl.Write([]byte{byte(d.Label(i))}); err != nil {
			return err
		}
	}
	return zl.Close()
}
