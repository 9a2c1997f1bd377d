package data

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/pbnjay/memory"
)

// Fetcher gets samples of a served dataset from the peers that serve it.
type Fetcher interface {
	// Fetch fills pix with the pixels of samples idx of the split, in
	// order, each checked against the manifest; pix is exactly their size.
	Fetch(ctx context.Context, split string, idx []int, pix []byte) error
}

// RemoteConfig says how a served split is fetched.
type RemoteConfig struct {
	// RequestSize is the samples asked for at once (Ember's
	// request_size). Default 256.
	RequestSize int
	// Ahead is how many requests are in flight at once. Default 8.
	Ahead int
	// CacheDir, if set, keeps the fetched samples in a file there named by
	// the dataset's ID, so that a restart reads them locally: what is found
	// there is checked against the manifest and not fetched again.
	CacheDir string
	// OnCacheError hears why the cache stopped being written (a full
	// disk, say); training goes on without it.
	OnCacheError func(error)
	// MaxBytes bounds the split's pixels, all of which a client holds in
	// memory, as it does a local dataset's: a manifest that announces more
	// is refused before any memory is taken for it. Default
	// DefaultMaxBytes. Whatever it says, a split over three quarters of
	// the machine's memory is refused too: a budget of 100 GiB on a
	// 24 GiB machine took a stranger's manifest at its word, and the
	// process died "out of memory" before a sample came.
	MaxBytes int64
	// Memory is the machine's memory in bytes; zero asks the system.
	Memory uint64
}

// DefaultMaxBytes is RemoteConfig.MaxBytes's default: 8 GiB, 170 times
// Fashion-MNIST's training set.
const DefaultMaxBytes = 8 << 30

// ErrTooLarge means a served dataset is larger than this machine allows
// it (RemoteConfig.MaxBytes).
var ErrTooLarge = errors.New("data: dataset over the memory budget")

// remote is a served split on a peer that trains on it: its Dataset's
// pixels arrive as the epochs need them. Every epoch fetches the samples
// of its share that are not here yet, in the order the loader reads them,
// as fast as the servers give them, and the loader waits only for samples
// that have not come.
type remote struct {
	split *SplitManifest
	d     *Dataset
	f     Fetcher
	cfg   RemoteConfig

	mu   sync.Mutex
	have []bool
	// cache is nil without a CacheDir, and once writing it failed.
	cache    *os.File
	fetched  atomic.Int64 // samples fetched
	cacheHit int          // samples the cache held at start
}

