package ring

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
	"unsafe"
)

// Errors that callers branch on. Every error a collective returns wraps one
// of these or the context's error.
var (
	// ErrClosed is returned by calls on a Ring after Close, or after an
	// earlier call failed and took the ring down with it.
	ErrClosed = errors.New("ring: closed")
	// ErrPeerLost means a neighbour's stream ended or broke mid-call.
	ErrPeerLost = errors.New("ring: peer lost")
	// ErrBadFrame means a neighbour sent a frame that is malformed or out of
	// place: wrong magic, generation, sequence, step, segment, offset or length.
	ErrBadFrame = errors.New("ring: bad frame")
	// ErrMismatch means a neighbour called a different collective, or the
	// same one on a buffer of another length or with another root.
	ErrMismatch = errors.New("ring: collective mismatch")
)

// Transport is one rank's link to its neighbours in one ring generation: an
// ordered, reliable byte stream to its successor and one from its
// predecessor. The Ring owns it and frames everything it sends.
type Transport interface {
	// Write sends bytes to the successor (rank+1 mod size).
	Write(p []byte) (int, error)
	// Read receives bytes from the predecessor (rank-1 mod size).
	Read(p []byte) (int, error)
	// Close ends both streams and makes pending Read and Write calls
	// return. It may be called more than once and from any goroutine.
	Close() error
}

// DefaultChunkBytes is the pipelining unit when Config.ChunkBytes is zero:
// small enough that sending, receiving and adding overlap, large enough that
// per-frame costs vanish.
const DefaultChunkBytes = 1 << 20

// maxChunkBytes bounds Config.ChunkBytes so a frame length always fits the
// header's 32-bit field with room to spare.
const maxChunkBytes = 64 << 20

// Config describes this rank's place in one ring generation.
type Config struct {
	// Rank is this peer's place in the ring, 0 ≤ Rank < Size.
	Rank int
	// Size is the number of peers in the ring. A ring of one needs no
	// Transport: its collectives return at once.
	Size int
	// Generation identifies the ring formation; frames from another
	// generation are refused.
	Generation uint64
	// ChunkBytes is the largest payload of one frame, a multiple of 4.
	// Zero means DefaultChunkBytes. Every rank must use the same value.
	ChunkBytes int
}

func (c *Config) validate() error {
	if c.Size < 1 {
		return fmt.Errorf("ring: size %d, want at least 1", c.Size)
	}
	if c.Rank < 0 || c.Rank >= c.Size {
		return fmt.Errorf("ring: rank %d outside [0, %d)", c.Rank, c.Size)
	}
	if c.ChunkBytes == 0 {
		c.ChunkBytes = DefaultChunkBytes
	}
	if c.ChunkBytes < 4 || c.ChunkBytes > maxChunkBytes || c.ChunkBytes%4 != 0 {
		return fmt.Errorf("ring: chunk of %d bytes, want a multiple of 4 in [4, %d]", c.ChunkBytes, maxChunkBytes)
	}
	return nil
}

// Ring runs collectives for one rank of one ring generation. Every rank must
// call the same collectives in the same order, on buffers of the same length
// (as with NCCL or MPI); a rank that does not is caught by its successor
// with ErrMismatch. Calls on one Ring are serialised.
//
// Any failed call closes the Ring: after an error the streams sit at an
// unknown place, so the only way on is a new generation.
type Ring struct {
	cfg   Config
	t     Transport
	chunk int // elements per frame

	mu      sync.Mutex // serialises calls; guards everything below
	seq     uint64
	err     error     // why the ring is closed, once it is
	scratch []float32 // payload pieces that are added rather than copied
	// wireOut and wireIn hold one frame's payload in a narrow encoding, on
	// its way out (send goroutine) and in (receive goroutine).
	wireOut, wireIn []byte
	fr              frameReader
	hdr             [HeaderSize]byte // sender's header buffer
	bufArr          [2][]byte        // backing for bufs, so writes allocate nothing
	bufs            net.Buffers
	stats           Stats
}

