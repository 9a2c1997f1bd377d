package elastic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ringtrain/ringtrain/ring"
)

// errKilled is how a killed peer's part ends.
var errKilled = errors.New("killed")

// world is the one fake of the p2p layer that replica jobs and pipeline
// jobs are both tested against (a member is a StageNet): it hands out
// in-memory rings, one generation after another, and, for pipelines, a
// ring per stage and a pair of pipes per boundary, each generation's
// own. A ring forms, as p2p's re-formation agreement does, once every
// peer it holds asks for it — each peer says which ring it wants, so
// peers that disagree (one drops a liar, another does not) form none. It
// kills peers on cue — in a step, while the ring re-forms, while it admits
// them — closing every stream they hold.
type world struct {
	t       *testing.T
	dropped []string // peers the jobs said they dropped for lying, under mu
	// distrusted: peers the jobs told their membership to keep out, under mu
	distrusted []string
	mu         sync.Mutex
	cond       *sync.Cond
	gen        uint64
	members    []string // the current ring, in rank order
	rings      map[string]*ring.Ring
	owned      map[string][]io.Closer // every stream a peer holds, closed when it is killed
	dead       map[string]bool
	standby    []string
	pending    map[string]*joiner // the peers asking for the next ring
	formed     [][]string         // every ring made, in order
	stages     map[string][]ring.Transport
	pipes      map[string][2]io.ReadWriteCloser
	// killOnReform kills a peer when it asks to re-form; killOnAdmit a
	// newcomer when the ring grows to take it; leaveOnReform cancels a
	// peer's context (Ctrl-C) when it asks to re-form.
	killOnReform, killOnAdmit map[string]bool
	leaveOnReform             map[string]context.CancelFunc
	// stallOnAdmit: a newcomer that stops answering once its ring is
	// made (SIGSTOP), until done; stalled ones are unreachable.
	stallOnAdmit, stalled map[string]bool
	done                  chan struct{}
	// leaveOnGrow cancels a peer's context when the ring grows; growing
	// is closed when it first does. checkpoints gives every peer a
	// checkpoint written every 5 steps.
	leaveOnGrow map[string]context.CancelFunc
	growing     chan struct{}
	grew        sync.Once
	checkpoints bool
	// ended are the peers that told the standbys the job had ended.
	ended []string
}

// joiner is a peer asking for the next ring: the ring it wants (sorted;
// nil, a newcomer's: any that holds it), and where it gets it.
type joiner struct {
	want []string
	came chan *ring.Ring
}

func newWorld(t *testing.T, names []string) *world {
	w := &world{t: t, gen: 1, members: slices.Clone(names), rings: map[string]*ring.Ring{}, owned: map[string][]io.Closer{},
		dead: map[string]bool{}, pending: map[string]*joiner{}, stages: map[string][]ring.Transport{}, pipes: map[string][2]io.ReadWriteCloser{},
		killOnReform: map[string]bool{}, killOnAdmit: map[string]bool{}, leaveOnReform: map[string]context.CancelFunc{},
		stallOnAdmit: map[string]bool{}, stalled: map[string]bool{}, done: make(chan struct{}),
		leaveOnGrow: map[string]context.CancelFunc{}, growing: make(chan struct{})}
	w.cond = sync.NewCond(&w.mu)
	w.formed = append(w.formed, slices.Clone(names))
	w.makeRingsLocked(names)
	return w
}

// peers are n peers' names: peer-0, peer-1, …
func peers(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("peer-%d", i)
	}
	return names
}

// member is one peer's StageNet in the world.
func (w *world) member(name string) *member { return &member{w: w, name: name} }

// makeRingsLocked makes the rings of the generation of names, in rank
// order, and hands each peer its own.
func (w *world) makeRingsLocked(names []string) {
	ts := ring.MemRing(len(names))
	for i, n := range names {
		ts[i] = &freezable{Transport: ts[i], w: w, name: n, closed: make(chan struct{})}
		r, err := ring.New(ts[i], ring.Config{Rank: i, Size: len(names), Generation: w.gen})
		if err != nil {
			w.t.Error(err)
		}
		w.rings[n] = r
		w.owned[n] = append(w.owned[n], ts[i])
	}
}

// freezable is a peer's ring transport that stops moving bytes once the
// peer is stalled (SIGSTOP: world.stall), holding what it has read, until
// the world is done or the transport is closed.
type freezable struct {
	ring.Transport
	w      *world
	name   string
	closed chan struct{}
	once   sync.Once
}

// hold waits, while the peer is stalled, for the world's end or the
// transport's close, and then fails.
func (f *freezable) hold() error {
	f.w.mu.Lock()
	stalled := f.w.stalled[f.name]
	f.w.mu.Unlock()
	if !stalled {
		return nil
	}
	select {
	case <-f.w.done:
	case <-f.closed:
	}
	return errKilled
}

