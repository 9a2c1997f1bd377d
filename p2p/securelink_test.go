package p2p

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/ring"
)

// tlsRing is a formed two-peer ring whose links take the given plane on
// loopback; pred and succ index its hosts by rank 0 and 1.
type tlsRing struct {
	s           *localSwarm
	links       []*RingLinks
	pred, succ  int
	f           []*Formation
	ctx         context.Context
	outsiderKey *libp2ptls.Identity // a stranger's identity, as TLS certificates
}

func newTLSRing(t *testing.T, plane DataPlane) *tlsRing {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	s := swarm(t, 2, Job{Name: "tls-" + plane.String(), ConfigHash: job.ConfigHash, WorldSize: 2})
	if err := s.Join(ctx); err != nil {
		t.Fatal(err)
	}
	r := &tlsRing{s: s, f: s.Formations, ctx: ctx}
	for i, h := range s.Hosts {
		l := NewRingLinks(h, s.Nodes[i], LinksConfig{Plane: plane, TCPListen: "127.0.0.1:0", Logger: zerolog.Nop()})
		t.Cleanup(l.Close)
		r.links = append(r.links, l)
		if s.Formations[i].Rank == 0 {
			r.pred = i
		} else {
			r.succ = i
		}
	}
	x := outsider(t, s.Hosts[0])
	id, err := libp2ptls.NewIdentity(x.Peerstore().PrivKey(x.ID()))
	if err != nil {
		t.Fatal(err)
	}
	r.outsiderKey = id
	return r
}

// token asks the successor, as the predecessor does, for a link of the
// ring's generation on ch; it returns the address and token given, and the
// stream, which the caller closes (closing it says the token is coming).
func (r *tlsRing) token(t *testing.T, ch Channel) (string, [tokenSize]byte, network.Stream) {
	t.Helper()
	pred, succ := r.s.Hosts[r.pred], r.s.Hosts[r.succ]
	st, err := pred.NewStream(r.ctx, succ.ID(), RingProtocol)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write(linkHelloMsg{rank: 0, gen: r.f[r.pred].Generation, plane: r.links[r.succ].cfg.Plane, ch: ch}.encode()); err != nil {
		t.Fatal(err)
	}
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	var n [1]byte
	if _, err := io.ReadFull(st, n[:]); err != nil || n[0] == 0 {
		t.Fatalf("the successor gave no address: %v, length %d", err, n[0])
	}
	buf := make([]byte, int(n[0])+tokenSize)
	if _, err := io.ReadFull(st, buf); err != nil {
		t.Fatal(err)
	}
	var tok [tokenSize]byte
	copy(tok[:], buf[n[0]:])
	return string(buf[:n[0]]), tok, st
}

// hello is the hello the predecessor would say for tok on ch.
func (r *tlsRing) hello(tok [tokenSize]byte, ch Channel) secureHello {
	return secureHello{token: tok, job: r.s.Nodes[r.pred].JobDigest(), gen: r.f[r.pred].Generation, rank: 0, ch: ch}
}

