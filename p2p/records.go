package p2p

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"golang.org/x/crypto/chacha20poly1305"
)

// After the TLS 1.3 handshake a ring link leaves crypto/tls: its records
// carry at most 16 KiB, each sealed into a fresh buffer, written with its
// own system call, and read back through two more copies — on a 2-core
// machine that was as slow as yamux over TLS. The link's records are
// instead sealed with the AEAD that TLS negotiated (AES-GCM where both
// CPUs have AES instructions, ChaCha20-Poly1305 where one does not), keyed
// from the TLS exporter (RFC 8446 §7.5), one record per ring frame part of
// up to maxRecord bytes: sealed straight from the caller's buffer into the
// one being sent, opened straight into the caller's.
//
// A record is a 4-byte big-endian header — the plaintext length, its top
// bit set on the last record of a stream — then the sealed plaintext. The
// header is the AEAD's additional data and the nonce is the record's
// sequence number in its direction, so a record altered, dropped,
// reordered or replayed fails to open, and a stream cut short is told from
// one that ended (its last record says so).
//
// A key seals at most keyBytes of plaintext and keyRecords records, then
// both ends roll to the next (RFC 8446 §5.5 puts AES-GCM's margin at
// 2^24.5 full records, 2^38 bytes; keyBytes keeps well inside it). Both
// ends count the same records in the same order, so they roll at the same
// record without a message for it, each new key taken from the TLS
// exporter with the key's number as its context: a key that leaks says
// nothing of the others.

const (
	maxRecord     = 1 << 20 // a ring frame's default chunk
	finalRecord   = 1 << 31
	recordHeader  = 4
	exporterLabel = "EXPORTER-ringtrain-link-keys"
	keyBytes      = 1 << 34
	keyRecords    = 1 << 24
)

// ErrLinkTampered means a record of a ring link failed authentication:
// something on the path altered it, or replayed or reordered records.
var ErrLinkTampered = errors.New("p2p: a ring link's record failed authentication (altered, replayed or reordered on the path)")

// keyLen is the record key length for a TLS 1.3 cipher suite.
func keyLen(suite uint16) int {
	if suite == tls.TLS_AES_128_GCM_SHA256 {
		return 16
	}
	return 32
}

// recordAEADs makes a link's two record AEADs from keys (2 × keyLen bytes
// of exporter output) for the cipher suite TLS negotiated: what the dialer
// seals with, and what the acceptor seals with.
func recordAEADs(suite uint16, keys []byte) (dialer, acceptor cipher.AEAD, err error) {
	n := keyLen(suite)
	if len(keys) != 2*n {
		return nil, nil, fmt.Errorf("p2p: %d bytes of record keys; want %d", len(keys), 2*n)
	}
	mk := func(key []byte) (cipher.AEAD, error) {
		switch suite {
		case tls.TLS_CHACHA20_POLY1305_SHA256:
			return chacha20poly1305.New(key)
		case tls.TLS_AES_128_GCM_SHA256, tls.TLS_AES_256_GCM_SHA384:
			b, err := aes.NewCipher(key)
			if err != nil {
				return nil, err
			}
			return cipher.NewGCM(b)
		}
		return nil, fmt.Errorf("p2p: cipher suite %s is no TLS 1.3 suite", tls.CipherSuiteName(suite))
	}
	if dialer, err = mk(keys[:n]); err == nil {
		acceptor, err = mk(keys[n:])
	}
	return dialer, acceptor, err
}

// secureConn is a ring link after its handshake: sealed records on a TCP
// connection. One goroutine reads and one writes at a time (a ring does);
// Close may come from any, and ends a Read or Write in progress.
type secureConn struct {
	raw    net.Conn
	closed func() // after Close: RingLinks forgets the link

	// export gives the keys of the link's key number k (exportKeys);
	// dialer says which of them this end seals with.
	export func(context []byte, n int) ([]byte, error)
	suite  uint16
	dialer bool
	// keyBytes and keyRecords are how much one key seals before both ends
	// roll to the next (tests make them small).
	keyBytes, keyRecords uint64

	wmu     sync.Mutex
	seal    cipher.AEAD
	sealSeq uint64
	sealed  keyUse
	wbuf    []byte
	werr    error

	open    cipher.AEAD
	openSeq uint64
	opened  keyUse
	limit   int    // the largest record plaintext accepted
	rbuf    []byte // a record as it came
	plain   []byte // an opened record the caller's buffer was too small for
	pend    []byte // what of plain is still to be read
	rerr    error
}