func (f *freezable) Read(p []byte) (int, error) {
	if err := f.hold(); err != nil {
		return 0, err
	}
	n, err := f.Transport.Read(p)
	if err := f.hold(); err != nil {
		return 0, err
	}
	return n, err
}

func (f *freezable) Write(p []byte) (int, error) {
	if err := f.hold(); err != nil {
		return 0, err
	}
	return f.Transport.Write(p)
}

func (f *freezable) Close() error {
	f.once.Do(func() { close(f.closed) })
	return f.Transport.Close()
}

// stall stops a peer as SIGSTOP would: its rings stop moving bytes, and
// it is in no ring made after, until the world is done.
func (w *world) stall(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stalled[name] = true
}

// kill ends a peer as SIGKILL would: every stream it holds closes under
// its neighbours, and it is in no ring made after.
func (w *world) kill(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.killLocked(name)
}

// breakRing closes a peer's current ring, and only that.
func (w *world) breakRing(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rings[name].Close()
}

func (w *world) killLocked(name string) {
	w.dead[name] = true
	if r := w.rings[name]; r != nil {
		r.Close()
	}
	for _, c := range w.owned[name] {
		c.Close()
	}
	w.standby = slices.DeleteFunc(w.standby, func(s string) bool { return s == name })
	// The others stop waiting for it, as p2p's agreement does for a peer
	// it cannot reach.
	for _, j := range w.pending {
		if j.want != nil {
			j.want = slices.DeleteFunc(slices.Clone(j.want), func(s string) bool { return s == name })
		}
	}
	w.completeLocked()
	w.cond.Broadcast()
}

// join asks for the ring want (nil: any that holds this peer) and waits
// until it forms.
func (w *world) join(ctx context.Context, name string, want []string) (*ring.Ring, error) {
	w.mu.Lock()
	if w.dead[name] {
		w.mu.Unlock()
		return nil, errKilled
	}
	if want != nil {
		want = slices.Sorted(slices.Values(want))
	}
	ch := make(chan *ring.Ring, 1)
	w.pending[name] = &joiner{want: want, came: ch}
	w.cond.Broadcast() // standbys look for a change that wants them
	w.completeLocked()
	w.mu.Unlock()
	select {
	case r := <-ch:
		if r == nil {
			return nil, errors.New("world: too few peers for the next ring, or one without this peer")
		}
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(20 * time.Second):
		return nil, errors.New("world: the other peers never came, or want another ring")
	}
}

// wantedLocked reports whether a pending peer's ring wants name.
func (w *world) wantedLocked(name string) bool {
	for _, j := range w.pending {
		if slices.Contains(j.want, name) {
			return true
		}
	}
	return false
}

// completeLocked makes the ring one pending peer wants once every peer
// it holds has asked for that ring (or, a newcomer, for any).
func (w *world) completeLocked() {
	for _, j := range w.pending {
		if j.want == nil {
			continue
		}
		agreed := true
		for _, n := range j.want {
			o := w.pending[n]
			agreed = agreed && o != nil && (o.want == nil || slices.Equal(o.want, j.want))
		}
		if agreed {
			w.makeLocked(j.want)
			return
		}
	}
}

// makeLocked makes the next generation of want; the other peers asking
// get none.
func (w *world) makeLocked(want []string) {
	w.gen++
	w.makeRingsLocked(want)
	for n, j := range w.pending {
		if slices.Contains(want, n) {
			j.came <- w.rings[n]
		} else {
			j.came <- nil
		}
	}
	w.pending = map[string]*joiner{}
	w.members = want
	w.formed = append(w.formed, slices.Clone(want))
	w.standby = slices.DeleteFunc(w.standby, func(s string) bool { return slices.Contains(want, s) })
	w.cond.Broadcast()
}

func (w *world) alive(names []string) []string {
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return w.dead[n] || w.stalled[n] })
}

func (w *world) current() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.members)
}

// member is one peer's StageNet in the world.
type member struct {
	w    *world
	name string
	cur  []string
}

func (m *member) Form(ctx context.Context) (*ring.Ring, bool, error) {
	w := m.w
	w.mu.Lock()
	if r := w.rings[m.name]; r != nil {
		m.cur = slices.Clone(w.members)
		w.mu.Unlock()
		return r, false, nil
	}
	// A newcomer: a standby until a growth wants it.
	w.standby = append(w.standby, m.name)
	late := false
	timer := time.AfterFunc(20*time.Second, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		late = true
		w.cond.Broadcast()
	})
	defer timer.Stop()
	for !w.wantedLocked(m.name) {
		if late {
			w.mu.Unlock()
			return nil, false, errors.New("world: never admitted")
		}
		w.cond.Wait()
	}
	if w.killOnAdmit[m.name] {
		w.killLocked(m.name)
		w.mu.Unlock()
		return nil, false, errKilled
	}
	w.mu.Unlock()
	r, err := w.join(ctx, m.name, nil)
	m.cur = w.current()
	w.mu.Lock()
	stall := w.stallOnAdmit[m.name]
	w.stalled[m.name] = stall
	w.mu.Unlock()
	if stall {
		<-w.done
		return nil, false, errKilled
	}
	return r, true, err
}

