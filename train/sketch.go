package train

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train/vec"
)

// Sketch checks the gradients of every-step rings, where no rank sees
// another's contribution: each rank sends, in the step's trailer, a
// linear sketch of its gradients — Dims values, each the sum of the
// gradient's entries in one random bucket with random signs (a count
// sketch) drawn from a seed every rank of the ring shares — so every rank
// holds every rank's sketch after the allreduce.
//
// Because the sketch is linear, the sketch of the ring's average must be
// the average of the ranks' sketches: a member that alters what it
// forwards while the ring sums makes them differ, and every rank skips
// the step (ErrTampered). And a rank whose gradients are far off —
// scaled, noise — shows in its sketches: summed over Window steps of one
// projection, a rank's sketch farther than NameAbove τ from the
// coordinate-wise median in NameAfter windows in a row is named (a
// LiarError: Run drops it, as any liar), where at least four ranks had
// samples in the window. A rank whose sketch comes back bit for bit
// NameAfter steps in a row within a window is named for a replay. With
// the norm guard on, a rank whose gradients it keeps out NameAfter steps
// in a row is named too. Direction names no one here: honest gradients
// of a few steps on shards that differ point apart too often. It only
// picks whom audits (AuditEvery, SuspectBelow) look at, and they name a
// flipped rank.
type Sketch struct {
	// Dims is the values in a rank's sketch; 0 is 32.
	Dims int
	// Window is the steps whose sketches are summed before the ranks are
	// judged; 0 is 16.
	Window int
	// NameAfter, above 0, names a rank that stood apart in this many
	// windows in a row; 0 never names.
	NameAfter int
	// NameAbove is the distance from the median, in units of τ (twice
	// the median distance), past which a rank stands apart; 0 is 3.
	NameAbove float64
	// AuditEvery, above 0, has every rank recompute one rank's gradients
	// at one step in AuditEvery on average (audits.go): a rank whose
	// sketch is not its batch's gradients' is named at once. As many
	// again, on average, go to suspects (SuspectBelow), and with the norm
	// guard on, every rank over its bound is audited.
	AuditEvery int
	// SuspectBelow is the lean — the running mean of a rank's cosine
	// against the others' sum, step by step — below which a rank is
	// audited at once, where the audits' budget allows; 0 is −0.3, −1
	// audits no suspect.
	SuspectBelow float64
}

// ErrTampered means the ring's average of the gradients is not the
// average of the ranks' own, as their sketches say: a member altered what
// it forwarded. Every rank skips the step.
var ErrTampered = errors.New("train: the ring's average does not match the ranks' sketches")

// Validate says what is wrong with the settings.
func (c *Sketch) Validate() error {
	if c.Dims < 0 || c.Dims > 1024 || c.Window < 0 || c.Window > 1<<20 || c.NameAfter < 0 || c.NameAfter > 1000 ||
		!(c.NameAbove >= 0 && c.NameAbove <= 1e6) {
		return fmt.Errorf("train: sketches of %d values over %d steps, naming after %d windows past %v τ; want 0 to 1024 values (0: 32), 0 to 2^20 steps (0: 16), 0 to 1000 windows and a distance in [0, 1e6] (0: 3)",
			c.Dims, c.Window, c.NameAfter, c.NameAbove)
	}
	if c.AuditEvery < 0 || c.AuditEvery > 1<<20 || !(c.SuspectBelow >= -1 && c.SuspectBelow <= 0) {
		return fmt.Errorf("train: an audit every %d steps, suspects below a lean of %v; want 0 (none) to 2^20 and a cosine in [−1, 0] (0: −0.3)", c.AuditEvery, c.SuspectBelow)
	}
	return nil
}

func (c *Sketch) dims() int          { return cmp.Or(c.Dims, 32) }
func (c *Sketch) window() int        { return cmp.Or(c.Window, 16) }
func (c *Sketch) nameAbove() float64 { return cmp.Or(c.NameAbove, 3) }
func (c *Sketch) suspectBelow() float64 {
	return cmp.Or(c.SuspectBelow, -0.3)
}

// slots is how many trailer values the sketches take on a ring of size.
func (c *Sketch) slots(size int) int { return c.dims() * size }

