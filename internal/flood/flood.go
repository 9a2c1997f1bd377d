// Package flood is the hostile peer of ringtrain's flood benchmark (bench
// flood): what a peer's limits are tested against. It speaks ringtrain's
// protocols from the outside, as an attacker's own code would, through
// what package p2p exports and the wire formats it documents. It exists to
// attack, so it is no API: internal.
package flood

import (
	"bufio"
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
	"github.com/ringtrain/ringtrain/p2p"
)

// Kind names what Run sends a peer.
type Kind string

// What a hostile peer can send a ringtrain peer, each as fast as it can.
const (
	// Hello: hellos of a stranger, well-formed, proving nothing.
	Hello Kind = "hello"
	// Statements: hellos as large as a hello may be, full of
	// statements no member signed.
	Statements Kind = "statements"
	// Links: ring links opened with a well-formed link hello of a
	// generation the peer is not in.
	Links Kind = "links"
	// JobConfig: job-config requests for jobs the peer does not run.
	JobConfig Kind = "jobconfig"
	// Data: manifest and sample requests for the dataset
	// Options.Dataset, valid ones, on at most 8 streams (what a data
	// server serves one peer at once), each asking again as soon as it
	// is answered.
	Data Kind = "data"
	// DataBad: data requests that are refused (unknown op, too many
	// samples, indices out of range).
	DataBad Kind = "data-bad"
	// DHT: DHT lookups of random keys.
	DHT Kind = "dht"
	// Random: random bytes on each of ringtrain's protocols in turn.
	Random Kind = "random"
	// DHTMessages: FIND_NODE and ADD_PROVIDER messages of ever new
	// keys, back to back on one kad stream each, from a new identity
	// each time a stream is cut off.
	DHTMessages Kind = "dht-messages"
	// Relay: relay reservations, and circuits through the peer to
	// peers it never heard of.
	Relay Kind = "relay"
	// Metrics: idle keep-alive connections to the peer's metrics
	// endpoint (Options.Metrics), as many as it takes.
	Metrics Kind = "metrics"
	// Formation: hellos of a peer that knows the job
	// (Options.Job), claiming a ring of itself at generation 2^62.
	Formation Kind = "formation-lie"
)

// Kinds are all the kinds, in the order a flood benchmark runs them.
func Kinds() []Kind {
	return []Kind{Hello, Statements, Links, JobConfig, Data, DataBad, DHT, Random,
		DHTMessages, Relay, Metrics, Formation}
}

// Options shape a Run.
type Options struct {
	// Workers send at once. Default 16.
	Workers int
	// Dataset is the served dataset's ID that Data asks for.
	Dataset string
	// Metrics is the host:port of the peer's metrics endpoint
	// (Metrics).
	Metrics string
	// Job is the job the peer runs, as its join command tells anyone
	// (Formation).
	Job p2p.Job
}

// Stats count what a Run did.
type Stats struct {
	Kind     Kind  `json:"kind"`
	Sent     int64 `json:"sent"`     // requests or streams sent in full
	Answered int64 `json:"answered"` // of those, answered with anything
	Failed   int64 `json:"failed"`   // streams or dials that failed (refused, reset, cut off)
	Bytes    int64 `json:"bytes"`    // bytes written
}

