package data

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// testManifest is the testdata subset's manifest, with its local splits.
func testManifest(t testing.TB) (*Manifest, *Split, *Split) {
	t.Helper()
	c, err := LoadConfig("../testdata/data-config.json")
	if err != nil {
		t.Fatal(err)
	}
	tr, err := c.Load("train")
	if err != nil {
		t.Fatal(err)
	}
	te, err := c.Load("test")
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManifest(c, tr.Dataset, te.Dataset)
	if err != nil {
		t.Fatal(err)
	}
	return m, tr, te
}

func TestManifestNamesTheData(t *testing.T) {
	m, tr, te := testManifest(t)
	again, err := ParseManifest(m.Encoded(), m.ID())
	if err != nil {
		t.Fatal(err)
	}
	if again.ID() != m.ID() || len(again.Splits) != 2 || len(again.Splits[0].Samples) != tr.Len() || len(again.Splits[1].Samples) != te.Len() {
		t.Fatalf("parsed manifest %s with %d splits; want %s with train %d, test %d", again.ID(), len(again.Splits), m.ID(), tr.Len(), te.Len())
	}
	// Another pixel, label or transform is another dataset.
	c, _ := LoadConfig("../testdata/data-config.json")
	tr.Image(7).Pix[100] ^= 1
	other, err := NewManifest(c, tr.Dataset, te.Dataset)
	tr.Image(7).Pix[100] ^= 1
	if err != nil {
		t.Fatal(err)
	}
	c.Transforms = c.Transforms[:1]
	otherTf, err := NewManifest(c, tr.Dataset, te.Dataset)
	if err != nil {
		t.Fatal(err)
	}
	trainOnly, err := NewManifest(c, tr.Dataset, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{m.ID(), other.ID(), otherTf.ID(), trainOnly.ID()}
	slices.Sort(ids)
	if len(slices.Compact(ids)) != 4 {
		t.Fatalf("IDs %v; want four different", ids)
	}
	if err := m.Splits[0].Check([]int{6, 7}, append(slices.Clone(tr.Image(6).Pix), tr.Image(7).Pix...)); err != nil {
		t.Fatalf("Check of true pixels: %v", err)
	}
	bad := append(slices.Clone(tr.Image(6).Pix), tr.Image(7).Pix...)
	bad[len(bad)-1] ^= 1
	if err := m.Splits[0].Check([]int{6, 7}, bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Check of a changed pixel: %v; want ErrCorrupt", err)
	}
	if err := m.Splits[0].Check([]int{6, 1 << 30}, bad); !errors.Is(err, ErrFormat) {
		t.Fatalf("Check of an index out of range: %v; want ErrFormat", err)
	}
}

func TestParseManifestBadInput(t *testing.T) {
	m, _, _ := testManifest(t)
	enc := m.Encoded()
	hl := int(binary.LittleEndian.Uint32(enc[len(manifestMagic):]))
	records := len(manifestMagic) + 4 + hl
	edit := func(f func(b []byte) []byte) []byte { return f(slices.Clone(enc)) }
	header := func(h string) []byte {
		b := append([]byte(manifestMagic), binary.LittleEndian.AppendUint32(nil, uint32(len(h)))...)
		return append(append(b, h...), enc[records:]...)
	}
	for _, c := range []struct {
		name string
		b    []byte
		id   string
		want error
	}{
		{"another ID", enc, ManifestID([]byte("x")), ErrCorrupt},
		{"bad magic", edit(func(b []byte) []byte { b[0] = 'X'; return b }), "", ErrFormat},
		{"empty", nil, "", ErrFormat},
		{"cut in the header", enc[:len(manifestMagic)+10], "", ErrFormat},
		{"header length past the end", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[len(manifestMagic):], 1<<31)
			return b
		}), "", ErrFormat},
		{"cut in a record", enc[:len(enc)-1], "", ErrFormat},
		{"a record too many", append(slices.Clone(enc), make([]byte, sampleRecord)...), "", ErrFormat},
		{"label out of range", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[records+12:], 10)
			return b
		}), "", ErrFormat},
		{"negative label", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[records+12:], 0xffffffff)
			return b
		}), "", ErrFormat},
		{"zero height", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[records:], 0)
			return b
		}), "", ErrFormat},
		{"a sample over the bound", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[records:], 1<<20)
			binary.LittleEndian.PutUint32(b[records+4:], 1<<20)
			return b
		}), "", ErrFormat},
		{"unknown header field", header(`{"transforms":[{"name":"ToTensor","args":[]}],"classes":["a"],"splits":[{"name":"train","samples":1}],"x":1}`), "", ErrFormat},
		{"no classes", header(`{"transforms":[{"name":"ToTensor","args":[]}],"classes":[],"splits":[{"name":"train","samples":1}]}`), "", ErrFormat},
		{"a split named other", header(`{"transforms":[{"name":"ToTensor","args":[]}],"classes":["a"],"splits":[{"name":"val","samples":1}]}`), "", ErrFormat},
		{"a split of no samples", header(`{"transforms":[{"name":"ToTensor","args":[]}],"classes":["a"],"splits":[{"name":"train","samples":0}]}`), "", ErrFormat},
		{"unknown transform", header(`{"transforms":[{"name":"Nope","args":[]}],"classes":["a"],"splits":[{"name":"train","samples":1}]}`), "", ErrConfig},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseManifest(c.b, c.id)
			if !errors.Is(err, c.want) {
				t.Fatalf("ParseManifest: %v; want %v", err, c.want)
			}
			// As it comes off the wire, with its length announced.
			want := c.want
			if c.name == "unknown transform" {
				// Its header's sample count is not the records': that
				// is seen first off the wire.
				want = ErrFormat
			}
			if _, err := ReadManifest(bytes.NewReader(c.b), uint64(len(c.b)), c.id); !errors.Is(err, want) {
				t.Fatalf("ReadManifest: %v; want %v", err, c.want)
			}
		})
	}
}