// keyUse is what one direction's current key has sealed or opened.
type keyUse struct {
	key     uint64 // the key's number: 0 first
	bytes   uint64
	records uint64
}

// newSecureConn makes the link's record layer on raw, whose TLS
// handshake (which read no byte past itself) gave cs.
func newSecureConn(raw net.Conn, cs tls.ConnectionState, dialer bool) (*secureConn, error) {
	export := func(context []byte, n int) ([]byte, error) {
		return cs.ExportKeyingMaterial(exporterLabel, context, n)
	}
	return newRecordConn(raw, cs.CipherSuite, export, dialer)
}

// newRecordConn makes the record layer on raw for suite, its keys from
// export.
func newRecordConn(raw net.Conn, suite uint16, export func(context []byte, n int) ([]byte, error), dialer bool) (*secureConn, error) {
	s := &secureConn{raw: raw, export: export, suite: suite, dialer: dialer, keyBytes: keyBytes, keyRecords: keyRecords, limit: maxRecord}
	d, a, err := s.keys(0)
	s.seal, s.open = d, a
	if !dialer {
		s.seal, s.open = a, d
	}
	return s, err
}

// keys are the AEADs of key number k, the dialer's and the acceptor's:
// from the TLS exporter, with no context for the first key and "roll" and
// k for the others.
func (s *secureConn) keys(k uint64) (dialer, acceptor cipher.AEAD, err error) {
	var context []byte
	if k > 0 {
		context = binary.BigEndian.AppendUint64([]byte("roll"), k)
	}
	material, err := s.export(context, 2*keyLen(s.suite))
	if err != nil {
		return nil, nil, fmt.Errorf("p2p: TLS exporter: %w", err)
	}
	return recordAEADs(s.suite, material)
}

// roll counts a record of size bytes on u, first taking the next key if
// the current one has sealed its share: it returns the key to use, aead
// itself if it is still the current one.
func (s *secureConn) roll(u *keyUse, aead cipher.AEAD, size int, sealing bool) (cipher.AEAD, error) {
	if u.records > 0 && (u.bytes+uint64(size) > s.keyBytes || u.records+1 > s.keyRecords) {
		d, a, err := s.keys(u.key + 1)
		if err != nil {
			return nil, err
		}
		next := a // what the acceptor seals with, the dialer opens with
		if s.dialer == sealing {
			next = d
		}
		*u = keyUse{key: u.key + 1}
		aead = next
	}
	u.bytes += uint64(size)
	u.records++
	return aead, nil
}

func nonce(seq uint64) [12]byte {
	var n [12]byte
	binary.BigEndian.PutUint64(n[4:], seq)
	return n
}

// sealTo appends to dst the record of plain, rolling the key first if it
// has sealed its share.
func (s *secureConn) sealTo(dst, plain []byte, final bool) ([]byte, error) {
	var err error
	if s.seal, err = s.roll(&s.sealed, s.seal, len(plain), true); err != nil {
		return dst, err
	}
	var h [recordHeader]byte
	v := uint32(len(plain))
	if final {
		v |= finalRecord
	}
	binary.BigEndian.PutUint32(h[:], v)
	dst = append(dst, h[:]...)
	n := nonce(s.sealSeq)
	s.sealSeq++
	return s.seal.Seal(dst, n[:], plain, h[:]), nil
}

// Write seals p into records and sends them before it returns.
func (s *secureConn) Write(p []byte) (int, error) {
	b := net.Buffers{p}
	n, err := s.WriteBuffers(&b)
	return int(n), err
}

// WriteBuffers seals b's slices into records, sending them in as few
// writes as maxRecord allows: a ring frame's header and payload go
// together.
func (s *secureConn) WriteBuffers(b *net.Buffers) (int64, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.werr != nil {
		return 0, s.werr
	}
	if s.wbuf == nil {
		// Room for a whole ring frame, its header's record and its
		// payload's, so that it goes in one write.
		s.wbuf = make([]byte, 0, maxRecord+4<<10)
	}
	var n int64
	flush := func() error {
		if len(s.wbuf) == 0 {
			return nil
		}
		_, err := s.raw.Write(s.wbuf)
		s.wbuf = s.wbuf[:0]
		return err
	}
	for _, p := range *b {
		for len(p) > 0 {
			m := min(len(p), maxRecord)
			if len(s.wbuf) > 0 && len(s.wbuf)+recordHeader+m+s.seal.Overhead() > cap(s.wbuf) {
				if s.werr = flush(); s.werr != nil {
					return n, s.werr
				}
			}
			if s.wbuf, s.werr = s.sealTo(s.wbuf, p[:m], false); s.werr != nil {
				return n, s.werr
			}
			n += int64(m)
			p = p[m:]
		}
	}
	*b = nil
	s.werr = flush()
	return n, s.werr
}