// Run sends target what kind says, from h, as fast as it can with
// opt.Workers at once, until ctx ends. It is the hostile peer of the flood
// benchmark (ringtrain bench flood): what a peer's limits are tested
// against. A peer that cuts h off makes every later try fail; Run keeps
// trying.
func Run(ctx context.Context, h *p2p.Host, target peer.AddrInfo, kind Kind, opt Options) (Stats, error) {
	if opt.Workers <= 0 {
		opt.Workers = 16
	}
	var id [32]byte
	if kind == Data {
		var err error
		if id, err = data.ParseID(opt.Dataset); err != nil {
			return Stats{Kind: kind}, fmt.Errorf("flood data: %w", err)
		}
	}
	if kind == Data {
		// As many streams as a server serves one peer at once (its
		// MaxPerPeer): valid requests, as fast as they are answered.
		opt.Workers = min(opt.Workers, 8)
	}
	if kind == Metrics && opt.Metrics == "" || kind == Formation && opt.Job.Name == "" {
		return Stats{Kind: kind}, fmt.Errorf("flood %s: Options says nothing of the peer's metrics or job", kind)
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
	return Stats{Kind: kind, Sent: f.sent.Load(), Answered: f.answered.Load(), Failed: f.failed.Load(), Bytes: f.bytes.Load()}, nil
}

type flooder struct {
	h       *p2p.Host
	to      peer.ID
	kind    Kind
	id      [32]byte
	dataset string
	opt     Options

	sent, answered, failed, bytes atomic.Int64
}

// floodProtocols are what Random sends garbage on.
var floodProtocols = []protocol.ID{p2p.HelloProtocol, p2p.ReformProtocol, p2p.AdmitProtocol, p2p.RingProtocol, p2p.JobConfigProtocol, p2p.DataProtocol, p2p.ProtocolPrefix + "/kad/1.0.0"}

// once sends one request (or, for Data, a run of them on one stream).
func (f *flooder) once(ctx context.Context, rng *mrand.Rand) {
	switch f.kind {
	case DHTMessages:
		f.dhtMessages(ctx, rng)
		return
	case Relay:
		f.relay(ctx, rng)
		return
	case Metrics:
		f.metrics(ctx)
		return
	case Formation:
		f.formationLie(ctx)
		return
	}
	if f.kind == DHT {
		var p [32]byte
		rand.Read(p[:])
		lctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := f.h.DHT.GetClosestPeers(lctx, string(p[:]))
		f.count(err, 0)
		if err != nil && ctx.Err() == nil {
			// Cut off, a lookup fails at once: do not spin the CPU the
			// job's peers need on this machine.
			sleepCtx(ctx, 10*time.Millisecond)
		}
		return
	}
	proto := map[Kind]protocol.ID{Hello: p2p.HelloProtocol, Statements: p2p.HelloProtocol, Links: p2p.RingProtocol,
		JobConfig: p2p.JobConfigProtocol, Data: p2p.DataProtocol, DataBad: p2p.DataProtocol}[f.kind]
	if f.kind == Random {
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
	if f.kind == Data {
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
	case Hello:
		msg = helloBytes(&p2p.Hello{Version: p2p.ProtocolVersion, Proof: fmt.Sprintf("%064x", rng.Uint64())})
	case Statements:
		msg = bigHello(rng)
	case Links:
		msg = linkHello(rng.IntN(4), rng.Uint64())
	case JobConfig:
		msg = make([]byte, 32)
		rand.Read(msg)
	case DataBad:
		msg = append([]byte{byte(3 + rng.IntN(250))}, make([]byte, 32)...)
	case Random:
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

func helloBytes(h *p2p.Hello) []byte {
	b, _ := p2p.EncodeHello(h) // the flooder's own hellos are within the limit
	return b
}

// bigHello is a hello near maxHelloBytes of statements signed by no one.
func bigHello(rng *mrand.Rand) []byte {
	h := &p2p.Hello{Version: p2p.ProtocolVersion, Proof: fmt.Sprintf("%064x", rng.Uint64()), Rings: [][]string{{"12D3KooWxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}}
	sig := make([]byte, 64)
	for range 1000 {
		h.Statements = append(h.Statements, p2p.Statement{From: "12D3KooWxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", Seq: rng.Uint64(), Gen: 1, Ring: 0, Sig: sig})
	}
	return helloBytes(h)
}

// dhtMessages sends DHT messages back to back on one kad stream until it
// is cut off, reading the answers aside.
func (f *flooder) dhtMessages(ctx context.Context, rng *mrand.Rand) {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	s, err := f.h.NewStream(network.WithAllowLimitedConn(sctx, "flood"), f.to, p2p.ProtocolPrefix+"/kad/1.0.0")
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

// relay asks the peer for a relay reservation, or — every other time —
// for a circuit through it to a peer it never heard of.
func (f *flooder) relay(ctx context.Context, rng *mrand.Rand) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var err error
	if rng.IntN(2) == 0 {
		_, err = client.Reserve(rctx, f.h.Host, peer.AddrInfo{ID: f.to, Addrs: f.h.Peerstore().Addrs(f.to)})
	} else {
		var nobody [32]byte
		rand.Read(nobody[:])
		id, _ := peer.IDFromBytes(append([]byte{0x00, 0x20}, nobody[:]...)) // an identity multihash: some peer
		err = fmt.Errorf("no address of %s", f.to)
		for _, a := range f.h.Peerstore().Addrs(f.to) {
			ai, perr := peer.AddrInfoFromP2pAddr(a.Encapsulate(ma.StringCast("/p2p/" + f.to.String() + "/p2p-circuit/p2p/" + id.String())))
			if perr == nil {
				err = f.h.Connect(rctx, *ai)
				break
			}
		}
	}
	f.count(err, 0)
	if err != nil && ctx.Err() == nil {
		// Refused, or cut off: do not spin the CPU the job's peers need
		// on this machine.
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
	s, err := f.h.NewStream(network.WithAllowLimitedConn(sctx, "flood"), f.to, p2p.HelloProtocol)
	if err != nil {
		f.count(err, 0)
		sleepCtx(ctx, 10*time.Millisecond)
		return
	}
	defer s.Close()
	setDeadline(sctx, s)
	h := &p2p.Hello{Version: p2p.ProtocolVersion, Proof: f.opt.Job.Proof(f.h.ID(), f.to),
		Generation: 1 << 62, Proposal: []string{f.h.ID().String()}, Ready: true, Formed: true}
	f.send(s, helloBytes(h))
}

// linkHello is a ring link's first bytes (p2p's wire format, little-endian):
// the magic "RTL3", a rank, a generation, the libp2p plane and the ring's
// channel.
func linkHello(rank int, gen uint64) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 0x334c5452)
	b = binary.LittleEndian.AppendUint32(b, uint32(rank))
	b = binary.LittleEndian.AppendUint64(b, gen)
	b = binary.LittleEndian.AppendUint32(b, uint32(p2p.PlaneLibp2p))
	return binary.LittleEndian.AppendUint32(b, uint32(p2p.ChannelRing))
}

// The data protocol's requests and answers (p2p's wire format): an op
// byte and the dataset's 32-byte ID, then the request; a status byte
// first in every answer.
const (
	opManifest = 1
	opSamples  = 2
	statusOK   = 0
)

// readStatus reads an answer's status byte; any but OK is an error.
func readStatus(br *bufio.Reader) error {
	s, err := br.ReadByte()
	if err == nil && s != statusOK {
		err = fmt.Errorf("status %d", s)
	}
	return err
}

// readManifestReply reads an answer to a manifest request: the status,
// the manifest's length and the manifest, checked against id.
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

func setDeadline(ctx context.Context, st network.Stream) {
	if d, ok := ctx.Deadline(); ok {
		st.SetDeadline(d)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
