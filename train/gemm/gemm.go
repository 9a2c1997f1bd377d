package gemm

import (
	"runtime"
	"sync"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"github.com/ringtrain/ringtrain/train/vec"
)

// BLAS is gonum's pure-Go BLAS with Sgemm replaced by this package's. It
// satisfies gorgonia's and tensor's BLAS interfaces; hand it to G.Use.
// Use a *BLAS; the zero value is not ready, call New.
type BLAS struct {
	gonum.Implementation
	ker     kernel
	threads int
	bufs    sync.Pool // *[]float32 packing buffers
}

// New returns a BLAS that splits a product over at most threads
// goroutines (runtime.GOMAXPROCS(0) at each call when threads ≤ 0), with
// the kernel Chosen for this CPU.
func New(threads int) *BLAS {
	return &BLAS{ker: Chosen().ker, threads: threads}
}

// Kernel names the micro-kernel in use: avx512, avx2 or go.
func (im *BLAS) Kernel() string { return im.ker.name }

// Threads is the most goroutines one product is split over.
func (im *BLAS) Threads() int {
	if im.threads > 0 {
		return im.threads
	}
	return runtime.GOMAXPROCS(0)
}

// minWorkPerThread is the product size (m·n·k) below which another thread
// costs more than it saves: about 30 µs of one core's work.
const minWorkPerThread = 1 << 21

// A B read in place (not packed) has rows at most maxInPlaceStride floats
// apart and spans at most maxInPlaceSpan floats: a few hundred pages,
// which the TLB holds while the A strips stream past.
const (
	maxInPlaceStride = 1024
	maxInPlaceSpan   = 1 << 20
)

// RowMultiple is a multiple of every kernel's strip height (12, 8, 6 or
// 4 rows): an A stored k × m read in place, whose rows are a multiple of
// it long, has no ragged strip to pack.
const RowMultiple = 24

// maxInPlaceStrideA is the farthest apart an A's rows may be for it to
// be read in place.
const maxInPlaceStrideA = 512

// lazyPackFloats is the packed B size (floats) above which B is packed a
// panel at a time: a quarter of a 2 MB L2.
const lazyPackFloats = 1 << 17

// kBlockT is the longest block of k a transposed product over a longer
// sum takes at a time (k is cut into equal blocks of at most this): a
// 32-column panel's block is then 32 KB, in L1 with an A strip's.
const kBlockT = 256

// kBlock is how many of k's steps a product whose B is packed in blocks
// of rows takes at a time: a 32-column panel's block is then 16 KB, in L1
// with an A strip's.
const kBlock = 128

