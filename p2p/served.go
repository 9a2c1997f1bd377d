package p2p

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	mh "github.com/multiformats/go-multihash"
	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/ringtrain/ringtrain/data"
)

// DataProtocol carries served datasets: a client asks for a dataset's
// manifest by its ID, then for samples by index, on one stream, one request
// at a time:
//
//	request:  op u8 (1 manifest, 2 samples) | dataset ID [32]byte
//	          samples: split u8 (0 train, 1 test) | count u32 | count × index u32
//	answer:   status u8 | manifest: length u64, its bytes
//	                      | samples: their pixels, in order (the manifest says how many bytes each)
//
// Integers are little-endian. The client checks the manifest against the
// ID and every sample against the manifest.
const DataProtocol protocol.ID = "/ringtrain/data/1.0.0"

const (
	opManifest = 1
	opSamples  = 2

	statusOK      = 0
	statusUnknown = 1 // the server does not serve that dataset
	statusBusy    = 2 // the server's limits are reached: ask elsewhere or later
	statusBad     = 3 // a request the server will not answer
)

// Errors callers branch on.
var (
	// ErrNoServer means no peer served the dataset within the time allowed.
	ErrNoServer = errors.New("p2p: no server of the dataset")
	// ErrNoJobConfig means no peer of the job handed out a config with
	// the hash asked for within the time allowed.
	ErrNoJobConfig = errors.New("p2p: no peer handed out the job config")
)

// dataKey is where a dataset's servers announce themselves in the DHT: a
// hash of its ID, not the ID, so that the peers that store the records do
// not learn the ID, which is what a client needs to fetch the data.
func dataKey(id [32]byte) cid.Cid {
	sum := sha256.Sum256(append([]byte("ringtrain data provider\x00"), id[:]...))
	h, _ := mh.Encode(sum[:], mh.SHA2_256) // cannot fail for a SHA-256 of the right length
	return cid.NewCidV1(cid.Raw, h)
}

// DataServerConfig bounds what a data server gives. Zero values mean the
// defaults given.
type DataServerConfig struct {
	// MaxRequest is the most samples one request may ask for. Default 8192.
	MaxRequest int
	// MaxStreams is how many clients' streams are served at once. Default 64.
	MaxStreams int
	// MaxPerPeer is how many of those one peer may hold, so that one client
	// cannot starve the others. Default 8.
	MaxPerPeer int
	// MaxPerIP is how many one address may hold (an IPv6 /56), whatever
	// identities it holds: eight sybils once took all 64 slots from one
	// address. 127.0.0.1 and ::1, a machine's own peers, are exempt.
	// Default 16: a few workers behind one NAT.
	MaxPerIP int
	// Idle closes a stream that has made no progress — samples served, or
	// its first manifest — for this long; requests that make none (the
	// manifest again and again) do not keep it open. Default 2 min.
	Idle time.Duration
	// Stale is how long a stream may make no progress before a new
	// stream, when every slot is taken, may have its slot: a fair share
	// for peers that train over peers that hold slots. Default 10 s.
	Stale time.Duration
	// Answer bounds reading one request and writing its answer: a client
	// that stops reading is cut off. Default 1 min.
	Answer time.Duration
	// PeerBytesPerSecond paces what one peer is sent, all its streams
	// together, so that a client asking as fast as it can — a valid one
	// too — takes no more of a serving peer's cores than this. Default 64
	// MiB/s: about ten times what a peer training the mlp here takes
	// (some 7,000 samples/s of 784 bytes), and a fetched dataset is
	// cached (cache_dir) after its first epoch.
	PeerBytesPerSecond int64
	// Announce is the first pause between announcements in the DHT; it
	// doubles up to 10 minutes. Default 1 s.
	Announce time.Duration
	Logger   zerolog.Logger
}

