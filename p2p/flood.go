package p2p

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	dhtpb "github.com/libp2p/go-libp2p-kad-dht/pb"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	"github.com/libp2p/go-msgio"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"google.golang.org/protobuf/proto"

	"github.com/ringtrain/ringtrain/data"
)

// FloodKind names what Flood sends a peer.
type FloodKind string

// What a hostile peer can send a ringtrain peer, each as fast as it can.
const (
	// FloodHello: hellos of a stranger, well-formed, proving nothing.
	FloodHello FloodKind = "hello"
	// FloodStatements: hellos as large as a hello may be, full of
	// statements no member signed.
	FloodStatements FloodKind = "statements"
	// FloodLinks: ring links opened with a well-formed link hello of a
	// generation the peer is not in.
	FloodLinks FloodKind = "links"
	// FloodJobConfig: job-config requests for jobs the peer does not run.
	FloodJobConfig FloodKind = "jobconfig"
	// FloodData: manifest and sample requests for the dataset
	// FloodOptions.Dataset, valid ones, on at most 8 streams (what a data
	// server serves one peer at once), each asking again as soon as it
	// is answered.
	FloodData FloodKind = "data"
	// FloodDataBad: data requests that are refused (unknown op, too many
	// samples, indices out of range).
	FloodDataBad FloodKind = "data-bad"
	// FloodDHT: DHT lookups of random keys.
	FloodDHT FloodKind = "dht"
	// FloodRandom: random bytes on each of ringtrain's protocols in turn.
	FloodRandom FloodKind = "random"
	// FloodDHTMessages: FIND_NODE and ADD_PROVIDER messages of ever new
	// keys, back to back on one kad stream each, from a new identity
	// each time a stream is cut off.
	FloodDHTMessages FloodKind = "dht-messages"
	// FloodRelay: relay reservations, and circuits through the peer to
	// peers it never heard of.
	FloodRelay FloodKind = "relay"
	// FloodMetrics: idle keep-alive connections to the peer's metrics
	// endpoint (FloodOptions.Metrics), as many as it takes.
	FloodMetrics FloodKind = "metrics"
	// FloodFormation: hellos of a peer that knows the job
	// (FloodOptions.Job), claiming a ring of itself at generation 2^62.
	FloodFormation FloodKind = "formation-lie"
)

// FloodKinds are all the kinds, in the order a flood benchmark runs them.
func FloodKinds() []FloodKind {
	return []FloodKind{FloodHello, FloodStatements, FloodLinks, FloodJobConfig, FloodData, FloodDataBad, FloodDHT, FloodRandom,
		FloodDHTMessages, FloodRelay, FloodMetrics, FloodFormation}
}

// FloodOptions shape a Flood.
type FloodOptions struct {
	// Workers send at once. Default 16.
	Workers int
	// Dataset is the served dataset's ID that FloodData asks for.
	Dataset string
	// Metrics is the host:port of the peer's metrics endpoint
	// (FloodMetrics).
	Metrics string
	// Job is the job the peer runs, as its join command tells anyone
	// (FloodFormation).
	Job Job
}

// FloodStats count what a Flood did.
type FloodStats struct {
	Kind     FloodKind `json:"kind"`
	Sent     int64     `json:"sent"`     // requests or streams sent in full
	Answered int64     `json:"answered"` // of those, answered with anything
	Failed   int64     `json:"failed"`   // streams or dials that failed (refused, reset, cut off)
	Bytes    int64     `json:"bytes"`    // bytes written
}

