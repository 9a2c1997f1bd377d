package data

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
)

// Batch is a batch of samples as the model takes them.
type Batch struct {
	// X holds N samples of C×H×W float32s, contiguous, NCHW; a text
	// batch's, N windows of byte values; a table's, N rows of C features
	// and then the table's targets.
	X []float32
	// Y holds the labels; a text batch's, each window's next bytes, N×W.
	Y []int
	// Index holds the samples' dataset indices.
	Index      []int
	N, C, H, W int
}

// Loader turns a Split into batches for one rank, prepared in the
// background a bounded number of batches ahead.
type Loader struct {
	Split   *Split
	Sampler Sampler
	// BatchSize is the samples per batch on this rank. The last batch of
	// an epoch may be smaller; every rank gets the same number of batches.
	BatchSize int
	// Prefetch is how many batches are prepared ahead; zero means 2.
	Prefetch int
	// Seed seeds the random transforms, with the epoch and the sample's
	// dataset index, so a run repeats exactly whatever the world size.
	Seed uint64
}

// Batches returns how many batches an epoch has on each rank.
func (l *Loader) Batches() int {
	return (l.Sampler.NumSamples() + l.BatchSize - 1) / l.BatchSize
}

// Epoch is one pass over a rank's share. Next must not be called from
// more than one goroutine.
type Epoch struct {
	l       *Loader
	out     chan result
	free    chan *Batch
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	current *Batch
	ctx     context.Context
	// complete is set by the producer once every batch is out, before it
	// closes out: an end without it was a cancellation.
	complete bool
}

type result struct {
	b   *Batch
	err error
}

// Epoch starts preparing the epoch's batches. Close it when done.
func (l *Loader) Epoch(ctx context.Context, epoch int) (*Epoch, error) {
	if l.BatchSize < 1 {
		return nil, fmt.Errorf("data: batch size %d; want at least 1", l.BatchSize)
	}
	idx, err := l.Sampler.Indices(epoch)
	if err != nil {
		return nil, err
	}
	prefetch := l.Prefetch
	if prefetch <= 0 {
		prefetch = 2
	}
	ctx, cancel := context.WithCancel(ctx)
	e := &Epoch{l: l, out: make(chan result, prefetch), free: make(chan *Batch, prefetch+1), cancel: cancel, ctx: ctx}
	// prefetch+1 buffers: prefetch ready or being filled, one with the caller.
	sz := l.Split.Values()
	ys := 1 // labels per sample
	if t := l.Split.Text; t != nil {
		if t.Context < 1 {
			cancel()
			return nil, fmt.Errorf("data: %s: windows of no context; SetContext first: %w", t.Source, ErrConfig)
		}
		ys = t.Context
	}
	for range prefetch + 1 {
		e.free <- &Batch{X: make([]float32, 0, l.BatchSize*sz), Y: make([]int, 0, l.BatchSize*ys), Index: make([]int, 0, l.BatchSize)}
	}
	var fill fillFunc
	switch {
	case l.Split.Text != nil:
		fill = e.windows(epoch)
	case l.Split.Table != nil:
		fill = e.rows()
	default:
		fill = e.images(ctx, idx, epoch)
	}
	e.wg.Go(func() { e.produce(ctx, idx, fill) })
	return e, nil
}

// fillFunc fills b with the samples chunk, the lo-th of the epoch's
// indices onwards.
type fillFunc func(ctx context.Context, b *Batch, lo int, chunk []int) error

