package data

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// textFolder makes a folder of text files, with what a folder read leaves
// out beside them: a hidden file, a binary one, a link and a subfolder.
func textFolder(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{"b": "second\n", "a": "first\n", ".hidden": "no\n", "a.dat": "bin\x00ary"}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("a", filepath.Join(dir, "a.u8")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestTextRead(t *testing.T) {
	dir := textFolder(t)
	for _, tc := range []struct {
		name string
		spec TextSpec
		want string
	}{
		{"folder", TextSpec{Folder: dir}, "first\nsecond\n"},
		{"glob", TextSpec{Glob: filepath.Join(dir, "[ab]")}, "first\nsecond\n"},
		{"files, sorted", TextSpec{Files: []string{filepath.Join(dir, "b"), filepath.Join(dir, "a")}}, "first\nsecond\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, files, err := tc.spec.Read(MaxTextBytes)
			if err != nil || string(got) != tc.want || len(files) != 2 {
				t.Errorf("Read = %q, %v, %v; want %q from 2 files", got, files, err, tc.want)
			}
		})
	}
}

func TestTextReadRefuses(t *testing.T) {
	dir := textFolder(t)
	empty := t.TempDir()
	if err := os.WriteFile(filepath.Join(empty, "nothing"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	binary := t.TempDir()
	for name, b := range map[string][]byte{"strings.dat": {'a', 0, 'b'}, ".hidden": []byte("text")} {
		if err := os.WriteFile(filepath.Join(binary, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(binary, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		spec  TextSpec
		limit int64
		want  string
	}{
		{"missing folder", TextSpec{Folder: filepath.Join(dir, "none")}, MaxTextBytes, "no such file"},
		{"missing file", TextSpec{Files: []string{filepath.Join(dir, "none")}}, MaxTextBytes, "no such file"},
		{"a folder named as a file", TextSpec{Files: []string{filepath.Join(dir, "sub")}}, MaxTextBytes, "not a regular file"},
		{"an empty corpus", TextSpec{Folder: empty}, MaxTextBytes, "holds no bytes (1 files; passed over: 0 binary"},
		{"a folder of what is passed over", TextSpec{Folder: binary}, MaxTextBytes, "holds no bytes (0 files; passed over: 1 binary (a NUL byte in the first 8 KiB), 2 hidden or not regular files)"},
		{"a glob that matches nothing", TextSpec{Glob: filepath.Join(dir, "*.txt")}, MaxTextBytes, "holds no bytes"},
		{"over the limit", TextSpec{Folder: dir}, 10, "over 10 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := tc.spec.Read(tc.limit)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Read: %v; want ErrConfig saying %q", err, tc.want)
			}
		})
	}
}

func TestTextConfig(t *testing.T) {
	dir := textFolder(t)
	for _, bad := range []string{
		`{"text": {}}`,
		`{"text": {"folder": "x", "glob": "y"}}`,
		`{"text": {"folder": "x"}, "dataset_path": {"train": "y"}}`,
		`{"text": {"folder": "x"}, "transforms": []}`,
		`{"text": {"folder": "x", "encoding": "utf8"}}`,
	} {
		if _, err := ParseConfig(strings.NewReader(bad), dir); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v; want ErrConfig", bad, err)
		}
	}
	c, err := ParseConfig(strings.NewReader(`{"text": {"folder": "."}}`), dir)
	if err != nil {
		t.Fatal(err)
	}
	train, err := c.Load("train")
	if err != nil {
		t.Fatal(err)
	}
	if err := train.SetContext(3); err != nil {
		t.Fatal(err)
	}
	// 13 bytes: 11 train (int(13 × 0.9)), 2 validate.
	if string(train.Text.Bytes) != "first\nsecon" || len(train.Classes) != 256 || train.Len() != 2 {
		t.Errorf("train part %q, %d classes, %d windows; want the first 11 bytes, 256, 2", train.Text.Bytes, len(train.Classes), train.Len())
	}
	test, err := c.Load("test")
	if err != nil {
		t.Fatal(err)
	}
	if string(test.Text.Bytes) != "d\n" || test.SetContext(3) == nil {
		t.Errorf("validation part %q; want the last 2 bytes, too few for a window of 4", test.Text.Bytes)
	}
}

// The cut is torch_gpt.py's, int(n × 0.9), for sizes like the corpus's.
func TestSplitText(t *testing.T) {
	for n, want := range map[int]int{10: 9, 2581440: 2323296, 2643146: 2378831, 1234567: 1111110, 999999: 899999} {
		train, val := SplitText(make([]byte, n))
		if len(train) != want || len(val) != n-want {
			t.Errorf("%d bytes: %d and %d; want %d and %d", n, len(train), len(val), want, n-want)
		}
	}
}

// Every window of an epoch is trained exactly once over the ranks; a
// window's targets are its bytes shifted by one; the offset moves with
// the epoch, and evaluation's stays 0.
func TestTextLoader(t *testing.T) {
	corpus := make([]byte, 1000)
	for i := range corpus {
		corpus[i] = byte(i * 7)
	}
	const ctxLen, world = 9, 3
	s := &Split{Dataset: &Dataset{Source: "test", Classes: byteClasses()}, Pipeline: &Pipeline{}, C: 1, H: 1, Text: &Text{Source: "test", Bytes: corpus}}
	if err := s.SetContext(ctxLen); err != nil {
		t.Fatal(err)
	}
	want := (1000 - ctxLen) / (ctxLen + 1)
	if s.Len() != want {
		t.Fatalf("%d windows; want %d", s.Len(), want)
	}
	for epoch := range 4 {
		off := s.Text.Offset(5, epoch, true)
		seen := map[int]int{}
		for rank := range world {
			l := &Loader{Split: s, BatchSize: 8, Seed: 5, Sampler: Sampler{N: s.Len(), World: world, Rank: rank, Seed: 5, Shuffle: true, Exact: true}}
			e, err := l.Epoch(context.Background(), epoch)
			if err != nil {
				t.Fatal(err)
			}
			err = e.Each(func(b *Batch) error {
				if len(b.X) != b.N*ctxLen || len(b.Y) != b.N*ctxLen || b.W != ctxLen {
					t.Fatalf("batch of %d: %d inputs, %d targets, width %d", b.N, len(b.X), len(b.Y), b.W)
				}
				for k, i := range b.Index {
					seen[i]++
					x, y := b.X[k*ctxLen:(k+1)*ctxLen], b.Y[k*ctxLen:(k+1)*ctxLen]
					w := corpus[off+i*(ctxLen+1):]
					for j := range ctxLen {
						if x[j] != float32(w[j]) || y[j] != int(w[j+1]) {
							t.Fatalf("epoch %d window %d at %d: input %v and target %d; want %d and %d", epoch, i, j, x[j], y[j], w[j], w[j+1])
						}
					}
				}
				return nil
			})
			e.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
		if len(seen) != want {
			t.Fatalf("epoch %d trained %d windows; want %d", epoch, len(seen), want)
		}
		for i, n := range seen {
			if n != 1 {
				t.Fatalf("epoch %d trained window %d %d times", epoch, i, n)
			}
		}
	}
	a, b := s.Text.Offset(5, 0, true), s.Text.Offset(5, 0, true)
	moved := false
	for epoch := range 8 {
		moved = moved || s.Text.Offset(5, epoch, true) != a
	}
	if a != b || !moved || s.Text.Offset(5, 3, false) != 0 {
		t.Errorf("offsets %d and %d for one epoch and seed, moved over 8 epochs: %v, evaluation's %d; want equal, true, 0", a, b, moved, s.Text.Offset(5, 3, false))
	}
}

// Debian's fortunes, where installed, read as the reference reads them:
// its 43 text files, 2,576,674 bytes.
func TestFortunesCorpus(t *testing.T) {
	const dir = "/usr/share/games/fortunes"
	if _, err := os.Stat(dir); err != nil {
		t.Skip("fortunes is not installed (make demo MODEL=gpt installs it)")
	}
	corpus, files, err := (&TextSpec{Folder: dir}).Read(MaxTextBytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 43 || len(corpus) != 2576674 {
		t.Errorf("%d files, %d bytes; want 43 and 2,576,674 (torch_gpt.py's corpus)", len(files), len(corpus))
	}
}

// A text corpus served: its parts go out as chunks, each hashed in the
// manifest, and come back the same bytes; a chunk that does not hash to
// its sum is refused.
func TestServedText(t *testing.T) {
	corpus := make([]byte, 3*TextChunk+1234)
	for i := range corpus {
		corpus[i] = byte(i*31 + i/7)
	}
	trainPart, valPart := SplitText(corpus)
	part := func(b []byte) *Split {
		return &Split{Dataset: &Dataset{Source: "t", Classes: byteClasses()}, Pipeline: &Pipeline{}, C: 1, H: 1, Text: &Text{Source: "t", Bytes: b}}
	}
	m, sets, err := NewTextManifest(part(trainPart), part(valPart))
	if err != nil {
		t.Fatal(err)
	}
	again, err := ParseManifest(m.enc, m.ID())
	if err != nil || !again.Text || again.Config().Text == nil {
		t.Fatalf("the manifest parsed again: %v, text %v", err, again != nil && again.Text)
	}
	for k, name := range []string{"train", "test"} {
		s, err := again.RemoteText(context.Background(), name, &fakeFetcher{d: sets[k], sm: again.Split(name)}, RemoteConfig{RequestSize: 2})
		if err != nil {
			t.Fatal(err)
		}
		if want := [][]byte{trainPart, valPart}[k]; !bytes.Equal(s.Text.Bytes, want) || s.SetContext(16) != nil {
			t.Errorf("%s: %d bytes back; want the %d served, as a text split", name, len(s.Text.Bytes), len(want))
		}
	}
	bad := textChunks("t", slices.Clone(trainPart))
	bad.pix[5] ^= 1
	if _, err := again.RemoteText(context.Background(), "train", &fakeFetcher{d: bad, sm: again.Split("train")}, RemoteConfig{}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a tampered chunk: %v; want ErrCorrupt", err)
	}
	if _, err := ParseManifest([]byte(strings.Replace(string(m.enc), `"text":true`, `"text":true,"transforms":[{"name":"ToTensor","args":[]}]`, 1)), ""); err == nil {
		t.Error("a text manifest with transforms was taken")
	}
}
