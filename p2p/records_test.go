package p2p

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
)

// wire is one direction of a link held in memory: what a dialer's
// secureConn wrote, for an acceptor's to read.
type wire struct {
	net.Conn // nil: only Read, Write and Close are used
	bytes.Buffer
}

func (w *wire) Read(p []byte) (int, error)  { return w.Buffer.Read(p) }
func (w *wire) Write(p []byte) (int, error) { return w.Buffer.Write(p) }
func (w *wire) Close() error                { return nil }

var suites = []uint16{tls.TLS_AES_128_GCM_SHA256, tls.TLS_AES_256_GCM_SHA384, tls.TLS_CHACHA20_POLY1305_SHA256}

// recordPair is a dialer's sealing end and an acceptor's opening end over
// one wire, keyed alike.
func recordPair(t testing.TB, suite uint16) (*secureConn, *secureConn, *wire) {
	w := &wire{}
	d, err := newRecordConn(w, suite, testExport, true)
	if err != nil {
		t.Fatal(err)
	}
	a, err := newRecordConn(w, suite, testExport, false)
	if err != nil {
		t.Fatal(err)
	}
	return d, a, w
}

// testExport stands in for a TLS exporter: n bytes that depend on the
// context, the same at both ends.
func testExport(context []byte, n int) ([]byte, error) {
	var out []byte
	for i := byte(0); len(out) < n; i++ {
		h := hmac.New(sha256.New, []byte("a handshake's secret"))
		h.Write(append([]byte{i}, context...))
		out = h.Sum(out)
	}
	return out[:n], nil
}

// TestKeysRoll: once a key has sealed its share, both ends roll to the
// next at the same record, so everything written still reads back — and
// an end that kept the first key cannot open what follows: the key did
// change. With every suite, records of every size about the limit.
func TestKeysRoll(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, suite := range suites {
		for _, limit := range []struct{ bytes, records uint64 }{{64 << 10, 1 << 24}, {1 << 34, 5}, {1, 1 << 24}} {
			d, a, w := recordPair(t, suite)
			d.keyBytes, d.keyRecords = limit.bytes, limit.records
			a.keyBytes, a.keyRecords = limit.bytes, limit.records
			_, stale, _ := recordPair(t, suite) // the first key for ever
			var want []byte
			for range 40 {
				p := make([]byte, rng.IntN(40<<10))
				for i := range p {
					p[i] = byte(rng.Uint32())
				}
				want = append(want, p...)
				if _, err := d.Write(p); err != nil {
					t.Fatal(err)
				}
			}
			d.CloseWrite()
			if d.sealed.key == 0 {
				t.Fatalf("%s, %+v: %d bytes in 41 records sealed with one key", tls.CipherSuiteName(suite), limit, len(want))
			}
			stale.raw = &wire{Buffer: *bytes.NewBuffer(bytes.Clone(w.Bytes()))}
			got, err := io.ReadAll(a)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s, %+v: read %d of %d bytes, %v", tls.CipherSuiteName(suite), limit, len(got), len(want), err)
			}
			if a.opened.key != d.sealed.key {
				t.Errorf("%s, %+v: the reader ended on key %d, the writer on %d", tls.CipherSuiteName(suite), limit, a.opened.key, d.sealed.key)
			}
			if _, err := io.ReadAll(stale); !errors.Is(err, ErrLinkTampered) {
				t.Errorf("%s, %+v: an end that never rolled read on: %v", tls.CipherSuiteName(suite), limit, err)
			}
		}
	}
}

// TestRecordsCarryWhatWasWritten: with every TLS 1.3 suite, what is
// written — whole, in buffers, in parts larger than a record — is what is
// read, with reads of any size, and the stream's end is io.EOF.
func TestRecordsCarryWhatWasWritten(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, suite := range suites {
		t.Run(tls.CipherSuiteName(suite), func(t *testing.T) {
			d, a, _ := recordPair(t, suite)
			var want []byte
			for _, n := range []int{1, 40, maxRecord, maxRecord + 3, 3*maxRecord - 1, 0, 7} {
				p := make([]byte, n)
				for i := range p {
					p[i] = byte(rng.Uint32())
				}
				want = append(want, p...)
				if n%2 == 1 {
					b := net.Buffers{p[:n/2], p[n/2:]}
					if _, err := d.WriteBuffers(&b); err != nil {
						t.Fatal(err)
					}
				} else if _, err := d.Write(p); err != nil {
					t.Fatal(err)
				}
			}
			if err := d.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			var got []byte
			for {
				buf := make([]byte, 1+rng.IntN(2*maxRecord))
				n, err := a.Read(buf)
				got = append(got, buf[:n]...)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("read %d bytes, not the %d written", len(got), len(want))
			}
		})
	}
}