func (c *DataServerConfig) fill() {
	if c.MaxRequest <= 0 {
		c.MaxRequest = 8192
	}
	if c.MaxStreams <= 0 {
		c.MaxStreams = 64
	}
	if c.MaxPerPeer <= 0 {
		c.MaxPerPeer = 8
	}
	if c.MaxPerIP <= 0 {
		c.MaxPerIP = 16
	}
	if c.Stale <= 0 {
		c.Stale = 10 * time.Second
	}
	if c.Idle <= 0 {
		c.Idle = 2 * time.Minute
	}
	if c.Answer <= 0 {
		c.Answer = time.Minute
	}
	if c.Announce <= 0 {
		c.Announce = time.Second
	}
	if c.PeerBytesPerSecond <= 0 {
		c.PeerBytesPerSecond = 64 << 20
	}
}

// DataServer serves datasets over DataProtocol and announces them in the
// DHT. It serves whoever asks with a dataset's ID: the ID is what a client
// must know, as with any content address. It keeps serving until Close,
// whether or not anyone trains.
type DataServer struct {
	h      *Host
	cfg    DataServerConfig
	warns  *warnLimiter // warnings about what clients did
	strike func(peer.ID, string)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	sets    map[[32]byte]*servedSet
	open    map[network.Stream]*servedStream
	perPeer map[peer.ID]int
	perIP   map[netip.Addr]int
	paces   map[peer.ID]*rate.Limiter // of the peers with a stream open
}

// servedStream is a stream being served: whose, from where, and when it
// last made progress.
type servedStream struct {
	from     peer.ID
	ip       netip.Addr // zero where exempt
	progress time.Time
	evicted  bool // its slot was given to another: released already
}

type servedSet struct {
	m      *data.Manifest
	splits []*data.Dataset // in the manifest's order
}

// NewDataServer registers DataProtocol on h. Close it when done.
func NewDataServer(h *Host, cfg DataServerConfig) *DataServer {
	cfg.fill()
	s := &DataServer{h: h, cfg: cfg, warns: newWarnLimiter(cfg.Logger).byAddress(h), sets: map[[32]byte]*servedSet{},
		open: map[network.Stream]*servedStream{}, perPeer: map[peer.ID]int{}, perIP: map[netip.Addr]int{}, paces: map[peer.ID]*rate.Limiter{}}
	s.strike = h.Guard.Strike
	s.ctx, s.cancel = context.WithCancel(context.Background())
	h.SetStreamHandler(DataProtocol, s.handle)
	return s
}

// Serve offers a dataset: m describes splits, which hold the images (the
// train split, then the test split if m has one). It announces the
// dataset in the DHT until Close.
func (s *DataServer) Serve(m *data.Manifest, splits ...*data.Dataset) error {
	if len(splits) != len(m.Splits) {
		return fmt.Errorf("p2p: serving %d splits for a manifest of %d", len(splits), len(m.Splits))
	}
	for i, d := range splits {
		if d.Len() != len(m.Splits[i].Samples) {
			return fmt.Errorf("p2p: the %s split holds %d samples, its manifest %d", m.Splits[i].Name, d.Len(), len(m.Splits[i].Samples))
		}
	}
	id, err := data.ParseID(m.ID())
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.sets[id] = &servedSet{m: m, splits: splits}
	s.mu.Unlock()
	s.wg.Go(func() { announce(s.ctx, s.h, dataKey(id), s.cfg.Announce) })
	return nil
}

