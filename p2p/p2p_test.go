package p2p

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	mrand "math/rand"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/ring"
)

var loopback = []string{"/ip4/127.0.0.1/tcp/0"}

func info(h *Host) peer.AddrInfo { return peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()} }

// startHosts starts n hosts on loopback; every one after the first knows
// only the first.
func startHosts(t *testing.T, n int, key pnet.PSK) []*Host {
	t.Helper()
	ctx := context.Background()
	hs := make([]*Host, n)
	for i := range n {
		cfg := HostConfig{Listen: loopback, SwarmKey: key}
		if i > 0 {
			cfg.Bootstrap = []peer.AddrInfo{info(hs[0])}
		}
		h, err := NewHost(ctx, cfg)
		if err != nil {
			t.Fatalf("host %d: %v", i, err)
		}
		hs[i] = h
		t.Cleanup(func() { h.Close() })
	}
	return hs
}

// swarm starts a localSwarm of n peers of j, closed when the test ends.
// slow skips a test of seconds under go test -short (make check); make
// test runs it.
func slow(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("takes seconds; make test runs it")
	}
}

func swarm(t *testing.T, n int, j Job) *localSwarm {
	t.Helper()
	slow(t)
	s, err := startLocalSwarm(context.Background(), n, j)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func startNodes(t *testing.T, hs []*Host, job Job) []*Node {
	t.Helper()
	ns := make([]*Node, len(hs))
	for i, h := range hs {
		n, err := NewNode(h, job, NodeConfig{})
		if err != nil {
			t.Fatal(err)
		}
		ns[i] = n
		t.Cleanup(func() { n.Close() })
	}
	return ns
}

var job = Job{Name: "test-job", ConfigHash: strings.Repeat("ab", 32), WorldSize: 8}

// TestEightPeersFormOneRing: 8 hosts that each know only the first find
// each other through the DHT and agree on the same ranks and generation.
func TestEightPeersFormOneRing(t *testing.T) {
	s := swarm(t, 8, job)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Join(ctx); err != nil {
		t.Fatal(err)
	}
	hs, fs := s.Hosts, s.Formations
	var want []peer.ID
	for _, h := range hs {
		want = append(want, h.ID())
	}
	slices.Sort(want)
	for i, f := range fs {
		if !slices.Equal(f.Members, want) || f.Generation != 1 || f.Members[f.Rank] != hs[i].ID() {
			t.Errorf("host %d: formation %+v; want members sorted by ID, generation 1, itself at its rank", i, f)
		}
	}
}

// TestRingOfOne: a job of world size 1 forms at once, with its one peer.
func TestRingOfOne(t *testing.T) {
	j := job
	j.WorldSize = 1
	s := swarm(t, 1, j)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Join(ctx); err != nil || len(s.Formations[0].Members) != 1 {
		t.Fatalf("Join of a ring of one = %v, %+v; want it formed", err, s.Formations[0])
	}
}

func TestDifferentConfigIsRefused(t *testing.T) {
	hs := startHosts(t, 3, nil)
	j := job
	j.WorldSize = 3
	ns := startNodes(t, hs[:2], j)
	other := j
	other.ConfigHash = strings.Repeat("cd", 32)
	odd, err := NewNode(hs[2], other, NodeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer odd.Close()
	// The two that agree join too, as they would: they advertise the job in
	// the DHT once their formation stalls, and so the odd peer finds them.
	good, stop := context.WithCancel(context.Background())
	goodErrs := make(chan error, 2)
	for _, n := range ns {
		go func() { _, err := n.Join(good); goodErrs <- err }()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = odd.Join(ctx)
	// Hashes never travel: the odd peer names its own, and learns nothing
	// of the others' (their side logs theirs).
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), other.ConfigHash[:16]) || strings.Contains(err.Error(), j.ConfigHash[:16]) {
		t.Errorf("Join with another config = %v; want ErrRefused naming its own config hash and not the others'", err)
	}
	// The two that agree still cannot form a ring of three without it.
	stop()
	for range ns {
		if err := <-goodErrs; !errors.Is(err, context.Canceled) {
			t.Errorf("Join of a good peer = %v; want it still waiting for a third peer when stopped", err)
		}
	}
}

func TestTooFewPeersTimesOut(t *testing.T) {
	j := job
	j.WorldSize = 3
	s := swarm(t, 2, j)
	hs := s.Hosts
	// The join times out once both have verified each other — not after a
	// fixed time, which a slow machine might spend finding them.
	ctx := newDeadline()
	go func() {
		defer ctx.expire()
		for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if verified(s.Nodes[0], hs[1].ID()) && verified(s.Nodes[1], hs[0].ID()) {
				return
			}
		}
	}()
	s.Join(ctx)
	for i, err := range s.Errs {
		if !errors.Is(err, ErrJoinTimeout) || !strings.Contains(err.Error(), "found 2 of 3 peers") ||
			!strings.Contains(err.Error(), hs[0].ID().String()) || !strings.Contains(err.Error(), hs[1].ID().String()) {
			t.Errorf("node %d: Join = %v; want ErrJoinTimeout saying 2 of 3 were found, and which", i, err)
		}
	}
}

