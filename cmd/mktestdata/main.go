// Command mktestdata makes testdata/ from the real Fashion-MNIST of Debian's
// dataset-fashion-mnist package: a subset as IDX .gz, a small image folder
// (PNG grayscale and JPEG colour) and a small CSV.
//
//	go run ./cmd/mktestdata [-src /usr/share/datasets/fashion-mnist] [-out testdata]
package main

import (
	"bufio"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ringtrain/ringtrain/data"
)

func main() {
	src := flag.String("src", "/usr/share/datasets/fashion-mnist", "folder of the four Fashion-MNIST IDX .gz files")
	out := flag.String("out", "testdata", "where to write")
	nTrain := flag.Int("train", 2000, "training images in the IDX subset")
	nTest := flag.Int("test", 500, "test images in the IDX subset")
	flag.Parse()
	if err := run(*src, *out, *nTrain, *nTest); err != nil {
		fmt.Fprintln(os.Stderr, "mktestdata:", err)
		os.Exit(1)
	}
}

func run(src, out string, nTrain, nTest int) error {
	train, err := data.Open(src, "train", nil)
	if err != nil {
		return err
	}
	test, err := data.Open(src, "test", nil)
	if err != nil {
		return err
	}
	idxDir := filepath.Join(out, "fashion-mnist")
	if err := os.MkdirAll(idxDir, 0o755); err != nil {
		return err
	}
	if err := writeIDX(idxDir, "train", train, nTrain); err != nil {
		return err
	}
	if err := writeIDX(idxDir, "t10k", test, nTest); err != nil {
		return err
	}
	// Image folder: from the test set, so it does not repeat the IDX
	// training subset. Four training and two test images per class.
	folder := filepath.Join(out, "fashion-folder")
	if err := os.RemoveAll(folder); err != nil {
		return err
	}
	perClass := map[int]int{}
	for i := test.Len() - 1; i >= 0; i-- {
		class := test.Label(i)
		split, k := "train", perClass[class]
		if k >= 6 {
			continue
		}
		if k >= 4 {
			split = "test"
		}
		perClass[class]++
		dir := filepath.Join(folder, split, folderName(data.FashionMNISTClasses[class]))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := writeImage(dir, i, test.Image(i), k%2 == 1); err != nil {
			return err
		}
	}
	return writeCSV(filepath.Join(out, "fashion-mnist.csv"), test, 100)
}

func writeIDX(dir, prefix string, d *data.Dataset, n int) error {
	fi, err := os.Create(filepath.Join(dir, prefix+"-images-idx3-ubyte.gz"))
	if err != nil {
		return err
	}
	defer fi.Close()
	fl, err := os.Create(filepath.Join(dir, prefix+"-labels-idx1-ubyte.gz"))
	if err != nil {
		return err
	}
	defer fl.Close()
	if err := data.WriteIDX(fi, fl, firstN(d, n)); err != nil {
		return err
	}
	if err := fi.Close(); err != nil {
		return err
	}
	return fl.Close()
}

// firstN is the first n images of d.
func firstN(d *data.Dataset, n int) *data.Dataset {
	var imgs []data.Image
	var labels []int
	for i := range min(n, d.Len()) {
		imgs = append(imgs, d.Image(i))
		labels = append(labels, d.Label(i))
	}
	return data.NewDataset(d.Source, d.Classes, imgs, labels)
}

// folderName makes a class name safe as a folder name ("T-shirt/top").
func folderName(class string) string {
	return strings.NewReplacer("/", "-", " ", "-").Replace(class)
}

// writeImage writes a grayscale PNG, or a colour (RGB) JPEG, so that both
// decoders and both colour paths are exercised.
func writeImage(dir string, i int, im data.Image, asJPEG bool) error {
	gray := im.ToImage()
	name := filepath.Join(dir, strconv.Itoa(i))
	if !asJPEG {
		f, err := os.Create(name + ".png")
		if err != nil {
			return err
		}
		defer f.Close()
		if err := png.Encode(f, gray); err != nil {
			return err
		}
		return f.Close()
	}
	rgb := image.NewRGBA(gray.Bounds())
	b := gray.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			v := gray.(*image.Gray).GrayAt(x, y).Y
			rgb.Set(x, y, color.RGBA{v, v, v, 255})
		}
	}
	f, err := os.Create(name + ".jpg")
	if err != nil {
		return err
	}
	defer f.Close()
	if err := jpeg.Encode(f, rgb, &jpeg.Options{Quality: 95}); err != nil {
		return err
	}
	return f.Close()
}

func writeCSV(path string, d *data.Dataset, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	w.WriteString("label")
	for i := range 28 * 28 {
		fmt.Fprintf(w, ",pixel%d", i+1)
	}
	w.WriteString("\n")
	for i := range min(n, d.Len()) {
		w.WriteString(strconv.Itoa(d.Label(i)))
		for _, v := range d.Image(i).Pix {
			w.WriteString(",")
			w.WriteString(strconv.Itoa(int(v)))
		}
		w.WriteString("\n")
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}
