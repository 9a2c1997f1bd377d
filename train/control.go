package train

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// Control messages — adoption claims, parameter hashes, the optimizer's
// shape, peer lists, answers to leave requests — are typed values with one codec: JSON, carried in a
// collective as float32s that each hold two bytes (a whole number below
// 2^16, which float32 holds exactly), after the length. Every reader
// checks what arrives the same way — the length against a bound, every
// piece a whole 16-bit value, the JSON strict, then the message's own
// check — before it is used.
//
// A message from every rank travels in a table with one row per rank,
// shared with an AllreduceSum: each rank fills only its own row and the
// others hold zeros, so every rank ends with every row, exactly. A row of
// zeros is a rank with nothing to say.
//
// Only the step's trailer is not a message: its flags, leave requests and
// norms ride in the gradients' own allreduce, so that a step costs one
// round; a leave request set there is then confirmed with messages
// (confirmLeaves).

// msgWidth is how many float32s a message of at most maxBytes takes.
func msgWidth(maxBytes int) int { return 1 + (maxBytes+1)/2 }

// putMsg writes v's encoding into row (msgWidth(maxBytes) long).
func putMsg(row []float32, v any, maxBytes int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > maxBytes {
		return fmt.Errorf("train: a %d-byte control message (%T), at most %d", len(b), v, maxBytes)
	}
	clear(row)
	packBytes(row, b)
	return nil
}

// packBytes writes b's length, then b two bytes to a float32, into row.
func packBytes(row []float32, b []byte) {
	row[0] = float32(len(b))
	for i := 0; i < len(b) && 1+i/2 < len(row); i += 2 {
		p := int(b[i])
		if i+1 < len(b) {
			p |= int(b[i+1]) << 8
		}
		row[1+i/2] = float32(p)
	}
}

// errMalformed is what getMsg says of a row that no honest rank writes.
var errMalformed = errors.New("malformed")