// deadline is a context that ends, with DeadlineExceeded, when expire is
// called: a join timeout at a moment the test chooses.
type deadline struct {
	context.Context
	done chan struct{}
	once sync.Once
}

func newDeadline() *deadline {
	return &deadline{Context: context.Background(), done: make(chan struct{})}
}

func (d *deadline) expire()               { d.once.Do(func() { close(d.done) }) }
func (d *deadline) Done() <-chan struct{} { return d.done }
func (d *deadline) Err() error {
	select {
	case <-d.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// verified reports whether n has checked p's proof of the job.
func verified(n *Node, p peer.ID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	pi, ok := n.peers[p]
	return ok && pi.verified
}

func TestExtraPeerIsStandby(t *testing.T) {
	j := job
	j.WorldSize = 2
	s := swarm(t, 3, j)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s.Join(ctx)
	formed, standby := 0, 0
	for i, err := range s.Errs {
		switch {
		case err == nil:
			formed++
		case errors.Is(err, ErrStandby):
			standby++
		default:
			t.Errorf("node %d: %v", i, err)
		}
	}
	if formed != 2 || standby != 1 {
		t.Errorf("%d formed and %d standbys; want 2 and 1", formed, standby)
	}
}

func swarmKey(t *testing.T) pnet.PSK {
	t.Helper()
	k := make([]byte, 32)
	rand.Read(k)
	return k
}

func TestSwarmKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "swarm.key")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteSwarmKey(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	k, err := ReadSwarmKey(path)
	if err != nil || len(k) != 32 {
		t.Fatalf("ReadSwarmKey of a written key = %d bytes, %v; want 32", len(k), err)
	}
	os.WriteFile(path, []byte("/key/swarm/psk/1.0.0/\n/base16/\nzz\n"), 0o600)
	if _, err := ReadSwarmKey(path); err == nil {
		t.Error("a corrupt swarm key loaded; want an error")
	}
}

// TestAllowList: a host that allows only one peer refuses another.
func TestAllowList(t *testing.T) {
	hs := startHosts(t, 1, nil)
	friend, err := NewHost(context.Background(), HostConfig{Listen: loopback})
	if err != nil {
		t.Fatal(err)
	}
	defer friend.Close()
	guarded, err := NewHost(context.Background(), HostConfig{Listen: loopback, Allow: []peer.ID{friend.ID()}})
	if err != nil {
		t.Fatal(err)
	}
	defer guarded.Close()
	guarded.SetStreamHandler("/test/echo", func(s network.Stream) {
		io.Copy(s, s)
		s.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The dialer may finish its side of the handshake before the guarded
	// side refuses the peer, so what counts is whether a stream gets through.
	echo := func(from *Host) error {
		from.Peerstore().AddAddrs(guarded.ID(), guarded.Addrs(), time.Minute)
		s, err := from.NewStream(ctx, guarded.ID(), "/test/echo")
		if err != nil {
			return err
		}
		defer s.Close()
		if _, err := s.Write([]byte("x")); err != nil {
			return err
		}
		_, err = io.ReadFull(s, make([]byte, 1))
		return err
	}
	if err := echo(hs[0]); err == nil {
		t.Error("a peer not on the allowlist got a stream through")
	}
	if err := echo(friend); err != nil {
		t.Errorf("the allowed peer could not get a stream through: %v", err)
	}
}

// notYetListening is a peer's key and ID, and an address on loopback at a
// free port that nobody listens on yet.
func notYetListening(t *testing.T) (crypto.PrivKey, peer.ID, ma.Multiaddr) {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0") // a free port, closed again
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return key, id, ma.StringCast(fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", port))
}

// TestPeerStartedLater: peers started together, each naming the others,
// find no one listening at first. A host keeps trying its bootstrap peer
// until the join timeout before NewHost returns; its Known peers it does
// not wait for — NewHost returns with none of them up — but tries again
// in the background. Either way it connects once the peer is up.
func TestPeerStartedLater(t *testing.T) {
	slow(t)
	for _, tc := range []struct {
		name, notYet string // notYet: what the host says when the first try finds no one
		known        bool   // the peer is among Known, not Bootstrap
	}{
		{"bootstrap", "no bootstrap peer reachable yet", false},
		{"known", "no peer this identity remembers reachable yet", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, id, addr := notYetListening(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			refused := &logWatch{want: tc.notYet, seen: make(chan struct{})}
			cfg := HostConfig{Listen: loopback, Logger: zerolog.New(refused)}
			if tc.known {
				cfg.Known, cfg.KnownFor = []peer.AddrInfo{{ID: id, Addrs: []ma.Multiaddr{addr}}}, 30*time.Second
			} else {
				cfg.Bootstrap = []peer.AddrInfo{{ID: id, Addrs: []ma.Multiaddr{addr}}}
			}
			started := make(chan *Host, 1)
			go func() {
				h, err := NewHost(ctx, cfg)
				if err != nil {
					t.Error(err)
				}
				started <- h
			}()
			var h *Host
			if tc.known { // up before the peer is
				select {
				case h = <-started:
				case <-ctx.Done():
					t.Fatal("NewHost waited for a known peer")
				}
			}
			select { // the peer starts once the first try was refused
			case <-refused.seen:
			case <-ctx.Done():
				t.Fatal("the host never said its peer was not reachable yet")
			}
			other, err := NewHost(ctx, HostConfig{Listen: []string{addr.String()}, Identity: key})
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			if !tc.known {
				h = <-started
			}
			if h == nil {
				return
			}
			defer h.Close()
			if !tc.known && h.Network().Connectedness(id) != network.Connected {
				t.Fatal("NewHost returned not connected to its bootstrap peer, started after it")
			}
			for h.Network().Connectedness(id) != network.Connected {
				select {
				case <-ctx.Done():
					t.Fatal("the host never connected to its peer, started after it")
				case <-time.After(50 * time.Millisecond):
				}
			}
		})
	}
}

// TestGoneBootstrapPeerDoesNotHoldTheJoin: of two bootstrap peers one
// answers and the other's machine is gone — a listener that accepts and
// never speaks, as a dial into a dead machine hangs until libp2p's dial
// timeout (5 s here, on loopback). The host is up, connected to the one
// that answered, long before that timeout; a peer restarted with the
// peers it remembers would otherwise wait out every one that has left.
func TestGoneBootstrapPeerDoesNotHoldTheJoin(t *testing.T) {
	slow(t)
	up := startHosts(t, 1, nil)[0]
	hole, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 16)
	go func() { // owned by the test: ends when hole closes
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	t.Cleanup(func() {
		hole.Close()
		for {
			select {
			case c := <-held:
				c.Close()
			default:
				return
			}
		}
	})
	gone := testPeerIDs(t, 11, 1)[0] // no process holds its key
	boot := []peer.AddrInfo{
		{ID: gone, Addrs: []ma.Multiaddr{ma.StringCast(fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", hole.Addr().(*net.TCPAddr).Port))}},
		info(up),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	h, err := NewHost(ctx, HostConfig{Listen: loopback, Bootstrap: boot})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	// Behaviour, not speed: 2.5 s is five graces and half the dial
	// timeout a host waiting for every bootstrap peer sits out.
	if took := time.Since(start); took > 2500*time.Millisecond {
		t.Errorf("the host took %v to start: it waited for the bootstrap peer that never answers", took)
	}
	if h.Network().Connectedness(up.ID()) != network.Connected {
		t.Error("the host is not connected to the bootstrap peer that answered")
	}
	if len(h.Network().ConnsToPeer(gone)) != 0 {
		t.Error("the host holds a connection to the peer that never answered")
	}
}

func TestWrongSwarmKeyCannotConnect(t *testing.T) {
	slow(t)
	a := startHosts(t, 1, swarmKey(t))[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // the join timeout: tries until then
	defer cancel()
	_, err := NewHost(ctx, HostConfig{Listen: loopback, SwarmKey: swarmKey(t), Bootstrap: []peer.AddrInfo{info(a)}})
	if err == nil || !strings.Contains(err.Error(), "no bootstrap peer reachable") {
		t.Errorf("NewHost with another swarm key = %v; want it unable to reach the bootstrap peer", err)
	}
	key := swarmKey(t)
	same := startHosts(t, 2, key) // the second bootstraps from the first
	if len(same[1].Network().ConnsToPeer(same[0].ID())) == 0 {
		t.Error("hosts with the same swarm key are not connected")
	}
}

// TestAllreduceOverLibp2pMatchesMemory: the same buffers give the same bits
// over libp2p streams as over in-memory pipes.
func TestAllreduceOverLibp2pMatchesMemory(t *testing.T) {
	const n, length = 3, 10_000
	j := job
	j.WorldSize = n
	s := swarm(t, n, j)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Join(ctx); err != nil {
		t.Fatal(err)
	}
	rng := mrand.New(mrand.NewSource(1))
	bufs := make([][]float32, n) // by rank
	for r := range bufs {
		bufs[r] = make([]float32, length)
		for i := range bufs[r] {
			bufs[r][i] = float32(rng.NormFloat64())
		}
	}
	run := func(ts []ring.Transport) [][]float32 {
		out := make([][]float32, n)
		var wg sync.WaitGroup
		errs := make([]error, n)
		for r := range n {
			out[r] = slices.Clone(bufs[r])
			wg.Go(func() {
				rg, err := ring.New(ts[r], ring.Config{Rank: r, Size: n, Generation: 1, ChunkBytes: 4096})
				if err != nil {
					errs[r] = err
					return
				}
				defer rg.Close()
				errs[r] = rg.AllreduceMean(ctx, out[r])
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		return out
	}
	want := run(ring.MemRing(n))
	for _, c := range []struct {
		plane   DataPlane
		streams int // TLS links striped over this many connections
	}{{PlaneTLS, 0}, {PlaneTLS, 3}, {PlaneLibp2p, 0}, {PlaneTCP, 0}, {PlaneTCP, 2}} {
		s.streams = c.streams
		ts, done, err := s.Connect(ctx, c.plane)
		if err != nil {
			t.Fatal(err)
		}
		got := run(ts) // run closes the rings, and so the transports
		done()
		for r := range n {
			for i := range got[r] {
				if got[r][i] != want[r][i] {
					t.Fatalf("plane %v, %d connections a link, rank %d element %d: %v over the network, %v in memory", c.plane, c.streams, r, i, got[r][i], want[r][i])
				}
			}
		}
	}
}

// TestTCPPlaneRefusesWrongToken: a TCP connection that does not open with
// a token handed out is closed by the listener.
func TestTCPPlaneRefusesWrongToken(t *testing.T) {
	hs := startHosts(t, 2, nil)
	links := NewRingLinks(hs[0], expectNone{}, LinksConfig{Plane: PlaneTCP, TCPListen: "127.0.0.1:0"})
	defer links.Close()
	ln, err := links.tcpListener()
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(append(make([]byte, tokenSize), 0, 1)) // all zeros: never handed out
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("read after a wrong token = %v; want the connection closed", err)
	}
}

// TestStrangerCannotHoldThePlaneSlots: a stranger that opens every slot
// of the clear TCP plane's listener from one address and sends nothing
// holds at most maxPendingPerIP of them: a connection from elsewhere is
// still taken and waited on for its token. Before, it was closed at once
// until the stranger stopped.
func TestStrangerCannotHoldThePlaneSlots(t *testing.T) {
	hs := startHosts(t, 1, nil)
	links := NewRingLinks(hs[0], expectNone{}, LinksConfig{Plane: PlaneTCP, TCPListen: "127.0.0.1:0"})
	defer links.Close()
	ln, err := links.tcpListener()
	if err != nil {
		t.Fatal(err)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	for range 2 * maxPendingTCP {
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	time.Sleep(100 * time.Millisecond) // for the listener to take them
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(time.Second))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("a connection beside a stranger's %d: read = %v; want it waited on for its token (a timeout here)", 2*maxPendingTCP, err)
	}
}

// TestPlaneListensWhereTheHostDoes: the data plane listens on the one IP
// the host listens on, and on every interface only where the host does.
func TestPlaneListensWhereTheHostDoes(t *testing.T) {
	for _, c := range []struct {
		addrs []string
		want  string
	}{
		{[]string{"/ip4/127.0.0.1/tcp/4001"}, "127.0.0.1:0"},
		{[]string{"/ip4/127.0.0.1/tcp/4001", "/ip4/127.0.0.1/udp/4001/quic-v1", "/p2p-circuit"}, "127.0.0.1:0"},
		{[]string{"/ip4/0.0.0.0/tcp/4001"}, ":0"},
		{[]string{"/ip4/127.0.0.1/tcp/4001", "/ip4/192.0.2.1/tcp/4001"}, ":0"},
		{nil, ":0"},
	} {
		var addrs []ma.Multiaddr
		for _, a := range c.addrs {
			addrs = append(addrs, ma.StringCast(a))
		}
		if got := planeListen(addrs); got != c.want {
			t.Errorf("planeListen(%v) = %q; want %q", c.addrs, got, c.want)
		}
	}
	hs := startHosts(t, 1, nil)
	links := NewRingLinks(hs[0], expectNone{}, LinksConfig{Plane: PlaneTLS})
	defer links.Close()
	ln, err := links.tcpListener()
	if err != nil {
		t.Fatal(err)
	}
	if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		t.Errorf("a host on 127.0.0.1 has its TLS plane on %v; want loopback only", ln.Addr())
	}
}

func TestIdentityPersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys", "identity.key")
	k1, err := LoadOrCreateIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("identity file: %v, mode %v; want 0600", err, st.Mode().Perm())
	}
	k2, err := LoadOrCreateIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	id1, _ := peer.IDFromPrivateKey(k1)
	id2, _ := peer.IDFromPrivateKey(k2)
	if id1 != id2 {
		t.Errorf("reloaded identity %s; want %s", id2, id1)
	}
	os.Chmod(path, 0o644)
	if _, err := LoadOrCreateIdentity(path); !errors.Is(err, ErrOpenKey) || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("an identity readable by others: %v; want ErrOpenKey saying chmod 600", err)
	}
	os.Chmod(path, 0o600)
	os.WriteFile(path, []byte("not a key"), 0o600)
	if _, err := LoadOrCreateIdentity(path); err == nil {
		t.Error("a corrupt identity file loaded; want an error")
	}
}

// TestSwarmKeyFileIsPrivate: swarm-key > FILE leaves FILE readable by its
// owner alone, whatever the umask made it.
func TestSwarmKeyFileIsPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "swarm.key")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644) // as the shell makes it
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteSwarmKey(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("swarm key file: %v, mode %v; want 0600", err, st.Mode().Perm())
	}
	if _, err := ReadSwarmKey(path); err != nil {
		t.Errorf("the key written does not load: %v", err)
	}
}

func FuzzReadHello(f *testing.F) {
	var b bytes.Buffer
	writeHello(&b, &Hello{Version: ProtocolVersion, Proof: "ab", Members: []Member{{ID: "x", Addrs: []string{"/ip4/127.0.0.1/tcp/1"}}}, Proposal: []string{"x"}})
	f.Add(b.Bytes())
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 2, '{', '}'})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := readHello(bytes.NewReader(data))
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := writeHello(&out, h); err != nil {
			t.Fatalf("a hello that was read cannot be written: %v", err)
		}
		if _, err := readHello(&out); err != nil {
			t.Fatalf("a hello written from a read one cannot be read: %v", err)
		}
	})
}

