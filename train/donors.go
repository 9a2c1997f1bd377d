package train

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
)

// partHashBytes is how much of a part's SHA-256 the donors compare.
const partHashBytes = 8

// maxDonorTensors bounds the tensors whose part hashes go round: a model's
// parameters and an optimizer's two state tensors each, with room to
// spare.
const maxDonorTensors = 1 << 12

// donorParts splits n values among d donors: part k is [cut[k], cut[k+1]).
// Every rank computes the same cuts from the same n and d.
func donorParts(n, d int) []int {
	cut := make([]int, d+1)
	for k := range cut {
		cut[k] = n * k / d
	}
	return cut
}

// donorCounts are the segments of one ring allgather that stripes a
// tensor of n values over the donors (ascending ranks of a ring of size):
// donor k's part at its rank, nothing elsewhere. Since the donors are in
// rank order, the segments laid end to end are the tensor itself.
func donorCounts(n, size int, donors []int) []int {
	cut := donorParts(n, len(donors))
	counts := make([]int, size)
	for k, rank := range donors {
		counts[rank] = cut[k+1] - cut[k]
	}
	return counts
}

// partHashes is each tensor's parts' hashes, tensor after tensor.
func partHashes(ts [][]float32, d int) []byte {
	out := make([]byte, 0, partHashBytes*d*len(ts))
	for _, t := range ts {
		cut := donorParts(len(t), d)
		for k := range d {
			h := sha256.Sum256(f32Bytes(t[cut[k]:cut[k+1]]))
			out = append(out, h[:partHashBytes]...)
		}
	}
	return out
}

// DirectLinker opens streams between this rank and others of its ring,
// outside the ring (p2p.Membership has it).
type DirectLinker interface {
	// DirectLinks opens a stream to each rank of to and takes one from
	// each rank of from; all come, or none. Those ranks call it at the
	// same time with this rank in their from and to.
	DirectLinks(ctx context.Context, to, from []int) ([]io.WriteCloser, []io.ReadCloser, error)
}

// directLinks are one rank's streams of a state transfer: a donor's to
// every rank that takes the state, or a taker's from every donor.
type directLinks struct {
	out []io.WriteCloser
	in  []io.ReadCloser
}

// openDirect opens the streams of a transfer from donors to the other
// ranks, when the Replica has Direct and some rank takes the state; nil
// otherwise (the ring carries it).
func (r *Replica) openDirect(ctx context.Context, donors []int) (*directLinks, error) {
	size, rank := r.Coll.Size(), r.Coll.Rank()
	if r.Direct == nil || len(donors) >= size {
		return nil, nil
	}
	var takers []int
	for k := range size {
		if !slices.Contains(donors, k) {
			takers = append(takers, k)
		}
	}
	l := &directLinks{}
	var err error
	if slices.Contains(donors, rank) {
		l.out, _, err = r.Direct.DirectLinks(ctx, takers, nil)
	} else {
		_, l.in, err = r.Direct.DirectLinks(ctx, nil, donors)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: links from the donors %v to the ranks taking their state: %w", ErrCollective, donors, err)
	}
	return l, nil
}

// close closes every stream.
func (l *directLinks) close() {
	if l == nil {
		return
	}
	for _, w := range l.out {
		w.Close()
	}
	for _, c := range l.in {
		c.Close()
	}
}