// Close stops serving: it cuts the open streams off and waits for their
// handlers and the announcements to end.
func (s *DataServer) Close() {
	s.h.RemoveStreamHandler(DataProtocol)
	s.cancel()
	s.mu.Lock()
	for st := range s.open {
		st.Reset()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// announce provides key in the DHT now and again, so that peers that
// came later find it too; a failed attempt (an empty routing table, say)
// is retried sooner.
func announce(ctx context.Context, h *Host, key cid.Cid, first time.Duration) {
	pause := first
	for {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := h.DHT.Provide(actx, key, true); err != nil {
			pause = first
		}
		cancel()
		if sleepCtx(ctx, pause) != nil {
			return
		}
		pause = min(2*pause, 10*time.Minute)
	}
}

// admit takes a stream slot for st, or says the limits are reached. With
// every slot taken, the stream that has made no progress the longest, if
// for Stale, gives its slot up.
func (s *DataServer) admit(st network.Stream, from peer.ID, ip netip.Addr) (*servedStream, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.ctx.Err() != nil || s.perPeer[from] >= s.cfg.MaxPerPeer || ip.IsValid() && s.perIP[ip] >= s.cfg.MaxPerIP {
		return nil, false
	}
	if len(s.open) >= s.cfg.MaxStreams {
		var stale network.Stream
		for o, ss := range s.open {
			if stale == nil || ss.progress.Before(s.open[stale].progress) {
				stale = o
			}
		}
		if now.Sub(s.open[stale].progress) < s.cfg.Stale {
			return nil, false
		}
		s.evictLocked(stale)
	}
	ss := &servedStream{from: from, ip: ip, progress: now}
	s.open[st] = ss
	if s.perPeer[from]++; s.perPeer[from] == 1 {
		s.paces[from] = rate.NewLimiter(rate.Limit(s.cfg.PeerBytesPerSecond), paceBurst)
	}
	if ip.IsValid() {
		s.perIP[ip]++
	}
	s.wg.Add(1)
	return ss, true
}

// evictLocked gives st's slot up: its handler ends as the reset reaches
// it. s.mu held.
func (s *DataServer) evictLocked(st network.Stream) {
	ss := s.open[st]
	s.dropLocked(st, ss)
	ss.evicted = true
	st.Reset()
	s.warns.Warn(ss.from.String(), "gave a data stream that made no progress to another").Msg("gave a data stream that made no progress to another")
}

func (s *DataServer) dropLocked(st network.Stream, ss *servedStream) {
	delete(s.open, st)
	if s.perPeer[ss.from]--; s.perPeer[ss.from] <= 0 {
		delete(s.perPeer, ss.from)
		delete(s.paces, ss.from)
	}
	if ss.ip.IsValid() {
		if s.perIP[ss.ip]--; s.perIP[ss.ip] <= 0 {
			delete(s.perIP, ss.ip)
		}
	}
}

// progressed notes that ss made progress now.
func (s *DataServer) progressed(ss *servedStream) {
	s.mu.Lock()
	ss.progress = time.Now()
	s.mu.Unlock()
}

// paceBurst is how many bytes a peer's pace lets go at once.
const paceBurst = 1 << 20

// pace waits until from may be sent n more bytes, or the server closes.
func (s *DataServer) pace(from peer.ID, n int) error {
	s.mu.Lock()
	lim := s.paces[from]
	s.mu.Unlock()
	if lim == nil {
		return nil
	}
	for n > 0 {
		k := min(n, paceBurst)
		if err := lim.WaitN(s.ctx, k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// streams is how many clients' streams are being served.
func (s *DataServer) streams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.open)
}

func (s *DataServer) release(st network.Stream, ss *servedStream) {
	s.mu.Lock()
	if !ss.evicted {
		s.dropLocked(st, ss)
	}
	s.mu.Unlock()
	s.wg.Done()
}

func (s *DataServer) handle(st network.Stream) {
	from := st.Conn().RemotePeer()
	ss, ok := s.admit(st, from, remoteIP(st))
	if !ok {
		s.warns.Warn(from.String(), "refused a data stream: this peer's or its address's slots, or all, are taken").
			Msg("refused a data stream: this peer's or its address's slots, or all, are taken")
		st.SetDeadline(time.Now().Add(time.Second))
		st.Write([]byte{statusBusy})
		st.Close()
		return
	}
	defer s.release(st, ss)
	defer st.Close()
	br := bufio.NewReaderSize(st, 64<<10)
	bw := bufio.NewWriterSize(st, 256<<10)
	var idx []int
	manifests := 0
	for {
		s.mu.Lock()
		st.SetDeadline(ss.progress.Add(s.cfg.Idle))
		s.mu.Unlock()
		op, err := br.ReadByte()
		if err != nil {
			return // the client is done (or gone), or made no progress for Idle
		}
		st.SetDeadline(time.Now().Add(s.cfg.Answer))
		more, err := s.answer(op, br, bw, from, &idx)
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			st.Reset()
			return
		}
		if !more {
			return
		}
		if op == opSamples || manifests == 0 {
			s.progressed(ss)
		}
		if op == opManifest {
			manifests++
		}
	}
}

// answer reads the rest of a request that began with op and writes its
// answer to bw; more is false after a request it refused, which ends the
// stream. idx is kept between requests, for its room.
func (s *DataServer) answer(op byte, br *bufio.Reader, bw *bufio.Writer, from peer.ID, idx *[]int) (more bool, err error) {
	var id [32]byte
	if _, err := io.ReadFull(br, id[:]); err != nil {
		return false, err
	}
	s.mu.Lock()
	set := s.sets[id]
	s.mu.Unlock()
	switch {
	case op != opManifest && op != opSamples:
		return false, s.refuse(bw, from, fmt.Sprintf("unknown op %d", op))
	case op == opSamples:
		var split byte
		if *idx, err = s.readSamples(br, &split, *idx); err != nil {
			return false, s.refuse(bw, from, err.Error())
		}
		if set == nil {
			return false, s.unknown(bw, from, id)
		}
		if err = set.check(split, *idx); err != nil {
			return false, s.refuse(bw, from, err.Error())
		}
		if err := s.pace(from, set.bytes(split, *idx)); err != nil {
			return false, err
		}
		return true, set.writeSamples(bw, split, *idx)
	case set == nil:
		return false, s.unknown(bw, from, id)
	default:
		enc := set.m.Encoded()
		if err := s.pace(from, len(enc)); err != nil {
			return false, err
		}
		bw.WriteByte(statusOK)
		bw.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(enc))))
		_, err = bw.Write(enc)
		return true, err
	}
}