// predID is the predecessor's identity as TLS certificates.
func (r *tlsRing) predID(t *testing.T) *libp2ptls.Identity {
	t.Helper()
	id, err := r.links[r.pred].tls.get(r.s.Hosts[r.pred].Peerstore().PrivKey(r.s.Hosts[r.pred].ID()))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// arrives waits up to d for the successor to be handed the link on ch from
// rank 0, and says whether it was, and whether over the TLS plane.
func (r *tlsRing) arrives(ch Channel, d time.Duration) (got, overTLS bool) {
	ctx, cancel := context.WithTimeout(r.ctx, d)
	defer cancel()
	_, in, err := r.links[r.succ].Pair(ctx, r.f[r.succ], ch, -1, 0)
	if err != nil {
		return false, false
	}
	defer in.Close()
	_, overTLS = in.(*secureConn)
	return true, overTLS
}

// refused says whether the server end of c closed it without a byte of
// ring data: what a refused TLS link sees when it reads.
func refused(c io.Reader) bool {
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// TestTLSLinkRefusesWhatTheRingDidNotName: a TLS link is handed to the ring
// only if its dialer proves, in the handshake, the identity the token was
// given to, and names the job, generation, rank and channel the token is
// for. Each bad hello is refused and leaves the token for its owner, whose
// own hello then gets through.
func TestTLSLinkRefusesWhatTheRingDidNotName(t *testing.T) {
	r := newTLSRing(t, PlaneTLS)
	addr, tok, st := r.token(t, ChannelRing)
	defer st.Close()
	other := JobDigest(Job{Name: "another job", ConfigHash: job.ConfigHash, WorldSize: 2})
	var stranger [tokenSize]byte
	copy(stranger[:], "never handed out by anyone here!")
	good := r.hello(tok, ChannelRing)
	cases := []struct {
		name  string
		id    *libp2ptls.Identity
		hello secureHello
	}{
		{"a stranger with a token it made up", r.outsiderKey, r.hello(stranger, ChannelRing)},
		{"a stranger with the member's token", r.outsiderKey, good},
		{"the member with a token it made up", r.predID(t), r.hello(stranger, ChannelRing)},
		{"the member, naming another job", r.predID(t), func() secureHello { h := good; h.job = other; return h }()},
		{"the member, naming an older generation", r.predID(t), func() secureHello { h := good; h.gen--; return h }()},
		{"the member, naming a later generation", r.predID(t), func() secureHello { h := good; h.gen++; return h }()},
		{"the member, naming another rank", r.predID(t), func() secureHello { h := good; h.rank = 1; return h }()},
		{"the member, naming another channel", r.predID(t), func() secureHello { h := good; h.ch = ChannelStage; return h }()},
	}
	for _, c := range cases {
		sc, err := dialSecureHello(r.ctx, c.id, r.s.Hosts[r.succ].ID(), addr, c.hello)
		if err != nil {
			t.Fatalf("%s: the handshake itself failed (%v); the refusal must come from the hello", c.name, err)
		}
		sc.raw.SetReadDeadline(time.Now().Add(10 * time.Second))
		if !refused(sc) {
			t.Errorf("%s: the link was not closed", c.name)
		}
		sc.Close()
		if got, _ := r.arrives(ChannelRing, 100*time.Millisecond); got {
			t.Fatalf("%s: the ring was handed the link", c.name)
		}
	}
	sc, err := dialSecureHello(r.ctx, r.predID(t), r.s.Hosts[r.succ].ID(), addr, good)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	st.Close()
	if got, overTLS := r.arrives(ChannelRing, 10*time.Second); !got || !overTLS {
		t.Fatalf("the member's own hello: link handed over %v, over TLS %v; want both", got, overTLS)
	}
}

// proxy is a man in the middle on loopback: every connection to it goes
// on to target, and what the dialer sends passes through edit, which sees
// how many bytes went before; edit returns false to cut the connection.
// It records what dialers sent.
type proxy struct {
	ln   net.Listener
	mu   sync.Mutex
	sent [][]byte // per connection, what the dialer sent
	wg   sync.WaitGroup
}

func startProxy(t *testing.T, target func() string, edit func(at int64, b []byte) bool) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			i := len(p.sent)
			p.sent = append(p.sent, nil)
			p.mu.Unlock()
			p.wg.Go(func() {
				defer c.Close()
				s, err := net.Dial("tcp", target())
				if err != nil {
					return
				}
				defer s.Close()
				go func() { io.Copy(c, s); c.Close() }()
				buf := make([]byte, 32<<10)
				var at int64
				for {
					n, err := c.Read(buf)
					if n > 0 {
						p.mu.Lock()
						p.sent[i] = append(p.sent[i], buf[:n]...)
						p.mu.Unlock()
						if edit != nil && !edit(at, buf[:n]) {
							return
						}
						if _, werr := s.Write(buf[:n]); werr != nil {
							return
						}
						at += int64(n)
					}
					if err != nil {
						if tc, ok := s.(*net.TCPConn); ok {
							tc.CloseWrite()
						}
						io.Copy(io.Discard, s)
						return
					}
				}
			})
		}
	})
	return p
}