// produce fills the epoch's batches in order, until the last, the first
// error (which it hands on as the batch's) or the context's end.
func (e *Epoch) produce(ctx context.Context, idx []int, fill fillFunc) {
	defer close(e.out)
	for lo := 0; lo < len(idx); lo += e.l.BatchSize {
		var b *Batch
		select {
		case b = <-e.free:
		case <-ctx.Done():
			return
		}
		chunk := idx[lo:min(lo+e.l.BatchSize, len(idx))]
		s := e.l.Split
		b.N, b.C, b.H, b.W, b.Index = len(chunk), s.C, s.H, s.W, append(b.Index[:0], chunk...)
		err := fill(ctx, b, lo, chunk)
		select {
		case e.out <- result{b, err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
	e.complete = true
}

// images fills a batch with images through the split's transforms,
// waiting for a served split's samples to arrive.
func (e *Epoch) images(ctx context.Context, idx []int, epoch int) fillFunc {
	s := e.l.Split
	sz := s.C * s.H * s.W
	var ws Workspace
	var fetch *fetchRun
	if s.remote != nil {
		fetch = s.remote.start(ctx, idx, &e.wg)
	}
	return func(ctx context.Context, b *Batch, lo int, chunk []int) error {
		b.X, b.Y = b.X[:len(chunk)*sz], b.Y[:0]
		if fetch != nil {
			if err := fetch.wait(ctx, lo+len(chunk)); err != nil {
				return err
			}
		}
		return fillImages(s, &ws, b, chunk, e.l.Seed, epoch)
	}
}

// fillImages puts the images chunk through s's transforms into b.X, which
// holds len(chunk) of them, and appends their labels to b.Y.
func fillImages(s *Split, ws *Workspace, b *Batch, chunk []int, seed uint64, epoch int) error {
	sz := s.C * s.H * s.W
	for k, i := range chunk {
		if err := s.Pipeline.Apply(ws, s.Image(i), b.X[k*sz:(k+1)*sz], seed, epoch, i); err != nil {
			return fmt.Errorf("%s: %w", s.Name(i), err)
		}
		b.Y = append(b.Y, s.Label(i))
	}
	return nil
}

// ErrNotLocal means Fill was asked for samples of a split served from
// elsewhere, whose samples a rank holds only for its own share.
var ErrNotLocal = errors.New("data: the split is served, not held here")

// Fill makes b the batch of the dataset indices idx as epoch's batches
// hold them (the same transforms, windows or rows, the same values) —
// any rank's batch, given its indices, from a split held in memory. A
// served split's is ErrNotLocal.
func (l *Loader) Fill(b *Batch, epoch int, idx []int) error {
	s := l.Split
	if s.remote != nil {
		return fmt.Errorf("data: %d samples asked for: %w", len(idx), ErrNotLocal)
	}
	for _, i := range idx {
		if i < 0 || i >= s.Len() {
			return fmt.Errorf("data: sample %d of a split of %d", i, s.Len())
		}
	}
	n := len(idx)
	b.N, b.C, b.H, b.W, b.Index = n, s.C, s.H, s.W, append(b.Index[:0], idx...)
	w := s.Values()
	switch {
	case s.Text != nil:
		c := s.Text.Context
		off := s.Text.Offset(l.Seed, epoch, l.Sampler.Shuffle)
		b.X, b.Y = slices.Grow(b.X[:0], n*c)[:n*c], slices.Grow(b.Y[:0], n*c)[:n*c]
		for k, i := range idx {
			s.Text.Window(i, off, b.X[k*c:(k+1)*c], b.Y[k*c:(k+1)*c])
		}
	case s.Table != nil:
		b.X, b.Y = slices.Grow(b.X[:0], n*w)[:n*w], slices.Grow(b.Y[:0], n)[:n]
		clear(b.Y)
		for k, i := range idx {
			copy(b.X[k*w:(k+1)*w], s.Table.Row(i))
		}
	default:
		var ws Workspace
		b.X, b.Y = slices.Grow(b.X[:0], n*w)[:n*w], b.Y[:0]
		return fillImages(s, &ws, b, idx, l.Seed, epoch)
	}
	return nil
}

// windows fills a batch of a text split: each index is a window of the
// epoch's offset.
func (e *Epoch) windows(epoch int) fillFunc {
	t := e.l.Split.Text
	off := t.Offset(e.l.Seed, epoch, e.l.Sampler.Shuffle)
	n := t.Context
	return func(_ context.Context, b *Batch, _ int, chunk []int) error {
		b.X, b.Y = b.X[:len(chunk)*n], b.Y[:len(chunk)*n]
		for k, i := range chunk {
			t.Window(i, off, b.X[k*n:(k+1)*n], b.Y[k*n:(k+1)*n])
		}
		return nil
	}
}

// rows fills a batch of a table: each index is a row, features then
// targets; every label is 0.
func (e *Epoch) rows() fillFunc {
	s := e.l.Split
	w := s.Values()
	return func(_ context.Context, b *Batch, _ int, chunk []int) error {
		b.X, b.Y = b.X[:len(chunk)*w], b.Y[:len(chunk)]
		clear(b.Y)
		for k, i := range chunk {
			copy(b.X[k*w:(k+1)*w], s.Table.Row(i))
		}
		return nil
	}
}

// Next returns the next batch, valid until the next call of Next or Close,
// or io.EOF after the last; if the epoch's context ends first, its error.
func (e *Epoch) Next() (*Batch, error) {
	if e.current != nil {
		e.free <- e.current
		e.current = nil
	}
	r, ok := <-e.out
	if !ok {
		if !e.complete && e.ctx.Err() != nil {
			return nil, fmt.Errorf("data: epoch stopped before its last batch: %w", context.Cause(e.ctx))
		}
		return nil, io.EOF
	}
	if r.err != nil {
		return nil, r.err
	}
	e.current = r.b
	return r.b, nil
}

// Each calls f with every remaining batch of the epoch, in order, and
// returns f's first error or the loader's; the end of the epoch is nil, and
// a cancelled epoch is the context's error, not an end.
func (e *Epoch) Each(f func(*Batch) error) error {
	for {
		b, err := e.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := f(b); err != nil {
			return err
		}
	}
}

// Close stops the background work and waits for it.
func (e *Epoch) Close() {
	e.cancel()
	e.wg.Wait()
}