// New returns the Ring for one rank. It takes ownership of t (nil is allowed
// for a ring of one); Close closes it.
func New(t Transport, cfg Config) (*Ring, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// Payloads go on the wire straight from the caller's memory.
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		return nil, errors.New("ring: big-endian hosts are not supported")
	}
	if t == nil && cfg.Size > 1 {
		return nil, fmt.Errorf("ring: rank %d of %d has no transport", cfg.Rank, cfg.Size)
	}
	return &Ring{cfg: cfg, t: t, chunk: cfg.ChunkBytes / 4, fr: frameReader{r: &heldReader{r: t}}}, nil
}

// Rank returns this peer's rank.
func (r *Ring) Rank() int { return r.cfg.Rank }

// Size returns the number of peers in the ring.
func (r *Ring) Size() int { return r.cfg.Size }

// Generation returns the ring formation this Ring belongs to.
func (r *Ring) Generation() uint64 { return r.cfg.Generation }

// Close closes the transport. Calls under way return an error; later calls
// return ErrClosed. It is safe to call more than once.
func (r *Ring) Close() error {
	var err error
	if r.t != nil {
		err = r.t.Close()
	}
	r.mu.Lock()
	if r.err == nil {
		r.err = ErrClosed
	}
	r.mu.Unlock()
	return err
}

// Drainer is a Transport that can be left cleanly (Streams is one).
type Drainer interface {
	// Drain half-closes the link to the successor, so that what was
	// written is delivered and then the end of it, waits until both
	// neighbours have closed their ends of the links — they have read
	// all they will — or ctx ends, and closes the transport.
	Drain(ctx context.Context) error
}

// Leave closes the ring as a rank that leaves while the others carry on:
// what it sent last is read before it goes. A rank that closed at once
// could have its kernel answer the frames still arriving with a reset,
// which throws away what the neighbour had received but not yet read — the
// last frames of the step that told the others it was leaving. Leave
// returns once the neighbours have closed their links (they re-form
// without this rank), or when ctx ends; either way the ring is closed.
func (r *Ring) Leave(ctx context.Context) error {
	r.mu.Lock()
	if r.err == nil {
		r.err = ErrClosed
	}
	r.mu.Unlock()
	if d, ok := r.t.(Drainer); ok {
		return d.Drain(ctx)
	}
	if r.t != nil {
		return r.t.Close()
	}
	return nil
}

// AllreduceSum replaces buf on every rank with the element-wise sum of all
// ranks' buffers. Every rank ends with the same bits.
func (r *Ring) AllreduceSum(ctx context.Context, buf []float32) error {
	return r.allreduce(ctx, OpAllreduceSum, buf)
}

// AllreduceMean replaces buf on every rank with the element-wise mean of all
// ranks' buffers. Every rank ends with the same bits.
func (r *Ring) AllreduceMean(ctx context.Context, buf []float32) error {
	return r.allreduce(ctx, OpAllreduceMean, buf)
}

// AllreduceMeanAs is AllreduceMean with the values sent as enc (BF16,
// FP16, I8): each hop's partial sums are narrowed to enc on the wire and added
// in float32, and each rank narrows the segment it completes before sending
// it round, so every rank still ends with the same bits — the mean rounded
// to enc. All ranks must pass the same enc; a rank that passes another is
// caught with ErrMismatch. F32 is AllreduceMean.
func (r *Ring) AllreduceMeanAs(ctx context.Context, buf []float32, enc Encoding) error {
	if !enc.known() {
		return fmt.Errorf("ring: unknown encoding %v", enc)
	}
	return r.call(ctx, func(seq uint64) error { return r.ringAllreduceAs(seq, OpAllreduceMean, enc, buf) })
}

// AwaitIncoming returns once the first byte of the next collective has
// come from the predecessor: some rank has begun it. It reads that byte
// ahead and keeps it for the collective, and it may run beside a
// collective call (one goroutine may wait here while another, finding
// it has its own part ready, calls the collective): the collective's
// reads wait until it returns, which they need not, as the collective
// brings the byte. If ctx ends first, or the ring is closed, it returns
// that error; an AwaitIncoming left blocked returns when the ring closes.
// A ring of one has no predecessor: it waits for ctx.
func (r *Ring) AwaitIncoming(ctx context.Context) error {
	if r.cfg.Size == 1 {
		<-ctx.Done()
		return ctx.Err()
	}
	done := make(chan error, 1)
	go func() { done <- r.fr.r.await() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("ring: rank %d: awaiting a collective from rank %d: %w", r.cfg.Rank, mod(r.cfg.Rank-1, r.cfg.Size), readErr(err))
		}
		return nil
	case <-ctx.Done():
		// The read goes on until a byte comes or the ring closes; what it
		// reads is kept for the next collective.
		return ctx.Err()
	}
}