// readSamples reads a samples request's split and indices, the count
// checked against MaxRequest before any index is read.
func (s *DataServer) readSamples(br *bufio.Reader, split *byte, idx []int) ([]int, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return nil, fmt.Errorf("a request cut short: %w", err)
	}
	*split = hdr[0]
	n := binary.LittleEndian.Uint32(hdr[1:])
	if n == 0 || n > uint32(s.cfg.MaxRequest) {
		return nil, fmt.Errorf("a request for %d samples; at most %d", n, s.cfg.MaxRequest)
	}
	idx = idx[:0]
	var b [4]byte
	for range n {
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return nil, fmt.Errorf("a request cut short: %w", err)
		}
		idx = append(idx, int(binary.LittleEndian.Uint32(b[:])))
	}
	return idx, nil
}

func (set *servedSet) check(split byte, idx []int) error {
	if int(split) >= len(set.splits) {
		return fmt.Errorf("split %d of a dataset of %d", split, len(set.splits))
	}
	n := set.splits[split].Len()
	for _, i := range idx {
		if i >= n {
			return fmt.Errorf("sample %d of the %s split, which has %d", i, set.m.Splits[split].Name, n)
		}
	}
	return nil
}

// bytes is what writeSamples writes of idx.
func (set *servedSet) bytes(split byte, idx []int) int {
	n := 0
	for _, i := range idx {
		n += set.m.Splits[split].Samples[i].Size()
	}
	return n
}

func (set *servedSet) writeSamples(w *bufio.Writer, split byte, idx []int) error {
	d := set.splits[split]
	w.WriteByte(statusOK)
	for _, i := range idx {
		if _, err := w.Write(d.Image(i).Pix); err != nil {
			return err
		}
	}
	return nil
}

// unknown answers a request for a dataset this server does not serve, and
// ends the stream: a strike, so that asking for nothing cannot hold a slot.
func (s *DataServer) unknown(w *bufio.Writer, from peer.ID, id [32]byte) error {
	s.warns.Warn(from.String(), "a data request for a dataset not served here").Str("dataset", fmt.Sprintf("%x", id[:8])).
		Msg("a data request for a dataset not served here")
	s.strike(from, "a data request for a dataset not served here")
	w.WriteByte(statusUnknown)
	return w.Flush()
}