// Flood sends target what kind says, from h, as fast as it can with
// opt.Workers at once, until ctx ends. It is the hostile peer of the flood
// benchmark (ringtrain bench flood): what a peer's limits are tested
// against. A peer that cuts h off makes every later try fail; Flood keeps
// trying.
func Flood(ctx context.Context, h *Host, target peer.AddrInfo, kind FloodKind, opt FloodOptions) (FloodStats, error) {
	if opt.Workers <= 0 {
		opt.Workers = 16
	}
	var id [32]byte
	if kind == FloodData {
		var err error
		if id, err = data.ParseID(opt.Dataset); err != nil {
			return FloodStats{Kind: kind}, fmt.Errorf("p2p: flood data: %w", err)
		}
	}
	if kind == FloodData {
		// As many streams as a server serves one peer at once (its
		// MaxPerPeer): valid requests, as fast as they are answered.
		opt.Workers = min(opt.Workers, 8)
	}
	if kind == FloodMetrics && opt.Metrics == "" || kind == FloodFormation && opt.Job.Name == "" {
		return FloodStats{Kind: kind}, fmt.Errorf("p2p: flood %s: FloodOptions says nothing of the peer's metrics or job", kind)
	}
	f := &flooder{h: h, to: target.ID, kind: kind, id: id, dataset: opt.Dataset, opt: opt}
	h.Peerstore().AddAddrs(target.ID, target.Addrs, time.Hour)
	var wg sync.WaitGroup
	for w := range opt.Workers {
		wg.Go(func() {
			rng := mrand.New(mrand.NewPCG(uint64(w), 1))
			for ctx.Err() == nil {
				f.once(ctx, rng)
			}
		})
	}
	wg.Wait()
	return FloodStats{Kind: kind, Sent: f.sent.Load(), Answered: f.answered.Load(), Failed: f.failed.Load(), Bytes: f.bytes.Load()}, nil
}

type flooder struct {
	h       *Host
	to      peer.ID
	kind    FloodKind
	id      [32]byte
	dataset string
	opt     FloodOptions

	sent, answered, failed, bytes atomic.Int64
}

// floodProtocols are what FloodRandom sends garbage on.
var floodProtocols = []protocol.ID{HelloProtocol, ReformProtocol, AdmitProtocol, RingProtocol, JobConfigProtocol, DataProtocol, ProtocolPrefix + "/kad/1.0.0"}