func (m *member) Reform(ctx context.Context, minSize int, gone []int) (*ring.Ring, error) {
	w := m.w
	w.mu.Lock()
	if w.killOnReform[m.name] {
		w.killLocked(m.name)
	}
	if cancel := w.leaveOnReform[m.name]; cancel != nil {
		cancel()
	}
	out := pick(m.cur, gone)
	want := slices.DeleteFunc(w.alive(m.cur), func(n string) bool { return slices.Contains(out, n) })
	w.mu.Unlock()
	r, err := w.join(ctx, m.name, want)
	if err == nil && r.Size() < minSize {
		r.Close()
		return nil, fmt.Errorf("world: %d peers left, fewer than %d", r.Size(), minSize)
	}
	m.cur = w.current()
	return r, err
}

func (m *member) Grow(ctx context.Context, add []string, admit bool, minSize int) (*ring.Ring, error) {
	m.w.grew.Do(func() { close(m.w.growing) })
	m.w.mu.Lock()
	if cancel := m.w.leaveOnGrow[m.name]; cancel != nil {
		cancel()
	}
	want := m.w.alive(append(slices.Clone(m.cur), add...))
	m.w.mu.Unlock()
	r, err := m.w.join(ctx, m.name, want)
	m.cur = m.w.current()
	return r, err
}

// Ended records that m told the standbys the job had ended.
func (m *member) Ended(context.Context) {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	m.w.ended = append(m.w.ended, m.name)
}

func (m *member) Standbys() []string {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	return slices.Sorted(slices.Values(m.w.standby))
}

func (m *member) Members() []string { return m.cur }

// Distrust records the peers m was told to keep out.
func (m *member) Distrust(peers []string) {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	m.w.distrusted = append(m.w.distrusted, peers...)
}

// rankLocked is the member's rank in the current ring, or −1.
func (m *member) rankLocked() int { return slices.Index(m.w.members, m.name) }

// StageRing connects the ring of the current ring's members at ranks.
func (m *member) StageRing(_ context.Context, ranks []int) (*ring.Ring, error) {
	w := m.w
	w.mu.Lock()
	defer w.mu.Unlock()
	key := fmt.Sprint(w.gen, ranks)
	ts, ok := w.stages[key]
	if !ok {
		ts = ring.MemRing(len(ranks))
		w.stages[key] = ts
		for i, r := range ranks {
			w.owned[w.members[r]] = append(w.owned[w.members[r]], ts[i])
		}
	}
	for i, r := range ranks {
		if r == m.rankLocked() {
			return ring.New(ts[i], ring.Config{Rank: i, Size: len(ranks), Generation: w.gen})
		}
	}
	return nil, fmt.Errorf("rank %d not in %v", m.rankLocked(), ranks)
}

// Boundary connects the member with the members at ranks prev and next.
func (m *member) Boundary(_ context.Context, prev, next int) (io.ReadWriteCloser, io.ReadWriteCloser, error) {
	return m.end(prev), m.end(next), nil
}

// end is this member's end of the pipe pair with the member at rank
// other, or nil for −1.
func (m *member) end(other int) io.ReadWriteCloser {
	if other < 0 {
		return nil
	}
	w := m.w
	w.mu.Lock()
	defer w.mu.Unlock()
	me := m.rankLocked()
	lo, hi := min(me, other), max(me, other)
	key := fmt.Sprint(w.gen, lo, hi)
	ends, ok := w.pipes[key]
	if !ok {
		ar, aw := io.Pipe()
		br, bw := io.Pipe()
		ends = [2]io.ReadWriteCloser{pipeEnd{aw, br}, pipeEnd{bw, ar}}
		w.pipes[key] = ends
		w.owned[w.members[lo]] = append(w.owned[w.members[lo]], ends[0])
		w.owned[w.members[hi]] = append(w.owned[w.members[hi]], ends[1])
	}
	if me == lo {
		return ends[0]
	}
	return ends[1]
}

type pipeEnd struct {
	w *io.PipeWriter
	r *io.PipeReader
}

func (e pipeEnd) Read(b []byte) (int, error)  { return e.r.Read(b) }
func (e pipeEnd) Write(b []byte) (int, error) { return e.w.Write(b) }
func (e pipeEnd) Close() error                { e.w.Close(); return e.r.Close() }

// drop records peers a job said it dropped for lying.
func (w *world) drop(peers []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.dropped = append(w.dropped, peers...)
}