// refuse answers a request the server will not serve, and says so (a few
// times a peer, then counted: warnLimiter); the request is a strike
// against the peer.
func (s *DataServer) refuse(w *bufio.Writer, from peer.ID, why string) error {
	s.warns.Warn(from.String(), "refused a data request").Str("request", why).Msg("refused a data request")
	s.strike(from, "a data request: "+why)
	w.WriteByte(statusBad)
	return w.Flush()
}

// DataClientConfig says how a client finds and uses servers. Zero values
// mean the defaults given.
type DataClientConfig struct {
	// Timeout bounds one request's answer: a server that stalls past it
	// is left for another. Default 20 s.
	Timeout time.Duration
	// ManifestTimeout bounds a manifest's answer. Default 10 s.
	ManifestTimeout time.Duration
	// Find bounds how long Fetch looks for a server when it has none left
	// (and how long OpenServedData looks for the first). Default 30 s.
	Find time.Duration
	// Streams is how many requests one server gets at once. Default 4.
	Streams int
	// Servers, if set, are asked first: peers known to serve the dataset
	// (a --data-from address), before the connected peers and the DHT.
	Servers []peer.AddrInfo
	Logger  zerolog.Logger
}

func (c *DataClientConfig) fill() {
	if c.Timeout <= 0 {
		c.Timeout = 20 * time.Second
	}
	if c.Find <= 0 {
		c.Find = 30 * time.Second
	}
	if c.ManifestTimeout <= 0 {
		c.ManifestTimeout = 10 * time.Second
	}
	if c.Streams <= 0 {
		c.Streams = 4
	}
}

// DataClient fetches a served dataset's samples (a data.Fetcher) from
// every server of it it can find, checking each sample against the
// manifest. A server that sends bytes that do not match is dropped for
// good and named in the log; one that stalls, refuses or goes away is
// left for a while and the request goes to another.
type DataClient struct {
	h   *Host
	id  [32]byte
	m   *data.Manifest
	cfg DataClientConfig

	mu      sync.Mutex
	servers []*dataConn
	bad     map[peer.ID]bool      // sent what does not match: never again
	away    map[peer.ID]time.Time // stalled, refused or unreachable: not before then
	closed  bool
	changed chan struct{} // closed and replaced when a stream slot frees
}

// dataConn is one server and its streams.
type dataConn struct {
	p        peer.ID
	idle     []network.Stream
	inFlight int
}

// OpenServedData finds servers of the dataset id, fetches its manifest
// from the first that has it, and checks it against id; the client then
// fetches from every server found with it. Close the client when done.
func OpenServedData(ctx context.Context, h *Host, id string, cfg DataClientConfig) (*DataClient, error) {
	cfg.fill()
	raw, err := data.ParseID(id)
	if err != nil {
		return nil, err
	}
	c := &DataClient{h: h, id: raw, cfg: cfg, bad: map[peer.ID]bool{}, away: map[peer.ID]time.Time{}, changed: make(chan struct{})}
	for _, ai := range cfg.Servers {
		h.Peerstore().AddAddrs(ai.ID, ai.Addrs, time.Hour)
	}
	fctx, cancel := context.WithTimeout(ctx, cfg.Find)
	defer cancel()
	var tried []string
	for c.m == nil {
		cands := c.candidates(fctx)
		for len(cands) > 0 && c.m == nil {
			batch := cands[:min(len(cands), manifestAsks)]
			cands = cands[len(batch):]
			m, from, failed := c.firstManifest(fctx, batch, id)
			tried = append(tried, failed...)
			if m == nil {
				continue
			}
			c.m = m
			// The other candidates serve too, as far as we know:
			// requests spread over all of them, and a lost server's go
			// to one already in hand. One that does not serve the
			// dataset says so at its first request and is left; what any
			// of them sends is checked against this manifest.
			for _, q := range append(batch, cands...) {
				if q == from || !c.isAway(q) {
					c.addServer(q) // in the order they were found
				}
			}
		}
		if c.m != nil {
			break
		}
		if err := sleepCtx(fctx, 200*time.Millisecond); err != nil {
			c.Close()
			return nil, fmt.Errorf("%w %s within %v: asked %d peers %v", ErrNoServer, id[:16], cfg.Find, len(tried), tried[:min(len(tried), 8)])
		}
	}
	return c, nil
}