// sketches is a replica's state of Sketch: its own sketch of the step,
// the window's sums per rank and the count of windows each stood apart.
type sketches struct {
	ring  Collective
	steps int       // exchanges on ring: with Window, the seed
	own   []float64 // this step's sketch of this rank's gradients
	avg   []float64 // and of the average
	sums  [][]float32
	apart outliers
	// guarded counts, per rank, the steps in a row the norm guard found
	// its gradients over its bound.
	guarded []int
	tab     sketchTable // the window's projection
	// lean is, per rank, the running mean of its sketch's cosine against
	// the others' sum (NaN until it has had samples): whom audits look
	// at (suspects). budget is the suspects' audits it may still run.
	lean   []float64
	budget float64
	// vouched is, per rank, the norm at which an audit found its
	// gradients its batch's while the norm guard found them far, in
	// window vouchedIn (vouch).
	vouched   []float64
	vouchedIn []int
}

// scan adds to sk the sketch of v (coordinates from off) under this
// step's projection, copies v to dst unless it is nil, and returns the
// sum of v's squares (sketchScan).
func (s *sketches) scan(c *Sketch, sk []float64, dst, v []float32, off int) float64 {
	return sketchScan(sk, dst, v, off, s.seed(c), &s.tab)
}

// reset starts the state for ring, a ring of size ranks, if it is not
// that ring's already: the seed counts exchanges on one ring, and every
// rank of a ring has run the same ones.
func (s *sketches) reset(c *Sketch, ring Collective) {
	if s.ring == ring && s.own != nil {
		return
	}
	s.ring, s.steps, s.budget = ring, 0, suspectBurst
	s.own = make([]float64, c.dims())
	s.lean = make([]float64, ring.Size())
	for r := range s.lean {
		s.lean[r] = math.NaN()
	}
	s.vouched, s.vouchedIn = make([]float64, ring.Size()), make([]int, ring.Size())
	s.guarded = make([]int, ring.Size())
	s.sums = make([][]float32, ring.Size())
	for k := range s.sums {
		s.sums[k] = make([]float32, c.dims())
	}
}

// repeated names the ranks whose sketch this step (slots, as averaged)
// is, bit for bit, the one they sent the step before, NameAfter steps in
// a row (outliers.repeated): within a window the projection is one, so
// the same gradients give the same sketch; across its end they do not,
// and a zero sketch (no samples) is none.
func (s *sketches) repeated(c *Sketch, slots []float32) *LiarError {
	named := s.apart.repeated(s.ring, sketchKeys(slots, c.dims()), c.NameAfter)
	if named == nil {
		return nil
	}
	return &LiarError{Ranks: named, Why: fmt.Sprintf("they sent the same gradients, bit for bit, %d steps in a row (a replay: an honest rank's change with its batch)", c.NameAfter+1)}
}

// seed is the projection's seed for the step: one per window.
func (s *sketches) seed(c *Sketch) uint64 { return splitmix(uint64(s.steps/c.window()) + 0x5ce7c4) }

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// sketchTable is blockHash's answers for blocks 0 to len(signs)−1 under
// one seed and bucket count: a window's projection, worked out once for
// its steps (each step sketches twice, a rank's own and the average),
// and the lanes sketchAdd sums its buckets in.
type sketchTable struct {
	seed    uint64
	dims    int
	buckets []int32
	signs   []uint64
	lanes   []float32
}

// cover makes t the table of seed and dims for at least blocks blocks.
func (t *sketchTable) cover(seed uint64, dims, blocks int) *sketchTable {
	if t.seed != seed || t.dims != dims {
		t.seed, t.dims, t.buckets, t.signs = seed, dims, t.buckets[:0], t.signs[:0]
	}
	for b := len(t.signs); b < blocks; b++ {
		bucket, mask := blockHash(seed, b, dims)
		t.buckets, t.signs = append(t.buckets, int32(bucket)), append(t.signs, mask)
	}
	if len(t.lanes) != 16*dims {
		t.lanes = make([]float32, 16*dims)
	}
	return t
}

// sketchRun is the most whole blocks whose lanes sketchScan sums in
// float32 before it adds them up in float64: ~32 a bucket at 32 values.
const sketchRun = 1024

// sketchAdd adds to s the count sketch, under seed, of v, whose first
// value is coordinate off of the flat gradients (sketchScan).
func sketchAdd(s []float64, v []float32, off int, seed uint64, tab *sketchTable) {
	sketchScan(s, nil, v, off, seed, tab)
}

