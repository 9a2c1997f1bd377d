package data

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// TextSpec is a data config's text corpus, by one of three names: a
// folder (every regular file in it, not hidden, not a link and not binary
// — a NUL in its first 8 KiB, as the .dat indexes beside Debian's
// fortunes), a glob, or a list of files. The files are read in sorted
// path order and concatenated as raw bytes: the vocabulary is the 256
// byte values.
type TextSpec struct {
	Folder string   `json:"folder,omitempty"`
	Glob   string   `json:"glob,omitempty"`
	Files  []string `json:"files,omitempty"`
}

// MaxTextBytes bounds a text corpus: it is held in memory whole.
const MaxTextBytes = 1 << 30

// ValidationShare is the part of a corpus that validates: its last
// tenth, as ../shared/bench/torch_gpt.py cuts it.
const ValidationShare = 0.1

// check says what is wrong with the spec: exactly one name, relative
// paths taken from dir.
func (t *TextSpec) check(dir string) error {
	n := 0
	for _, set := range []bool{t.Folder != "", t.Glob != "", len(t.Files) > 0} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf(`data: config: text names its corpus by one of "folder", "glob" or "files"; it names %d: %w`, n, ErrConfig)
	}
	abs := func(p string) string {
		if p != "" && !filepath.IsAbs(p) && dir != "" {
			return filepath.Join(dir, p)
		}
		return p
	}
	t.Folder, t.Glob = abs(t.Folder), abs(t.Glob)
	for i, f := range t.Files {
		t.Files[i] = abs(f)
	}
	return nil
}

// paths are the corpus's files, sorted, and what a folder held that is
// passed over: entries that are not regular files or are hidden, and
// binary files, so that a corpus found empty can say why.
func (t *TextSpec) paths() (out []string, passed string, err error) {
	switch {
	case t.Folder != "":
		entries, err := os.ReadDir(t.Folder)
		if err != nil {
			return nil, "", fmt.Errorf("data: text folder: %w: %w", err, ErrConfig)
		}
		var other, binary int
		for _, e := range entries {
			p := filepath.Join(t.Folder, e.Name())
			switch {
			case !e.Type().IsRegular() || e.Name()[0] == '.':
				other++
			case binaryFile(p):
				binary++
			default:
				out = append(out, p)
			}
		}
		return out, fmt.Sprintf("; passed over: %d binary (a NUL byte in the first 8 KiB), %d hidden or not regular files", binary, other), nil
	case t.Glob != "":
		out, err := filepath.Glob(t.Glob)
		if err != nil {
			return nil, "", fmt.Errorf("data: text glob %q: %w: %w", t.Glob, err, ErrConfig)
		}
		slices.Sort(out)
		return out, "", nil
	}
	return slices.Sorted(slices.Values(t.Files)), "", nil
}

// binaryFile reports whether the file at p holds a NUL byte in its first
// 8 KiB (or cannot be read: it is then read, and fails, no further).
func binaryFile(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	var b [8 << 10]byte
	n, _ := io.ReadFull(f, b[:])
	return bytes.IndexByte(b[:n], 0) >= 0
}

// Read reads the corpus: its files' bytes end to end, at most limit in
// all. A file named that is missing or not a regular file, and a corpus
// with no bytes, are errors that say so.
func (t *TextSpec) Read(limit int64) (corpus []byte, files []string, err error) {
	paths, passed, err := t.paths()
	if err != nil {
		return nil, nil, err
	}
	for _, p := range paths {
		if corpus, err = appendFile(corpus, p, limit); err != nil {
			return nil, nil, err
		}
	}
	if len(corpus) == 0 {
		return nil, nil, fmt.Errorf("data: text corpus %s holds no bytes (%d files%s): %w", t.describe(), len(paths), passed, ErrConfig)
	}
	return corpus, paths, nil
}

// appendFile appends the regular file at p to b, refusing to go past
// limit bytes in all.
func appendFile(b []byte, p string, limit int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("data: text: %w: %w", err, ErrConfig)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("data: text: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("data: text: %s is not a regular file (%v): %w", p, st.Mode().Type(), ErrConfig)
	}
	left := limit - int64(len(b))
	n, err := io.Copy(&appender{&b}, io.LimitReader(f, left+1))
	if err != nil {
		return nil, fmt.Errorf("data: text: reading %s: %w", p, err)
	}
	if n > left {
		return nil, fmt.Errorf("data: text corpus over %d bytes at %s: %w", limit, p, ErrConfig)
	}
	return b, nil
}

// appender is an io.Writer that appends to a byte slice.
type appender struct{ b *[]byte }

func (a *appender) Write(p []byte) (int, error) {
	*a.b = append(*a.b, p...)
	return len(p), nil
}

func (t *TextSpec) describe() string {
	switch {
	case t.Folder != "":
		return t.Folder
	case t.Glob != "":
		return t.Glob
	}
	return fmt.Sprint(t.Files)
}

// SplitText cuts a corpus into its training part, the first 90%, and its
// validation part, the rest — where torch_gpt.py cuts it, int(n × 0.9).
func SplitText(corpus []byte) (train, val []byte) {
	cut := int(float64(len(corpus)) * (1 - ValidationShare))
	return corpus[:cut], corpus[cut:]
}

// Text is one part of a byte corpus as samples: windows of Context+1
// bytes, of which a language model reads the first Context and predicts
// each byte from those before it. An epoch cuts the part into windows
// after an offset of its own (below Context+1, drawn from the seed and
// the epoch), so that the windows' edges move from epoch to epoch while
// every window is a sample that the sampler shuffles and shares out, as
// it does images: "every sample once per epoch", resuming mid-epoch and
// elastic shares keep their meaning.
type Text struct {
	Source  string
	Bytes   []byte
	Context int // the bytes a window's model reads; 0 until set
}