// TestReadManifestBoundsWhatItReads: a length announced over the bound,
// or other than the header's samples make, is refused before the records
// are read; a manifest that comes whole is the one ParseManifest reads.
func TestReadManifestBoundsWhatItReads(t *testing.T) {
	m, _, _ := testManifest(t)
	enc := m.Encoded()
	for _, c := range []struct {
		name      string
		announced uint64
		want      error
	}{
		{"1 GiB announced", 1 << 30, ErrFormat},
		{"one record more than the header says", uint64(len(enc)) + sampleRecord, ErrFormat},
		{"one byte short of the header's", uint64(len(enc)) - 1, ErrFormat},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &countingReader{r: bytes.NewReader(append(slices.Clone(enc), make([]byte, 1<<20)...))}
			if _, err := ReadManifest(r, c.announced, m.ID()); !errors.Is(err, c.want) {
				t.Fatalf("%v; want %v", err, c.want)
			}
			if r.n > 64<<10 {
				t.Fatalf("read %d bytes before refusing; want no more than the header", r.n)
			}
		})
	}
	got, err := ReadManifest(bytes.NewReader(enc), uint64(len(enc)), m.ID())
	if err != nil || got.ID() != m.ID() || len(got.Split("train").Samples) != 2000 {
		t.Fatalf("the whole manifest: %v", err)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// TestRemoteRefusesADatasetOverItsBudget: a manifest may announce samples
// whose pixels add up to more memory than this machine has (1,024 of
// 4096×4096×4, 64 GiB); the split is refused before any of it is taken,
// saying how large it is and what the budget is. Its samples' shape after
// the transforms is known from the manifest alone.
func TestRemoteRefusesADatasetOverItsBudget(t *testing.T) {
	small, _, _ := testManifest(t)
	big := &Manifest{Transforms: small.Transforms[:1], Classes: []string{"a"}} // ToTensor
	sm := SplitManifest{Name: "train", Samples: make([]SampleInfo, 1024)}
	for i := range sm.Samples {
		sm.Samples[i] = SampleInfo{H: 4096, W: 4096, C: 4}
	}
	big.Splits = []SplitManifest{sm}
	enc, err := big.encode()
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParseManifest(enc, "")
	if err != nil {
		t.Fatal(err)
	}
	if c, h, w, err := m.Shape("train"); err != nil || c != 4 || h != 4096 || w != 4096 {
		t.Fatalf("Shape: %d×%d×%d, %v; want 4×4096×4096", c, h, w, err)
	}
	for _, max := range []int64{0, 1 << 30} { // the default, and a smaller budget
		s, err := m.Remote("train", nil, RemoteConfig{MaxBytes: max})
		if !errors.Is(err, ErrTooLarge) {
			t.Fatalf("budget %d: %v; want ErrTooLarge", max, err)
		}
		if s != nil {
			t.Fatal("a split came back with the error")
		}
	}
	if _, err := small.Remote("train", nil, RemoteConfig{MaxBytes: 1000 * 784}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("2,000 samples of 784 bytes in a budget of 1,000: %v; want ErrTooLarge", err)
	}
	// A budget larger than the machine (join --data-memory 100GiB on a
	// 24 GiB machine) does not make room that is not there: the 64 GiB
	// split is refused, not allocated until the process dies.
	if _, err := m.Remote("train", nil, RemoteConfig{MaxBytes: 100 << 30, Memory: 24 << 30}); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("64 GiB with a budget of 100 GiB on a 24 GiB machine: %v; want ErrTooLarge naming the machine's memory", err)
	}
}