// sketchScan adds to s the count sketch, under seed, of v, whose first
// value is coordinate off of the flat gradients, copies v to dst unless
// it is nil, and returns the sum of v's squares — all in one pass over v,
// whose memory traffic, not its arithmetic, is what a pass costs beside a
// step. Coordinates go in blocks of 64 to a bucket the block's hash
// picks, each with a sign from one bit of it (blockHash). Whole blocks
// are folded into their bucket's 16 lanes by vec.SketchScan, up to
// sketchRun at a time, whose lanes are then added to the sketch; a block
// a piece's edge cuts, value by value. A vector sketched whole or in
// pieces of any bounds gives the same sketch up to rounding; the same
// call on the same values, the same bits. The sum of squares is Inf or
// NaN where a value is not finite (and where float32 lanes overflow, past
// 1.8e19 for the norm: scannedNorm). tab holds the blocks' hashes and
// the lanes (nil: a table made for the call).
func sketchScan(s []float64, dst, v []float32, off int, seed uint64, tab *sketchTable) (squares float64) {
	if tab == nil {
		tab = new(sketchTable)
	}
	tab.cover(seed, len(s), (off+len(v)+63)/64)
	for i := 0; i < len(v); {
		e := off + i
		blk := e >> 6
		if e&63 != 0 || i+64 > len(v) {
			mask := tab.signs[blk]
			end := min(len(v), i+64-(e&63))
			if dst != nil {
				copy(dst[i:end], v[i:end])
			}
			var acc float64
			for ; i < end; i++ {
				squares += float64(v[i]) * float64(v[i])
				acc += float64(math.Float32frombits(math.Float32bits(v[i]) ^ uint32(mask>>uint((off+i)&63)&1)<<31))
			}
			s[tab.buckets[blk]] += acc
			continue
		}
		n := min(sketchRun, (len(v)-i)/64)
		var to []float32
		if dst != nil {
			to = dst[i : i+64*n]
		}
		var sq [16]float32
		vec.SketchScan(to, v[i:i+64*n], tab.signs[blk:blk+n], tab.buckets[blk:blk+n], tab.lanes, &sq)
		for _, x := range sq {
			squares += float64(x)
		}
		for b := range s {
			lanes := tab.lanes[16*b : 16*b+16]
			var acc float64
			for _, x := range lanes {
				acc += float64(x)
			}
			s[b] += acc
			clear(lanes)
		}
		i += 64 * n
	}
	return squares
}

// scannedNorm is the norm of v from the sum of its squares as sketchScan
// added them; where that sum leaves float32's range — over it, or so small
// that squares may have rounded to zero — it is summed again in float64,
// as norm2 does.
func scannedNorm(squares float64, v []float32) float64 {
	if squares >= 1e-20 && squares <= math.MaxFloat32 {
		return math.Sqrt(squares)
	}
	return norm2Wide(v)
}

// scannedFinite reports whether v, whose squares sketchScan summed, is
// finite: a NaN or Inf makes the sum one, and only where float32 lanes
// overflowed must v be looked at again.
func scannedFinite(squares float64, v []float32) bool {
	return squares <= math.MaxFloat64 || finite(v)
}

// blockHash is block blk's bucket of k and its 64 signs under seed: one
// splitmix of the two, the signs its bits, the bucket its high half
// mixed once more and taken into [0, k) by a multiply.
func blockHash(seed uint64, blk, k int) (int, uint64) {
	h := splitmix(seed ^ uint64(blk)*0xd6e8feb86659fd93)
	return int(((h * 0x9e3779b97f4a7c15) >> 32) * uint64(k) >> 32), h
}

// put writes this rank's sketch into its slots of the trailer's sketch
// part, clearing the others'.
func (s *sketches) put(slots []float32, rank int) {
	clear(slots)
	k := len(s.own)
	for j, v := range s.own {
		slots[rank*k+j] = float32(v)
	}
}

// check is the step's verdict once the ring has averaged it: got the
// average's sketch, slots the averaged sketch part (each rank's sketch
// over the ring's size). It returns an ErrTampered where the average's sketch is
// not the slots' sum, a LiarError where a window closed with ranks to
// name, or nil; and counts the step.
func (s *sketches) check(c *Sketch, got []float64, slots []float32, wire ring.Encoding) error {
	size, k := s.ring.Size(), c.dims()
	if !finite(slots) {
		// Only a lie puts one there (a rank's sketch of finite gradients
		// is finite), and it would blind the checks below.
		s.steps++
		return fmt.Errorf("%w: the sketches hold a NaN or Inf; skipped on all", ErrTampered)
	}
	want := make([]float64, k)
	var scale float64
	for r := range size {
		var nn float64
		for j, v := range slots[r*k : (r+1)*k] {
			want[j] += float64(v)
			nn += float64(v) * float64(v)
		}
		scale += math.Sqrt(nn)
	}
	var diff, gn float64
	for j := range got {
		d := got[j] - want[j]
		diff += d * d
		gn += got[j] * got[j]
	}
	scale += math.Sqrt(gn)
	// Sums in other orders round apart by ~1e-6 of the norms; a narrowed
	// wire's hops by up to a few percent.
	tol := 1e-3
	if wire != ring.F32 {
		tol = 5e-2
	}
	if math.Sqrt(diff) > tol*scale+1e-30 {
		s.steps++
		return fmt.Errorf("%w: the average's sketch is %.3g away from the ranks' sketches' average, whose norms add to %.3g (a member altered what it forwarded); skipped on all",
			ErrTampered, math.Sqrt(diff), scale)
	}
	s.leanOn(slots, k)
	replayed := s.repeated(c, slots)
	for r := range size {
		for j, v := range slots[r*k : (r+1)*k] {
			s.sums[r][j] += v * float32(size)
		}
	}
	s.steps++
	if replayed != nil {
		return replayed
	}
	if s.steps%c.window() != 0 {
		return nil
	}
	return s.judgeWindow(c)
}

