package data

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
)

// maxCSVPixels bounds one row, so a hostile file cannot make rows of any size.
const maxCSVPixels = 4096 * 4096 * 3

// ReadCSV reads images in the common label,pixel1,…,pixelN layout: a header
// line, then one image per row with its label first and its pixels (0–255)
// after, row-major. N must be s² (grayscale s×s) or 3s² (colour s×s, each
// pixel's three samples together). name is used in errors.
func ReadCSV(r io.Reader, name string) (*Dataset, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("data: %s: reading header: %w: %w", name, err, ErrFormat)
	}
	npix := len(header) - 1
	side, ch := imageSide(npix)
	if side == 0 {
		return nil, fmt.Errorf("data: %s: header has %d pixel columns; want a square count (s×s grayscale or s×s×3 colour): %w", name, npix, ErrFormat)
	}
	d := &Dataset{Source: name}
	pix := make([]uint8, npix)
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("data: %s: %w: %w", name, err, ErrFormat)
		}
		label, err := strconv.Atoi(rec[0])
		if err != nil || label < 0 || label > math.MaxInt16 {
			return nil, fmt.Errorf("data: %s line %d: label %q is not a class number: %w", name, line, rec[0], ErrFormat)
		}
		for i, f := range rec[1:] {
			v, err := strconv.ParseUint(f, 10, 8)
			if err != nil {
				return nil, fmt.Errorf("data: %s line %d column %d: pixel %q is not a whole number 0–255: %w", name, line, i+2, f, ErrFormat)
			}
			pix[i] = uint8(v)
		}
		d.add(Image{Pix: pix, H: side, W: side, C: ch}, label, "")
	}
	return d, nil
}

// imageSide returns the side and channel count of a square image of n
// samples, or 0 if n is not s² or 3s².
func imageSide(n int) (side, channels int) {
	if n <= 0 || n > maxCSVPixels {
		return 0, 0
	}
	for _, c := range []int{1, 3} {
		if n%c != 0 {
			continue
		}
		s := int(math.Sqrt(float64(n / c)))
		for _, t := range []int{s - 1, s, s + 1} {
			if t > 0 && t*t == n/c {
				return t, c
			}
		}
	}
	return 0, 0
}

// ReadCSVFile reads a CSV file; see ReadCSV.
func ReadCSVFile(path string) (*Dataset, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	return ReadCSV(f, path)
}
