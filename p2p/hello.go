package p2p

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"
)

// HelloProtocol is the protocol of the agreement exchange.
const HelloProtocol = "/ringtrain/hello/3.0.0"

// ProtocolVersion is what peers must share to form a ring. Version 2
// proves the job instead of naming it; version 3 passes signed statements
// on, so that a ring forms without every pair of peers connected; version
// 4 keeps no subnormal optimizer state (train/vec.Flush), so a version-3
// replica of the same job would apply other bits and be taken for a liar
// at the first hash check — it is refused at the hello instead, by name;
// version 5 sums a conv layer's weight gradient sample by sample
// (train/conv.go), other bits again; version 6 sums its bias gradient in
// vec.Sum's order, and other bits again; version 7 sends a sparse
// outer round's payload lengths in its trailer's allreduce, one
// collective fewer, which a version-6 peer would not follow; version 8
// sends a newcomer its state over direct links from each donor (channel
// 6), where a version-7 peer waits for it round the ring; version 9
// admits only peers whose hellos say they are waiting (Hello.Waiting),
// which a version-8 standby never says.
// The hello's wire form is unchanged, so the two still understand the
// refusal.
const ProtocolVersion = 9

// Bounds on a hello: a peer list of hundreds of members with a few
// addresses each fits in maxHelloBytes with room to spare.
const (
	maxHelloBytes  = 256 << 10
	maxHelloPeers  = 4096
	maxMemberAddrs = 16
)

// ErrBadHello means a peer sent a hello that is malformed or too large.
var ErrBadHello = errors.New("p2p: bad hello")

// Member is a peer a hello vouches for, with where to dial it.
type Member struct {
	ID    string   `json:"id"`
	Addrs []string `json:"addrs,omitempty"`
}

// Hello is what peers exchange to agree on a ring. A request and its
// response are both Hellos. Nothing in it names the job: Proof shows that
// the sender holds the job's name, config hash and world size, bound to the
// sender and the receiver (see proof), so a stranger learns nothing from
// it and cannot pass it on as its own.
type Hello struct {
	Version int    `json:"version"`
	Proof   string `json:"proof,omitempty"`
	// Members are peers of this job the sender has verified and the
	// receiver, as far as the sender knows, has not heard of — sent only to
	// verified peers. Receivers greet the ones they did not know, so a swarm
	// that started in pieces ends as one.
	Members []Member `json:"members,omitempty"`
	// Proposal is the ring the sender proposes: peer IDs in rank order
	// (sorted); empty until it knows enough members.
	Proposal []string `json:"proposal,omitempty"`
	// Ready: the sender has seen every member propose Proposal and will
	// not change it; the ring forms when all members are ready.
	Ready bool `json:"ready,omitempty"`
	// Generation of the proposed ring.
	Generation uint64 `json:"generation"`
	// Formed: the sender's ring has formed and is training; a peer not in
	// its Proposal is late, and waits as a standby.
	Formed bool `json:"formed,omitempty"`
	// Seq numbers the sender's proposals, rising: a receiver drops a
	// proposal older than one it holds, as hellos cross — an answer written
	// before its sender changed its mind can arrive after its next hello.
	Seq uint64 `json:"seq,omitempty"`
	// Incarnation tells the sender's processes apart: it is new each time
	// the peer starts. A peer restarted with the same identity knows
	// nothing of what its last process was told, and the others know
	// nothing of it as a newcomer: a new incarnation makes both news again.
	Incarnation uint64 `json:"inc,omitempty"`
	// Waiting says the sender is joining the job: forming its first ring,
	// or waiting as a standby to be admitted. A member admits only a peer
	// whose latest hello says so: a peer restarted with the same identity
	// is connected — its host up, its node answering — well before it has
	// built its job and joins, and a ring that admitted it then waited its
	// grace for a re-formation it could not yet take part in.
	Waiting bool `json:"waiting,omitempty"`
	// Statements are the sender's own signed proposal and the newest it
	// holds of other members (see Statement) — sent only to verified peers;
	// Rings are the member lists they refer to, each once.
	Statements []Statement `json:"statements,omitempty"`
	Rings      [][]string  `json:"rings,omitempty"`
	// Refused, in a response, says that the responder will not form a ring
	// with the sender — without saying anything of the responder's job.
	Refused string `json:"refused,omitempty"`
}

// writeHello writes h as a 4-byte big-endian length and JSON.
func writeHello(w io.Writer, h *Hello) error {
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	if len(b) > maxHelloBytes {
		return fmt.Errorf("p2p: hello of %d bytes is over the %d-byte limit", len(b), maxHelloBytes)
	}
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := w.Write(append(n[:], b...)); err != nil {
		return err
	}
	return nil
}

// readHello reads one hello, refusing a length over the limit before
// allocating anything.
func readHello(r io.Reader) (*Hello, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, fmt.Errorf("reading hello length: %w", err)
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxHelloBytes {
		return nil, fmt.Errorf("hello of %d bytes, limit %d: %w", size, maxHelloBytes, ErrBadHello)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("reading %d-byte hello: %w", size, err)
	}
	return decodeHello(b)
}