// once sends one request (or, for FloodData, a run of them on one stream).
func (f *flooder) once(ctx context.Context, rng *mrand.Rand) {
	switch f.kind {
	case FloodDHTMessages:
		f.dhtMessages(ctx, rng)
		return
	case FloodRelay:
		f.relay(ctx)
		return
	case FloodMetrics:
		f.metrics(ctx)
		return
	case FloodFormation:
		f.formationLie(ctx)
		return
	}
	if f.kind == FloodDHT {
		var p [32]byte
		rand.Read(p[:])
		lctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := f.h.DHT.GetClosestPeers(lctx, string(p[:]))
		f.count(err, 0)
		return
	}
	proto := map[FloodKind]protocol.ID{FloodHello: HelloProtocol, FloodStatements: HelloProtocol, FloodLinks: RingProtocol,
		FloodJobConfig: JobConfigProtocol, FloodData: DataProtocol, FloodDataBad: DataProtocol}[f.kind]
	if f.kind == FloodRandom {
		proto = floodProtocols[rng.IntN(len(floodProtocols))]
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := f.h.NewStream(network.WithAllowLimitedConn(sctx, "flood"), f.to, proto)
	if err != nil {
		f.count(err, 0)
		if ctx.Err() == nil {
			// A cut-off peer refuses at once: do not spin the CPU the
			// job's peers need on this machine.
			time.Sleep(10 * time.Millisecond)
		}
		return
	}
	defer s.Close()
	defer context.AfterFunc(ctx, func() { s.Reset() })()
	if f.kind == FloodData {
		// Valid requests for as long as the flood lasts; a stream the
		// server ended (busy, say) is opened again after a pause, as a
		// client would, not at once.
		f.dataRun(s, rng)
		time.Sleep(100 * time.Millisecond)
		return
	}
	setDeadline(sctx, s)
	var msg []byte
	switch f.kind {
	case FloodHello:
		msg = helloBytes(&Hello{Version: ProtocolVersion, Proof: fmt.Sprintf("%064x", rng.Uint64())})
	case FloodStatements:
		msg = bigHello(rng)
	case FloodLinks:
		msg = linkHelloMsg{rank: rng.IntN(4), gen: rng.Uint64(), plane: PlaneLibp2p, ch: ChannelRing}.encode()
	case FloodJobConfig:
		msg = make([]byte, 32)
		rand.Read(msg)
	case FloodDataBad:
		msg = append([]byte{byte(3 + rng.IntN(250))}, make([]byte, 32)...)
	case FloodRandom:
		msg = make([]byte, 1+rng.IntN(4096))
		rand.Read(msg)
	}
	f.send(s, msg)
}

// send writes msg on s, ends its side, and counts the answer.
func (f *flooder) send(s network.Stream, msg []byte) {
	n, err := s.Write(msg)
	f.bytes.Add(int64(n))
	if err != nil {
		f.count(err, 0)
		return
	}
	s.CloseWrite()
	got, _ := io.Copy(io.Discard, io.LimitReader(s, 1<<20))
	f.count(nil, got)
}

// dataRun asks for the manifest, then for samples, on one stream until
// the server stops answering.
func (f *flooder) dataRun(s network.Stream, rng *mrand.Rand) {
	br := bufio.NewReaderSize(s, 64<<10)
	n, err := s.Write(append([]byte{opManifest}, f.id[:]...))
	f.bytes.Add(int64(n))
	if err != nil {
		f.count(err, 0)
		return
	}
	m, err := readManifestReply(br, f.dataset)
	if err != nil {
		f.count(err, 0)
		return
	}
	f.count(nil, 1)
	train := m.Splits[0].Samples
	for {
		// 256 samples, as a training peer asks for them.
		req := append(append([]byte{opSamples}, f.id[:]...), 0)
		req = binary.LittleEndian.AppendUint32(req, 256)
		want := int64(0)
		for range 256 {
			i := rng.IntN(len(train))
			req = binary.LittleEndian.AppendUint32(req, uint32(i))
			want += int64(train[i].Size())
		}
		n, err := s.Write(req)
		f.bytes.Add(int64(n))
		if err == nil {
			err = readStatus(br)
		}
		if err != nil {
			f.count(err, 0)
			return
		}
		got, err := io.CopyN(io.Discard, br, want)
		f.count(err, got)
		if err != nil {
			return
		}
	}
}

func (f *flooder) count(err error, answered int64) {
	if err != nil {
		f.failed.Add(1)
		return
	}
	f.sent.Add(1)
	if answered > 0 {
		f.answered.Add(1)
	}
}

func helloBytes(h *Hello) []byte {
	var b bytes.Buffer
	writeHello(&b, h)
	return b.Bytes()
}

// bigHello is a hello near maxHelloBytes of statements signed by no one.
func bigHello(rng *mrand.Rand) []byte {
	h := &Hello{Version: ProtocolVersion, Proof: fmt.Sprintf("%064x", rng.Uint64()), Rings: [][]string{{"12D3KooWxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}}
	sig := make([]byte, 64)
	for range 1000 {
		h.Statements = append(h.Statements, Statement{From: "12D3KooWxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", Seq: rng.Uint64(), Gen: 1, Ring: 0, Sig: sig})
	}
	return helloBytes(h)
}

// dhtMessages sends DHT messages back to back on one kad stream until it
// is cut off, reading the answers aside.
func (f *flooder) dhtMessages(ctx context.Context, rng *mrand.Rand) {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	s, err := f.h.NewStream(network.WithAllowLimitedConn(sctx, "flood"), f.to, ProtocolPrefix+"/kad/1.0.0")
	cancel()
	if err != nil {
		f.count(err, 0)
		sleepCtx(ctx, 10*time.Millisecond)
		return
	}
	defer s.Reset()
	defer context.AfterFunc(ctx, func() { s.Reset() })()
	go io.Copy(io.Discard, s) // ends with the stream
	w := msgio.NewVarintWriter(s)
	addr := [][]byte{f.h.Addrs()[0].Bytes()}
	for ctx.Err() == nil {
		key := fmt.Appendf(nil, "flood %x", rng.Uint64())
		m := &dhtpb.Message{Type: dhtpb.Message_FIND_NODE, Key: key}
		if rng.IntN(2) == 1 {
			m = &dhtpb.Message{Type: dhtpb.Message_ADD_PROVIDER, Key: key, ProviderPeers: []*dhtpb.Message_Peer{{Id: []byte(f.h.ID()), Addrs: addr}}}
		}
		b, _ := proto.Marshal(m)
		if err := w.WriteMsg(b); err != nil {
			f.count(err, 0)
			return
		}
		f.bytes.Add(int64(len(b)))
		f.count(nil, 0)
	}
}

// relay asks the peer for a relay reservation, then for a circuit to a
// peer it never heard of.
func (f *flooder) relay(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := client.Reserve(rctx, f.h.Host, peer.AddrInfo{ID: f.to, Addrs: f.h.Peerstore().Addrs(f.to)})
	f.count(err, 0)
	var nobody [32]byte
	rand.Read(nobody[:])
	id, _ := peer.IDFromBytes(append([]byte{0x00, 0x20}, nobody[:]...)) // an identity multihash: some peer
	circuit, err := ma.NewMultiaddr("/p2p/" + f.to.String() + "/p2p-circuit/p2p/" + id.String())
	if err == nil {
		for _, a := range f.h.Peerstore().Addrs(f.to) {
			if ai, err := peer.AddrInfoFromP2pAddr(a.Encapsulate(circuit)); err == nil {
				err = f.h.Connect(rctx, *ai)
				f.count(err, 0)
				break
			}
		}
	}
	if err != nil && ctx.Err() == nil {
		sleepCtx(ctx, 10*time.Millisecond)
	}
}

// metrics holds idle keep-alive connections to the metrics endpoint: each
// asks once, reads its answer, and waits; one the server closes is opened
// again.
func (f *flooder) metrics(ctx context.Context) {
	var d net.Dialer
	if ip, err := manet.ToIP(f.h.Addrs()[0]); err == nil {
		d.LocalAddr = &net.TCPAddr{IP: ip} // from the flooder's address
	}
	held := make([]net.Conn, 0, 1250)
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for ctx.Err() == nil && len(held) < cap(held) {
		c, err := d.DialContext(ctx, "tcp", f.opt.Metrics)
		if err != nil {
			f.count(err, 0)
			sleepCtx(ctx, 10*time.Millisecond)
			continue
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		n, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
		f.bytes.Add(int64(n))
		got := int64(0)
		if err == nil {
			var buf [512]byte
			k, _ := c.Read(buf[:])
			got = int64(k)
		}
		if err != nil || got == 0 {
			c.Close()
			f.count(cmp.Or(err, io.EOF), 0)
			sleepCtx(ctx, 10*time.Millisecond)
			continue
		}
		c.SetDeadline(time.Time{})
		held = append(held, c)
		f.count(nil, got)
	}
	<-ctx.Done()
}

// formationLie sends a hello that proves the job and claims that a ring of
// the sender alone, of generation 2^62, has formed.
func (f *flooder) formationLie(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := f.h.NewStream(network.WithAllowLimitedConn(sctx, "flood"), f.to, HelloProtocol)
	if err != nil {
		f.count(err, 0)
		sleepCtx(ctx, 10*time.Millisecond)
		return
	}
	defer s.Close()
	setDeadline(sctx, s)
	h := &Hello{Version: ProtocolVersion, Proof: proof(jobKey(f.opt.Job), f.h.ID(), f.to)}
	h.setProposal(Proposal{Gen: 1 << 62, Members: []peer.ID{f.h.ID()}, Ready: true, Formed: true}, &idNames{})
	f.send(s, helloBytes(h))
}