// TestReplayedHandshakeIsRefused: the bytes a member sent to open a TLS
// link, recorded on the path and sent again, open nothing — even with the
// token they carry put back as if never used. The same replay on the clear
// TCP plane opens the link, which is why that plane is no plane for the
// internet.
func TestReplayedHandshakeIsRefused(t *testing.T) {
	for _, plane := range []DataPlane{PlaneTLS, PlaneTCP} {
		t.Run(plane.String(), func(t *testing.T) {
			r := newTLSRing(t, plane)
			addr, tok, st := r.token(t, ChannelRing)
			p := startProxy(t, func() string { return addr }, nil)
			// The member opens the link, through the recorder.
			var w io.WriteCloser
			if plane == PlaneTLS {
				sc, err := dialSecureHello(r.ctx, r.predID(t), r.s.Hosts[r.succ].ID(), p.ln.Addr().String(), r.hello(tok, ChannelRing))
				if err != nil {
					t.Fatal(err)
				}
				w = sc
			} else {
				c, err := net.Dial("tcp", p.ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				c.Write(append(tok[:], 0, 1)) // connection 0 of 1
				w = c
			}
			st.Close()
			if got, _ := r.arrives(ChannelRing, 10*time.Second); !got {
				t.Fatal("the member's own link did not arrive")
			}
			w.Write([]byte("gradients"))
			w.Close()
			var recorded []byte
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				p.mu.Lock()
				recorded = bytes.Clone(p.sent[0])
				p.mu.Unlock()
				if bytes.Contains(recorded, []byte("gradients")) == (plane == PlaneTCP) && len(recorded) > tokenSize || time.Now().After(deadline) {
					break
				}
			}
			if plane == PlaneTLS && bytes.Contains(recorded, []byte("gradients")) {
				t.Fatal("the TLS link carried a frame in the clear")
			}
			// Its token back, as if it were still to come.
			l := r.links[r.succ]
			pend := &pendingLink{key: linkKey{gen: r.f[r.succ].Generation, from: r.s.Hosts[r.pred].ID(), ch: ChannelRing}, rank: 0, conn: make(chan io.ReadCloser, 1)}
			l.mu.Lock()
			l.tokens[tok] = pend
			l.mu.Unlock()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write(recorded)
			select {
			case in := <-pend.conn:
				in.Close()
				if plane == PlaneTLS {
					t.Fatal("a replayed handshake opened a TLS link")
				}
			case <-time.After(3 * time.Second):
				if plane == PlaneTCP {
					t.Fatal("the replay on the clear plane opened nothing: this test cannot tell the planes apart")
				}
			}
		})
	}
}

// TestManInTheMiddleLearnsNothing: a man in the middle with its own libp2p
// key, where the predecessor dials its successor's TLS address, fails the
// handshake (it cannot prove the successor's identity) and reads no byte of
// the link; the predecessor falls back to the libp2p stream, which the man
// in the middle is not on, and the ring still forms.
func TestManInTheMiddleLearnsNothing(t *testing.T) {
	r := newTLSRing(t, PlaneTLS)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var plain bytes.Buffer
	var handshakeErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		conf, _ := linkTLSConfig(r.outsiderKey, "")
		tc := tls.Server(c, conf)
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		if handshakeErr = tc.Handshake(); handshakeErr == nil {
			io.Copy(&plain, tc)
		}
	})
	r.links[r.pred].redirect = func(string) string { return ln.Addr().String() }
	var w io.WriteCloser
	var derr error
	wg.Go(func() { w, _, derr = r.links[r.pred].Pair(r.ctx, r.f[r.pred], ChannelRing, 1, -1) })
	got, overTLS := r.arrives(ChannelRing, 15*time.Second)
	wg.Wait()
	if derr != nil {
		t.Fatal(derr)
	}
	w.Close()
	if !got || overTLS {
		t.Errorf("after the man in the middle: a link %v, over TLS %v; want one, over the libp2p stream", got, overTLS)
	}
	if plain.Len() > 0 {
		t.Fatalf("the man in the middle read %d bytes of the link", plain.Len())
	}
	if handshakeErr == nil {
		t.Fatal("the predecessor finished a handshake with a man in the middle")
	}
	t.Logf("the man in the middle's handshake: %v", handshakeErr)
}