// Stats are what a ring has done, for metrics.
type Stats struct {
	// BytesSent counts every frame's bytes, headers included, since New.
	BytesSent int64
	// LastWait is how long the last allreduce waited for its neighbour's
	// first frame: the time the other ranks took to reach it.
	LastWait time.Duration
}

// Stats returns the ring's figures; call it between collectives.
func (r *Ring) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Barrier returns once every rank has entered it.
func (r *Ring) Barrier(ctx context.Context) error {
	// An empty allreduce still sends one frame per step, and the last
	// frame a rank receives depends, through 2(n-1) hops, on every rank
	// having entered the call.
	return r.allreduce(ctx, OpBarrier, nil)
}

// Broadcast copies root's buf into buf on every other rank.
func (r *Ring) Broadcast(ctx context.Context, buf []float32, root int) error {
	if root < 0 || root >= r.cfg.Size {
		return fmt.Errorf("ring: broadcast root %d outside [0, %d)", root, r.cfg.Size)
	}
	return r.call(ctx, func(seq uint64) error { return r.broadcast(seq, buf, root) })
}

func (r *Ring) allreduce(ctx context.Context, op Op, buf []float32) error {
	return r.call(ctx, func(seq uint64) error { return r.ringAllreduceAs(seq, op, F32, buf) })
}

// call runs one collective: it serialises calls, ties the transport to ctx
// and takes the ring down when the collective fails.
func (r *Ring) call(ctx context.Context, run func(seq uint64) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.cfg.Size == 1 {
		return nil
	}
	r.seq++
	// Closing the transport is the only way to unblock a Read or Write
	// in progress; it also tells the neighbours, whose calls then fail too.
	stop := context.AfterFunc(ctx, func() { r.t.Close() })
	err := run(r.seq)
	if !stop() && ctx.Err() != nil {
		err = fmt.Errorf("ring: rank %d: %w", r.cfg.Rank, ctx.Err())
	}
	if err != nil {
		r.t.Close()
		r.err = fmt.Errorf("%w after: %w", ErrClosed, err)
	}
	return err
}

// segmentOf is segment for a blockwise encoding: whole blocks of blk
// elements are cut into size segments, the last block short if count is
// not a multiple.
func segmentOf(count uint64, size, k int, blk uint64) (start, length uint64) {
	if blk <= 1 {
		return segment(count, size, k)
	}
	start, length = segment((count+blk-1)/blk, size, k)
	start = min(start*blk, count) // a segment past the last block is empty
	length = min(length*blk, count-start)
	return start, length
}

// segment returns the first element and the length of segment k when count
// elements are cut into size segments that differ in length by at most one.
func segment(count uint64, size, k int) (start, length uint64) {
	n := uint64(size)
	base, rem := count/n, count%n
	kk := uint64(k)
	start = kk*base + min(kk, rem)
	length = base
	if kk < rem {
		length++
	}
	return start, length
}

// frames returns how many frames carry length elements in chunks of chunk
// elements. An empty segment still takes one empty frame, so that every rank
// sends and receives the same frames whatever the buffer's length; that is
// what lets a mismatched call be caught rather than hang.
func frames(length uint64, chunk int) int {
	if length == 0 {
		return 1
	}
	c := uint64(chunk)
	return int((length + c - 1) / c)
}

func mod(a, n int) int { return ((a % n) + n) % n }

// asBytes views f as its little-endian bytes without copying.
func asBytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
}

