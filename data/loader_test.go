package data

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSamplerShares(t *testing.T) {
	for _, n := range []int{0, 1, 9, 10, 11, 2000} {
		for _, world := range []int{1, 2, 3, 4, 7} {
			for _, drop := range []bool{false, true} {
				counts := make([]int, n)
				var shares [][]int
				for rank := range world {
					s := Sampler{N: n, World: world, Rank: rank, Seed: 42, Shuffle: true, DropLast: drop}
					idx, err := s.Indices(3)
					if err != nil {
						t.Fatal(err)
					}
					if len(idx) != s.NumSamples() {
						t.Fatalf("N=%d world=%d drop=%v rank %d: %d indices; want NumSamples() = %d", n, world, drop, rank, len(idx), s.NumSamples())
					}
					for _, i := range idx {
						counts[i]++
					}
					shares = append(shares, idx)
				}
				for r := 1; r < world; r++ {
					if len(shares[r]) != len(shares[0]) {
						t.Fatalf("N=%d world=%d drop=%v: rank %d has %d samples, rank 0 has %d", n, world, drop, r, len(shares[r]), len(shares[0]))
					}
				}
				seen := 0
				for i, c := range counts {
					if drop && c > 1 {
						t.Fatalf("N=%d world=%d drop: sample %d in %d shares; want disjoint shares", n, world, i, c)
					}
					if !drop && c == 0 {
						t.Fatalf("N=%d world=%d pad: sample %d in no share; want every sample", n, world, i)
					}
					if c > 0 {
						seen++
					}
				}
				if drop && seen != n/world*world {
					t.Fatalf("N=%d world=%d drop: union of %d samples; want %d", n, world, seen, n/world*world)
				}
			}
		}
	}
}

// TestSamplerExact: exact shares hold every sample once, differ in size by
// at most one, and match NumSamples — also with more ranks than samples.
func TestSamplerExact(t *testing.T) {
	for _, n := range []int{0, 1, 9, 10, 11, 500} {
		for _, world := range []int{1, 2, 3, 4, 7, 16} {
			counts := make([]int, n)
			small, large := n, 0
			for rank := range world {
				s := Sampler{N: n, World: world, Rank: rank, Seed: 1, Exact: true}
				idx, err := s.Indices(0)
				if err != nil {
					t.Fatal(err)
				}
				if len(idx) != s.NumSamples() {
					t.Fatalf("N=%d world=%d rank %d: %d indices; want NumSamples() = %d", n, world, rank, len(idx), s.NumSamples())
				}
				small, large = min(small, len(idx)), max(large, len(idx))
				for _, i := range idx {
					counts[i]++
				}
			}
			for i, c := range counts {
				if c != 1 {
					t.Fatalf("N=%d world=%d: sample %d in %d shares; want exactly 1", n, world, i, c)
				}
			}
			if large-small > 1 {
				t.Fatalf("N=%d world=%d: shares of %d to %d samples; want sizes within one", n, world, small, large)
			}
		}
	}
}

func TestSamplerPermutation(t *testing.T) {
	s := Sampler{N: 100, World: 1, Seed: 7, Shuffle: true}
	e0, _ := s.Indices(0)
	again, _ := s.Indices(0)
	e1, _ := s.Indices(1)
	if !slices.Equal(e0, again) {
		t.Error("the same epoch gave two permutations")
	}
	if slices.Equal(e0, e1) {
		t.Error("epochs 0 and 1 gave the same permutation")
	}
	if _, err := (Sampler{N: 10, World: 2, Rank: 2}).Indices(0); err == nil {
		t.Error("rank 2 of 2: nil error; want one")
	}
}