// Remote makes a split of the served dataset whose samples f fetches. The
// split's images are zero until fetched; the loader waits for them. Close
// the split when done, to close its cache file.
func (m *Manifest) Remote(split string, f Fetcher, cfg RemoteConfig) (*Split, error) {
	sm := m.Split(split)
	if sm == nil {
		return nil, fmt.Errorf("data: served dataset %s has no %s split: %w", short(m.id), split, ErrConfig)
	}
	if cfg.RequestSize <= 0 {
		cfg.RequestSize = 256
	}
	if cfg.Ahead <= 0 {
		cfg.Ahead = 8
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.Memory == 0 {
		cfg.Memory = memory.TotalMemory()
	}
	total := sm.TotalBytes()
	if total > cfg.MaxBytes {
		return nil, fmt.Errorf("data: served dataset %s: its %s split is %d bytes (%d samples), over this machine's budget of %d bytes: %w",
			short(m.id), split, total, len(sm.Samples), cfg.MaxBytes, ErrTooLarge)
	}
	if room := cfg.Memory / 4 * 3; cfg.Memory > 0 && uint64(total) > room {
		return nil, fmt.Errorf("data: served dataset %s: its %s split is %d bytes (%d samples), over three quarters of this machine's %d bytes of memory: %w",
			short(m.id), split, total, len(sm.Samples), cfg.Memory, ErrTooLarge)
	}
	d := &Dataset{Source: fmt.Sprintf("served dataset %s (%s)", short(m.id), split), Classes: m.Classes,
		pix: make([]uint8, total), index: make([]imageRef, len(sm.Samples)), labels: make([]int32, len(sm.Samples))}
	off := 0
	for i, x := range sm.Samples {
		d.index[i] = imageRef{off: off, h: int32(x.H), w: int32(x.W), c: int32(x.C)}
		d.labels[i] = x.Label
		off += x.Size()
	}
	// Touch every page now, as reading local files does at load: a first
	// write faults a page in, which costs a VM dearly, and would otherwise
	// fall inside the first epoch's steps.
	for i := 0; i < len(d.pix); i += 4096 {
		d.pix[i] = 0
	}
	r := &remote{split: sm, d: d, f: f, cfg: cfg, have: make([]bool, len(sm.Samples))}
	if cfg.CacheDir != "" {
		if err := r.openCache(filepath.Join(cfg.CacheDir, m.id+"."+split)); err != nil {
			return nil, err
		}
	}
	if m.Text { // chunks of bytes, for RemoteText: no transforms, no shape
		return &Split{Dataset: d, Pipeline: &Pipeline{}, C: 1, H: 1, remote: r}, nil
	}
	p, err := NewPipeline(m.Transforms)
	if err != nil {
		r.closeCache()
		return nil, err
	}
	s, err := NewSplit(d, p)
	if err != nil {
		r.closeCache()
		return nil, err
	}
	s.remote = r
	return s, nil
}

// openCache reads what the cache file holds, keeps the samples that match
// the manifest, and keeps the file open to write the rest into.
func (r *remote) openCache(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("data: cache: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("data: cache: %w", err)
	}
	st, err := f.Stat()
	if err == nil && st.Size() == int64(len(r.d.pix)) {
		_, err = f.ReadAt(r.d.pix, 0)
	} else if err == nil {
		// Another size is another layout (or a torn first write): start over.
		err = f.Truncate(int64(len(r.d.pix)))
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("data: cache %s: %w", path, err)
	}
	for i := range r.have {
		im := r.d.Image(i)
		if r.split.Check([]int{i}, im.Pix) == nil {
			r.have[i] = true
			r.cacheHit++
		} else {
			clear(im.Pix)
		}
	}
	r.cache = f
	return nil
}

func (r *remote) closeCache() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cache == nil {
		return nil
	}
	err := r.cache.Close()
	r.cache = nil
	return err
}

