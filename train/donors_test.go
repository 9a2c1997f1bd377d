package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

func TestDonorCounts(t *testing.T) {
	for _, tc := range []struct {
		n, size int
		donors  []int
		want    []int
	}{
		{10, 5, []int{0, 2, 3}, []int{3, 0, 3, 4, 0}},
		{10, 3, []int{1}, []int{0, 10, 0}},
		{2, 4, []int{0, 1, 2, 3}, []int{0, 1, 0, 1}},
		{0, 2, []int{0, 1}, []int{0, 0}},
	} {
		got := donorCounts(tc.n, tc.size, tc.donors)
		if !slices.Equal(got, tc.want) {
			t.Errorf("donorCounts(%d, %d, %v) = %v; want %v", tc.n, tc.size, tc.donors, got, tc.want)
		}
		sum := 0
		for _, c := range got {
			sum += c
		}
		if sum != tc.n {
			t.Errorf("donorCounts(%d, %d, %v) sums to %d", tc.n, tc.size, tc.donors, sum)
		}
	}
}

// striping records the segments of each allgather that passes, and, when
// tamper is set, alters this rank's own segment as it sends it.
type striping struct {
	Collective
	mu     sync.Mutex
	counts [][]int
	tamper bool
}

func (s *striping) Allgather(ctx context.Context, buf []float32, counts []int) error {
	s.mu.Lock()
	s.counts = append(s.counts, slices.Clone(counts))
	s.mu.Unlock()
	if s.tamper && counts[s.Rank()] > 1 {
		off := 0
		for _, c := range counts[:s.Rank()] {
			off += c
		}
		buf[off] += 1
	}
	return s.Collective.(Allgatherer).Allgather(ctx, buf, counts)
}

// pipeNet is an in-memory DirectLinker for n ranks: a pipe for each
// ordered pair, made by whichever end asks first. A rank in tamper alters
// the first byte of every write it makes.
type pipeNet struct {
	mu     sync.Mutex
	pipes  map[[2]int]*pipePair
	tamper int
}

type pipePair struct {
	r *io.PipeReader
	w *io.PipeWriter
}

func (p *pipeNet) pair(from, to int) *pipePair {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := [2]int{from, to}
	if p.pipes[k] == nil {
		r, w := io.Pipe()
		p.pipes[k] = &pipePair{r, w}
	}
	return p.pipes[k]
}

// rank is rank's end of the net.
type rankLinks struct {
	net  *pipeNet
	rank int
}

func (l rankLinks) DirectLinks(_ context.Context, to, from []int) ([]io.WriteCloser, []io.ReadCloser, error) {
	var out []io.WriteCloser
	var in []io.ReadCloser
	for _, k := range to {
		w := io.WriteCloser(l.net.pair(l.rank, k).w)
		if l.rank == l.net.tamper {
			w = tamperer{w}
		}
		out = append(out, w)
	}
	for _, k := range from {
		in = append(in, l.net.pair(k, l.rank).r)
	}
	return out, in, nil
}

// tamperer flips a bit of the first byte of each write.
type tamperer struct{ io.WriteCloser }

func (t tamperer) Write(b []byte) (int, error) {
	c := slices.Clone(b)
	if len(c) > 0 {
		c[0] ^= 1
	}
	return t.WriteCloser.Write(c)
}

// donorsRun runs takeState on n ranks over an in-memory ring: the donors
// hold the same random tensors (rank odd, if ≥ 0, others), the rest zeros
// of the same shapes; rank tamper alters what it sends. With direct, the
// donors send over in-memory links of their own (DirectLinker). It
// returns each rank's tensors and error, and the segments each rank's
// allgathers had.
func donorsRun(t *testing.T, n int, donors []int, odd, tamper int, direct bool) ([][][]float32, []error, [][][]int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(5, 5))
	shape := []int{37, 5, 1, 130}
	ref := make([][]float32, len(shape))
	for i, l := range shape {
		ref[i] = make([]float32, l)
		for j := range ref[i] {
			ref[i][j] = float32(rng.NormFloat64())
		}
	}
	rings := memRings(t, n)
	ts := make([][][]float32, n)
	errs := make([]error, n)
	colls := make([]*striping, n)
	net := &pipeNet{pipes: map[[2]int]*pipePair{}, tamper: tamper}
	onAll(n, func(i int) error {
		colls[i] = &striping{Collective: rings[i], tamper: i == tamper}
		ts[i] = make([][]float32, len(shape))
		for k, l := range shape {
			ts[i][k] = make([]float32, l)
			if slices.Contains(donors, i) {
				copy(ts[i][k], ref[k])
				if i == odd {
					ts[i][k][0] -= 2
				}
			}
		}
		rep := NewReplica(newMLP(t, mlpCfg(4, []int{3}, 2, 2, 1)), &SGD{LR: 0.1}, colls[i])
		if direct {
			rep.Direct = rankLinks{net, i}
		}
		links, err := rep.openDirect(context.Background(), donors)
		if err != nil {
			errs[i] = err
			return nil
		}
		defer links.close()
		_, errs[i] = rep.takeState(context.Background(), donors, ts[i], links)
		return nil
	})
	segs := make([][][]int, n)
	for i, c := range colls {
		segs[i] = c.counts
	}
	return ts, errs, segs
}

