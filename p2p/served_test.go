package p2p

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/data"
)

// testData is the testdata subset: its manifest and local splits.
func testData(t testing.TB) (*data.Manifest, *data.Split, *data.Split) {
	t.Helper()
	c, err := data.LoadConfig("../testdata/data-config.json")
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
	m, err := data.NewManifest(c, tr.Dataset, te.Dataset)
	if err != nil {
		t.Fatal(err)
	}
	return m, tr, te
}

func serveOn(t *testing.T, h *Host, cfg DataServerConfig, m *data.Manifest, splits ...*data.Dataset) *DataServer {
	t.Helper()
	s := NewDataServer(h, cfg)
	t.Cleanup(func() { s.Close() })
	if err := s.Serve(m, splits...); err != nil {
		t.Fatal(err)
	}
	return s
}

// lockedBuffer is a log sink the test reads while hosts write.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// fetchAll fetches every train sample in requests of 50 and checks them
// against the local split.
func fetchAll(t *testing.T, c *DataClient, tr *data.Split, between func(k int)) {
	t.Helper()
	for lo, k := 0, 0; lo < tr.Len(); lo, k = lo+50, k+1 {
		if between != nil {
			between(k)
		}
		idx := make([]int, 0, 50)
		want := []byte{}
		for i := lo; i < min(lo+50, tr.Len()); i++ {
			idx = append(idx, i)
			want = append(want, tr.Image(i).Pix...)
		}
		pix := make([]byte, len(want))
		if err := c.Fetch(context.Background(), "train", idx, pix); err != nil {
			t.Fatalf("request %d: %v", k, err)
		}
		if !bytes.Equal(pix, want) {
			t.Fatalf("request %d: pixels differ from the local split's", k)
		}
	}
}