// put stores fetched samples, in memory and in the cache.
func (r *remote) put(idx []int, pix []byte) {
	off := 0
	for _, i := range idx {
		im := r.d.Image(i)
		copy(im.Pix, pix[off:off+len(im.Pix)])
		off += len(im.Pix)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cache != nil {
		off = 0
		for _, i := range idx {
			ref := r.d.index[i]
			n := int(ref.h) * int(ref.w) * int(ref.c)
			if _, err := r.cache.WriteAt(pix[off:off+n], int64(ref.off)); err != nil {
				r.cache.Close()
				r.cache = nil
				if r.cfg.OnCacheError != nil {
					r.cfg.OnCacheError(fmt.Errorf("data: cache of %s: %w; going on without it", r.d.Source, err))
				}
				break
			}
			off += n
		}
	}
	for _, i := range idx {
		r.have[i] = true
	}
}

// fetchRun is one epoch's fetching: requests in the order the loader
// reads, each one's first position in the epoch's order, and how far the
// loader may read.
type fetchRun struct {
	first []int // position in the epoch of each request's first sample
	n     int   // positions in the epoch

	mu      sync.Mutex
	done    []bool
	next    int           // requests done, counted from the first without a gap
	err     error         // the failure of the earliest request that failed
	errAt   int           // that request
	changed chan struct{} // closed and replaced when next or err changes
}

// start begins fetching the samples of idx that are not here yet, in
// order, with up to Ahead requests in flight; the goroutine is wg's.
func (r *remote) start(ctx context.Context, idx []int, wg *sync.WaitGroup) *fetchRun {
	var reqs [][]int
	fr := &fetchRun{n: len(idx), changed: make(chan struct{})}
	r.mu.Lock()
	queued := make([]bool, len(r.have))
	var cur []int
	for p, i := range idx {
		if r.have[i] || queued[i] {
			continue
		}
		queued[i] = true
		if len(cur) == 0 {
			fr.first = append(fr.first, p)
		}
		cur = append(cur, i)
		if len(cur) == r.cfg.RequestSize {
			reqs, cur = append(reqs, cur), nil
		}
	}
	r.mu.Unlock()
	if len(cur) > 0 {
		reqs = append(reqs, cur)
	}
	fr.done = make([]bool, len(reqs))
	wg.Go(func() { fr.run(ctx, r, reqs) })
	return fr
}

func (fr *fetchRun) run(ctx context.Context, r *remote, reqs [][]int) {
	// One buffer per request in flight, reused: fresh ones would be
	// garbage, and memory faulted in anew for every request.
	free := make(chan []byte, r.cfg.Ahead)
	for range r.cfg.Ahead {
		free <- nil
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for k, req := range reqs {
		var buf []byte
		select {
		case buf = <-free:
		case <-ctx.Done():
			fr.finish(k, ctx.Err())
			return
		}
		if fr.failed() {
			// The requests before it finish, so that the loader gets
			// every batch it can before the error.
			return
		}
		wg.Go(func() {
			n, err := r.split.Bytes(req)
			if cap(buf) < n {
				buf = make([]byte, n)
			}
			defer func() { free <- buf }()
			if err == nil {
				pix := buf[:n]
				if err = r.f.Fetch(ctx, r.split.Name, req, pix); err == nil {
					r.put(req, pix)
					r.fetched.Add(int64(len(req)))
				}
			}
			fr.finish(k, err)
		})
	}
}

func (fr *fetchRun) failed() bool {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	return fr.err != nil
}

// finish records request k's end.
func (fr *fetchRun) finish(k int, err error) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if err != nil {
		if fr.err == nil || k < fr.errAt {
			fr.err, fr.errAt = err, k
			close(fr.changed)
			fr.changed = make(chan struct{})
		}
		return
	}
	fr.done[k] = true
	moved := false
	for fr.next < len(fr.done) && fr.done[fr.next] {
		fr.next++
		moved = true
	}
	if moved {
		close(fr.changed)
		fr.changed = make(chan struct{})
	}
}

// wait returns once the samples at positions [0, hi) of the epoch are
// here, or with the error of a failed request they need, or the context's.
// Requests before a failed one go on, so the batches they fill still come.
func (fr *fetchRun) wait(ctx context.Context, hi int) error {
	for {
		fr.mu.Lock()
		ready := fr.n
		if fr.next < len(fr.first) {
			ready = fr.first[fr.next]
		}
		err, changed := fr.err, fr.changed
		needsFailed := err != nil && hi > fr.first[fr.errAt]
		fr.mu.Unlock()
		if ready >= hi {
			return nil
		}
		if needsFailed {
			return fmt.Errorf("data: fetching served samples: %w", err)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// RemoteStats says what a served split fetched.
type RemoteStats struct {
	Fetched int // samples fetched from servers
	Cached  int // samples the cache held at start
	Here    int // samples in memory now
	Total   int
}

// RemoteStats reports a served split's fetching; ok is false for a split
// of local files.
func (s *Split) RemoteStats() (st RemoteStats, ok bool) {
	r := s.remote
	if r == nil {
		return st, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range r.have {
		if h {
			st.Here++
		}
	}
	st.Fetched, st.Cached, st.Total = int(r.fetched.Load()), r.cacheHit, len(r.have)
	return st, true
}

// Close closes a served split's cache file; for local files it does
// nothing.
func (s *Split) Close() error {
	if s.remote == nil {
		return nil
	}
	if err := s.remote.closeCache(); err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("data: cache: %w", err)
	}
	return nil
}

// Prefetch fetches the samples idx of a served split that are not here
// yet, as an epoch would, and returns once they are all here; for local
// files it does nothing. It warms a cache, and it is how the served path's
// own speed is measured.
func (s *Split) Prefetch(ctx context.Context, idx []int) error {
	if s.remote == nil {
		return nil
	}
	for _, i := range idx {
		if i < 0 || i >= s.Len() {
			return fmt.Errorf("data: prefetch of sample %d of %d: %w", i, s.Len(), ErrFormat)
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	return s.remote.start(ctx, idx, &wg).wait(ctx, len(idx))
}