// flow carries the hand-offs between the two halves of one call. Both
// channels hold struct{}, which takes no memory however many frames a call has.
type flow struct {
	// ready: recv → send, one per received frame that send will forward,
	// in the order send forwards them.
	ready chan struct{}
	// sent: send → recv, one per frame whose memory recv will later
	// overwrite, once it is on the wire. The ring's own causality already
	// orders the two (the frame that overwrites it cannot arrive before
	// ours left), but only through the network, which a lying peer can
	// break and the race detector cannot see. Closed when send returns.
	sent chan struct{}
	// quit is closed when recv fails, so send stops waiting on ready.
	quit chan struct{}
}

// awaitReady waits for the next frame to forward; false means stop.
func (f *flow) awaitReady() bool {
	select {
	case <-f.ready:
		return true
	case <-f.quit:
		return false
	}
}

// awaitSent waits until the next frame send owes is out; false means send
// has returned without it.
func (f *flow) awaitSent() bool {
	_, ok := <-f.sent
	return ok
}

// errSendStopped is what recv reports when send gave up first; pipe
// returns send's own error in its place.
var errSendStopped = errors.New("ring: send stopped")

// pipe runs send and recv at once and returns when both have. If either side
// fails, the transport is closed so the other cannot block, and the error of
// the side that failed first is returned.
func (r *Ring) pipe(send func(f *flow) error, recv func(f *flow) error, nframes int) error {
	f := &flow{
		ready: make(chan struct{}, nframes),
		sent:  make(chan struct{}, nframes),
		quit:  make(chan struct{}),
	}
	sendErr := make(chan error, 1)
	go func() {
		err := send(f)
		close(f.sent)
		if err != nil {
			r.t.Close()
		}
		sendErr <- err
	}()
	rerr := recv(f)
	if rerr != nil {
		// Only on failure: after a clean recv every ready token is
		// queued, and send must still forward the last of them.
		r.t.Close()
		close(f.quit)
	}
	serr := <-sendErr
	// The other side's error is usually just the closed transport.
	switch {
	case rerr != nil && serr != nil:
		if errors.Is(rerr, errSendStopped) || errors.Is(rerr, ErrPeerLost) && !errors.Is(serr, ErrPeerLost) {
			return serr
		}
		return rerr
	case rerr != nil:
		return rerr
	}
	return serr
}

// BuffersWriter is an optional Transport method: it sends several byte
// slices to the successor as one write (writev on a TCP connection), which
// saves a system call per frame. Streams has it.
type BuffersWriter interface {
	WriteBuffers(b *net.Buffers) (int64, error)
}

// writeFrame sends one frame: the header, then payload straight from the
// caller's buffer.
func (r *Ring) writeFrame(h *Header, payload []float32) error {
	return r.writeBytes(h, asBytes(payload))
}

// writeBytes sends one frame whose payload is already in wire form.
func (r *Ring) writeBytes(h *Header, payload []byte) error {
	putHeader(r.hdr[:], h)
	r.stats.BytesSent += int64(HeaderSize + len(payload))
	var err error
	if bw, ok := r.t.(BuffersWriter); ok && len(payload) > 0 {
		r.bufs = append(r.bufArr[:0], r.hdr[:], payload)
		_, err = bw.WriteBuffers(&r.bufs)
	} else if _, err = r.t.Write(r.hdr[:]); err == nil && len(payload) > 0 {
		_, err = r.t.Write(payload)
	}
	if err != nil {
		return r.sendErr(h, err)
	}
	return nil
}

func (r *Ring) sendErr(h *Header, err error) error {
	succ := mod(r.cfg.Rank+1, r.cfg.Size)
	return fmt.Errorf("ring: rank %d: %v seq %d step %d: sending to rank %d: %w: %w",
		r.cfg.Rank, h.Op, h.Seq, h.Step, succ, ErrPeerLost, err)
}

func (r *Ring) recvErr(want *Header, err error) error {
	pred := mod(r.cfg.Rank-1, r.cfg.Size)
	return fmt.Errorf("ring: rank %d: %v seq %d step %d: frame from rank %d: %w",
		r.cfg.Rank, want.Op, want.Seq, want.Step, pred, err)
}