// sendDirect is takeState over direct links: each donor writes its part
// of every tensor, tensor after tensor, to every taker at once, and each
// taker reads every donor's parts at once into ts — exactly the bytes its
// own shapes say, so a donor can send no more — hashing what came. The
// donors' part hashes are then compared over the ring (agreeOnParts), as
// after an allgather. ctx's end closes the streams under a transfer that
// stalls.
func (r *Replica) sendDirect(ctx context.Context, donors []int, ts [][]float32, l *directLinks) error {
	d := len(donors)
	me := slices.Index(donors, r.Coll.Rank())
	want := partHashBytes * d * len(ts)
	stop := context.AfterFunc(ctx, l.close)
	defer stop()
	var mine []byte
	var got [][]byte
	var wg sync.WaitGroup
	errs := make([]error, max(len(l.out), len(l.in)))
	if me >= 0 {
		wg.Go(func() { mine = partHashes(ts, d) })
		for j, w := range l.out {
			wg.Go(func() {
				for _, t := range ts {
					cut := donorParts(len(t), d)
					if _, err := w.Write(f32Bytes(t[cut[me]:cut[me+1]])); err != nil {
						errs[j] = err
						return
					}
				}
			})
		}
	} else {
		got = make([][]byte, len(ts))
		for i := range got {
			got[i] = make([]byte, d*partHashBytes)
		}
		for k, in := range l.in {
			wg.Go(func() { errs[k] = receivePart(in, ts, d, k, got) })
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: the state over direct links: %w", ErrCollective, err)
	}
	return r.agreeOnParts(ctx, donors, mine, want, got)
}

// receiveChunk is how much of a part is read before it is handed to the
// hasher: small enough that hashing keeps up with the link, so that the
// sender is not held while a whole part is hashed.
const receiveChunk = 1 << 20

// receivePart reads donor k's part of every tensor of ts (of d donors)
// from in, into the tensors, and its hash into got[i] at k's place; the
// hashing runs beside the reading, a chunk behind.
func receivePart(in io.Reader, ts [][]float32, d, k int, got [][]byte) error {
	type chunk struct {
		i    int
		b    []byte
		last bool
	}
	chunks := make(chan chunk, 8)
	hashed := make(chan struct{})
	go func() {
		defer close(hashed)
		h := sha256.New()
		for c := range chunks {
			h.Write(c.b)
			if c.last {
				copy(got[c.i][k*partHashBytes:], h.Sum(nil)[:partHashBytes])
				h.Reset()
			}
		}
	}()
	defer func() { close(chunks); <-hashed }()
	for i, t := range ts {
		cut := donorParts(len(t), d)
		part := f32Bytes(t[cut[k]:cut[k+1]])
		for at := 0; ; at += receiveChunk {
			b := part[at:min(at+receiveChunk, len(part))]
			if _, err := io.ReadFull(in, b); err != nil {
				return fmt.Errorf("from donor %d of %d: %w", k+1, d, err)
			}
			last := at+receiveChunk >= len(part)
			chunks <- chunk{i, b, last}
			if last {
				break
			}
		}
	}
	return nil
}

// takeState gives every rank the donors' tensors ts — the donors, ranks
// in ascending order that hold them alike, send them; the others' are
// overwritten. Over direct links (openDirect), each donor sends its part
// of every tensor straight to every rank that takes them (sendDirect).
// Else, where the Collective has a ring allgather and there are
// several donors, each donor sends an equal part of every tensor, all at
// once in one allgather per tensor: a newcomer's state comes from every
// donor, no one of them sending it all. Each part is checked against the
// hash the donors agree it has (each donor hashes every part of its own
// copy while the tensors travel, and the hashes are gathered after): a
// rank that takes them names a donor whose part does not match; a donor,
// as a broadcast's root does, keeps its own tensors and checks nothing it
// forwards. Where every rank is a donor only the hashes go round, and
// must agree. With one donor, or no allgather, the first donor
// broadcasts the tensors; the caller checks what it can (the parameters'
// hash): checked says whether the parts were checked here.
func (r *Replica) takeState(ctx context.Context, donors []int, ts [][]float32, direct *directLinks) (checked bool, err error) {
	if direct != nil && len(ts) <= maxDonorTensors {
		return true, r.sendDirect(ctx, donors, ts, direct)
	}
	ag, ok := r.Coll.(Allgatherer)
	if !ok || len(donors) < 2 || len(ts) > maxDonorTensors {
		return false, r.broadcastTensors(ctx, ts, donors[0])
	}
	return true, r.stripeState(ctx, ag, donors, ts)
}

// stripeState is takeState over the ring's allgather: see there.
func (r *Replica) stripeState(ctx context.Context, ag Allgatherer, donors []int, ts [][]float32) error {
	size, rank, d := r.Coll.Size(), r.Coll.Rank(), len(donors)
	me := slices.Index(donors, rank)
	want := partHashBytes * d * len(ts)
	if me >= 0 && size == d { // every rank holds the state: compare hashes alone
		return r.agreeOnParts(ctx, donors, partHashes(ts, d), want, nil)
	}
	// The parts are hashed while the tensors travel, on both sides, and
	// the hashes compared after. Every rank goes through every tensor's allgather,
	// lie or not, so that none waits in one the others have left. A
	// donor sends its part from a copy and keeps its own tensors whatever
	// comes.
	var wg sync.WaitGroup
	defer wg.Wait()
	var mine []byte
	var got [][]byte // on a rank that takes the tensors
	if me >= 0 {
		wg.Go(func() { mine = partHashes(ts, d) })
	} else {
		got = make([][]byte, len(ts))
	}
	var scratch []float32
	for i, t := range ts {
		into := t
		if me >= 0 {
			scratch = grow(scratch, len(t))
			cut := donorParts(len(t), d)
			into = scratch
			copy(into[cut[me]:cut[me+1]], t[cut[me]:cut[me+1]])
		}
		if err := ag.Allgather(ctx, into, donorCounts(len(t), size, donors)); err != nil {
			return fmt.Errorf("%w: taking tensor %d from %d donors: %w", ErrCollective, i, d, err)
		}
		if me < 0 {
			wg.Go(func() { got[i] = partHashes([][]float32{t}, d) })
		}
	}
	wg.Wait()
	return r.agreeOnParts(ctx, donors, mine, want, got)
}

// agreeOnParts gathers the donors' part hashes (mine, on a donor) and,
// on a rank that took the tensors, checks the hashes of what came (got,
// tensor by tensor) against the ones the donors agree on: the first
// donor whose part does not match is named.
func (r *Replica) agreeOnParts(ctx context.Context, donors []int, mine []byte, want int, got [][]byte) error {
	hashes, err := allgatherBytes(ctx, r.Coll, mine, want)
	if err != nil {
		return fmt.Errorf("%w: gathering the donors' part hashes: %w", ErrCollective, err)
	}
	agreed, err := agreedParts(hashes, donors, want)
	if err != nil {
		return err
	}
	d := len(donors)
	for i, g := range got {
		for k, from := range donors {
			at := (i*d + k) * partHashBytes
			if !bytes.Equal(g[k*partHashBytes:(k+1)*partHashBytes], agreed[at:at+partHashBytes]) {
				return &LiarError{Ranks: []int{from}, Why: fmt.Sprintf("part %d of %d of state tensor %d that it sent does not match the hash the donors agree on", k+1, d, i)}
			}
		}
	}
	return nil
}

// agreedParts is, for every part, the hash most donors gave: each donor
// must give one for every part, and a donor that disagrees with the
// others is named; where no hash has a majority, no one can be.
func agreedParts(hashes [][]byte, donors []int, want int) ([]byte, error) {
	var bad []int
	for k, h := range hashes {
		if isDonor := slices.Contains(donors, k); isDonor && len(h) != want || !isDonor && len(h) != 0 {
			bad = append(bad, k)
		}
	}
	if len(bad) > 0 {
		return nil, &LiarError{Ranks: bad, Why: fmt.Sprintf("they send part hashes of the wrong length (want %d bytes from each donor %v, none from the others)", want, donors)}
	}
	agreed := make([]byte, want)
	for at := 0; at < want; at += partHashBytes {
		of := func(k int) string { return string(hashes[k][at : at+partHashBytes]) }
		odd, majority := oddOnes(donors, of)
		if len(odd) > 0 && !majority {
			return nil, fmt.Errorf("train: the donors %v disagree on a part of the state, and no majority tells which are right", donors)
		}
		if len(odd) > 0 {
			return nil, &LiarError{Ranks: odd, Why: "their state's part hashes differ from the other donors'"}
		}
		copy(agreed[at:], hashes[donors[0]][at:at+partHashBytes])
	}
	return agreed, nil
}
