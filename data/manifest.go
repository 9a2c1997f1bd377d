package data

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// ErrCorrupt means bytes that came from elsewhere — a served sample, a
// cached one, a manifest — do not match the hash that names them.
var ErrCorrupt = errors.New("data: does not match its hash")

// Manifest describes a dataset that peers serve: its transforms and class
// names, and every sample's shape, label and SHA-256. Its ID, the SHA-256
// of its encoding, names the dataset: two servers of the same images under
// the same config have the same ID, and a client checks every sample it is
// sent against the manifest whose hash it asked for. Paths are not in it:
// they are each machine's own.
type Manifest struct {
	Transforms []TransformSpec
	Classes    []string
	// Splits are "train" and, if the config has one, "test".
	Splits []SplitManifest
	// Text says the dataset is a text corpus: each split its part's bytes
	// in chunks of TextChunk (samples of 1×n×1, label 0), put together
	// again by RemoteText; it has no transforms, and the 256 byte values
	// are its classes.
	Text bool

	enc []byte // the encoding, once made or parsed
	id  string
}

// SplitManifest is one split's samples, in dataset order.
type SplitManifest struct {
	Name    string
	Samples []SampleInfo
}

// SampleInfo is one sample as the manifest holds it.
type SampleInfo struct {
	H, W, C uint32
	Label   int32
	Sum     [sha256.Size]byte // of the sample's pixels, H×W×C bytes
}

// Size is the sample's pixel bytes.
func (s SampleInfo) Size() int { return int(s.H) * int(s.W) * int(s.C) }

// Bounds on what a manifest may announce, so that a hostile one cannot make
// a client allocate more than a real dataset needs.
const (
	// MaxManifestBytes bounds an encoded manifest: 2.8 million samples,
	// twice ImageNet's. A client holds the manifest it reads before its
	// hash can be checked, so this is what one lying server can cost it.
	MaxManifestBytes = 128 << 20
	// MaxSampleBytes bounds one sample's pixels (a 4096×4096 RGBA image).
	MaxSampleBytes = 64 << 20
	// MaxSplitBytes bounds one split's pixels, all of which a client
	// holds in memory, as it does a local dataset's.
	MaxSplitBytes  = 64 << 30
	maxHeaderBytes = 1 << 20
	sampleRecord   = 4*4 + sha256.Size
)

const manifestMagic = "ringtrain dataset 1\n"

// manifestHeader is the manifest's JSON part.
type manifestHeader struct {
	Transforms []TransformSpec `json:"transforms"`
	Classes    []string        `json:"classes"`
	Text       bool            `json:"text,omitempty"`
	Splits     []struct {
		Name    string `json:"name"`
		Samples int    `json:"samples"`
	} `json:"splits"`
}

// NewManifest describes the config's splits for serving: train, then test
// if there is one. It hashes every sample.
func NewManifest(cfg *Config, train, test *Dataset) (*Manifest, error) {
	m := &Manifest{Transforms: cfg.Transforms, Classes: train.Classes}
	if m.Transforms == nil {
		m.Transforms = []TransformSpec{}
	}
	add := func(name string, d *Dataset) {
		sm := SplitManifest{Name: name, Samples: make([]SampleInfo, d.Len())}
		for i := range d.Len() {
			im := d.Image(i)
			sm.Samples[i] = SampleInfo{H: uint32(im.H), W: uint32(im.W), C: uint32(im.C), Label: int32(d.Label(i)), Sum: sha256.Sum256(im.Pix)}
		}
		m.Splits = append(m.Splits, sm)
	}
	add("train", train)
	if test != nil {
		if !slices.Equal(test.Classes, train.Classes) {
			return nil, fmt.Errorf("data: %s names classes %v but %s names %v; serve splits with one set of classes: %w", test.Source, test.Classes, train.Source, train.Classes, ErrConfig)
		}
		add("test", test)
	}
	enc, err := m.encode()
	if err != nil {
		return nil, err
	}
	// Parse what was made, so that a server never offers a manifest its
	// clients would refuse (a sample over the bounds, say).
	return ParseManifest(enc, "")
}

// encode lays the manifest out: the magic, the JSON header's length and
// the header, then per sample H, W, C, label (uint32 little-endian) and the
// SHA-256 of its pixels.
func (m *Manifest) encode() ([]byte, error) {
	var h manifestHeader
	h.Transforms, h.Classes, h.Text = m.Transforms, m.Classes, m.Text
	n := 0
	for _, s := range m.Splits {
		h.Splits = append(h.Splits, struct {
			Name    string `json:"name"`
			Samples int    `json:"samples"`
		}{s.Name, len(s.Samples)})
		n += len(s.Samples)
	}
	hj, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("data: manifest: %w", err)
	}
	b := make([]byte, 0, len(manifestMagic)+4+len(hj)+n*sampleRecord)
	b = append(b, manifestMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(hj)))
	b = append(b, hj...)
	for _, s := range m.Splits {
		for _, x := range s.Samples {
			b = binary.LittleEndian.AppendUint32(b, x.H)
			b = binary.LittleEndian.AppendUint32(b, x.W)
			b = binary.LittleEndian.AppendUint32(b, x.C)
			b = binary.LittleEndian.AppendUint32(b, uint32(x.Label))
			b = append(b, x.Sum[:]...)
		}
	}
	return b, nil
}