func FuzzParseManifest(f *testing.F) {
	m, _, _ := testManifest(f)
	f.Add(m.Encoded()[:len(manifestMagic)+600])
	f.Add([]byte(manifestMagic + "\x10\x00\x00\x00{\"splits\":null}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ParseManifest(b, "")
		if err != nil {
			return
		}
		// What parses is what encodes back to the same bytes.
		enc, err := got.encode()
		if err != nil {
			t.Fatal(err)
		}
		if got.ID() != ManifestID(b) || len(got.Splits) == 0 {
			t.Fatalf("parsed %d bytes into ID %s with %d splits", len(b), got.ID(), len(got.Splits))
		}
		if _, err := ParseManifest(enc, ""); err != nil {
			t.Fatalf("re-encoded manifest refused: %v", err)
		}
		// Read off a stream, the same bytes are the same manifest.
		if again, err := ReadManifest(bytes.NewReader(b), uint64(len(b)), got.ID()); err != nil || again.ID() != got.ID() {
			t.Fatalf("ReadManifest of what ParseManifest takes: %v", err)
		}
	})
}

// fakeFetcher serves a local split, checking what it sends as a server
// would, and records what it was asked.
type fakeFetcher struct {
	d  *Dataset
	sm *SplitManifest

	mu    sync.Mutex
	asked [][]int
	fail  func(idx []int) error // nil: never
	gate  chan struct{}         // if set, every request but the one of sample pass waits for it
	pass  int
}

func (f *fakeFetcher) Fetch(ctx context.Context, split string, idx []int, pix []byte) error {
	f.mu.Lock()
	f.asked = append(f.asked, slices.Clone(idx))
	f.mu.Unlock()
	if split != f.sm.Name {
		return errors.New("wrong split")
	}
	if f.gate != nil && idx[0] != f.pass {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if f.fail != nil {
		if err := f.fail(idx); err != nil {
			return err
		}
	}
	off := 0
	for _, i := range idx {
		off += copy(pix[off:], f.d.Image(i).Pix)
	}
	return f.sm.Check(idx, pix)
}

func (f *fakeFetcher) samples() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, a := range f.asked {
		n += len(a)
	}
	return n
}