// manifestAsks is how many peers are asked for a manifest at once: a few
// that stall cost the wait of one, not of each in turn, and what lying
// peers can make a client hold at once stays bounded.
const manifestAsks = 4

// firstManifest asks the peers for the manifest at once and returns the
// first that checks out, and from whom; the others are then cut off, and
// their answers awaited. A peer that failed, but for being cut off, is
// left (for good if it lied) and described in failed.
func (c *DataClient) firstManifest(ctx context.Context, peers []peer.ID, id string) (*data.Manifest, peer.ID, []string) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type answer struct {
		p   peer.ID
		m   *data.Manifest
		err error
	}
	answers := make(chan answer, len(peers))
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Go(func() {
			m, err := c.fetchManifest(ctx, p, id)
			answers <- answer{p, m, err}
		})
	}
	var failed []string
	var won *answer
	for range peers {
		a := <-answers
		switch {
		case a.err == nil && won == nil:
			won = &a
			cancel() // the others' answers are moot
		case a.err == nil:
		case won != nil && ctx.Err() != nil && !errors.Is(a.err, errNotServed) && !errors.Is(a.err, data.ErrCorrupt) && !errors.Is(a.err, data.ErrFormat):
			// Cut off by the winner's answer, not failed.
		default:
			failed = append(failed, fmt.Sprintf("%s: %v", a.p, a.err))
			c.leave(a.p, errors.Is(a.err, data.ErrCorrupt) || errors.Is(a.err, data.ErrFormat), a.err)
		}
	}
	wg.Wait()
	if won == nil {
		return nil, "", failed
	}
	return won.m, won.p, failed
}

// isAway reports whether p was left, for good or for a while.
func (c *DataClient) isAway(p peer.ID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.awayLocked(p)
}

// awayLocked is isAway with c.mu held.
func (c *DataClient) awayLocked(p peer.ID) bool {
	return c.bad[p] || time.Now().Before(c.away[p])
}

// Manifest is the dataset's manifest, checked against its ID.
func (c *DataClient) Manifest() *data.Manifest { return c.m }

// Close closes the client's streams.
func (c *DataClient) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for _, s := range c.servers {
		for _, st := range s.idle {
			st.Close()
		}
		s.idle = nil
	}
}

// candidates are the peers to ask: the given servers and the connected
// peers that speak DataProtocol or, if there are none, the DHT's providers;
// none that was dropped, is resting, or is a server already.
func (c *DataClient) candidates(ctx context.Context) []peer.ID {
	var out []peer.ID
	add := func(p peer.ID) {
		if p == c.h.ID() || slices.Contains(out, p) {
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.awayLocked(p) || slices.ContainsFunc(c.servers, func(s *dataConn) bool { return s.p == p }) {
			return
		}
		out = append(out, p)
	}
	for _, ai := range c.cfg.Servers {
		add(ai.ID)
	}
	for _, p := range c.h.Network().Peers() {
		if ok, _ := c.h.Peerstore().SupportsProtocols(p, DataProtocol); len(ok) > 0 {
			add(p)
		}
	}
	if len(out) > 0 {
		// The DHT only when nothing nearer serves: a lookup costs seconds
		// and connections.
		return out
	}
	fctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	for ai := range c.h.DHT.FindProvidersAsync(fctx, dataKey(c.id), 20) {
		if len(ai.Addrs) > 0 {
			c.h.Peerstore().AddAddrs(ai.ID, ai.Addrs, time.Hour)
		}
		add(ai.ID)
	}
	return out
}

// leave drops p: for good if it lied, else for a while — a minute if it
// does not serve the dataset, a few seconds if it failed otherwise.
func (c *DataClient) leave(p peer.ID, lied bool, why error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case lied:
		c.bad[p] = true
	case errors.Is(why, errNotServed):
		c.away[p] = time.Now().Add(time.Minute)
	default:
		c.away[p] = time.Now().Add(5 * time.Second)
	}
	for i, s := range c.servers {
		if s.p == p {
			for _, st := range s.idle {
				st.Reset()
			}
			s.idle = nil
			c.servers = slices.Delete(c.servers, i, i+1)
			break
		}
	}
	c.signalLocked()
}

