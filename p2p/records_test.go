package p2p

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"testing"
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
	keys := make([]byte, 2*keyLen(suite))
	for i := range keys {
		keys[i] = byte(i)
	}
	w := &wire{}
	d, err := newRecordConn(w, suite, keys, true)
	if err != nil {
		t.Fatal(err)
	}
	a, err := newRecordConn(w, suite, keys, false)
	if err != nil {
		t.Fatal(err)
	}
	return d, a, w
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