// epochBatches is every batch of an epoch, copied.
func epochBatches(t *testing.T, l *Loader, epoch int) []Batch {
	t.Helper()
	e, err := l.Epoch(context.Background(), epoch)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var out []Batch
	if err := e.Each(func(b *Batch) error {
		out = append(out, Batch{X: slices.Clone(b.X), Y: slices.Clone(b.Y), Index: slices.Clone(b.Index), N: b.N})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRemoteBatchesAreLocalOnes(t *testing.T) {
	m, tr, _ := testManifest(t)
	f := &fakeFetcher{d: tr.Dataset, sm: m.Split("train")}
	rs, err := m.Remote("train", f, RemoteConfig{RequestSize: 7, Ahead: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	if rs.C != tr.C || rs.H != tr.H || rs.W != tr.W || !slices.Equal(rs.Classes, tr.Classes) {
		t.Fatalf("served split %d×%d×%d %v; want %d×%d×%d %v", rs.C, rs.H, rs.W, rs.Classes, tr.C, tr.H, tr.W, tr.Classes)
	}
	loader := func(s *Split) *Loader {
		return &Loader{Split: s, BatchSize: 16, Seed: 5, Sampler: Sampler{N: s.Len(), World: 3, Rank: 1, Seed: 5, Shuffle: true}}
	}
	share := loader(tr).Sampler.NumSamples()
	for epoch := range 3 {
		want, got := epochBatches(t, loader(tr), epoch), epochBatches(t, loader(rs), epoch)
		if len(got) != len(want) {
			t.Fatalf("epoch %d: %d batches; want %d", epoch, len(got), len(want))
		}
		for i := range want {
			if !slices.Equal(got[i].X, want[i].X) || !slices.Equal(got[i].Y, want[i].Y) || !slices.Equal(got[i].Index, want[i].Index) {
				t.Fatalf("epoch %d batch %d differs from the local split's", epoch, i)
			}
		}
		if epoch == 0 && f.samples() != share {
			t.Fatalf("first epoch fetched %d samples; want the share's %d, each once", f.samples(), share)
		}
	}
	st, _ := rs.RemoteStats()
	if st.Fetched != f.samples() || st.Here != st.Fetched || st.Fetched > tr.Len() {
		t.Fatalf("stats %+v after fetching %d; want every fetched sample here, none twice", st, f.samples())
	}
	for _, a := range f.asked[:len(f.asked)-1] {
		if len(a) > 7 {
			t.Fatalf("a request of %d samples; want at most the request size, 7", len(a))
		}
	}
}

func TestRemoteFetchesAheadOfTheLoader(t *testing.T) {
	m, tr, _ := testManifest(t)
	// Every request but the first waits: the first batch must still come,
	// and the others must already have been asked for.
	l := &Loader{BatchSize: 8, Seed: 1, Sampler: Sampler{N: tr.Len(), World: 1, Seed: 1, Shuffle: true}}
	order, err := l.Sampler.Indices(0)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeFetcher{d: tr.Dataset, sm: m.Split("train"), gate: make(chan struct{}), pass: order[0]}
	rs, err := m.Remote("train", f, RemoteConfig{RequestSize: 8, Ahead: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	l.Split = rs
	e, err := l.Epoch(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Next()
	if err != nil {
		t.Fatal(err)
	}
	if b.N != 8 {
		t.Fatalf("first batch of %d; want 8", b.N)
	}
	// The first request is done and three more wait at the gate; a
	// loader that did not fetch ahead would ask for no more.
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		f.mu.Lock()
		asked := len(f.asked)
		f.mu.Unlock()
		if asked >= 4 {
			break
		}
		if time.Now().After(deadline) {
			close(f.gate)
			e.Close()
			t.Fatalf("%d requests asked for while the loader holds the first batch; want 4, fetched ahead", asked)
		}
	}
	close(f.gate)
	n := 1
	if err := e.Each(func(*Batch) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	e.Close()
	if n != l.Batches() {
		t.Fatalf("%d batches; want %d", n, l.Batches())
	}
}

func TestRemoteFetchErrorEndsTheEpoch(t *testing.T) {
	m, tr, _ := testManifest(t)
	lie := errors.New("server gone")
	f := &fakeFetcher{d: tr.Dataset, sm: m.Split("train"), fail: func(idx []int) error {
		if idx[0] == 30 { // the 4th request of an unshuffled epoch
			return lie
		}
		return nil
	}}
	rs, err := m.Remote("train", f, RemoteConfig{RequestSize: 10, Ahead: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	l := &Loader{Split: rs, BatchSize: 10, Sampler: Sampler{N: rs.Len(), World: 1}}
	e, err := l.Epoch(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	got := 0
	err = e.Each(func(*Batch) error { got++; return nil })
	if !errors.Is(err, lie) || got != 3 {
		t.Fatalf("after %d batches: %v; want the fetch's error after the 3 batches it fetched", got, err)
	}
}

func TestRemoteCache(t *testing.T) {
	m, tr, _ := testManifest(t)
	dir := t.TempDir()
	l := func(s *Split) *Loader {
		return &Loader{Split: s, BatchSize: 32, Seed: 2, Sampler: Sampler{N: s.Len(), World: 2, Rank: 0, Seed: 2, Shuffle: true}}
	}
	f := &fakeFetcher{d: tr.Dataset, sm: m.Split("train")}
	rs, err := m.Remote("train", f, RemoteConfig{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	want := epochBatches(t, l(rs), 0)
	if err := rs.Close(); err != nil {
		t.Fatal(err)
	}
	first := f.samples()

	// A restart reads the cache: the same epoch fetches nothing.
	f2 := &fakeFetcher{d: tr.Dataset, sm: m.Split("train")}
	rs2, err := m.Remote("train", f2, RemoteConfig{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	got := epochBatches(t, l(rs2), 0)
	st, _ := rs2.RemoteStats()
	rs2.Close()
	if f2.samples() != 0 || st.Cached != first {
		t.Fatalf("after a restart: fetched %d, cache held %d; want 0 and %d", f2.samples(), st.Cached, first)
	}
	for i := range want {
		if !slices.Equal(got[i].X, want[i].X) {
			t.Fatalf("batch %d from the cache differs", i)
		}
	}

	// A cached sample that was changed is fetched again, not used.
	path := filepath.Join(dir, m.ID()+".train")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := want[0].Index[0]
	off := 0
	for _, x := range m.Split("train").Samples[:i] {
		off += x.Size()
	}
	b[off+3] ^= 0x40
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	f3 := &fakeFetcher{d: tr.Dataset, sm: m.Split("train")}
	rs3, err := m.Remote("train", f3, RemoteConfig{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer rs3.Close()
	got = epochBatches(t, l(rs3), 0)
	if f3.samples() != 1 || !slices.Equal(f3.asked[0], []int{i}) || !slices.Equal(got[0].X, want[0].X) {
		t.Fatalf("with sample %d changed in the cache: asked %v; want that one sample fetched again", i, f3.asked)
	}
	if !bytes.Equal(tr.Image(i).Pix, rs3.Image(i).Pix) {
		t.Fatal("the refetched sample is not the true one")
	}
}

func TestPrefetch(t *testing.T) {
	m, tr, _ := testManifest(t)
	f := &fakeFetcher{d: tr.Dataset, sm: m.Split("train")}
	rs, err := m.Remote("train", f, RemoteConfig{RequestSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	idx := []int{5, 9, 5, 1999, 0}
	if err := rs.Prefetch(context.Background(), idx); err != nil {
		t.Fatal(err)
	}
	for _, i := range idx {
		if !bytes.Equal(rs.Image(i).Pix, tr.Image(i).Pix) {
			t.Fatalf("sample %d not here after Prefetch", i)
		}
	}
	if f.samples() != 4 {
		t.Fatalf("fetched %d samples for 4 distinct ones", f.samples())
	}
	if err := rs.Prefetch(context.Background(), []int{2000}); !errors.Is(err, ErrFormat) {
		t.Fatalf("Prefetch out of range: %v; want ErrFormat", err)
	}
	if err := tr.Prefetch(context.Background(), []int{1, 2}); err != nil {
		t.Fatalf("Prefetch on local files: %v; want nothing to do", err)
	}
}