// ringAllreduce is reduce-scatter then all-gather. In step s (of 2(n-1)) a
// rank sends segment rank-s and receives segment rank-s-1: in the first n-1
// steps it adds what it receives, after which it holds one fully reduced
// segment; in the last n-1 steps it copies, so every rank ends with the same
// bits. A frame received in step s is forwarded in step s+1 as soon as it has
// been added, which is what pipelines the chunks.
//
// With a narrow encoding, frames carry enc's bytes (encoded from buf into
// a buffer of the sender's, decoded into a buffer of the receiver's), and
// the rank that completes a segment narrows its own copy the same way
// before sending it, so all ranks hold the bits that went round.
func (r *Ring) ringAllreduceAs(seq uint64, op Op, enc Encoding, buf []float32) error {
	began := time.Now()
	r.stats.LastWait = 0
	n, rank := r.cfg.Size, r.cfg.Rank
	count := uint64(len(buf))
	steps := 2 * (n - 1)
	base := Header{Op: op, Encoding: enc, Generation: r.cfg.Generation, Seq: seq, Count: count}
	chunk, blk, nframes := r.prepareAllreduce(enc, count)
	segment := func(count uint64, n, k int) (uint64, uint64) { return segmentOf(count, n, k, blk) }

	send := func(f *flow) error {
		for s := range steps {
			seg := mod(rank-s, n)
			start, length := segment(count, n, seg)
			h := base
			h.Step, h.Segment = uint32(s), uint32(seg)
			for c := range frames(length, chunk) {
				if s > 0 && !f.awaitReady() {
					return nil
				}
				lo := start + uint64(c*chunk)
				hi := min(lo+uint64(chunk), start+length)
				h.Offset, h.Length = lo, uint32(enc.Size(int(hi-lo)))
				// Step n-1 sends the segment this rank completed: it keeps
				// what the others get.
				if err := r.sendFrame(&h, enc, buf[lo:hi], s == n-1); err != nil {
					return err
				}
				if s < n-1 { // all-gather step s+n-1 overwrites this frame's memory
					f.sent <- struct{}{}
				}
			}
		}
		return nil
	}

	recv := func(f *flow) error {
		for s := range steps {
			seg := mod(rank-s-1, n)
			start, length := segment(count, n, seg)
			want := base
			want.Step, want.Segment = uint32(s), uint32(seg)
			div := 0 // the mean divides a segment by n once this step completes it
			if s == n-2 && op == OpAllreduceMean {
				div = n
			}
			for c := range frames(length, chunk) {
				lo := start + uint64(c*chunk)
				hi := min(lo+uint64(chunk), start+length)
				want.Offset, want.Length = lo, uint32(enc.Size(int(hi-lo)))
				if err := r.recvFrame(f, &want, enc, buf[lo:hi], s < n-1, div); err != nil {
					return err
				}
				if s == 0 && c == 0 {
					// Until the neighbour's first frame came, this rank
					// waited for the others to reach the collective.
					r.stats.LastWait = time.Since(began)
				}
				if s < steps-1 {
					f.ready <- struct{}{}
				}
			}
		}
		return nil
	}
	return r.pipe(send, recv, nframes)
}

// prepareAllreduce sizes a ring allreduce of count values in enc: its
// frames' length (a blockwise encoding's frames and segments start on its
// blocks, blk), the frames it sends over all its steps, and the buffers
// its frames pass through, grown where they are short.
func (r *Ring) prepareAllreduce(enc Encoding, count uint64) (chunk int, blk uint64, nframes int) {
	n := r.cfg.Size
	chunk, blk = r.chunk, uint64(enc.block())
	if blk > 1 {
		chunk = max(int(blk), chunk/int(blk)*int(blk))
	}
	if enc != F32 {
		if need := enc.Size(chunk); len(r.wireOut) < need && count > 0 {
			r.wireOut, r.wireIn = make([]byte, need), make([]byte, need)
		}
	}
	for k := range n {
		_, l := segmentOf(count, n, k, blk)
		nframes += 2 * frames(l, chunk)
	}
	if need := int(min(uint64(min(chunk, addPiece)), count)); len(r.scratch) < need {
		r.scratch = make([]float32, need)
	}
	return chunk, blk, nframes
}