// CloseWrite sends the stream's last record and half-closes the
// connection, so the other end reads to the end of what was sent.
func (s *secureConn) CloseWrite() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.werr != nil {
		return s.werr
	}
	last, err := s.sealTo(s.wbuf[:0], nil, true)
	if err == nil {
		_, err = s.raw.Write(last)
	}
	s.werr = net.ErrClosed
	if tc, ok := s.raw.(interface{ CloseWrite() error }); ok && err == nil {
		err = tc.CloseWrite()
	}
	return err
}

// Read reads the plaintext of records that opened; the end of a stream
// whose last record never came is io.ErrUnexpectedEOF.
func (s *secureConn) Read(p []byte) (int, error) {
	for {
		if len(s.pend) > 0 {
			n := copy(p, s.pend)
			s.pend = s.pend[n:]
			return n, nil
		}
		if s.rerr != nil {
			return 0, s.rerr
		}
		if len(p) == 0 {
			return 0, nil
		}
		n, err := s.readRecord(p)
		if err != nil {
			s.rerr = err
		}
		if n > 0 || err != nil {
			return n, err
		}
	}
}

// readRecord reads one record, opening it into p if it fits, else into
// s.plain, whose first part it then copies into p.
func (s *secureConn) readRecord(p []byte) (int, error) {
	var h [recordHeader]byte
	if _, err := io.ReadFull(s.raw, h[:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // no last record: cut short
		}
		return 0, err
	}
	v := binary.BigEndian.Uint32(h[:])
	final, size := v&finalRecord != 0, int(v&^finalRecord)
	if size > s.limit {
		return 0, fmt.Errorf("p2p: a ring link's record of %d bytes; at most %d", size, s.limit)
	}
	var err error
	if s.open, err = s.roll(&s.opened, s.open, size, false); err != nil {
		return 0, err
	}
	ct := size + s.open.Overhead()
	if cap(s.rbuf) < ct {
		s.rbuf = make([]byte, ct)
	}
	s.rbuf = s.rbuf[:ct]
	if _, err := io.ReadFull(s.raw, s.rbuf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, err
	}
	dst := p[:0]
	if len(p) < size {
		if cap(s.plain) < size {
			s.plain = make([]byte, 0, size)
		}
		dst = s.plain[:0]
	}
	n := nonce(s.openSeq)
	out, err := s.open.Open(dst, n[:], s.rbuf, h[:])
	if err != nil {
		return 0, ErrLinkTampered
	}
	s.openSeq++
	if final {
		s.rerr = io.EOF
	}
	if len(p) >= size {
		return size, nil
	}
	k := copy(p, out)
	s.pend = out[k:]
	return k, nil
}

// Close closes the link; it also ends a Read or Write in progress.
func (s *secureConn) Close() error {
	err := s.raw.Close()
	if s.closed != nil {
		s.closed()
	}
	return err
}

// handshakeConn gives crypto/tls one TLS record at a time and never a
// byte past it, so that the records that follow the handshake on the same
// connection are left for secureConn.
type handshakeConn struct {
	net.Conn
	hdr  [5]byte
	have int // bytes of hdr read
	left int // bytes of the current record's body still to read
}

func (c *handshakeConn) Read(p []byte) (int, error) {
	if c.left == 0 {
		n, err := c.Conn.Read(p[:min(len(p), len(c.hdr)-c.have)])
		copy(c.hdr[c.have:], p[:n])
		if c.have += n; c.have == len(c.hdr) {
			c.have, c.left = 0, int(binary.BigEndian.Uint16(c.hdr[3:]))
		}
		return n, err
	}
	n, err := c.Conn.Read(p[:min(len(p), c.left)])
	c.left -= n
	return n, err
}