// judgeWindow judges the window that has just closed, from each rank's
// sums of its sketches, and starts the next: it names the ranks whose
// sums stood apart NameAfter windows in a row.
func (s *sketches) judgeWindow(c *Sketch) error {
	size := s.ring.Size()
	defer func() {
		for _, w := range s.sums {
			clear(w)
		}
	}()
	if c.NameAfter <= 0 {
		return nil
	}
	// A rank with no samples in the window has nothing to judge.
	var ranks []int
	var xs [][]float32
	for r, w := range s.sums {
		if nonzero(w) {
			ranks, xs = append(ranks, r), append(xs, w)
		}
	}
	if len(xs) < judgedFrom {
		return nil
	}
	dist, cos := spread(new(columns).gather(xs, nil), 2)
	named := s.apart.count(s.ring, size, ranks, dist, cos, c.nameAbove(), false, c.NameAfter)
	if named == nil {
		return nil
	}
	ks, why := make([]int, len(named)), make([]string, len(named))
	for i, j := range named {
		ks[i] = j.rank
		why[i] = fmt.Sprintf("rank %d: distance %.3g τ, cosine %.3f against the others' median", j.rank, j.dist, j.cos)
	}
	w := s.steps / c.window()
	return &LiarError{Ranks: ks, Why: fmt.Sprintf("the sketches of their gradients stood apart from the others' in %d windows of %d steps in a row, the last steps %d to %d on this ring (%s; past %v τ from the median)",
		c.NameAfter, c.window(), (w-1)*c.window()+1, w*c.window(), strings.Join(why, "; "), c.nameAbove())}
}

// nonzero reports whether x holds a value other than ±0: a sketch of
// gradients sent, where zeros are none (no samples, nothing sent).
func nonzero(x []float32) bool {
	return slices.ContainsFunc(x, func(v float32) bool { return v != 0 })
}

// sketchKeys are the ranks' sketches in slots (k values a rank) as keys
// for outliers.repeated: the bits of each, "" for a sketch of zeros.
func sketchKeys(slots []float32, k int) []string {
	keys := make([]string, len(slots)/k)
	for r := range keys {
		if sk := slots[r*k : (r+1)*k]; nonzero(sk) {
			keys[r] = string(f32Bytes(sk))
		}
	}
	return keys
}

// guard counts the ranks the norm guard found over its bound this step
// (far; every rank holds the same declared norms) and names those over
// it NameAfter steps in a row: the guard keeps their gradients out, but a
// member whose every step is skipped would otherwise end the job (its
// limit of skips in a row) rather than be dropped from it.
func (s *sketches) guard(c *Sketch, far []int, bound float64) *LiarError {
	if c.NameAfter <= 0 {
		return nil
	}
	var named []int
	for r := range s.guarded {
		if !slices.Contains(far, r) {
			s.guarded[r] = 0
		} else if s.guarded[r]++; s.guarded[r] >= c.NameAfter {
			named = append(named, r)
			s.guarded[r] = 0
		}
	}
	if named == nil || 2*len(far) >= len(s.guarded) {
		return nil
	}
	return &LiarError{Ranks: named, Why: fmt.Sprintf("the norm of their gradients was over %g × the median in %d steps in a row", bound, c.NameAfter)}
}

// spread is each rank's distance to the coordinate-wise median over τ,
// clip times the median of those distances (0 where τ is 0), and its
// cosine against the median of the others' (othersCos).
func spread(c *columns, clip float64) (dist, cos []float64) {
	dist, cos = make([]float64, c.n), make([]float64, c.n)
	c.median(make([]float32, len(c.at)), dist, cos)
	dist, _ = overTau(dist, clip)
	return dist, cos
}