// TestAlteredLinkFailsTheRing: a record altered or cut short in flight
// fails the ring's allreduce on the TLS plane; no rank ends with a result
// (so no corrupted gradient is applied) — the ring re-forms as after any
// lost link. The same alteration on the clear TCP plane goes through
// unseen, into every rank's result.
func TestAlteredLinkFailsTheRing(t *testing.T) {
	const size = 1 << 20 // floats: frames well past the handshake
	const where = int64(256 << 10)
	flip := func(at int64, b []byte) bool {
		if at <= where && where < at+int64(len(b)) {
			b[where-at] ^= 0x40
		}
		return true
	}
	cut := func(at int64, b []byte) bool { return at < where }
	for _, c := range []struct {
		name  string
		plane DataPlane
		edit  func(int64, []byte) bool
	}{
		{"tls/altered", PlaneTLS, flip},
		{"tls/truncated", PlaneTLS, cut},
		{"tcp/altered", PlaneTCP, flip},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newTLSRing(t, c.plane)
			var target atomic.Value
			p := startProxy(t, func() string { return target.Load().(string) }, c.edit)
			r.links[r.pred].redirect = func(addr string) string { target.Store(addr); return p.ln.Addr().String() }
			ts := make([]ring.Transport, 2)
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for i := range 2 {
				wg.Go(func() { ts[r.f[i].Rank], errs[i] = r.links[i].Connect(r.ctx, r.f[i]) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			out := make([][]float32, 2)
			for rank := range 2 {
				wg.Go(func() {
					rg, err := ring.New(ts[rank], ring.Config{Rank: rank, Size: 2, Generation: r.f[0].Generation})
					if err != nil {
						errs[rank] = err
						return
					}
					defer rg.Close()
					v := make([]float32, size)
					for i := range v {
						v[i] = float32(rank + 1)
					}
					ctx, cancel := context.WithTimeout(r.ctx, 20*time.Second)
					defer cancel()
					if errs[rank] = rg.AllreduceMean(ctx, v); errs[rank] == nil {
						out[rank] = v
					}
				})
			}
			wg.Wait()
			t.Logf("rank 0: %v; rank 1: %v", errs[0], errs[1])
			corrupted := false
			for rank := range 2 {
				for _, x := range out[rank] {
					if x != 1.5 {
						corrupted = true
						break
					}
				}
			}
			if c.plane == PlaneTCP {
				if !corrupted {
					t.Fatal("the altered byte on the clear plane went unseen by the test itself")
				}
				return
			}
			if corrupted {
				t.Fatal("a rank applied a corrupted result")
			}
			if errs[0] == nil && errs[1] == nil {
				t.Fatal("the ring went on after the link was tampered with")
			}
			for _, err := range errs {
				if err != nil && strings.Contains(err.Error(), "deadline") {
					t.Errorf("the ring hung until its deadline instead of failing: %v", err)
				}
			}
		})
	}
}

func FuzzSecureHello(f *testing.F) {
	f.Add(secureHello{gen: 7, rank: 3, ch: ChannelBackward}.encode())
	f.Add(make([]byte, secureHelloSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseSecureHello(b)
		if err != nil {
			return
		}
		if got := m.encode(); !bytes.Equal(got, b) {
			t.Fatalf("parse then encode: %x, want %x", got, b)
		}
		if binary.LittleEndian.Uint32(b) != secureHelloMagic {
			t.Fatal("a hello without the magic was taken")
		}
	})
}

// TestTLSLinkFallsBackWhenTheAddressIsUnreachable: a successor whose TLS
// address cannot be dialled (a firewall, a port no one forwards) still
// gets its link, over the libp2p stream, and says so on both sides.
func TestTLSLinkFallsBackWhenTheAddressIsUnreachable(t *testing.T) {
	r := newTLSRing(t, PlaneTLS)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now: dials are refused
	r.links[r.pred].redirect = func(string) string { return dead }
	var w io.WriteCloser
	var derr error
	var wg sync.WaitGroup
	wg.Go(func() { w, _, derr = r.links[r.pred].Pair(r.ctx, r.f[r.pred], ChannelRing, 1, -1) })
	ctx, cancel := context.WithTimeout(r.ctx, 15*time.Second)
	defer cancel()
	_, in, err := r.links[r.succ].Pair(ctx, r.f[r.succ], ChannelRing, -1, 0)
	wg.Wait()
	if err != nil || derr != nil {
		t.Fatalf("the link: %v, %v; want it over the libp2p stream", err, derr)
	}
	defer in.Close()
	if _, ok := in.(network.Stream); !ok {
		t.Fatalf("the successor got a %T; want the libp2p stream", in)
	}
	if _, ok := w.(network.Stream); !ok {
		t.Fatalf("the predecessor got a %T; want the libp2p stream", w)
	}
	go func() { w.Write([]byte("frame")); w.Close() }()
	got, err := io.ReadAll(in)
	if err != nil || string(got) != "frame" {
		t.Fatalf("over the fallback: %q, %v", got, err)
	}
}

// TestClosingLinksEndsOpenTLSLinks: RingLinks.Close ends the TLS links it
// made that are still open, as the end of the process would: a neighbour
// reading one sees it end.
func TestClosingLinksEndsOpenTLSLinks(t *testing.T) {
	r := newTLSRing(t, PlaneTLS)
	var w io.WriteCloser
	var wg sync.WaitGroup
	wg.Go(func() { w, _, _ = r.links[r.pred].Pair(r.ctx, r.f[r.pred], ChannelRing, 1, -1) })
	_, in, err := r.links[r.succ].Pair(r.ctx, r.f[r.succ], ChannelRing, -1, 0)
	wg.Wait()
	if err != nil || w == nil {
		t.Fatalf("the link: %v", err)
	}
	sc, ok := in.(*secureConn)
	if !ok {
		t.Fatalf("the successor got a %T; want a TLS link", in)
	}
	defer sc.Close()
	r.links[r.pred].Close()
	sc.raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := sc.Read(make([]byte, 1)); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("reading a link whose predecessor's RingLinks closed: %v; want the end of a link cut short", err)
	}
	runtime.KeepAlive(w) // else its socket's finalizer could close it first
}