// Sgemm computes C = alpha·op(A)·op(B) + beta·C for row-major matrices,
// with gonum's argument checks and panics.
func (im *BLAS) Sgemm(tA, tB blas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	im.sgemm(im.Threads(), tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// SgemmSerial is Sgemm on the calling goroutine alone, for callers that
// already run one product per thread (the same bits as Sgemm).
func (im *BLAS) SgemmSerial(tA, tB blas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	im.sgemm(1, tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

func (im *BLAS) sgemm(threads int, tA, tB blas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	checkSgemm(tA, tB, m, n, k, a, lda, b, ldb, c, ldc)
	if m == 0 || n == 0 {
		return
	}
	if alpha == 0 || k == 0 {
		scale(m, n, beta, c, ldc)
		return
	}
	im.gemm(threads, product{tA: tA != blas.NoTrans, tB: tB != blas.NoTrans, m: m, n: n, k: k,
		alpha: alpha, a: a, lda: lda, b: b, ldb: ldb, beta: beta, c: c, ldc: ldc})
}

// PackedA is an A packed once for several products with it (PackA,
// SgemmPackedSerial): a layer's weights, multiplied by each sample of a
// batch in turn, were packed again for every sample.
type PackedA struct {
	m, k, mr int
	buf      []float32
}

// PackA packs op(A), m × k, into p, whose memory is reused from call to
// call; p then stands for A until the next PackA.
func (im *BLAS) PackA(p *PackedA, tA blas.Transpose, m, k int, a []float32, lda int) {
	checkMat("A", tA, m, k, a, lda)
	mr := im.ker.mr
	mt := (m + mr - 1) / mr
	p.m, p.k, p.mr, p.buf = m, k, mr, sized(p.buf, mt*mr*k)
	packA(tA != blas.NoTrans, a, lda, m, k, mr, 0, mt, p.buf)
}

// SgemmPackedSerial is SgemmSerial with alpha 1 and A packed by PackA
// (the same bits): C = A·op(B) + beta·C, C being p.m × n.
func (im *BLAS) SgemmPackedSerial(p *PackedA, tB blas.Transpose, n int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	m, k := p.m, p.k
	if p.mr != im.ker.mr && m > 0 {
		panic("gemm: A was packed for another kernel")
	}
	checkMat("B", tB, k, n, b, ldb)
	checkMat("C", blas.NoTrans, m, n, c, ldc)
	switch {
	case m == 0 || n == 0:
		return
	case k == 0:
		scale(m, n, beta, c, ldc)
		return
	}
	im.gemm(1, product{tB: tB != blas.NoTrans, m: m, n: n, k: k, alpha: 1, a: p.buf, aPacked: true,
		b: b, ldb: ldb, beta: beta, c: c, ldc: ldc})
}

// PackedB is a B packed once for several products with it (PackB,
// SgemmTSerial): a layer's weights, multiplied by each sample of a batch
// in turn, would be packed again for every sample.
type PackedB struct {
	k, n, nr int
	buf      []float32
}

// PackB packs op(B), k × n, into p, whose memory is reused from call to
// call; p then stands for B until the next PackB.
func (im *BLAS) PackB(p *PackedB, tB blas.Transpose, k, n int, b []float32, ldb int) {
	checkMat("B", tB, k, n, b, ldb)
	nr := im.ker.nr
	nt := (n + nr - 1) / nr
	p.k, p.n, p.nr, p.buf = k, n, nr, sized(p.buf, nt*nr*k)
	packB(tB != blas.NoTrans, b, ldb, n, k, nr, 0, nt, p.buf)
}

// SgemmTSerial writes the product op(A)·B (m × p.n, B packed by PackB)
// transposed into C: C = (op(A)·B)ᵀ, p.n × m, its rows ldc apart, on the
// calling goroutine. Each element is the same sum, in the same order, as
// SgemmSerial's (the same bits); the transposed form lets a product whose
// C has few rows and many columns (a conv layer's 64 filters × 196
// positions) fill the kernel's tiles.
func (im *BLAS) SgemmTSerial(tA blas.Transpose, m int, a []float32, lda int, p *PackedB, c []float32, ldc int) {
	n, k := p.n, p.k
	if p.nr != im.ker.nr && n > 0 {
		panic("gemm: B was packed for another kernel")
	}
	checkMat("A", tA, m, k, a, lda)
	checkMat("C", blas.NoTrans, n, m, c, ldc)
	switch {
	case m == 0 || n == 0:
		return
	case k == 0:
		scale(n, m, 0, c, ldc)
		return
	}
	im.gemm(1, product{tA: tA != blas.NoTrans, m: m, n: n, k: k, alpha: 1, a: a, lda: lda,
		b: p.buf, bPacked: true, c: c, ldc: ldc, cT: true})
}

// product is one C = alpha·op(A)·op(B) + beta·C: A or B may come packed
// (aPacked, bPacked: strips or panels side by side, as packA and packB
// write them), and C may be
// stored transposed (cT: element (i, j) at c[j·ldc+i]; alpha 1, beta 0
// only).
type product struct {
	tA, tB      bool
	m, n, k     int
	alpha, beta float32
	a           []float32
	lda         int
	aPacked     bool
	b           []float32
	ldb         int
	bPacked     bool
	c           []float32
	ldc         int
	cT          bool
}

// gemm multiplies: the kernel's tiles, panel by panel of B, its operands
// packed or read in place.
func (im *BLAS) gemm(maxThreads int, pr product) {
	g := im.planGemm(maxThreads, &pr)
	if !pr.aPacked {
		defer im.put(g.pa)
	}
	k, nt, nr := pr.k, g.nt, g.nr
	switch {
	case pr.cT && pr.bPacked && k > 2*kBlockT:
		g.transposedInKBlocks()
	case !pr.bPacked && !pr.tB && g.packFrom == 0 && nt*nr*k > lazyPackFloats && g.mt*g.mr*nt*nr <= lazyPackFloats && !pr.cT:
		g.packBInKBlocks()
	case g.packFrom == 0 && nt*nr*k > lazyPackFloats && nt >= 2*g.threads:
		g.packBByPanel()
	default:
		g.allTiles()
	}
}

// gemmPlan is how one product is taken: the kernel and its tiles (mt × nt
// of mr × nr), the threads, A's strips below aFrom and B's panels below
// packFrom read in place, A's other strips packed in pa.
type gemmPlan struct {
	im                      *BLAS
	pr                      *product
	ker                     kernel
	mr, nr, mt, nt, threads int
	aFrom, packFrom         int
	pa                      *[]float32
	direct                  bool // alpha 1, beta 0: a full tile may go straight into C
}

// planGemm chooses what of pr is read in place and packs the rest of A;
// the caller gives pa back where A was not packed already.
func (im *BLAS) planGemm(maxThreads int, pr *product) *gemmPlan {
	m, n, k := pr.m, pr.n, pr.k
	ker := im.ker
	if !pr.aPacked && !pr.bPacked {
		ker = ker.shapeFor(m, n)
	}
	g := &gemmPlan{im: im, pr: pr, ker: ker, mr: ker.mr, nr: ker.nr, direct: pr.alpha == 1 && pr.beta == 0}
	mr, nr := g.mr, g.nr
	g.mt, g.nt = (m+mr-1)/mr, (n+nr-1)/nr
	g.threads = min(maxThreads, g.mt*g.nt, max(1, m*n*k/minWorkPerThread))
	// An operand stored k-major (A stored k × m, B stored k × n) whose
	// rows are near each other is read in place: its full strips or
	// panels need no copy (only the last, ragged one is packed). Far-apart
	// rows are packed, as each would cost a TLB miss per k.
	near := func(kMajor bool, ld int) bool { return kMajor && ld <= maxInPlaceStride && ld*k <= maxInPlaceSpan }
	// An A read in place costs more per strip than a packed one (its
	// rows straddle cache lines, and the kernel reads it at a stride), so
	// it is read in place only where each strip is read once or twice,
	// and its rows are no further apart than the CPU's stride prefetcher
	// reaches (2 KB on Intel's; a conv layer's weight gradient with
	// patches 3.2 KB apart was 5% slower read in place).
	if near(pr.tA, pr.lda) && pr.lda <= maxInPlaceStrideA && g.nt <= 2 && !pr.aPacked {
		g.aFrom = m / mr
		// A ragged last strip is read in place too where A's rows have
		// room for the whole strip: the rows past m give C rows that are
		// never stored, so whatever lies there cannot reach C.
		if g.aFrom < g.mt && g.mt*mr <= pr.lda && (k-1)*pr.lda+g.mt*mr <= len(pr.a) {
			g.aFrom = g.mt
		}
	}
	if pr.bPacked {
		g.packFrom = g.nt
	} else if near(!pr.tB, pr.ldb) {
		g.packFrom = n / nr
	}
	// Packing is split like the tiles: by A strips and B panels.
	g.pa = &pr.a
	if !pr.aPacked {
		g.pa = im.get((g.mt - g.aFrom) * mr * k)
		parallel(g.threads, g.mt-g.aFrom, func(lo, hi int) {
			packA(pr.tA, pr.a, pr.lda, m, k, mr, g.aFrom+lo, g.aFrom+hi, (*g.pa)[lo*mr*k:])
		})
	}
	return g
}

// strip is A's strip i from step kb of k on, and how far apart its steps
// are.
func (g *gemmPlan) strip(i, kb int) ([]float32, int) {
	pr, mr, k := g.pr, g.mr, g.pr.k
	if i < g.aFrom {
		return pr.a[kb*pr.lda+i*mr:], pr.lda
	}
	return (*g.pa)[(i-g.aFrom)*mr*k+kb*mr : (i-g.aFrom+1)*mr*k], mr
}

// tileOf computes C's tile (i, j) from A's strip i and B's panel j (bs,
// its steps bstride apart), through tile where it cannot go straight
// into C.
func (g *gemmPlan) tileOf(i, j int, bs []float32, bstride int, tile []float32) {
	pr, mr, nr, k, c, ldc := g.pr, g.mr, g.nr, g.pr.k, g.pr.c, g.pr.ldc
	as, astride := g.strip(i, 0)
	rows, cols := min(mr, pr.m-i*mr), min(nr, pr.n-j*nr)
	if pr.cT {
		g.ker.run(k, as, bs, tile, nr, bstride, astride, false)
		storeT(c[j*nr*ldc+i*mr:], ldc, tile, nr, rows, cols)
		return
	}
	at := i*mr*ldc + j*nr
	if g.direct && rows == mr && cols == nr {
		g.ker.run(k, as, bs, c[at:], ldc, bstride, astride, false)
		return
	}
	g.ker.run(k, as, bs, tile, nr, bstride, astride, false)
	pr.put(c[at:], tile, nr, rows, cols)
}

// transposedInKBlocks takes a transposed product over a long sum (the
// conv forward's 801 taps) k in blocks, its sums going on from a padded C
// in cache, then written out transposed: a block of B's panels then stays
// in L1 while every A strip passes, where over the whole sum each strip
// read them from L2 (−9% of the kernel's time on conv2's forward).
func (g *gemmPlan) transposedInKBlocks() {
	pr, mr, nr, mt, nt, k := g.pr, g.mr, g.nr, g.mt, g.nt, g.pr.k
	blocks := (k + kBlockT - 1) / kBlockT
	kc := (k + blocks - 1) / blocks
	ldp := nt * nr
	cp := g.im.get(mt * mr * ldp)
	defer g.im.put(cp)
	for kb := 0; kb < k; kb += kc {
		kk := min(kc, k-kb)
		for i := range mt {
			as, astride := g.strip(i, kb)
			for j := range nt {
				g.ker.run(kk, as, pr.b[j*nr*k+kb*nr:], (*cp)[i*mr*ldp+j*nr:], ldp, nr, astride, kb > 0)
			}
		}
	}
	for i := range mt {
		for j := range nt {
			storeT(pr.c[j*nr*pr.ldc+i*mr:], pr.ldc, (*cp)[i*mr*ldp+j*nr:], ldp, min(mr, pr.m-i*mr), min(nr, pr.n-j*nr))
		}
	}
}

// packBInKBlocks takes a large B stored k × n with a C small enough for
// the cache (the cnn's fc1 forward: 64 samples, W 3136 × 1024): B is
// packed kBlock rows at a time, each row read along, and each block's
// tiles go on from the sums so far in a padded copy of C, then put into
// C. Packed a panel at a time, B's far-apart rows were read a few lines
// each, from memory. The same bits either way.
func (g *gemmPlan) packBInKBlocks() {
	pr, mr, nr, mt, nt, k := g.pr, g.mr, g.nr, g.mt, g.nt, g.pr.k
	ldp := nt * nr
	cp := g.im.get(mt * mr * ldp)
	defer g.im.put(cp)
	parallel(g.threads, nt, func(lo, hi int) {
		blk := g.im.get((hi - lo) * nr * kBlock)
		defer g.im.put(blk)
		for kb := 0; kb < k; kb += kBlock {
			kk := min(kBlock, k-kb)
			packB(false, pr.b[kb*pr.ldb:], pr.ldb, pr.n, kk, nr, lo, hi, *blk)
			for j := lo; j < hi; j++ {
				for i := range mt {
					as, astride := g.strip(i, kb)
					g.ker.run(kk, as, (*blk)[(j-lo)*nr*kk:], (*cp)[i*mr*ldp+j*nr:], ldp, nr, astride, kb > 0)
				}
			}
		}
	})
	pr.put(pr.c, *cp, ldp, pr.m, pr.n)
}

// packBByPanel packs a B larger than the cache a panel at a time, just
// before its tiles, each thread taking whole panels: packed all at once
// it went to memory and was read back (the cnn's fc1, 12.8 MB, twice a
// step). The same bits either way.
func (g *gemmPlan) packBByPanel() {
	pr, nr, mt, k := g.pr, g.nr, g.mt, g.pr.k
	parallel(g.threads, g.nt, func(lo, hi int) {
		tile := make([]float32, g.mr*nr)
		panel := g.im.get(nr * k)
		defer g.im.put(panel)
		for j := lo; j < hi; j++ {
			packB(pr.tB, pr.b, pr.ldb, pr.n, k, nr, j, j+1, *panel)
			for i := range mt {
				g.tileOf(i, j, *panel, nr, tile)
			}
		}
	})
}

// allTiles packs what of B is not read in place, then runs every tile.
// Where all of B fits in the cache, tiles run strip by strip (i outer):
// an A strip stays in L1 while B's panels pass, and C is written a band
// of rows at a time, where panel by panel its rows were written a few
// lines each, far apart (the cnn's fc1 weight gradient, 12.8 MB). Else
// panel by panel (j outer), so a B panel stays in cache while the A
// strips stream past it.
func (g *gemmPlan) allTiles() {
	pr, nr, mt, nt, k, packFrom := g.pr, g.nr, g.mt, g.nt, g.pr.k, g.packFrom
	var pb *[]float32
	if !pr.bPacked {
		pb = g.im.get((nt - packFrom) * nr * k)
		defer g.im.put(pb)
		parallel(g.threads, nt-packFrom, func(lo, hi int) {
			packB(pr.tB, pr.b, pr.ldb, pr.n, k, nr, packFrom+lo, packFrom+hi, (*pb)[lo*nr*k:])
		})
	}
	byStrip := nt*nr*k <= lazyPackFloats
	parallel(g.threads, mt*nt, func(lo, hi int) {
		tile := make([]float32, g.mr*nr)
		for t := lo; t < hi; t++ {
			j, i := t/mt, t%mt
			if byStrip {
				i, j = t/nt, t%nt
			}
			switch {
			case pr.bPacked:
				g.tileOf(i, j, pr.b[j*nr*k:(j+1)*nr*k], nr, tile)
			case j < packFrom:
				g.tileOf(i, j, pr.b[j*nr:], pr.ldb, tile)
			default:
				g.tileOf(i, j, (*pb)[(j-packFrom)*nr*k:(j-packFrom+1)*nr*k], nr, tile)
			}
		}
	})
}

// put puts rows × cols values of t (rows ldt apart) into C at c as the
// product's alpha and beta say.
func (pr *product) put(c, t []float32, ldt, rows, cols int) {
	alpha, beta, ldc := pr.alpha, pr.beta, pr.ldc
	if alpha == 1 && beta == 1 {
		// C += A·B, a sum over products taken in turn (a conv layer's
		// weight gradient, sample by sample): the same roundings as the
		// loop below, in vectors.
		vec.AddRows(c, ldc, t, ldt, rows, cols)
		return
	}
	for r := range rows {
		dst := c[r*ldc : r*ldc+cols]
		src := t[r*ldt : r*ldt+cols]
		switch {
		case alpha == 1 && beta == 0:
			copy(dst, src)
		case beta == 0:
			for q, v := range src {
				dst[q] = alpha * v
			}
		default:
			for q, v := range src {
				// The conversions round each product on its own, so no
				// compiler fuses them into an FMA.
				dst[q] = float32(alpha*v) + float32(beta*dst[q])
			}
		}
	}
}

// Transpose writes src (rows × cols, its rows lds apart) transposed into
// dst (cols × rows, its rows ldd apart), 16 × 16 blocks at a time in
// AVX-512 where the CPU has it.
func Transpose(dst []float32, ldd int, src []float32, lds int, rows, cols int) {
	if rows <= 0 || cols <= 0 {
		return
	}
	_ = src[(rows-1)*lds+cols-1]
	_ = dst[(cols-1)*ldd+rows-1]
	for r0 := 0; r0 < rows; r0 += 16 {
		n := min(16, rows-r0)
		q := 0
		if blocks := cols / 16; blocks > 0 && transposeBlocks(src[r0*lds:], lds, dst[r0:], ldd, n, n, blocks) {
			q = blocks * 16
		}
		for ; q < cols; q++ {
			for r := range n {
				dst[q*ldd+r0+r] = src[(r0+r)*lds+q]
			}
		}
	}
}

// storeT writes a tile's first rows × cols values (rows nr apart)
// transposed at c: c[q·ldc+r] = tile[r·nr+q].
func storeT(c []float32, ldc int, tile []float32, nr, rows, cols int) {
	_ = tile[(rows-1)*nr+cols-1]
	q := 0
	if blocks := cols / 16; blocks > 0 && transposeBlocks(tile, nr, c, ldc, rows, rows, blocks) {
		q = blocks * 16
	}
	for ; q < cols; q++ {
		dst := c[q*ldc : q*ldc+rows]
		for r := range dst {
			dst[r] = tile[r*nr+q]
		}
	}
}

// packA copies A's strips lo…hi-1 (mr rows each) k-major, zero-padded,
// into dst, strip lo first.
func packA(t bool, a []float32, lda, m, k, mr, lo, hi int, dst []float32) {
	for i := lo; i < hi; i++ {
		strip := dst[(i-lo)*mr*k : (i-lo+1)*mr*k]
		if t && (i+1)*mr <= m {
			// A is stored k × m: each k holds the strip's mr values side
			// by side.
			vec.CopyRows(strip, mr, a[i*mr:], lda, k, mr)
			continue
		}
		from := 0
		if rows := min(mr, m-i*mr); !t {
			// A is stored m × k: blocks of 16 k go through the CPU's
			// transpose where it has one, the strip's missing rows
			// written as zeros.
			if transposeBlocks(a[i*mr*lda:], lda, strip, mr, rows, mr, k/16) {
				from = k / 16 * 16
			}
		}
		for r := range mr {
			row := i*mr + r
			if row >= m {
				for p := from; p < k; p++ {
					strip[p*mr+r] = 0
				}
				continue
			}
			if t { // A is stored k × m
				for p := range k {
					strip[p*mr+r] = a[p*lda+row]
				}
			} else {
				for p, v := range a[row*lda+from : row*lda+k] {
					strip[(from+p)*mr+r] = v
				}
			}
		}
	}
}

// packB copies B's panels lo…hi-1 (nr columns each) k-major, zero-padded,
// into dst, panel lo first.
func packB(t bool, b []float32, ldb, n, k, nr, lo, hi int, dst []float32) {
	if t {
		for j := lo; j < hi; j++ {
			packBT(b[j*nr*ldb:], ldb, min(nr, n-j*nr), k, nr, dst[(j-lo)*nr*k:(j-lo+1)*nr*k])
		}
		return
	}
	if hi-lo == 1 {
		// One panel (packed lazily): its rows of nr values in vectors.
		cols := min(nr, n-lo*nr)
		vec.CopyRows(dst, nr, b[lo*nr:], ldb, k, cols)
		if cols < nr {
			for p := range k {
				clear(dst[p*nr+cols : (p+1)*nr])
			}
		}
		return
	}
	// Row by row of B, each row's part of every panel: B's rows are far
	// apart (else it is read in place), and panel by panel every row
	// would be a TLB miss once per panel.
	// The row's nr-value pieces for the full panels go as the rows of a
	// CopyRows, nr·k apart in dst.
	full := min(hi, n/nr) - lo
	for p := range k {
		row := b[p*ldb : p*ldb+n]
		if full > 0 {
			vec.CopyRows(dst[p*nr:], nr*k, row[lo*nr:], nr, full, nr)
		}
		for j := lo + max(0, full); j < hi; j++ {
			cols := min(nr, n-j*nr)
			out := dst[(j-lo)*nr*k+p*nr : (j-lo)*nr*k+(p+1)*nr]
			copy(out[:cols], row[j*nr:j*nr+cols])
			clear(out[cols:])
		}
	}
}

// packBT packs a panel of a B stored n × k: its cols rows (ldb apart)
// become the panel's first cols columns, the rest zeros. Blocks of 16 × 16
// go through the CPU's transpose where it has one; each remaining row is
// read along and written down the panel, which (nr·k floats) stays in L1.
func packBT(b []float32, ldb, cols, k, nr int, panel []float32) {
	q := 0
	for ; q+16 <= cols; q += 16 {
		rows := b[q*ldb:]
		p := 0
		if transposeBlocks(rows, ldb, panel[q:], nr, 16, 16, k/16) {
			p = k / 16 * 16
		}
		if p < k {
			for r := range 16 {
				for pp, v := range rows[r*ldb+p : r*ldb+k] {
					panel[(p+pp)*nr+q+r] = v
				}
			}
		}
	}
	for ; q < cols; q++ {
		for p, v := range b[q*ldb : q*ldb+k] {
			panel[p*nr+q] = v
		}
	}
	if cols < nr {
		for p := range k {
			clear(panel[p*nr+cols : (p+1)*nr])
		}
	}
}

// parallel runs f over [0, n) cut into threads contiguous ranges, the last
// on the calling goroutine, and returns when all are done.
func parallel(threads, n int, f func(lo, hi int)) {
	threads = max(1, min(threads, n))
	var wg sync.WaitGroup
	for t := range threads - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(t*n/threads, (t+1)*n/threads)
		}()
	}
	f((threads-1)*n/threads, n)
	wg.Wait()
}

// scale sets C = beta·C, without reading C when beta is 0 (BLAS's rule:
// C may then hold NaNs that must not survive).
func scale(m, n int, beta float32, c []float32, ldc int) {
	for i := range m {
		row := c[i*ldc : i*ldc+n]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}

// sized is buf with length n, in new memory only where buf's capacity is
// short of it.
func sized(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}

func (im *BLAS) get(n int) *[]float32 {
	if p, ok := im.bufs.Get().(*[]float32); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	s := make([]float32, n)
	return &s
}

func (im *BLAS) put(p *[]float32) { im.bufs.Put(p) }

// checkMat panics unless x, with leading dimension ld, holds op(X) of
// rows × cols.
func checkMat(name string, t blas.Transpose, rows, cols int, x []float32, ld int) {
	if t != blas.NoTrans && t != blas.Trans && t != blas.ConjTrans {
		panic("blas: illegal transpose")
	}
	if rows < 0 || cols < 0 {
		panic("blas: negative dimension of " + name)
	}
	if t != blas.NoTrans {
		rows, cols = cols, rows
	}
	if ld < max(1, cols) {
		panic("blas: bad leading dimension of " + name)
	}
	if rows > 0 && cols > 0 && len(x) < ld*(rows-1)+cols {
		panic("blas: insufficient length of " + name)
	}
}

// checkSgemm panics as gonum's Sgemm does on arguments that do not
// describe the matrices given.
func checkSgemm(tA, tB blas.Transpose, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	valid := func(t blas.Transpose) bool {
		return t == blas.NoTrans || t == blas.Trans || t == blas.ConjTrans
	}
	switch {
	case !valid(tA):
		panic("blas: illegal transpose")
	case !valid(tB):
		panic("blas: illegal transpose")
	case m < 0:
		panic("blas: m < 0")
	case n < 0:
		panic("blas: n < 0")
	case k < 0:
		panic("blas: k < 0")
	}
	rowA, colA := m, k
	if tA != blas.NoTrans {
		rowA, colA = k, m
	}
	rowB, colB := k, n
	if tB != blas.NoTrans {
		rowB, colB = n, k
	}
	switch {
	case lda < max(1, colA):
		panic("blas: bad leading dimension of A")
	case ldb < max(1, colB):
		panic("blas: bad leading dimension of B")
	case ldc < max(1, n):
		panic("blas: bad leading dimension of C")
	}
	if m == 0 || n == 0 {
		return
	}
	switch {
	case len(a) < lda*(rowA-1)+colA:
		panic("blas: insufficient length of a")
	case len(b) < ldb*(rowB-1)+colB:
		panic("blas: insufficient length of b")
	case len(c) < ldc*(m-1)+n:
		panic("blas: insufficient length of c")
	}
}