func ExampleParseBootstrap() {
	ais, err := ParseBootstrap([]string{"/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"})
	fmt.Println(len(ais), err)
	// Output: 1 <nil>
}

// TestDeadPeerDoesNotStallFormation: a peer the DHT or a member named that
// refuses connections, or one that accepts and then says nothing, does not
// hold formation up: hellos to it run beside the others' and formation
// finishes well inside the hello timeout (here a minute, so a round that
// waited for the silent peer could not finish in the test's 10 s).
func TestDeadPeerDoesNotStallFormation(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held sync.WaitGroup
	defer func() { silent.Close(); held.Wait() }()
	held.Go(func() { // accept and hold, speaking no protocol
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	})
	for _, tc := range []struct {
		name  string
		addrs func(t *testing.T) (peer.ID, []ma.Multiaddr)
	}{
		{"refuses", func(t *testing.T) (peer.ID, []ma.Multiaddr) {
			gone, err := NewHost(context.Background(), HostConfig{Listen: loopback})
			if err != nil {
				t.Fatal(err)
			}
			id, addrs := gone.ID(), gone.Addrs()
			gone.Close()
			return id, addrs
		}},
		{"says nothing", func(t *testing.T) (peer.ID, []ma.Multiaddr) {
			h, err := NewHost(context.Background(), HostConfig{Listen: loopback})
			if err != nil {
				t.Fatal(err)
			}
			id := h.ID() // a real identity, at an address that never answers
			h.Close()
			a, err := ma.NewMultiaddr(fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", silent.Addr().(*net.TCPAddr).Port))
			if err != nil {
				t.Fatal(err)
			}
			return id, []ma.Multiaddr{a}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := job
			j.WorldSize = 3
			s := swarm(t, 3, j)
			id, addrs := tc.addrs(t)
			n := s.Nodes[0]
			n.cfg.HelloTimeout = time.Minute
			n.h.Peerstore().AddAddrs(id, addrs, time.Minute)
			n.mu.Lock()
			n.pending = append(n.pending, id)
			n.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := s.Join(ctx); err != nil {
				t.Fatal(err)
			}
			if tc.name == "refuses" && !n.isKnown(id) {
				t.Error("the gone peer is not backed off from after its hello failed")
			}
		})
	}
}

// TestSurvivorsReform: of a formed ring of four, one host dies; the three
// others agree on generation 2 without it (same members, ranks in the old
// order), connect it and allreduce over it; asking for four at least fails
// with ErrTooFew instead.
func TestSurvivorsReform(t *testing.T) {
	const n = 4
	j := job
	j.WorldSize = n
	s := swarm(t, n, j)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Join(ctx); err != nil {
		t.Fatal(err)
	}
	dead := 2 // by host
	s.Nodes[dead].Close()
	s.Hosts[dead].Close()
	var alive []int
	for i := range n {
		if i != dead {
			alive = append(alive, i)
		}
	}
	reform := func(min int) ([]*Formation, []error) {
		fs := make([]*Formation, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for _, i := range alive {
			wg.Go(func() {
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				fs[i], errs[i] = s.Nodes[i].Reform(rctx, s.Formations[i], min)
			})
		}
		wg.Wait()
		return fs, errs
	}
	fs, errs := reform(n)
	for _, i := range alive {
		if !errors.Is(errs[i], ErrTooFew) {
			t.Errorf("host %d: Reform with min %d = %v; want ErrTooFew", i, n, errs[i])
		}
	}
	// The next attempt is the generation after; a fresh Formation per try.
	fs, errs = reform(n - 1)
	want := slices.DeleteFunc(slices.Clone(s.Formations[0].Members), func(p peer.ID) bool { return p == s.Hosts[dead].ID() })
	for _, i := range alive {
		if errs[i] != nil {
			t.Fatalf("host %d: Reform: %v", i, errs[i])
		}
		if f := fs[i]; !slices.Equal(f.Members, want) || f.Generation != 2 || f.Members[f.Rank] != s.Hosts[i].ID() {
			t.Errorf("host %d: formation %+v; want the three survivors sorted by ID, generation 2", i, f)
		}
	}
	ts := make([]ring.Transport, n-1)
	var wg sync.WaitGroup
	for _, i := range alive {
		links := NewRingLinks(s.Hosts[i], s.Nodes[i], LinksConfig{Logger: zerolog.Nop()})
		t.Cleanup(links.Close)
		wg.Go(func() {
			var err error
			if ts[fs[i].Rank], err = links.Connect(ctx, fs[i]); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	sums := make([][]float32, n-1)
	for r := range n - 1 {
		wg.Go(func() {
			rg, err := ring.New(ts[r], ring.Config{Rank: r, Size: n - 1, Generation: 2})
			if err != nil {
				t.Error(err)
				return
			}
			defer rg.Close()
			sums[r] = []float32{float32(r + 1)}
			if err := rg.AllreduceSum(ctx, sums[r]); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for r, s := range sums {
		if len(s) != 1 || s[0] != 6 {
			t.Errorf("rank %d of generation 2: sum %v; want 6", r, s)
		}
	}
}

// expectNone is a Gate that expects no ring link.
type expectNone struct{}

func (expectNone) Expects(uint64, peer.ID) bool { return false }
func (expectNone) JobDigest() [32]byte          { return [32]byte{} }

// TestHostOutlivesItsStartContext: a host's DHT keeps working after the
// context NewHost was given ends (a caller bounds the start with its join
// timeout and cancels it on return). kad-dht ties its lifetime to the
// context New gets; when that was NewHost's, discovery died with it and no
// ring formed.
func TestHostOutlivesItsStartContext(t *testing.T) {
	start, cancel := context.WithCancel(context.Background())
	hs := make([]*Host, 2)
	for i := range hs {
		cfg := HostConfig{Listen: loopback}
		if i > 0 {
			cfg.Bootstrap = []peer.AddrInfo{info(hs[0])}
		}
		h, err := NewHost(start, cfg)
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = h
		t.Cleanup(func() { h.Close() })
	}
	cancel()
	j := job
	j.WorldSize = 2
	ns := startNodes(t, hs, j)
	ctx, done := context.WithTimeout(context.Background(), 20*time.Second)
	defer done()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, n := range ns {
		wg.Go(func() { _, errs[i] = n.Join(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Join after the hosts' start context ended: %v", err)
	}
}