// getMsg reads what putMsg wrote into v, which the message's check then
// vets; a row of zeros is no message (ok false). Anything else that is
// not exactly what putMsg writes is an error wrapping errMalformed.
func getMsg(row []float32, v any, maxBytes int) (ok bool, err error) {
	n := row[0]
	l := int(n)
	switch {
	case n == 0:
		for _, p := range row[1:] {
			if p != 0 {
				return false, fmt.Errorf("%w: an empty message with a payload", errMalformed)
			}
		}
		return false, nil
	case float32(l) != n || l < 0 || l > maxBytes || len(row) < msgWidth(l):
		return false, fmt.Errorf("%w: a message of %v bytes, at most %d", errMalformed, n, maxBytes)
	}
	b := make([]byte, l)
	for i := range (l + 1) / 2 {
		p := row[1+i]
		if p < 0 || p > 0xffff || p != float32(math.Trunc(float64(p))) || 2*i+1 == l && p > 0xff {
			return false, fmt.Errorf("%w: %v in a message's bytes", errMalformed, p)
		}
		b[2*i] = byte(int(p))
		if 2*i+1 < l {
			b[2*i+1] = byte(int(p) >> 8)
		}
	}
	for _, p := range row[1+(l+1)/2:] {
		if p != 0 {
			return false, fmt.Errorf("%w: %v after a message's bytes", errMalformed, p)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return false, fmt.Errorf("%w: %w", errMalformed, err)
	}
	if dec.More() {
		return false, fmt.Errorf("%w: data after the message", errMalformed)
	}
	// Only putMsg's own form: JSON that decodes alike may encode longer
	// (a key in another case, an & that Marshal escapes to six bytes), and
	// a message taken in must go out again within its bound.
	if re, err := json.Marshal(v); err != nil || !bytes.Equal(re, b) {
		return false, fmt.Errorf("%w: not the form the message is written in", errMalformed)
	}
	return true, nil
}

// gatherMsgs gives every rank every rank's message (mine, or nil for none):
// out[k] is rank k's, nil where it sent none; bad names the ranks whose
// rows are malformed — the same on every rank, which all read the same
// rows.
func gatherMsgs[T any](ctx context.Context, c Collective, mine *T, maxBytes int) (out []*T, bad []int, err error) {
	w := msgWidth(maxBytes)
	buf := make([]float32, c.Size()*w)
	if mine != nil {
		if err := putMsg(buf[c.Rank()*w:(c.Rank()+1)*w], mine, maxBytes); err != nil {
			return nil, nil, err
		}
	}
	if err := c.AllreduceSum(ctx, buf); err != nil {
		return nil, nil, err
	}
	out = make([]*T, c.Size())
	for k := range out {
		v := new(T)
		ok, err := getMsg(buf[k*w:(k+1)*w], v, maxBytes)
		switch {
		case err != nil:
			bad = append(bad, k)
		case ok:
			out[k] = v
		}
	}
	return out, bad, nil
}

// broadcastMsg sends root's message to every rank; what arrives is
// checked as every message is.
func broadcastMsg[T any](ctx context.Context, c Collective, root int, msg *T, maxBytes int) (*T, error) {
	buf := make([]float32, msgWidth(maxBytes))
	if c.Rank() == root {
		if err := putMsg(buf, msg, maxBytes); err != nil {
			return nil, err
		}
	}
	if err := c.Broadcast(ctx, buf, root); err != nil {
		return nil, fmt.Errorf("%w: broadcasting from rank %d: %w", ErrCollective, root, err)
	}
	v := new(T)
	ok, err := getMsg(buf, v, maxBytes)
	if err == nil && !ok {
		err = fmt.Errorf("%w: an empty message", errMalformed)
	}
	if err != nil {
		return nil, &LiarError{Ranks: []int{root}, Why: fmt.Sprintf("it broadcast a control message that does not decode: %v", err)}
	}
	return v, nil
}

// paramHash is a parameter hash as messages carry it: the first 128 bits,
// in hex.
func paramHash(h [32]byte) string { return hex.EncodeToString(h[:16]) }

// validHash reports whether s is a hash as paramHash writes it.
func validHash(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == 16
}

// Step trailer: after the gradients in the step's AllreduceMean come the
// non-finite flag, the newcomer flag, then one leave slot per rank, then —
// with the gradient norm guard — one norm slot per rank. A mean of flags
// is the share of ranks that set them; a norm slot's mean times the size
// is that rank's norm.
const (
	flagNonFinite = iota
	flagNewcomer
	stepFlags
)

func stepTrailer(size int, norms bool) int {
	if norms {
		return stepFlags + 2*size
	}
	return stepFlags + size
}

// stepSays is what one rank's trailer says.
type stepSays struct {
	nonFinite bool    // its gradients hold a NaN or an Inf
	leave     bool    // it asks to leave after this step
	newcomer  bool    // a newcomer waits to be admitted after this step
	norm      float32 // its gradient norm, if the trailer has norm slots
}

// put writes this rank's trailer, clearing the other ranks' slots.
func (s stepSays) put(tail []float32, rank, size int) {
	clear(tail)
	if s.nonFinite {
		tail[flagNonFinite] = 1
	}
	if s.newcomer {
		tail[flagNewcomer] = 1
	}
	if s.leave {
		tail[stepFlags+rank] = 1
	}
	if len(tail) == stepTrailer(size, true) {
		tail[stepFlags+size+rank] = s.norm
	}
}

// normsOf reads the ranks' declared gradient norms from an averaged
// trailer with norm slots.
func normsOf(tail []float32, size int) []float64 {
	out := make([]float64, size)
	for k, v := range tail[stepFlags+size : stepFlags+2*size] {
		out[k] = float64(v) * float64(size)
	}
	return out
}

// stepFlagsOf reads an averaged trailer: how many ranks had non-finite
// gradients, whether any rank saw a newcomer waiting, and which asked to
// leave.
func stepFlagsOf(tail []float32, size int) (nonFinite int, newcomer bool, leaving []int) {
	nonFinite = int(math.Round(float64(tail[flagNonFinite]) * float64(size)))
	for k, v := range tail[stepFlags : stepFlags+size] {
		if v != 0 {
			leaving = append(leaving, k)
		}
	}
	return nonFinite, tail[flagNewcomer] != 0, leaving
}

// peerList is a list of peer IDs sent from one rank (rank 0's choice of
// newcomers to admit).
type peerList struct {
	Peers []string `json:"peers"`
}

// BroadcastStrings sends root's list of strings — at most maxN, each at
// most maxLen bytes — to every rank, so that all act on the same list (rank
// 0's choice of standbys to admit, say). What arrives is checked against
// the same bounds before it is used.
func BroadcastStrings(ctx context.Context, c Collective, root int, ss []string, maxN, maxLen int) ([]string, error) {
	if c.Rank() == root {
		if len(ss) > maxN {
			return nil, fmt.Errorf("train: %d strings to send, at most %d", len(ss), maxN)
		}
		for _, s := range ss {
			if len(s) > maxLen {
				return nil, fmt.Errorf("train: a %d-byte string to send, at most %d", len(s), maxLen)
			}
		}
	}
	// JSON writes a peer ID's characters as they are; quotes, commas and
	// brackets are the rest (an ID that needs escapes is refused below).
	got, err := broadcastMsg(ctx, c, root, &peerList{Peers: ss}, 16+maxN*(maxLen+3))
	if err != nil {
		return nil, err
	}
	if len(got.Peers) > maxN {
		return nil, fmt.Errorf("train: rank %d sends %d strings, at most %d expected", root, len(got.Peers), maxN)
	}
	for _, s := range got.Peers {
		if len(s) > maxLen {
			return nil, fmt.Errorf("train: rank %d sends a string of %d bytes, at most %d", root, len(s), maxLen)
		}
	}
	return got.Peers, nil
}

// broadcastTensors sends ts from root, one tensor at a time, into the
// same-shaped ts of the others.
func (r *Replica) broadcastTensors(ctx context.Context, ts [][]float32, root int) error {
	for _, t := range ts {
		if err := r.Coll.Broadcast(ctx, t, root); err != nil {
			return err
		}
	}
	return nil
}