func TestServedDataFoundThroughTheDHT(t *testing.T) {
	m, tr, te := testData(t)
	// The server and the client each know only hs[0], which serves nothing:
	// the client finds the server through the DHT's provider record.
	hs := startHosts(t, 3, nil)
	serveOn(t, hs[1], DataServerConfig{Announce: 50 * time.Millisecond}, m, tr.Dataset, te.Dataset)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := OpenServedData(ctx, hs[2], m.ID(), DataClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Manifest().ID() != m.ID() || !slices.Equal(c.Servers(), []peer.ID{hs[1].ID()}) {
		t.Fatalf("manifest %s from %v; want %s from the server %s", c.Manifest().ID(), c.Servers(), m.ID(), hs[1].ID())
	}
	// Through the loader, as training reads it: the same batches as local
	// files.
	rs, err := c.Manifest().Remote("test", c, data.RemoteConfig{RequestSize: 33})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	for _, s := range []*data.Split{te, rs} {
		l := &data.Loader{Split: s, BatchSize: 20, Seed: 3, Sampler: data.Sampler{N: s.Len(), World: 2, Rank: 1, Seed: 3, Shuffle: true}}
		e, err := l.Epoch(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		var xs []float32
		err = e.Each(func(b *data.Batch) error { xs = append(xs, b.X...); return nil })
		e.Close()
		if err != nil {
			t.Fatal(err)
		}
		if s == te {
			defer func(want []float32) {
				if !slices.Equal(xs, want) {
					t.Fatal("the served test split's batches differ from the local one's")
				}
			}(slices.Clone(xs))
		}
	}
}

func TestLosingAServerCostsNoRequest(t *testing.T) {
	m, tr, te := testData(t)
	hs := startHosts(t, 3, nil)
	a := serveOn(t, hs[0], DataServerConfig{}, m, tr.Dataset, te.Dataset)
	serveOn(t, hs[1], DataServerConfig{}, m, tr.Dataset, te.Dataset)
	c, err := OpenServedData(context.Background(), hs[2], m.ID(), DataClientConfig{Servers: []peer.AddrInfo{info(hs[0]), info(hs[1])}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fetchAll(t, c, tr, func(k int) {
		if k == 3 {
			a.Close()
			hs[0].Close()
		}
	})
	for _, p := range c.Servers() {
		if p == hs[0].ID() {
			t.Fatalf("servers %v still hold the closed one", c.Servers())
		}
	}
	// Its clients gone, the other server keeps serving: a new client is
	// served.
	c.Close()
	c2, err := OpenServedData(context.Background(), hs[2], m.ID(), DataClientConfig{Servers: []peer.AddrInfo{info(hs[1])}})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	fetchAll(t, c2, tr, nil)
}

func TestLyingServerIsDroppedAndNamed(t *testing.T) {
	m, tr, te := testData(t)
	hs := startHosts(t, 3, nil)
	// The liar holds a copy of the data with one pixel changed in every
	// tenth image, and serves it under the true manifest.
	c0, _ := data.LoadConfig("../testdata/data-config.json")
	forged, err := c0.Load("train")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < forged.Len(); i += 10 {
		forged.Image(i).Pix[0] ^= 0xff
	}
	serveOn(t, hs[0], DataServerConfig{}, m, forged.Dataset, te.Dataset)
	serveOn(t, hs[1], DataServerConfig{}, m, tr.Dataset, te.Dataset)
	var log lockedBuffer
	c, err := OpenServedData(context.Background(), hs[2], m.ID(), DataClientConfig{
		Servers: []peer.AddrInfo{info(hs[0]), info(hs[1])}, Logger: zerolog.New(&log)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fetchAll(t, c, tr, nil)
	if !strings.Contains(log.String(), hs[0].ID().String()) || !strings.Contains(log.String(), "do not match") {
		t.Fatalf("log %q; want the liar %s named", log.String(), hs[0].ID())
	}
	if slices.Contains(c.Servers(), hs[0].ID()) {
		t.Fatalf("servers %v; want the liar dropped", c.Servers())
	}
}

// stallServer answers manifest requests and never answers for samples.
func stallServer(t *testing.T, h *Host, m *data.Manifest) {
	h.SetStreamHandler(DataProtocol, func(st network.Stream) {
		defer st.Close()
		br := bufio.NewReader(st)
		for {
			var req [33]byte
			if _, err := io.ReadFull(br, req[:]); err != nil {
				return
			}
			if req[0] != opManifest {
				io.Copy(io.Discard, br) // until the client gives up
				return
			}
			b := binary.LittleEndian.AppendUint64([]byte{statusOK}, uint64(len(m.Encoded())))
			st.Write(append(b, m.Encoded()...))
		}
	})
}

func TestStalledServerIsLeftForAnother(t *testing.T) {
	m, tr, te := testData(t)
	hs := startHosts(t, 3, nil)
	stallServer(t, hs[0], m)
	serveOn(t, hs[1], DataServerConfig{}, m, tr.Dataset, te.Dataset)
	c, err := OpenServedData(context.Background(), hs[2], m.ID(), DataClientConfig{
		Servers: []peer.AddrInfo{info(hs[0]), info(hs[1])}, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.Servers(); len(got) != 2 || !slices.Contains(got, hs[0].ID()) || !slices.Contains(got, hs[1].ID()) {
		t.Fatalf("servers %v; want the staller, which answers manifests, and the other", got)
	}
	fetchAll(t, c, tr, nil)
	if !slices.Equal(c.Servers(), []peer.ID{hs[1].ID()}) {
		t.Fatalf("servers %v; want only the one that answers", c.Servers())
	}
}

// TestRequestsSpreadOverServers: the client fetches from every server it
// found, not only the one that gave it the manifest. With one stream per
// server, a request goes to a second server while the first holds another
// (here for ever: it stalls), and a peer that serves other data is left
// for the one that serves this.
func TestRequestsSpreadOverServers(t *testing.T) {
	m, tr, te := testData(t)
	hs := startHosts(t, 4, nil)
	stallServer(t, hs[0], m)
	serveOn(t, hs[1], DataServerConfig{}, m, tr.Dataset, te.Dataset)
	other := NewDataServer(hs[2], DataServerConfig{}) // serves no dataset
	defer other.Close()
	c, err := OpenServedData(context.Background(), hs[3], m.ID(), DataClientConfig{
		Servers: []peer.AddrInfo{info(hs[0]), info(hs[2]), info(hs[1])}, Streams: 1, Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The peer serving other data is among them unless its refusal of
	// the manifest came before another's answer.
	if got := c.Servers(); !slices.Contains(got, hs[0].ID()) || !slices.Contains(got, hs[1].ID()) {
		t.Fatalf("servers %v; want both servers of the dataset", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	want := append(slices.Clone(tr.Image(1).Pix), tr.Image(2).Pix...)
	type result struct {
		pix []byte
		err error
	}
	done := make(chan result, 2)
	for range 2 {
		go func() {
			pix := make([]byte, len(want))
			done <- result{pix, c.Fetch(ctx, "train", []int{1, 2}, pix)}
		}()
	}
	// Whichever request took the staller waits; the other must not.
	first := <-done
	cancel()
	<-done
	if first.err != nil || !bytes.Equal(first.pix, want) {
		t.Fatalf("the first request to end: %v; want the samples while the other waits on the staller", first.err)
	}
	if slices.Contains(c.Servers(), hs[2].ID()) {
		t.Fatalf("servers %v still hold the peer that serves other data", c.Servers())
	}
}

func TestNoServerIsAnErrorInBoundedTime(t *testing.T) {
	slow(t)
	m, _, _ := testData(t)
	hs := startHosts(t, 3, nil)
	stallServer(t, hs[0], m)
	cases := []struct {
		name string
		id   string
		run  func(c *DataClient) error
	}{
		{"a dataset nobody serves", strings.Repeat("0", 64), nil},
		{"only a server that stalls", m.ID(), func(c *DataClient) error {
			return c.Fetch(context.Background(), "train", []int{1, 2}, make([]byte, 2*784))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			c, err := OpenServedData(context.Background(), hs[2], tc.id, DataClientConfig{
				Servers: []peer.AddrInfo{info(hs[0])}, Timeout: 300 * time.Millisecond, Find: time.Second})
			if err == nil {
				defer c.Close()
				err = tc.run(c)
			}
			if !errors.Is(err, ErrNoServer) || time.Since(start) > 15*time.Second {
				t.Fatalf("after %v: %v; want ErrNoServer within the bounds", time.Since(start), err)
			}
		})
	}
	if _, err := OpenServedData(context.Background(), hs[2], "not-an-id", DataClientConfig{}); err == nil || !strings.Contains(err.Error(), "hex digits") {
		t.Fatalf("a malformed ID: %v; want it named", err)
	}
}

// rawRequest sends one request on a fresh stream and returns the status.
func rawRequest(t *testing.T, h *Host, to peer.ID, req []byte) (network.Stream, byte) {
	t.Helper()
	st, err := h.NewStream(context.Background(), to, DataProtocol)
	if err != nil {
		t.Fatal(err)
	}
	st.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := st.Write(req); err != nil {
		t.Fatal(err)
	}
	var s [1]byte
	if _, err := io.ReadFull(st, s[:]); err != nil {
		t.Fatal(err)
	}
	return st, s[0]
}

func samplesRequest(id string, split byte, idx ...uint32) []byte {
	raw, _ := data.ParseID(id)
	b := append(append([]byte{opSamples}, raw[:]...), split)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(idx)))
	for _, i := range idx {
		b = binary.LittleEndian.AppendUint32(b, i)
	}
	return b
}

func TestDataServerLimits(t *testing.T) {
	m, tr, te := testData(t)
	hs := startHosts(t, 3, nil)
	srv := serveOn(t, hs[0], DataServerConfig{MaxRequest: 4, MaxPerPeer: 2, MaxStreams: 3}, m, tr.Dataset, te.Dataset)
	// A stream reset by the client frees its slot once the server's
	// handler sees it: wait for that, not a while.
	drained := func() {
		for srv.streams() > 0 {
			time.Sleep(time.Millisecond)
		}
	}
	for _, c := range []struct {
		name string
		req  []byte
		want byte
	}{
		{"within the limits", samplesRequest(m.ID(), 0, 1, 2), statusOK},
		{"too many samples", samplesRequest(m.ID(), 0, 1, 2, 3, 4, 5), statusBad},
		{"no samples", samplesRequest(m.ID(), 0), statusBad},
		{"a sample out of range", samplesRequest(m.ID(), 0, uint32(tr.Len())), statusBad},
		{"a split out of range", samplesRequest(m.ID(), 2, 1), statusBad},
		{"another dataset", samplesRequest(strings.Repeat("1", 64), 0, 1), statusUnknown},
		{"an unknown op", append([]byte{9}, make([]byte, 32)...), statusBad},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, got := rawRequest(t, hs[1], hs[0].ID(), c.req)
			st.Reset()
			if got != c.want {
				t.Fatalf("status %d; want %d", got, c.want)
			}
			drained()
		})
	}
	// One peer holds its two streams; its third is refused, and another
	// peer is still served.
	var held []network.Stream
	for range 2 {
		st, s := rawRequest(t, hs[1], hs[0].ID(), samplesRequest(m.ID(), 0, 1))
		if s != statusOK {
			t.Fatalf("status %d; want OK", s)
		}
		held = append(held, st)
	}
	if st, s := rawRequest(t, hs[1], hs[0].ID(), samplesRequest(m.ID(), 0, 1)); s != statusBusy {
		t.Fatalf("a third stream of one peer: status %d; want busy", s)
	} else {
		st.Reset()
	}
	st, s := rawRequest(t, hs[2], hs[0].ID(), samplesRequest(m.ID(), 0, 1))
	if s != statusOK {
		t.Fatalf("another peer: status %d; want OK", s)
	}
	// MaxStreams is 3: a fourth stream from anyone is refused.
	if st2, s := rawRequest(t, hs[2], hs[0].ID(), samplesRequest(m.ID(), 0, 1)); s != statusBusy {
		t.Fatalf("a stream over MaxStreams: status %d; want busy", s)
	} else {
		st2.Reset()
	}
	st.Reset()
	for _, h := range held {
		h.Reset()
	}
}

func TestFetchJobConfig(t *testing.T) {
	slow(t)
	hs := startHosts(t, 4, nil)
	good := []byte(`{"name":"j"}`)
	check := func(b []byte) error {
		if !bytes.Equal(b, good) {
			return errors.New("hash mismatch")
		}
		return nil
	}
	// hs[1] lies: it knows name@hash and hands out other bytes.
	stopLiar := ServeJobConfig(hs[1], "j", "h1", []byte(`{"name":"evil"}`), zerolog.Nop())
	defer stopLiar()
	ServeJobConfig(hs[2], "other", "h9", []byte(`{"name":"other"}`), zerolog.Nop())
	for _, h := range hs[1:3] {
		if err := hs[3].Connect(context.Background(), info(h)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := FetchJobConfig(ctx, hs[3], "j", "h1", check, zerolog.Nop())
	if !errors.Is(err, ErrNoJobConfig) || !strings.Contains(err.Error(), hs[1].ID().String()) {
		t.Fatalf("with only a liar: %v; want ErrNoJobConfig naming %s", err, hs[1].ID())
	}
	ServeJobConfig(hs[0], "j", "h1", good, zerolog.Nop())
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := FetchJobConfig(ctx, hs[3], "j", "h1", check, zerolog.Nop())
	if err != nil || !bytes.Equal(b, good) {
		t.Fatalf("got %q, %v; want the honest config", b, err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := FetchJobConfig(ctx, hs[3], "j", "other-hash", check, zerolog.Nop()); !errors.Is(err, ErrNoJobConfig) {
		t.Fatalf("a hash nobody has: %v; want ErrNoJobConfig", err)
	}
}

// hostileManifest answers manifest requests with a status of OK, the
// announced length, and then up to send bytes — a manifest's magic and a
// header announcing 10 samples, then zeros — counting what the client
// took before it reset the stream.
func hostileManifest(h *Host, announced uint64, send int, wrote *atomic.Int64) {
	h.SetStreamHandler(DataProtocol, func(st network.Stream) {
		defer st.Close()
		var req [33]byte
		if _, err := io.ReadFull(st, req[:]); err != nil {
			return
		}
		hj := []byte(`{"transforms":[],"classes":["a"],"splits":[{"name":"train","samples":10}]}`)
		b := binary.LittleEndian.AppendUint64([]byte{statusOK}, announced)
		b = append(b, "ringtrain dataset 1\n"...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(hj)))
		b = append(b, hj...)
		if _, err := st.Write(b); err != nil {
			return
		}
		zeros := make([]byte, 1<<20)
		for range send >> 20 {
			if _, err := st.Write(zeros); err != nil {
				return
			}
			wrote.Add(int64(len(zeros)))
		}
	})
}

// TestManifestLengthIsCheckedBeforeItIsRead: a data peer that announces a
// manifest far larger than any real one, or one longer than its own header
// says, is refused before the client reads it: what it makes the client
// take in is at most a stream's window, not what it announced.
func TestManifestLengthIsCheckedBeforeItIsRead(t *testing.T) {
	slow(t)
	for _, tc := range []struct {
		name      string
		announced uint64
	}{
		{"1 GiB", 1 << 30},
		{"more than its header says", 96 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := startHosts(t, 2, nil)
			var wrote atomic.Int64
			const send = 96 << 20
			hostileManifest(hs[0], tc.announced, send, &wrote)
			_, err := OpenServedData(context.Background(), hs[1], strings.Repeat("ab", 32), DataClientConfig{
				Servers: []peer.AddrInfo{info(hs[0])}, Find: 3 * time.Second})
			if !errors.Is(err, ErrNoServer) || !strings.Contains(err.Error(), "announced as") {
				t.Fatalf("%v; want ErrNoServer saying what was announced", err)
			}
			// yamux lets a writer run up to 16 MiB ahead of its reader.
			if w := wrote.Load(); w > 32<<20 {
				t.Fatalf("the client took %d MiB of the hostile manifest; want it refused at its header", w>>20)
			}
		})
	}
}

// TestStallingDataPeersCostOneWait: peers that accept a manifest request
// and never answer it cost the wait of one of them, not of each in turn:
// peers are asked at once, and the first good answer wins.
func TestStallingDataPeersCostOneWait(t *testing.T) {
	slow(t)
	m, tr, te := testData(t)
	hs := startHosts(t, 6, nil)
	var servers []peer.AddrInfo
	for _, h := range hs[:4] {
		h.SetStreamHandler(DataProtocol, func(st network.Stream) {
			io.Copy(io.Discard, st) // never answers
			st.Close()
		})
		servers = append(servers, info(h))
	}
	serveOn(t, hs[4], DataServerConfig{}, m, tr.Dataset, te.Dataset)
	servers = append(servers, info(hs[4]))
	start := time.Now()
	c, err := OpenServedData(context.Background(), hs[5], m.ID(), DataClientConfig{Servers: servers, ManifestTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Asked one after another, the four stallers would cost 8 s; asked
	// four at a time, the honest peer is in the second four: one wait.
	if el := time.Since(start); el > 6*time.Second {
		t.Fatalf("the manifest took %v with 4 stalling peers asked first; want one wait of 2 s", el)
	}
}

// TestBadRequestsDoNotFloodTheLog: a stranger that sends a data server bad
// requests in a loop gets each refused, and the server's log a few lines
// about it, not one a request.
func TestBadRequestsDoNotFloodTheLog(t *testing.T) {
	m, tr, te := testData(t)
	hs := startHosts(t, 2, nil)
	hs[0].Guard.SetLimits(Limits{Strikes: 1000}) // not cut off (TestGarbageSenderIsCutOff)
	var log lockedBuffer
	serveOn(t, hs[0], DataServerConfig{Logger: zerolog.New(&log)}, m, tr.Dataset, te.Dataset)
	const n = 200
	for range n {
		st, status := rawRequest(t, hs[1], hs[0].ID(), append([]byte{9}, make([]byte, 32)...))
		st.Close()
		if status != statusBad {
			t.Fatalf("status %d for an unknown op; want %d", status, statusBad)
		}
	}
	if lines := strings.Count(log.String(), "refused a data request"); lines > warnBurst {
		t.Fatalf("%d bad requests wrote %d warnings; want at most %d", n, lines, warnBurst)
	}
}

// FuzzDataRequest feeds a data server's request reader whatever bytes a
// client may send, requests after requests as on one stream: every one is
// answered or refused, none panics, and what is written is bounded by
// what was asked (MaxRequest samples).
func FuzzDataRequest(f *testing.F) {
	m, tr, te := testData(f)
	id, err := data.ParseID(m.ID())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(append([]byte{opManifest}, id[:]...))
	f.Add(samplesRequest(m.ID(), 0, 0, 1, 2))
	f.Add(samplesRequest(m.ID(), 1, 499))
	f.Add(samplesRequest(m.ID(), 0, 1<<31))
	f.Add(samplesRequest(m.ID(), 7, 0))
	f.Add(append(samplesRequest(m.ID(), 0, 3), append([]byte{opManifest}, id[:]...)...))
	f.Add([]byte{opSamples})
	f.Add([]byte{9, 1, 2, 3})
	f.Fuzz(func(t *testing.T, req []byte) {
		s := &DataServer{cfg: DataServerConfig{MaxRequest: 64}, warns: newWarnLimiter(zerolog.Nop()),
			strike: func(peer.ID, string) {}, sets: map[[32]byte]*servedSet{id: {m: m, splits: []*data.Dataset{tr.Dataset, te.Dataset}}}}
		s.cfg.fill()
		br := bufio.NewReader(bytes.NewReader(req))
		var out bytes.Buffer
		bw := bufio.NewWriter(&out)
		var idx []int
		for n := 0; ; n++ {
			op, err := br.ReadByte()
			if err != nil {
				return
			}
			more, err := s.answer(op, br, bw, "p", &idx)
			bw.Flush()
			if limit := 9 + len(m.Encoded()) + 64*len(tr.Image(0).Pix); out.Len() > (n+1)*limit {
				t.Fatalf("%d bytes answered to %d requests", out.Len(), n+1)
			}
			if err != nil || !more {
				return
			}
		}
	})
}

// FuzzDataReply feeds a data client's manifest reader whatever a server
// may answer: it is a manifest whose ID is the one asked for, or an error.
func FuzzDataReply(f *testing.F) {
	m, _, _ := testData(f)
	enc := m.Encoded()
	f.Add(append(binary.LittleEndian.AppendUint64([]byte{statusOK}, uint64(len(enc))), enc...))
	f.Add(binary.LittleEndian.AppendUint64([]byte{statusOK}, 1<<62))
	f.Add([]byte{statusBusy})
	f.Add([]byte{200})
	f.Fuzz(func(t *testing.T, reply []byte) {
		got, err := readManifestReply(bufio.NewReader(bytes.NewReader(reply)), m.ID())
		if err == nil && got.ID() != m.ID() {
			t.Fatalf("a manifest of %s for %s", got.ID(), m.ID())
		}
	})
}

// TestDataServerPacesAPeer: what one peer is sent is paced at
// PeerBytesPerSecond, however fast it asks — two requests of 2,000
// samples (3.1 MB) at 1 MiB/s, after a burst of 1 MiB, take two seconds
// at least, where unpaced they take milliseconds.
func TestDataServerPacesAPeer(t *testing.T) {
	slow(t)
	m, tr, te := testData(t)
	hs := startHosts(t, 2, nil)
	serveOn(t, hs[0], DataServerConfig{PeerBytesPerSecond: 1 << 20}, m, tr.Dataset, te.Dataset)
	idx := make([]uint32, tr.Len())
	want := 0
	for i := range idx {
		idx[i] = uint32(i)
		want += len(tr.Image(i).Pix)
	}
	start := time.Now()
	st, err := hs[1].NewStream(context.Background(), hs[0].ID(), DataProtocol)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.SetDeadline(time.Now().Add(30 * time.Second))
	for range 2 {
		if _, err := st.Write(samplesRequest(m.ID(), 0, idx...)); err != nil {
			t.Fatal(err)
		}
		var s [1]byte
		if _, err := io.ReadFull(st, s[:]); err != nil || s[0] != statusOK {
			t.Fatalf("status %d, %v; want OK", s[0], err)
		}
		if _, err := io.CopyN(io.Discard, st, int64(want)); err != nil {
			t.Fatal(err)
		}
	}
	if took, least := time.Since(start), time.Duration(float64(2*want-paceBurst)/(1<<20)*float64(time.Second))*9/10; took < least {
		t.Errorf("%d bytes in %v; paced at 1 MiB/s after a 1 MiB burst they take at least %v", 2*want, took, least)
	}
}

// TestSybilsCannotLockOutADataServer: eight identities from one address
// hold at most MaxPerIP slots; streams that make no progress give their
// slots up to a peer that asks once every slot is taken; asking for a
// dataset not served ends the stream with a strike; and asking for the
// manifest again and again does not keep a stream open. Before, eight
// sybils from one address held all 64 slots, and honest workers were
// told "busy" for as long as they kept asking.
func TestSybilsCannotLockOutADataServer(t *testing.T) {
	slow(t)
	m, tr, te := testData(t)
	server := startHosts(t, 1, nil)[0]
	// Idle is long here, so that no sybil's stream ends on its own while
	// a loaded machine is still opening the others: only Stale frees a
	// slot. The manifest loop below has a server with a short Idle.
	cfg := DataServerConfig{MaxStreams: 6, MaxPerPeer: 2, MaxPerIP: 4, Idle: time.Minute, Stale: 300 * time.Millisecond}
	srv := serveOn(t, server, cfg, m, tr.Dataset, te.Dataset)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	manifest := append([]byte{opManifest}, func() []byte { id, _ := data.ParseID(m.ID()); return id[:] }()...)
	hold := func(from string) (held int, streams []network.Stream) {
		for range 8 {
			h, err := NewHost(ctx, HostConfig{Listen: []string{"/ip4/" + from + "/tcp/0"}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { h.Close() })
			h.Peerstore().AddAddrs(server.ID(), server.Addrs(), time.Minute)
			for range 2 {
				st, s := rawRequest(t, h, server.ID(), manifest)
				if s == statusOK {
					held++
					streams = append(streams, st)
				} else {
					st.Reset()
				}
			}
		}
		return held, streams
	}
	if held, _ := hold("127.0.0.2"); held != 4 {
		t.Errorf("8 identities × 2 streams from one address hold %d slots; want MaxPerIP, 4", held)
	}
	hold("127.0.0.3") // every slot taken now
	if n := srv.streams(); n != 6 {
		t.Fatalf("%d streams served; want all 6 slots taken", n)
	}
	time.Sleep(400 * time.Millisecond) // past Stale: the sybils made no progress since
	honest := startHosts(t, 1, nil)[0]
	honest.Peerstore().AddAddrs(server.ID(), server.Addrs(), time.Minute)
	st, s := rawRequest(t, honest, server.ID(), samplesRequest(m.ID(), 0, 1, 2))
	if s != statusOK {
		t.Fatalf("an honest peer with every slot held by sybils that make no progress: status %d; want OK", s)
	}
	st.Reset()
	// Asking for the manifest again and again makes no progress: the
	// stream ends at Idle all the same.
	cfg.Idle = time.Second
	idle := startHosts(t, 1, nil)[0]
	serveOn(t, idle, cfg, m, tr.Dataset, te.Dataset)
	honest.Peerstore().AddAddrs(idle.ID(), idle.Addrs(), time.Minute)
	st, _ = rawRequest(t, honest, idle.ID(), manifest)
	st.SetDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	br := bufio.NewReader(st)
	for {
		if _, err := io.CopyN(io.Discard, br, 8+int64(len(m.Encoded()))); err != nil {
			break
		}
		if _, err := st.Write(manifest); err != nil {
			break
		}
		if _, err := br.ReadByte(); err != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("a stream asking for the manifest again and again stayed open %v; want it closed at Idle (1 s)", d)
	}
	st.Reset()
	strikes := func() int {
		server.Guard.mu.Lock()
		defer server.Guard.mu.Unlock()
		if s := server.Guard.g.strikes[honest.ID()]; s != nil {
			return s.n
		}
		return 0
	}
	before := strikes()
	st, s = rawRequest(t, honest, server.ID(), samplesRequest(strings.Repeat("1", 64), 0, 1))
	if s != statusUnknown {
		t.Fatalf("a dataset not served: status %d; want unknown", s)
	}
	if _, err := st.Read(make([]byte, 1)); err == nil {
		t.Error("the stream of a request for a dataset not served stays open")
	}
	if strikes() <= before {
		t.Error("a request for a dataset not served is no strike")
	}
}
