package p2p

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Statement is one peer's proposal for the first ring, signed by that peer,
// so that any peer of the job can pass it on: a hello carries the sender's
// own statement and the newest ones it holds of members the receiver lacks.
// With statements passed on, a ring forms over a star — every peer talking
// to its bootstrap peer only — where it needed every pair of peers
// connected (32 peers: 496 connections, most of the formation's time).
//
// The signature is over an HMAC under the job key (see statementDigest), so
// a valid one shows both who made the statement and that its maker holds
// the job: a member passing statements on can drop or delay them but not
// forge or alter one.
type Statement struct {
	From   string `json:"from"`
	Seq    uint64 `json:"seq"`
	Gen    uint64 `json:"gen"`
	Ring   int    `json:"ring"` // index into Hello.Rings; -1 while proposing none
	Ready  bool   `json:"ready,omitempty"`
	Formed bool   `json:"formed,omitempty"`
	Sig    []byte `json:"sig"`
}

// maxSigBytes bounds a statement's signature: RSA-4096 is 512 bytes.
const maxSigBytes = 1024

// ErrBadStatement means a passed-on statement does not check out: its
// signature, its maker's key or its ring reference is wrong.
var ErrBadStatement = errors.New("p2p: bad statement")

// signed is a statement this node holds: decoded, checked, and with its
// signature kept to pass it on.
type signed struct {
	seq  uint64
	prop Proposal
	sig  []byte
}

// statementDigest is what a statement's maker signs: an HMAC under the job
// key of every field, peer IDs length-prefixed so no two rings share bytes.
func statementDigest(key []byte, from peer.ID, seq uint64, m Proposal) []byte {
	h := hmac.New(sha256.New, key)
	var b []byte
	b = append(b, "ringtrain statement\x00"...)
	b = binary.AppendUvarint(b, uint64(len(from)))
	b = append(b, from...)
	b = binary.LittleEndian.AppendUint64(b, seq)
	b = binary.LittleEndian.AppendUint64(b, m.Gen)
	b = append(b, boolByte(m.Ready), boolByte(m.Formed))
	b = binary.AppendUvarint(b, uint64(len(m.Members)))
	for _, p := range m.Members {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	h.Write(b)
	return h.Sum(nil)
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// sign makes this peer's statement of m.
func sign(priv crypto.PrivKey, key []byte, self peer.ID, seq uint64, m Proposal) (*signed, error) {
	sig, err := priv.Sign(statementDigest(key, self, seq, m))
	if err != nil {
		return nil, fmt.Errorf("p2p: signing a statement: %w", err)
	}
	return &signed{seq: seq, prop: Proposal{Gen: m.Gen, Members: slices.Clone(m.Members), Ready: m.Ready, Formed: m.Formed}, sig: sig}, nil
}

// verify checks that s is from's statement of its proposal under the job
// key. pub is from's public key when the peer ID does not embed it (RSA),
// else nil.
func (s *signed) verify(key []byte, from peer.ID, pub crypto.PubKey) error {
	if len(s.sig) == 0 || len(s.sig) > maxSigBytes {
		return fmt.Errorf("%w: a %d-byte signature", ErrBadStatement, len(s.sig))
	}
	if pub == nil {
		k, err := from.ExtractPublicKey()
		if err != nil {
			return fmt.Errorf("%w: no public key for %s: %v", ErrBadStatement, from, err)
		}
		pub = k
	}
	ok, err := pub.Verify(statementDigest(key, from, s.seq, s.prop), s.sig)
	if err != nil || !ok {
		return fmt.Errorf("%w: the signature is not %s's over this statement under the job key", ErrBadStatement, from)
	}
	return nil
}

// putStatements writes the statements into h, each ring once in h.Rings.
func (h *Hello) putStatements(from []peer.ID, ss []*signed, names *idNames) {
	index := map[string]int{}
	for i, s := range ss {
		st := Statement{From: names.name(from[i]), Seq: s.seq, Gen: s.prop.Gen, Ring: -1, Ready: s.prop.Ready, Formed: s.prop.Formed, Sig: s.sig}
		if len(s.prop.Members) > 0 {
			k := ringKey(s.prop.Members)
			r, ok := index[k]
			if !ok {
				r = len(h.Rings)
				index[k] = r
				ring := make([]string, len(s.prop.Members))
				for j, p := range s.prop.Members {
					ring[j] = names.name(p)
				}
				h.Rings = append(h.Rings, ring)
			}
			st.Ring = r
		}
		h.Statements = append(h.Statements, st)
	}
}

func ringKey(ps []peer.ID) string {
	var b strings.Builder
	for _, p := range ps {
		b.WriteString(string(p))
		b.WriteByte(0)
	}
	return b.String()
}

// statement decodes h.Statements[i]: its maker and what it says, not yet
// verified. A malformed one is an error naming what is wrong.
func (h *Hello) statement(i int, names *idNames) (peer.ID, *signed, error) {
	st := h.Statements[i]
	from, err := names.decode(st.From)
	if err != nil {
		return "", nil, fmt.Errorf("%w: statement %d is from %q: %v", ErrBadStatement, i, st.From, err)
	}
	s := &signed{seq: st.Seq, prop: Proposal{Gen: st.Gen, Ready: st.Ready, Formed: st.Formed}, sig: st.Sig}
	switch {
	case st.Ring == -1:
	case st.Ring < 0 || st.Ring >= len(h.Rings):
		return "", nil, fmt.Errorf("%w: statement %d of %s names ring %d of %d", ErrBadStatement, i, from, st.Ring, len(h.Rings))
	default:
		for _, name := range h.Rings[st.Ring] {
			p, err := names.decode(name)
			if err != nil {
				return "", nil, fmt.Errorf("%w: ring %d holds %q: %v", ErrBadStatement, st.Ring, name, err)
			}
			s.prop.Members = append(s.prop.Members, p)
		}
	}
	return from, s, nil
}
