package p2p

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	drouting "github.com/libp2p/go-libp2p/p2p/discovery/routing"
	"github.com/rs/zerolog"
)

// JobConfigProtocol hands a job's config to a peer that names the job:
//
//	request: key [32]byte, SHA-256 of "ringtrain job config", the job's name and config hash
//	answer:  status u8 (0: here it is, 1: not this job) | length u32 | the config's bytes
//
// Only a peer that knows name@hash can ask, and what it is told it checks
// against the hash, so no peer can hand out another job.
const JobConfigProtocol protocol.ID = "/ringtrain/jobconfig/1.0.0"

// MaxJobConfigBytes bounds a job config on the wire.
const MaxJobConfigBytes = 1 << 20

func jobConfigKey(name, hash string) [32]byte {
	return sha256.Sum256(fmt.Appendf(nil, "ringtrain job config\x00%s\x00%s", name, hash))
}

// ServeJobConfig answers JobConfigProtocol requests for the job name@hash
// with config until the returned func is called. The peers that ask find
// this one through their bootstrap peers or the job's rendezvous key (a
// Node advertises it).
func ServeJobConfig(h *Host, name, hash string, config []byte, log zerolog.Logger) (stop func()) {
	key := jobConfigKey(name, hash)
	h.SetStreamHandler(JobConfigProtocol, func(st network.Stream) {
		defer st.Close()
		st.SetDeadline(time.Now().Add(10 * time.Second))
		var got [32]byte
		if _, err := io.ReadFull(st, got[:]); err != nil {
			st.Reset()
			return
		}
		if !hmac.Equal(got[:], key[:]) {
			st.Write([]byte{1})
			return
		}
		log.Info().Stringer("peer", st.Conn().RemotePeer()).Msg("handed out the job config")
		b := binary.LittleEndian.AppendUint32([]byte{0}, uint32(len(config)))
		st.Write(append(b, config...))
	})
	return func() { h.RemoveStreamHandler(JobConfigProtocol) }
}

// FetchJobConfig asks the connected peers, then the peers that advertise
// the job in the DHT, for the config of name@hash, until one hands out
// bytes that check accepts (check recomputes the hash); a peer whose bytes
// it refuses is named in the error, should no other answer. It fails with
// ErrNoJobConfig when ctx ends first.
func FetchJobConfig(ctx context.Context, h *Host, name, hash string, check func([]byte) error, log zerolog.Logger) ([]byte, error) {
	key := jobConfigKey(name, hash)
	asked := map[peer.ID]bool{}
	var why []error
	rd := drouting.NewRoutingDiscovery(h.DHT)
	for {
		var cands []peer.ID
		for _, p := range h.Network().Peers() {
			if ok, _ := h.Peerstore().SupportsProtocols(p, JobConfigProtocol); len(ok) > 0 && !asked[p] {
				cands = append(cands, p)
			}
		}
		if len(cands) == 0 {
			fctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			if ch, err := rd.FindPeers(fctx, "ringtrain/job/"+name); err == nil {
				for ai := range ch {
					if ai.ID != h.ID() && !asked[ai.ID] && len(ai.Addrs) > 0 {
						h.Peerstore().AddAddrs(ai.ID, ai.Addrs, time.Minute)
						cands = append(cands, ai.ID)
					}
				}
			}
			cancel()
		}
		for _, p := range cands {
			asked[p] = true
			b, err := askJobConfig(ctx, h, p, key)
			if err == nil {
				if err = check(b); err == nil {
					return b, nil
				}
				log.Warn().Stringer("peer", p).Err(err).Msg("a peer handed out a job config that does not match the hash asked for")
			}
			if !errors.Is(err, errNotThisJob) {
				why = append(why, fmt.Errorf("%s: %w", p, err))
			}
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return nil, errors.Join(append([]error{fmt.Errorf("%w %s@%s: asked %d peers", ErrNoJobConfig, name, hash, len(asked))}, why[:min(len(why), 8)]...)...)
		}
		if len(cands) == 0 {
			clear(asked) // a peer asked while it was starting may know now
		}
	}
}

var errNotThisJob = errors.New("not a peer of that job")

func askJobConfig(ctx context.Context, h *Host, p peer.ID, key [32]byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := h.NewStream(network.WithAllowLimitedConn(ctx, "ringtrain job config"), p, JobConfigProtocol)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	setDeadline(ctx, st)
	if _, err := st.Write(key[:]); err != nil {
		st.Reset()
		return nil, err
	}
	br := bufio.NewReader(st)
	s, err := br.ReadByte()
	switch {
	case err != nil:
		return nil, err
	case s == 1:
		return nil, errNotThisJob
	case s != 0:
		return nil, fmt.Errorf("job config status %d", s)
	}
	var n [4]byte
	if _, err := io.ReadFull(br, n[:]); err != nil {
		return nil, err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size > MaxJobConfigBytes {
		st.Reset()
		return nil, fmt.Errorf("a job config of %d bytes; at most %d", size, MaxJobConfigBytes)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(br, b); err != nil {
		st.Reset()
		return nil, err
	}
	return b, nil
}