// ManifestID is the ID of an encoded manifest: its SHA-256 in hex.
func ManifestID(enc []byte) string {
	s := sha256.Sum256(enc)
	return hex.EncodeToString(s[:])
}

// ReadManifest reads an encoded manifest of size bytes (as its sender
// announced them) from r, checking as it goes: the size against
// MaxManifestBytes before anything is read, then against the length the
// header implies before the samples' records are read, and the SHA-256 of
// what arrived against id (ErrCorrupt) before anything of it is used. What
// it holds grows with what was sent, never with what was announced.
func ReadManifest(r io.Reader, size uint64, id string) (*Manifest, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("data: manifest: "+format+": %w", append(a, ErrFormat)...)
	}
	if size > MaxManifestBytes {
		return nil, bad("announced as %d bytes; at most %d", size, MaxManifestBytes)
	}
	sum := sha256.New()
	var buf bytes.Buffer
	tee := io.TeeReader(r, io.MultiWriter(sum, &buf))
	head := make([]byte, len(manifestMagic)+4)
	if uint64(len(head)) > size {
		return nil, bad("announced as %d bytes, less than its header", size)
	}
	if _, err := io.ReadFull(tee, head); err != nil {
		return nil, fmt.Errorf("data: manifest: %w", err)
	}
	if string(head[:len(manifestMagic)]) != manifestMagic {
		return nil, bad("does not start with %q", manifestMagic)
	}
	hl := uint64(binary.LittleEndian.Uint32(head[len(manifestMagic):]))
	if hl > maxHeaderBytes || uint64(len(head))+hl > size {
		return nil, bad("header of %d bytes in %d", hl, size)
	}
	hj := make([]byte, hl)
	if _, err := io.ReadFull(tee, hj); err != nil {
		return nil, fmt.Errorf("data: manifest: %w", err)
	}
	var h manifestHeader
	if err := json.Unmarshal(hj, &h); err != nil {
		return nil, bad("header: %v", err)
	}
	total := uint64(0)
	for _, s := range h.Splits {
		if s.Samples < 1 || s.Samples > MaxManifestBytes/sampleRecord {
			return nil, bad("split %s has %d samples", s.Name, s.Samples)
		}
		total += uint64(s.Samples)
	}
	if want := uint64(len(head)) + hl + total*sampleRecord; want != size {
		return nil, bad("announced as %d bytes, but its header's %d samples make %d", size, total, want)
	}
	if _, err := io.CopyN(io.Discard, tee, int64(size)-int64(len(head))-int64(hl)); err != nil {
		return nil, fmt.Errorf("data: manifest cut short at %d of %d bytes: %w", buf.Len(), size, err)
	}
	if got := hex.EncodeToString(sum.Sum(nil)); id != "" && got != id {
		return nil, fmt.Errorf("data: manifest of %d bytes hashes to %s, not %s: %w", size, got[:16], short(id), ErrCorrupt)
	}
	return ParseManifest(buf.Bytes(), "")
}

// ParseManifest reads an encoded manifest. If id is not empty the bytes
// must hash to it (ErrCorrupt if not); everything else is checked as bytes
// from a stranger: sizes against the bounds above, labels against the
// classes, transforms against the samples' shapes.
func ParseManifest(b []byte, id string) (*Manifest, error) {
	if id != "" && ManifestID(b) != id {
		return nil, fmt.Errorf("data: manifest of %d bytes hashes to %s, not %s: %w", len(b), ManifestID(b)[:16], short(id), ErrCorrupt)
	}
	h, p, rest, err := parseManifestHeader(b)
	if err != nil {
		return nil, err
	}
	m := &Manifest{Transforms: h.Transforms, Classes: h.Classes, Text: h.Text, enc: b, id: ManifestID(b)}
	for _, s := range h.Splits {
		var sm SplitManifest
		if sm, rest, err = parseSplitRecords(s.Name, s.Samples, rest, len(h.Classes), p); err != nil {
			return nil, err
		}
		m.Splits = append(m.Splits, sm)
	}
	return m, nil
}

// badManifest is a manifest's format error.
func badManifest(format string, a ...any) error {
	return fmt.Errorf("data: manifest: "+format+": %w", append(a, ErrFormat)...)
}