func (c *DataClient) addServer(p peer.ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.ContainsFunc(c.servers, func(s *dataConn) bool { return s.p == p }) {
		c.servers = append(c.servers, &dataConn{p: p})
	}
	c.signalLocked()
}

func (c *DataClient) signalLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Servers are the peers the client fetches from now.
func (c *DataClient) Servers() []peer.ID {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]peer.ID, len(c.servers))
	for i, s := range c.servers {
		out[i] = s.p
	}
	return out
}

func (c *DataClient) fetchManifest(ctx context.Context, p peer.ID, id string) (*data.Manifest, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ManifestTimeout)
	defer cancel()
	st, err := c.h.NewStream(network.WithAllowLimitedConn(ctx, "ringtrain data"), p, DataProtocol)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	setDeadline(ctx, st)
	// Another peer's answer may make this one moot before its deadline.
	defer context.AfterFunc(ctx, func() { st.Reset() })()
	req := append([]byte{opManifest}, c.id[:]...)
	if _, err := st.Write(req); err != nil {
		st.Reset()
		return nil, err
	}
	m, err := readManifestReply(bufio.NewReader(st), id)
	if err != nil {
		st.Reset()
		return nil, err
	}
	return m, nil
}

// readManifestReply reads a server's answer to a manifest request for id:
// its status, then the manifest, its length checked before it is read and
// its bytes against id.
func readManifestReply(br *bufio.Reader, id string) (*data.Manifest, error) {
	if err := readStatus(br); err != nil {
		return nil, err
	}
	var n [8]byte
	if _, err := io.ReadFull(br, n[:]); err != nil {
		return nil, err
	}
	return data.ReadManifest(br, binary.LittleEndian.Uint64(n[:]), id)
}

func readStatus(br *bufio.Reader) error {
	s, err := br.ReadByte()
	if err != nil {
		return err
	}
	return statusErr(s)
}

// errNotServed is a server's answer that it does not serve the dataset.
var errNotServed = errors.New("does not serve the dataset")

func statusErr(s byte) error {
	switch s {
	case statusOK:
		return nil
	case statusUnknown:
		return errNotServed
	case statusBusy:
		return errors.New("busy")
	case statusBad:
		return errors.New("refused the request")
	}
	return fmt.Errorf("status %d: %w", s, data.ErrFormat)
}

func setDeadline(ctx context.Context, st network.Stream) {
	if d, ok := ctx.Deadline(); ok {
		st.SetDeadline(d)
	}
}

// Fetch fills pix with the pixels of samples idx of the split, checked
// against the manifest (data.Fetcher). It goes to the server with the
// fewest requests in flight and, where one fails, to another; it fails
// when no server was to be had for Find.
func (c *DataClient) Fetch(ctx context.Context, split string, idx []int, pix []byte) error {
	sm := c.m.Split(split)
	if sm == nil {
		return fmt.Errorf("p2p: dataset %x has no %s split", c.id[:8], split)
	}
	splitNo := byte(slices.IndexFunc(c.m.Splits, func(s data.SplitManifest) bool { return s.Name == split }))
	if len(idx) == 0 {
		return nil
	}
	req := make([]byte, 0, 1+32+5+4*len(idx))
	req = append(append(append(req, opSamples), c.id[:]...), splitNo)
	req = binary.LittleEndian.AppendUint32(req, uint32(len(idx)))
	for _, i := range idx {
		req = binary.LittleEndian.AppendUint32(req, uint32(i))
	}
	var since time.Time // when the client last had no server
	for {
		s, st, err := c.stream(ctx, &since)
		if err != nil {
			return err
		}
		err = c.ask(ctx, st, req, pix)
		if err == nil {
			if err = sm.Check(idx, pix); err != nil {
				c.cfg.Logger.Error().Stringer("server", s.p).Err(err).Msg("dropped a data server that sent samples that do not match the dataset's hash")
				st.Reset()
				c.done(s, nil)
				c.leave(s.p, true, err)
				continue
			}
			c.done(s, st)
			return nil
		}
		st.Reset()
		c.done(s, nil)
		if ctx.Err() != nil {
			return fmt.Errorf("p2p: fetching samples: %w", context.Cause(ctx))
		}
		ev := c.cfg.Logger.Warn()
		if errors.Is(err, errNotServed) {
			ev = c.cfg.Logger.Info() // a peer found beside the servers, serving other data
		}
		ev.Stringer("server", s.p).Err(err).Msg("a data server failed a request; asking another")
		c.leave(s.p, errors.Is(err, data.ErrFormat), err)
	}
}