// Windows is how many windows every epoch holds.
func (t *Text) Windows() int {
	if t.Context < 1 {
		return 0
	}
	return max(0, (len(t.Bytes)-t.Context)/(t.Context+1))
}

// Offset is where the epoch's first window begins: drawn from seed and
// epoch where shuffle is set, else 0 (evaluation's fixed windows).
func (t *Text) Offset(seed uint64, epoch int, shuffle bool) int {
	if !shuffle {
		return 0
	}
	return rand.New(rand.NewPCG(seed^0x74657874, uint64(epoch))).IntN(t.Context + 1)
}

// Window writes window k of an epoch at offset off: its first Context
// bytes into x, as token ids, and the byte after each into y.
func (t *Text) Window(k, off int, x []float32, y []int) {
	w := t.Bytes[off+k*(t.Context+1):]
	for i := range t.Context {
		x[i], y[i] = float32(w[i]), int(w[i+1])
	}
}

// byteClasses names the 256 byte values: a text split's classes.
func byteClasses() []string {
	out := make([]string, 256)
	for i := range out {
		out[i] = strconv.QuoteRune(rune(i))
	}
	return out
}

// loadText is Load of a text config's split: "train", the corpus's first
// 90%, or "test", the rest.
func (c *Config) loadText(split string) (*Split, error) {
	corpus, files, err := c.Text.Read(MaxTextBytes)
	if err != nil {
		return nil, err
	}
	train, val := SplitText(corpus)
	part, name := train, "training part"
	if split == "test" {
		part, name = val, "validation part"
	}
	src := fmt.Sprintf("%s (%d files, %d bytes), its %s", c.Text.describe(), len(files), len(corpus), name)
	return &Split{Dataset: &Dataset{Source: src, Classes: byteClasses()}, Pipeline: &Pipeline{}, C: 1, H: 1,
		Text: &Text{Source: src, Bytes: part}}, nil
}

// SetContext makes a text split's samples windows of context+1 bytes: the
// model's context, which the data config does not know.
func (s *Split) SetContext(context int) error {
	switch {
	case s.Text == nil:
		return fmt.Errorf("data: %s is not text: %w", s.Source, ErrConfig)
	case context < 1:
		return fmt.Errorf("data: a context of %d bytes; want at least 1: %w", context, ErrConfig)
	case len(s.Text.Bytes) < 2*context+1:
		return fmt.Errorf("data: %s holds %d bytes, not one window of %d after an offset of up to %d: %w",
			s.Source, len(s.Text.Bytes), context+1, context, ErrConfig)
	}
	s.Text.Context, s.W = context, context
	return nil
}

// TextChunk is the bytes of one sample of a served text corpus: a part is
// served as chunks of it, each hashed, fetched and checked as an image is.
const TextChunk = 64 << 10

// textChunks is a text part as a dataset of chunks (1×n×1, label 0).
func textChunks(source string, part []byte) *Dataset {
	var images []Image
	for lo := 0; lo < len(part); lo += TextChunk {
		hi := min(lo+TextChunk, len(part))
		images = append(images, Image{Pix: part[lo:hi], H: 1, W: hi - lo, C: 1})
	}
	return NewDataset(source, byteClasses(), images, make([]int, len(images)))
}

// NewTextManifest describes a text config's splits for serving: the
// corpus's training part and validation part as chunks, and the datasets
// of chunks to serve (train, test).
func NewTextManifest(train, test *Split) (*Manifest, []*Dataset, error) {
	if train.Text == nil || test == nil || test.Text == nil {
		return nil, nil, fmt.Errorf("data: a text manifest wants a text corpus's two parts: %w", ErrConfig)
	}
	sets := []*Dataset{textChunks(train.Source, train.Text.Bytes), textChunks(test.Source, test.Text.Bytes)}
	m := &Manifest{Transforms: []TransformSpec{}, Classes: byteClasses(), Text: true}
	for k, name := range []string{"train", "test"} {
		d := sets[k]
		sm := SplitManifest{Name: name, Samples: make([]SampleInfo, d.Len())}
		for i := range d.Len() {
			im := d.Image(i)
			sm.Samples[i] = SampleInfo{H: 1, W: uint32(im.W), C: 1, Sum: sha256.Sum256(im.Pix)}
		}
		m.Splits = append(m.Splits, sm)
	}
	enc, err := m.encode()
	if err != nil {
		return nil, nil, err
	}
	m, err = ParseManifest(enc, "")
	return m, sets, err
}

// RemoteText is a served text corpus's split: every chunk fetched (each
// checked against the manifest) and put together again, as a text split
// of the same bytes the server read.
func (m *Manifest) RemoteText(ctx context.Context, split string, f Fetcher, cfg RemoteConfig) (*Split, error) {
	if !m.Text {
		return nil, fmt.Errorf("data: served dataset %s is not text: %w", short(m.id), ErrConfig)
	}
	chunks, err := m.Remote(split, f, cfg)
	if err != nil {
		return nil, err
	}
	defer chunks.Close()
	all := make([]int, chunks.Len())
	for i := range all {
		all[i] = i
	}
	if err := chunks.Prefetch(ctx, all); err != nil {
		return nil, err
	}
	var part []byte
	for i := range all {
		part = append(part, chunks.Image(i).Pix...)
	}
	src := fmt.Sprintf("served text %s, its %s part (%d bytes)", short(m.id), split, len(part))
	return &Split{Dataset: &Dataset{Source: src, Classes: byteClasses()}, Pipeline: &Pipeline{}, C: 1, H: 1,
		Text: &Text{Source: src, Bytes: part}}, nil
}