// TestStateFromManyDonors: a newcomer and a rank behind take every tensor
// from three donors at once — each donor's part in its own segment of one
// allgather per tensor, or over direct links — bit for bit; the donors
// keep theirs.
func TestStateFromManyDonors(t *testing.T) {
	donors := []int{0, 1, 3}
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprint("direct=", direct), func(t *testing.T) {
			ts, errs, segs := donorsRun(t, 5, donors, -1, -1, direct)
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			for i := range ts {
				if !slices.EqualFunc(ts[i], ts[0], slices.Equal[[]float32]) {
					t.Errorf("rank %d's tensors differ from donor 0's", i)
				}
			}
			if direct {
				// The ring carries the part hashes alone.
				if got := len(segs[2]); got != 1 {
					t.Errorf("%d allgathers; want 1 of hashes", got)
				}
				return
			}
			// One allgather a tensor, then one of the part hashes.
			if got := len(segs[2]); got != 4+1 {
				t.Fatalf("%d allgathers; want 4 of tensors and 1 of hashes", got)
			}
			if want := []int{12, 12, 0, 13, 0}; !slices.Equal(segs[2][0], want) {
				t.Errorf("the first tensor's segments %v; want %v (37 values over 3 donors)", segs[2][0], want)
			}
		})
	}
}

// TestDonorsThatDisagreeOrLie: a donor that holds other values than the
// others is named on every rank; one that sends its part altered, on
// every rank that takes it; the donors' own tensors are not touched. When every rank is a
// donor, nothing but the hashes moves.
func TestDonorsThatDisagreeOrLie(t *testing.T) {
	donors := []int{0, 1, 3}
	for _, tc := range []struct {
		name        string
		odd, tamper int
		direct      bool
	}{{"holds other values", 1, -1, false}, {"alters its part", -1, 1, false},
		{"holds other values, direct", 1, -1, true}, {"alters its part, direct", -1, 1, true}} {
		ts, errs, _ := donorsRun(t, 5, donors, tc.odd, tc.tamper, tc.direct)
		for i, err := range errs {
			if i == 1 || tc.tamper >= 0 && slices.Contains(donors, i) {
				continue // the liar; donors check nothing they forward
			}
			var liar *LiarError
			if !errors.As(err, &liar) || !slices.Equal(liar.Ranks, []int{1}) {
				t.Errorf("%s: rank %d: %v; want rank 1 named", tc.name, i, err)
			}
		}
		if ts[0][0][0] != ts[3][0][0] || ts[0][0][0] == ts[1][0][0] && tc.odd == 1 {
			t.Errorf("%s: the honest donors' tensors changed", tc.name)
		}
	}
	_, errs, segs := donorsRun(t, 3, []int{0, 1, 2}, -1, -1, true)
	if err := errors.Join(errs...); err != nil || len(segs[0]) != 1 {
		t.Errorf("every rank a donor: %v, %d allgathers; want no error and the hashes' alone", err, len(segs[0]))
	}
	_, errs, _ = donorsRun(t, 3, []int{0, 1, 2}, 2, -1, true)
	var liar *LiarError
	if !errors.As(errs[0], &liar) || !slices.Equal(liar.Ranks, []int{2}) {
		t.Errorf("every rank a donor, rank 2 odd: %v; want rank 2 named", errs[0])
	}
}