// TestRecordsRefuseWhatThePathDid: a record altered anywhere (header,
// ciphertext, tag), records dropped, replayed or swapped, or a stream cut
// short — even at a record's edge — never reads as data: each fails with
// ErrLinkTampered, or io.ErrUnexpectedEOF for a stream that ends without
// its last record.
func TestRecordsRefuseWhatThePathDid(t *testing.T) {
	d, _, w := recordPair(t, tls.TLS_AES_128_GCM_SHA256)
	var recs [][]byte // three records of 100 bytes, then the last one
	for i := range 3 {
		d.Write(bytes.Repeat([]byte{byte(i)}, 100))
		recs = append(recs, bytes.Clone(w.Next(w.Len())))
	}
	d.CloseWrite()
	recs = append(recs, bytes.Clone(w.Next(w.Len())))
	join := func(rs ...[]byte) []byte { return bytes.Join(rs, nil) }
	altered := func(at int, bit byte) []byte {
		b := join(recs...)
		b[at] ^= bit
		return b
	}
	cases := []struct {
		name   string
		stream []byte
		want   error
	}{
		{"a header's length", altered(3, 1), nil}, // any error: the length no longer frames the record
		{"a header's last-record bit", altered(0, 0x80), ErrLinkTampered},
		{"the ciphertext", altered(50, 1), ErrLinkTampered},
		{"the tag", altered(len(recs[0])-1, 1), ErrLinkTampered},
		{"a record dropped", join(recs[0], recs[2], recs[3]), ErrLinkTampered},
		{"a record replayed", join(recs[0], recs[0], recs[1]), ErrLinkTampered},
		{"two records swapped", join(recs[1], recs[0], recs[2], recs[3]), ErrLinkTampered},
		{"the last record dropped", join(recs[0], recs[1], recs[2]), io.ErrUnexpectedEOF},
		{"cut inside a record", join(recs...)[:150], io.ErrUnexpectedEOF},
		{"cut inside a header", join(recs...)[:len(recs[0])+2], io.ErrUnexpectedEOF},
		{"nothing at all", nil, io.ErrUnexpectedEOF},
	}
	for _, c := range cases {
		_, a, w := recordPair(t, tls.TLS_AES_128_GCM_SHA256)
		w.Write(c.stream)
		got, err := io.ReadAll(a)
		if err == nil {
			t.Errorf("%s: read %d bytes and a clean end", c.name, len(got))
			continue
		}
		if c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: %v; want %v", c.name, err, c.want)
		}
		for i := range got {
			if got[i] != byte(i/100) {
				t.Fatalf("%s: byte %d read as %d, which was never written there", c.name, i, got[i])
			}
		}
	}
}

// TestRecordLengthIsBoundedBeforeReading: a header that claims more than
// the reader accepts fails before anything is allocated for it — the
// acceptor takes no record larger than a hello before the hello proves
// the link.
func TestRecordLengthIsBoundedBeforeReading(t *testing.T) {
	d, a, _ := recordPair(t, tls.TLS_AES_128_GCM_SHA256)
	a.limit = secureHelloSize
	d.Write(make([]byte, secureHelloSize+1))
	if _, err := a.Read(make([]byte, 4096)); err == nil || a.rbuf != nil {
		t.Fatalf("a record past the limit: %v, %d bytes taken for it; want an error and none", err, cap(a.rbuf))
	}
}

func TestRecordKeysAreChecked(t *testing.T) {
	if _, _, err := recordAEADs(tls.TLS_AES_128_GCM_SHA256, make([]byte, 16)); err == nil {
		t.Error("16 bytes of keys for two AES-128 keys were taken")
	}
	if _, _, err := recordAEADs(tls.TLS_RSA_WITH_AES_128_CBC_SHA, make([]byte, 64)); err == nil {
		t.Error("a TLS 1.2 suite was taken")
	}
}

// FuzzLinkRecords: whatever bytes arrive on a link, reading them returns
// an error or plaintext that was sealed with the link's key — never a
// panic, and never more than the limit at once.
func FuzzLinkRecords(f *testing.F) {
	d, _, w := recordPair(f, tls.TLS_AES_128_GCM_SHA256)
	d.Write([]byte("a ring frame"))
	d.CloseWrite()
	f.Add(bytes.Clone(w.Bytes()))
	f.Add([]byte{0x80, 0, 0, 0})
	f.Add([]byte{0x7f, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, a, w := recordPair(t, tls.TLS_AES_128_GCM_SHA256)
		w.Write(b)
		got, err := io.ReadAll(a)
		if err == nil && len(got) > 0 && !bytes.Equal(got, []byte("a ring frame")) {
			t.Fatalf("read %q from bytes no one sealed", got)
		}
	})
}

// TestKeysRollOverTLS: two ends of a real TLS 1.3 handshake roll their
// keys from the TLS exporter at the same record.
func TestKeysRollOverTLS(t *testing.T) {
	ends := make([]*libp2ptls.Identity, 2)
	ids := make([]peer.ID, 2)
	for i := range ends {
		priv, _, err := crypto.GenerateEd25519Key(nil)
		if err != nil {
			t.Fatal(err)
		}
		if ends[i], err = libp2ptls.NewIdentity(priv); err != nil {
			t.Fatal(err)
		}
		ids[i], _ = peer.IDFromPrivateKey(priv)
	}
	cc, sc := net.Pipe()
	defer cc.Close()
	defer sc.Close()
	conns := make([]*secureConn, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, raw := range []net.Conn{cc, sc} {
		wg.Go(func() {
			conf, _ := linkTLSConfig(ends[i], ids[1-i])
			tc := tls.Client(&handshakeConn{Conn: raw}, conf)
			if i == 1 {
				conf, _ = linkTLSConfig(ends[i], "")
				tc = tls.Server(&handshakeConn{Conn: raw}, conf)
			}
			if errs[i] = tc.Handshake(); errs[i] == nil {
				conns[i], errs[i] = newSecureConn(raw, tc.ConnectionState(), i == 0)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		c.keyBytes = 100 << 10
	}
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	go func() {
		for off := 0; off < len(want); off += 30 << 10 {
			conns[0].Write(want[off:min(off+30<<10, len(want))])
		}
		conns[0].CloseWrite()
	}()
	got, err := io.ReadAll(conns[1])
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d of %d bytes: %v", len(got), len(want), err)
	}
	if conns[1].opened.key < 9 || conns[1].opened.key != conns[0].sealed.key {
		t.Errorf("1 MiB at 100 KiB a key: the reader ended on key %d, the writer on %d", conns[1].opened.key, conns[0].sealed.key)
	}
}