// TestClosingLinksEndsUnclaimedTLSLinks: a TLS link that arrived and was
// never claimed — a neighbour that solved another ring order dials for a
// link this peer never asks for — is closed by RingLinks.Close, which
// returns. Closing such a link while holding the links' lock once hung
// Close for good: the link's own close takes the lock too.
func TestClosingLinksEndsUnclaimedTLSLinks(t *testing.T) {
	r := newTLSRing(t, PlaneTLS)
	w, _, err := r.links[r.pred].Pair(r.ctx, r.f[r.pred], ChannelProbe, 1, -1)
	if err != nil {
		t.Fatalf("the link: %v", err)
	}
	defer w.Close()
	succ := r.links[r.succ]
	for waiting := 0; waiting == 0; {
		succ.mu.Lock()
		for _, ch := range succ.inbox {
			waiting += len(ch)
		}
		succ.mu.Unlock()
		if r.ctx.Err() != nil {
			t.Fatal("the link never reached the successor's inbox")
		}
		time.Sleep(5 * time.Millisecond)
	}
	done := make(chan struct{})
	go func() { succ.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("RingLinks.Close with an unclaimed TLS link waiting did not return")
	}
}

// TestStrangerCannotHoldTheTLSHandshakeSlots: a stranger with a libp2p
// identity, dialing the TLS plane from eight addresses, cannot keep the
// listener's slots: past its handshake it is closed at once (no token was
// ever given it), and from one address it gets at most maxPendingPerIP
// connections waiting at all.
func TestStrangerCannotHoldTheTLSHandshakeSlots(t *testing.T) {
	hs := startHosts(t, 1, nil)
	links := NewRingLinks(hs[0], expectNone{}, LinksConfig{Plane: PlaneTLS, TCPListen: "127.0.0.1:0", Logger: zerolog.Nop()})
	defer links.Close()
	ln, err := links.tcpListener()
	if err != nil {
		t.Fatal(err)
	}
	priv, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := libp2ptls.NewIdentity(priv)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 * maxPendingTCP {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%8))}}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conf, _ := linkTLSConfig(stranger, hs[0].ID())
		tc := tls.Client(&handshakeConn{Conn: c}, conf)
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if err := tc.Handshake(); err != nil {
			t.Fatalf("connection %d: handshake: %v", i, err)
		}
		if _, err := c.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("connection %d: a stranger past its handshake is still held after 2 s", i)
		}
	}
	// From one address, at most maxPendingPerIP wait for their handshake.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 20)}}
	for i := range maxPendingPerIP + 1 {
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err = c.Read(make([]byte, 1))
		held := errors.Is(err, os.ErrDeadlineExceeded)
		if held != (i < maxPendingPerIP) {
			t.Errorf("connection %d from one address: held %v (%v); want held for the first %d only", i, held, err, maxPendingPerIP)
		}
	}
}

// dialSecureHello is a dialer's one connection of a link: the handshake,
// then hello.
func dialSecureHello(ctx context.Context, id *libp2ptls.Identity, succ peer.ID, addr string, hello secureHello) (*secureConn, error) {
	sc, err := dialSecure(ctx, id, succ, addr)
	if err != nil {
		return nil, err
	}
	return sc, sayHello(sc, succ, hello)
}