// ask sends one request on st and reads its answer into pix.
func (c *DataClient) ask(ctx context.Context, st network.Stream, req, pix []byte) error {
	deadline := time.Now().Add(c.cfg.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	st.SetDeadline(deadline)
	// A cancelled context ends the read at once, not at the deadline.
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()) })
	defer stop()
	if _, err := st.Write(req); err != nil {
		return err
	}
	var status [1]byte
	if _, err := io.ReadFull(st, status[:]); err != nil {
		return err
	}
	if err := statusErr(status[0]); err != nil {
		return err
	}
	_, err := io.ReadFull(st, pix)
	return err
}

// stream returns a stream to the server with the fewest requests in
// flight, opening one where it has fewer than Streams; with none free it
// waits, and with none at all it looks for more, for Find at most.
func (c *DataClient) stream(ctx context.Context, since *time.Time) (*dataConn, network.Stream, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, nil, fmt.Errorf("p2p: data client closed: %w", net.ErrClosed)
		}
		var best *dataConn
		for _, s := range c.servers {
			if s.inFlight < c.cfg.Streams && (best == nil || s.inFlight < best.inFlight) {
				best = s
			}
		}
		changed, none := c.changed, len(c.servers) == 0
		if best != nil {
			best.inFlight++
			var st network.Stream
			if n := len(best.idle); n > 0 {
				st, best.idle = best.idle[n-1], best.idle[:n-1]
			}
			c.mu.Unlock()
			if st != nil {
				return best, st, nil
			}
			st, err := c.open(ctx, best.p)
			if err == nil {
				return best, st, nil
			}
			c.done(best, nil)
			c.cfg.Logger.Warn().Stringer("server", best.p).Err(err).Msg("could not reach a data server; asking another")
			c.leave(best.p, false, err)
			continue
		}
		c.mu.Unlock()
		if !none {
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return nil, nil, fmt.Errorf("p2p: fetching samples: %w", context.Cause(ctx))
			}
		}
		if since.IsZero() {
			*since = time.Now()
		}
		if time.Since(*since) > c.cfg.Find {
			return nil, nil, fmt.Errorf("%w %x: none left, and none found for %v", ErrNoServer, c.id[:8], c.cfg.Find)
		}
		for _, p := range c.candidates(ctx) {
			c.addServer(p)
		}
		c.mu.Lock()
		none = len(c.servers) == 0
		c.mu.Unlock()
		if none {
			if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
				return nil, nil, fmt.Errorf("p2p: fetching samples: %w", context.Cause(ctx))
			}
		}
	}
}

func (c *DataClient) open(ctx context.Context, p peer.ID) (network.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	st, err := c.h.NewStream(network.WithAllowLimitedConn(ctx, "ringtrain data"), p, DataProtocol)
	if err != nil {
		return nil, err
	}
	return st, nil
}

func (c *DataClient) server(p peer.ID) *dataConn {
	for _, s := range c.servers {
		if s.p == p {
			return s
		}
	}
	return nil
}

// done ends a request on s; st, if not nil, goes back to its idle streams.
func (c *DataClient) done(s *dataConn, st network.Stream) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s.inFlight--
	if st != nil {
		if c.closed || c.server(s.p) != s {
			st.Close()
		} else {
			s.idle = append(s.idle, st)
		}
	}
	c.signalLocked()
}