// parseManifestHeader checks a manifest's size, magic and header — its
// transforms (p) among it — and that the sample records after it are as
// many as its splits say; rest is those records.
func parseManifestHeader(b []byte) (h manifestHeader, p *Pipeline, rest []byte, err error) {
	if len(b) > MaxManifestBytes {
		return h, nil, nil, badManifest("%d bytes; at most %d", len(b), MaxManifestBytes)
	}
	if !bytes.HasPrefix(b, []byte(manifestMagic)) {
		return h, nil, nil, badManifest("does not start with %q", manifestMagic)
	}
	rest = b[len(manifestMagic):]
	if len(rest) < 4 {
		return h, nil, nil, badManifest("ends before its header")
	}
	hl := binary.LittleEndian.Uint32(rest)
	rest = rest[4:]
	if hl > maxHeaderBytes || int(hl) > len(rest) {
		return h, nil, nil, badManifest("header of %d bytes in %d", hl, len(rest))
	}
	dec := json.NewDecoder(bytes.NewReader(rest[:hl]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return h, nil, nil, badManifest("header: %v", err)
	}
	if dec.More() {
		return h, nil, nil, badManifest("header holds more than one JSON value")
	}
	rest = rest[hl:]
	if h.Text {
		if len(h.Transforms) > 0 || len(h.Classes) != 256 {
			return h, nil, nil, badManifest("a text corpus with %d transforms and %d classes; want none and the 256 byte values", len(h.Transforms), len(h.Classes))
		}
	} else if p, err = NewPipeline(h.Transforms); err != nil {
		return h, nil, nil, fmt.Errorf("data: manifest: %w", err)
	}
	if len(h.Classes) == 0 {
		return h, nil, nil, badManifest("names no classes")
	}
	want := [][]string{{"train"}, {"train", "test"}}
	names := make([]string, len(h.Splits))
	for i, s := range h.Splits {
		names[i] = s.Name
	}
	if !slices.Equal(names, want[0]) && !slices.Equal(names, want[1]) {
		return h, nil, nil, badManifest("splits %q; want train, or train and test", names)
	}
	total := 0
	for _, s := range h.Splits {
		if s.Samples < 1 || s.Samples > MaxManifestBytes/sampleRecord {
			return h, nil, nil, badManifest("split %s has %d samples", s.Name, s.Samples)
		}
		total += s.Samples
	}
	if total*sampleRecord != len(rest) {
		return h, nil, nil, badManifest("%d samples need %d bytes of records; %d follow the header", total, total*sampleRecord, len(rest))
	}
	return h, p, rest, nil
}

// parseSplitRecords reads split name's n sample records from rest, each
// checked — its shape, its label among classes, the split's bytes, and
// that the transforms p take its shape — and returns what follows them.
func parseSplitRecords(name string, n int, rest []byte, classes int, p *Pipeline) (SplitManifest, []byte, error) {
	sm := SplitManifest{Name: name, Samples: make([]SampleInfo, n)}
	bytesIn := 0
	type dims struct{ h, w, c uint32 }
	shapes := map[dims]bool{}
	for i := range sm.Samples {
		r := rest[:sampleRecord]
		rest = rest[sampleRecord:]
		x := SampleInfo{H: binary.LittleEndian.Uint32(r), W: binary.LittleEndian.Uint32(r[4:]), C: binary.LittleEndian.Uint32(r[8:]), Label: int32(binary.LittleEndian.Uint32(r[12:]))}
		copy(x.Sum[:], r[16:])
		if x.H < 1 || x.W < 1 || x.C < 1 || x.H > MaxSampleBytes || x.W > MaxSampleBytes || x.C > 4 || x.Size() > MaxSampleBytes {
			return sm, nil, badManifest("%s sample %d is %d×%d×%d; want 1–4 channels and at most %d bytes", name, i, x.H, x.W, x.C, MaxSampleBytes)
		}
		if x.Label < 0 || int(x.Label) >= classes {
			return sm, nil, badManifest("%s sample %d has label %d; the manifest names %d classes", name, i, x.Label, classes)
		}
		if bytesIn += x.Size(); bytesIn > MaxSplitBytes {
			return sm, nil, badManifest("split %s holds over %d bytes", name, MaxSplitBytes)
		}
		k := dims{x.H, x.W, x.C}
		if p == nil { // text: chunks of bytes
			if x.H != 1 || x.C != 1 || x.Label != 0 {
				return sm, nil, badManifest("%s chunk %d is %d×%d×%d of label %d; a text corpus's are 1×n×1 of label 0", name, i, x.H, x.W, x.C, x.Label)
			}
		} else if !shapes[k] {
			if _, _, _, err := p.OutShape(int(x.H), int(x.W), int(x.C)); err != nil {
				return sm, nil, fmt.Errorf("data: manifest: %s sample %d (%d×%d×%d): %w", name, i, x.H, x.W, x.C, err)
			}
			shapes[k] = true
		}
		sm.Samples[i] = x
	}
	return sm, rest, nil
}

// ParseID reads a dataset ID as ManifestID writes it: 64 lowercase hex
// digits.
func ParseID(id string) ([sha256.Size]byte, error) {
	var out [sha256.Size]byte
	if len(id) != 2*len(out) || strings.ToLower(id) != id {
		return out, fmt.Errorf("data: dataset ID %q: want 64 lowercase hex digits (the SHA-256 ringtrain serve prints): %w", id, ErrConfig)
	}
	if _, err := hex.Decode(out[:], []byte(id)); err != nil {
		return out, fmt.Errorf("data: dataset ID %q: want 64 lowercase hex digits (the SHA-256 ringtrain serve prints): %w", id, ErrConfig)
	}
	return out, nil
}

// ID names the dataset: the hex SHA-256 of its encoding.
func (m *Manifest) ID() string { return m.id }

// Encoded is the manifest as it travels; do not modify it.
func (m *Manifest) Encoded() []byte { return m.enc }

// Config is the data config the manifest carries, with no paths.
func (m *Manifest) Config() *Config {
	if m.Text {
		return &Config{Text: &TextSpec{}}
	}
	return &Config{Transforms: m.Transforms, Classes: m.Classes}
}

// Shape is the shape the split's samples become after the manifest's
// transforms (channels, height, width), read from the manifest alone: a
// dataset that does not fit the model can be refused before a byte of it
// is fetched or a byte of memory is taken for it.
func (m *Manifest) Shape(split string) (c, h, w int, err error) {
	sm := m.Split(split)
	if sm == nil {
		return 0, 0, 0, fmt.Errorf("data: served dataset %s has no %s split: %w", short(m.id), split, ErrConfig)
	}
	p, err := NewPipeline(m.Transforms)
	if err != nil {
		return 0, 0, 0, err
	}
	type dims struct{ h, w, c uint32 }
	seen := map[dims]bool{}
	for i, x := range sm.Samples {
		if seen[dims{x.H, x.W, x.C}] {
			continue
		}
		c1, h1, w1, err := p.OutShape(int(x.H), int(x.W), int(x.C))
		if err != nil {
			return 0, 0, 0, fmt.Errorf("data: %s sample %d (%d×%d×%d): %w", split, i, x.H, x.W, x.C, err)
		}
		if len(seen) > 0 && (c1 != c || h1 != h || w1 != w) {
			return 0, 0, 0, fmt.Errorf("data: %s sample %d becomes %d×%d×%d, sample 0 %d×%d×%d: %w", split, i, c1, h1, w1, c, h, w, ErrFormat)
		}
		c, h, w = c1, h1, w1
		seen[dims{x.H, x.W, x.C}] = true
	}
	return c, h, w, nil
}

// TotalBytes is the pixel bytes of the whole split.
func (s *SplitManifest) TotalBytes() int64 {
	n := int64(0)
	for _, x := range s.Samples {
		n += int64(x.Size())
	}
	return n
}

// Split returns the split of that name, or nil.
func (m *Manifest) Split(name string) *SplitManifest {
	for i := range m.Splits {
		if m.Splits[i].Name == name {
			return &m.Splits[i]
		}
	}
	return nil
}

// Check says whether pix holds the pixels of samples idx of the split, in
// order: ErrCorrupt names the first that does not hash to the manifest's
// sum, ErrFormat a wrong length or an index out of range.
func (s *SplitManifest) Check(idx []int, pix []byte) error {
	n, err := s.Bytes(idx)
	if err != nil {
		return err
	}
	if n != len(pix) {
		return fmt.Errorf("data: %d samples of %s are %d bytes, not %d: %w", len(idx), s.Name, n, len(pix), ErrFormat)
	}
	off := 0
	for _, i := range idx {
		x := s.Samples[i]
		if sha256.Sum256(pix[off:off+x.Size()]) != x.Sum {
			return fmt.Errorf("data: %s sample %d: %w", s.Name, i, ErrCorrupt)
		}
		off += x.Size()
	}
	return nil
}

// Bytes is the pixel bytes of samples idx, or ErrFormat for an index out
// of range.
func (s *SplitManifest) Bytes(idx []int) (int, error) {
	n := 0
	for _, i := range idx {
		if i < 0 || i >= len(s.Samples) {
			return 0, fmt.Errorf("data: sample %d of %s, which has %d: %w", i, s.Name, len(s.Samples), ErrFormat)
		}
		n += s.Samples[i].Size()
	}
	return n, nil
}

func short(id string) string { return id[:min(16, len(id))] }