// sendFrame sends src under header h, encoded in enc; with keep, src
// takes the encoded values' bits, as the receivers will.
func (r *Ring) sendFrame(h *Header, enc Encoding, src []float32, keep bool) error {
	if enc == F32 {
		return r.writeFrame(h, src)
	}
	out := r.wireOut[:enc.Size(len(src))]
	enc.encode(out, src)
	if keep {
		enc.decode(src, out)
	}
	return r.writeBytes(h, out)
}

// recvFrame reads the frame want into dst: added to it where reduce (then
// divided by div, if not 0), else copied, once the sender has sent what
// dst held (an all-gather frame overwrites what a reduce-scatter step
// sent).
func (r *Ring) recvFrame(f *flow, want *Header, enc Encoding, dst []float32, reduce bool, div int) error {
	switch {
	case enc != F32:
		if !reduce && !f.awaitSent() {
			return errSendStopped
		}
		in := r.wireIn[:enc.Size(len(dst))]
		if err := r.fr.read(want, in); err != nil {
			return r.recvErr(want, err)
		}
		if !reduce {
			enc.decode(dst, in)
			return nil
		}
		enc.decodeAdd(dst, in)
		if div > 0 {
			scale(dst, div)
		}
	case reduce:
		if err := r.readAdd(want, dst, div); err != nil {
			return r.recvErr(want, err)
		}
	default:
		if !f.awaitSent() {
			return errSendStopped
		}
		if err := r.fr.read(want, asBytes(dst)); err != nil {
			return r.recvErr(want, err)
		}
	}
	return nil
}

// addPiece is how many elements of a payload are read and added at a time:
// small enough that they are still in cache when added, so the payload
// crosses memory once rather than three times.
const addPiece = 64 << 10

// readAdd reads a frame and adds its payload into dst piece by piece,
// then divides each piece by div when div > 0 (the mean).
func (r *Ring) readAdd(want *Header, dst []float32, div int) error {
	if err := r.fr.readHeader(want); err != nil {
		return err
	}
	for len(dst) > 0 {
		src := r.scratch[:min(len(dst), len(r.scratch))]
		if err := r.fr.readPayload(asBytes(src)); err != nil {
			return err
		}
		add(dst[:len(src)], src)
		if div > 0 { // while the piece is still in cache
			scale(dst[:len(src)], div)
		}
		dst = dst[len(src):]
	}
	return nil
}

// broadcast pipelines root's buffer along the ring: each rank after root
// receives a chunk and forwards it, until the last rank, which instead sends
// root one empty frame when it has everything. That frame gives root
// something to read, so a rank that called another collective is caught
// rather than left blocked, and root returns only once every rank has the data.
func (r *Ring) broadcast(seq uint64, buf []float32, root int) error {
	n, rank := r.cfg.Size, r.cfg.Rank
	count := uint64(len(buf))
	h := Header{Op: OpBroadcast, Generation: r.cfg.Generation, Seq: seq, Count: count, Root: uint32(root)}
	ack := h
	ack.Step = 1
	nf := frames(count, r.chunk)
	dist := mod(rank-root, n) // hops from root
	last := dist == n-1

	chunk := func(c int) Header {
		f := h
		f.Offset = uint64(c * r.chunk)
		f.Length = uint32(4 * (min(f.Offset+uint64(r.chunk), count) - f.Offset))
		return f
	}
	send := func(f *flow) error {
		if last {
			if !f.awaitReady() {
				return nil
			}
			return r.writeFrame(&ack, nil)
		}
		for c := range nf {
			if dist > 0 && !f.awaitReady() {
				return nil
			}
			h := chunk(c)
			if err := r.writeFrame(&h, buf[h.Offset:h.Offset+uint64(h.Length/4)]); err != nil {
				return err
			}
		}
		return nil
	}
	recv := func(f *flow) error {
		if dist == 0 {
			if err := r.fr.read(&ack, nil); err != nil {
				return r.recvErr(&ack, err)
			}
			return nil
		}
		for c := range nf {
			want := chunk(c)
			if err := r.fr.read(&want, asBytes(buf[want.Offset:want.Offset+uint64(want.Length/4)])); err != nil {
				return r.recvErr(&want, err)
			}
			if !last {
				f.ready <- struct{}{}
			}
		}
		if last {
			f.ready <- struct{}{}
		}
		return nil
	}
	return r.pipe(send, recv, nf+1)
}