func testLoader(t *testing.T, world, rank int, specs ...TransformSpec) *Loader {
	t.Helper()
	d, err := Open(testIDX, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSplit(d, mustPipeline(t, specs...))
	if err != nil {
		t.Fatal(err)
	}
	return &Loader{Split: s, Sampler: Sampler{N: d.Len(), World: world, Rank: rank, Seed: 5, Shuffle: true}, BatchSize: 64, Seed: 9}
}

func TestLoaderBatches(t *testing.T) {
	l := testLoader(t, 3, 1, TransformSpec{Name: "ToTensor"})
	e, err := l.Epoch(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	want, _ := l.Sampler.Indices(2)
	var got []int
	batches := 0
	for {
		b, err := e.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		batches++
		if b.C != 1 || b.H != 28 || b.W != 28 || len(b.X) != b.N*784 || len(b.Y) != b.N {
			t.Fatalf("batch %d: N=%d %d×%d×%d, %d floats, %d labels", batches, b.N, b.C, b.H, b.W, len(b.X), len(b.Y))
		}
		for k, i := range b.Index {
			if b.Y[k] != l.Split.Label(i) {
				t.Fatalf("batch %d sample %d: label %d; dataset says %d", batches, k, b.Y[k], l.Split.Label(i))
			}
			px := l.Split.Image(i).Pix
			for j := range 784 {
				if b.X[k*784+j] != float32(px[j])/255 {
					t.Fatalf("batch %d sample %d pixel %d = %v; want %v", batches, k, j, b.X[k*784+j], float32(px[j])/255)
				}
			}
		}
		got = append(got, b.Index...)
	}
	if batches != l.Batches() || !slices.Equal(got, want) {
		t.Errorf("epoch gave %d batches over %d samples; want %d batches over the sampler's %d", batches, len(got), l.Batches(), len(want))
	}
}

// TestLoaderRandomIndependentOfWorld: a sample's random transforms depend on
// (seed, epoch, index) only, not on which rank of how many draws it.
func TestLoaderRandomIndependentOfWorld(t *testing.T) {
	specs := []TransformSpec{{Name: "RandomCrop", Args: raw(`[28, 4]`)}, {Name: "RandomHorizontalFlip"}, {Name: "ToTensor"}}
	tensors := func(world, rank int) map[int][]float32 {
		l := testLoader(t, world, rank, specs...)
		e, err := l.Epoch(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		out := map[int][]float32{}
		err = e.Each(func(b *Batch) error {
			for k, i := range b.Index {
				out[i] = slices.Clone(b.X[k*784 : (k+1)*784])
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	one := tensors(1, 0)
	for _, rank := range []int{0, 1} {
		for i, x := range tensors(2, rank) {
			if !slices.Equal(x, one[i]) {
				t.Fatalf("sample %d: rank %d of 2 transformed it differently from rank 0 of 1", i, rank)
			}
		}
	}
}

// TestLoaderCloseMidEpoch: closing before the end stops the background
// work (goleak in TestMain checks nothing is left).
func TestLoaderCloseMidEpoch(t *testing.T) {
	l := testLoader(t, 1, 0, TransformSpec{Name: "ToTensor"})
	l.BatchSize = 8
	e, err := l.Epoch(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	stop := errors.New("stop")
	seen := 0
	err = e.Each(func(*Batch) error {
		seen++
		return stop
	})
	if !errors.Is(err, stop) || seen != 1 {
		t.Errorf("Each with a failing callback = %v after %d batches; want its error after 1", err, seen)
	}
	e.Close()
}

func FuzzReadIDX(f *testing.F) {
	images := []byte{0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 1, 1, 2}
	labels := []byte{0, 0, 8, 1, 0, 0, 0, 2, 3, 4}
	f.Add(images, labels)
	f.Add(gzipped(images), labels)
	f.Add(images[:10], labels)
	f.Fuzz(func(t *testing.T, images, labels []byte) {
		d, err := ReadIDX(bytes.NewReader(images), "images", bytes.NewReader(labels), "labels")
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("ReadIDX error %v does not wrap ErrFormat", err)
			}
			return
		}
		for i := range d.Len() {
			im := d.Image(i)
			if len(im.Pix) != im.H*im.W*im.C {
				t.Fatalf("image %d has %d bytes for %d×%d×%d", i, len(im.Pix), im.H, im.W, im.C)
			}
		}
	})
}

func FuzzReadCSV(f *testing.F) {
	f.Add("label,p1,p2,p3,p4\n1,0,255,3,4\n0,1,2,3,4\n")
	f.Add("label,p1\n1,300\n")
	f.Add("label,a,b,c\n\"1\",\"2\",3,4\n")
	f.Fuzz(func(t *testing.T, in string) {
		d, err := ReadCSV(strings.NewReader(in), "fuzz.csv")
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("ReadCSV error %v does not wrap ErrFormat", err)
			}
			return
		}
		for i := range d.Len() {
			if im := d.Image(i); len(im.Pix) != im.H*im.W*im.C || d.Label(i) < 0 {
				t.Fatalf("image %d: %d bytes for %d×%d×%d, label %d", i, len(im.Pix), im.H, im.W, im.C, d.Label(i))
			}
		}
	})
}

// BenchmarkLoader measures load → ToTensor → Normalize → batches of 64 on
// the real Fashion-MNIST training set where Debian's package is installed,
// else on testdata/. Run with -cpu 1 for the one-core figure.
func BenchmarkLoader(b *testing.B) {
	path := "/usr/share/datasets/fashion-mnist"
	d, err := Open(path, "train", nil)
	if err != nil {
		b.Logf("%v; using testdata", err)
		if d, err = Open(testIDX, "train", nil); err != nil {
			b.Fatal(err)
		}
	}
	p, err := NewPipeline([]TransformSpec{{Name: "ToTensor"}, {Name: "Normalize", Args: raw(`[[0.5], [0.5]]`)}})
	if err != nil {
		b.Fatal(err)
	}
	s, err := NewSplit(d, p)
	if err != nil {
		b.Fatal(err)
	}
	l := &Loader{Split: s, Sampler: Sampler{N: d.Len(), World: 1, Shuffle: true}, BatchSize: 64}
	samples := 0
	var sum float64
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		e, err := l.Epoch(context.Background(), i)
		if err != nil {
			b.Fatal(err)
		}
		err = e.Each(func(batch *Batch) error {
			samples += batch.N
			sum += float64(batch.X[0])
			return nil
		})
		e.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(samples)/b.Elapsed().Seconds(), "samples/s")
	if math.IsNaN(sum) {
		b.Fatal("NaN in batches")
	}
}

// TestSamplerSkip: a sampler that skips the positions k steps of W ranks ×
// B samples used gives each rank the rest of the batches it would have had
// — also in a padded last batch — and an out-of-range skip is an error.
func TestSamplerSkip(t *testing.T) {
	const n, world, batch = 103, 3, 4 // 103 is no multiple of 3: padding
	for _, steps := range []int{0, 1, 5, 8} {
		for rank := range world {
			full := Sampler{N: n, World: world, Rank: rank, Seed: 9, Shuffle: true}
			all, err := full.Indices(2)
			if err != nil {
				t.Fatal(err)
			}
			skip := full
			skip.Skip = steps * world * batch
			rest, err := skip.Indices(2)
			if err != nil {
				t.Fatal(err)
			}
			if want := all[steps*batch:]; !slices.Equal(rest, want) || skip.NumSamples() != len(want) {
				t.Errorf("skip %d steps, rank %d: %v (NumSamples %d); want %v", steps, rank, rest, skip.NumSamples(), want)
			}
		}
	}
	for _, bad := range []int{-1, n + 1} {
		if _, err := (Sampler{N: n, World: 1, Skip: bad}).Indices(0); err == nil {
			t.Errorf("skip %d of %d: no error", bad, n)
		}
	}
}

// TestCancelledEpochIsNotAnEnd: an epoch whose context ends before its
// last batch says so, rather than ending as if it were complete.
func TestCancelledEpochIsNotAnEnd(t *testing.T) {
	l := testLoader(t, 1, 0, TransformSpec{Name: "ToTensor"})
	l.BatchSize, l.Prefetch = 8, 1
	ctx, cancel := context.WithCancel(context.Background())
	e, err := l.Epoch(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	n := 0
	err = e.Each(func(*Batch) error {
		if n++; n == 2 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || n >= l.Batches() {
		t.Errorf("Each over a cancelled epoch = %v after %d of %d batches; want context.Canceled", err, n, l.Batches())
	}
}

// Fill gives any rank's batch, from its indices, as the rank's own epoch
// gives it: the same transforms (random ones drawn from seed, epoch and
// index), windows and labels.
func TestFillIsTheEpochsBatch(t *testing.T) {
	corpus := make([]byte, 1000)
	for i := range corpus {
		corpus[i] = byte(i * 7)
	}
	text := &Split{Dataset: &Dataset{Source: "test", Classes: byteClasses()}, Pipeline: &Pipeline{}, C: 1, H: 1, Text: &Text{Source: "test", Bytes: corpus}}
	if err := text.SetContext(9); err != nil {
		t.Fatal(err)
	}
	images := testLoader(t, 3, 1, TransformSpec{Name: "RandomCrop", Args: raw(`[28, 4]`)}, TransformSpec{Name: "RandomHorizontalFlip"}, TransformSpec{Name: "ToTensor"})
	for name, l := range map[string]*Loader{
		"images": images,
		"text":   {Split: text, BatchSize: 8, Seed: 5, Sampler: Sampler{N: text.Len(), World: 3, Rank: 2, Seed: 5, Shuffle: true}},
	} {
		t.Run(name, func(t *testing.T) {
			e, err := l.Epoch(context.Background(), 1)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			var got Batch
			err = e.Each(func(b *Batch) error {
				if err := l.Fill(&got, 1, b.Index); err != nil {
					return err
				}
				if got.N != b.N || got.C != b.C || got.H != b.H || got.W != b.W || !slices.Equal(got.X, b.X) || !slices.Equal(got.Y, b.Y) ||
					!slices.Equal(got.Index, b.Index) {
					t.Fatalf("Fill of indices %v is not the epoch's batch", b.Index[:min(4, len(b.Index))])
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	if err := images.Fill(&Batch{}, 1, []int{0, images.Split.Len()}); err == nil {
		t.Error("Fill of a sample past the split's end: nil error; want one")
	}
	served := &Loader{Split: &Split{remote: &remote{}}}
	if err := served.Fill(&Batch{}, 0, []int{0}); !errors.Is(err, ErrNotLocal) {
		t.Errorf("Fill of a served split: %v; want ErrNotLocal", err)
	}
}