func decodeHello(b []byte) (*Hello, error) {
	var h Hello
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("hello: %v: %w", err, ErrBadHello)
	}
	if len(h.Proposal) > maxHelloPeers || len(h.Members) > maxHelloPeers || len(h.Proof) > 128 || len(h.Refused) > 1024 ||
		len(h.Statements) > maxHelloPeers || len(h.Rings) > maxHelloPeers {
		return nil, fmt.Errorf("hello with %d members, a proposal of %d, a %d-byte proof, a %d-byte refusal, %d statements, %d rings: %w",
			len(h.Members), len(h.Proposal), len(h.Proof), len(h.Refused), len(h.Statements), len(h.Rings), ErrBadHello)
	}
	for i, r := range h.Rings {
		if len(r) > maxHelloPeers {
			return nil, fmt.Errorf("hello ring %d of %d peers, at most %d: %w", i, len(r), maxHelloPeers, ErrBadHello)
		}
	}
	for i, st := range h.Statements {
		if len(st.Sig) > maxSigBytes {
			return nil, fmt.Errorf("hello statement %d with a %d-byte signature, at most %d: %w", i, len(st.Sig), maxSigBytes, ErrBadHello)
		}
	}
	for _, m := range h.Members {
		if len(m.Addrs) > maxMemberAddrs {
			return nil, fmt.Errorf("hello vouches for %s at %d addresses, at most %d: %w", m.ID, len(m.Addrs), maxMemberAddrs, ErrBadHello)
		}
	}
	return &h, nil
}

// proposal decodes a hello's proposal; a malformed peer ID is an error.
func (h *Hello) proposal(names *idNames) (Proposal, error) {
	m := Proposal{Gen: h.Generation, Ready: h.Ready, Formed: h.Formed}
	for _, s := range h.Proposal {
		id, err := names.decode(s)
		if err != nil {
			return Proposal{}, fmt.Errorf("%w: proposal holds %q: %v", ErrBadProposal, s, err)
		}
		m.Members = append(m.Members, id)
	}
	return m, nil
}

// setProposal writes m into the hello.
func (h *Hello) setProposal(m Proposal, names *idNames) {
	h.Generation, h.Ready, h.Formed, h.Proposal = m.Gen, m.Ready, m.Formed, nil
	for _, p := range m.Members {
		h.Proposal = append(h.Proposal, names.name(p))
	}
}

// idNames caches peer IDs' text both ways: base58 took a third of the CPU
// of a 32-peer formation, every hello spelling every member again. At most
// maxNames are kept; past that it starts afresh.
type idNames struct {
	mu  sync.Mutex
	str map[peer.ID]string
	id  map[string]peer.ID
}

const maxNames = 4096

func (c *idNames) name(p peer.ID) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.str[p]; ok {
		return s
	}
	s := p.String()
	c.putLocked(p, s)
	return s
}

func (c *idNames) decode(s string) (peer.ID, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.id[s]; ok {
		return p, nil
	}
	p, err := peer.Decode(s)
	if err != nil {
		return "", err
	}
	c.putLocked(p, s)
	return p, nil
}

func (c *idNames) putLocked(p peer.ID, s string) {
	if c.str == nil || len(c.str) >= maxNames {
		c.str, c.id = map[peer.ID]string{}, map[string]peer.ID{}
	}
	c.str[p], c.id[s] = s, p
}

// jobKey is the secret a hello's proof is made with: every peer of the job
// derives it from the job's name, config hash and world size.
func jobKey(j Job) []byte {
	k := sha256.Sum256(fmt.Appendf(nil, "ringtrain job key\x00%d\x00%s\x00%s\x00%d", ProtocolVersion, j.Name, j.ConfigHash, j.WorldSize))
	return k[:]
}

// proof is what from says to prove to to that it is a peer of the job: an
// HMAC of both peer IDs under the job key. Both IDs are authenticated by
// the connection, so a proof is good only from that sender to that
// receiver: relayed or echoed, it proves nothing.
func proof(key []byte, from, to peer.ID) string {
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "ringtrain hello\x00%s\x00%s", from, to)
	return hex.EncodeToString(m.Sum(nil))
}

// Proof is what a peer of job j says in Hello.Proof to prove the job to
// peer to: an HMAC of both IDs under the job's key, which anyone who knows
// the job's name, config hash and world size can compute — and no one
// else.
func (j Job) Proof(from, to peer.ID) string { return proof(jobKey(j), from, to) }

// EncodeHello is h as it goes on the wire: a 4-byte big-endian length and
// its JSON, at most maxHelloBytes.
func EncodeHello(h *Hello) ([]byte, error) {
	var b bytes.Buffer
	if err := writeHello(&b, h); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// proves reports whether got is from's proof to to.
func proves(key []byte, got string, from, to peer.ID) bool {
	return hmac.Equal([]byte(got), []byte(proof(key, from, to)))
}
