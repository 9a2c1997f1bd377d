package p2p

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
)

// maxKnownPeers bounds the peers RememberPeers writes and KnownPeers
// reads, and maxPeersFile the file: a file grown past them is not a
// peers file of ours.
const (
	maxKnownPeers = 256
	maxPeersFile  = 1 << 20
)

// ErrPeersFile means a file of known peers could not be read as one.
var ErrPeersFile = errors.New("p2p: bad file of known peers")

// RememberPeers writes to path the addresses ps holds for ids (the
// members of a ring just formed, this peer left out by the caller): one
// /…/p2p/<id> multiaddr a line, those of at most maxKnownPeers peers. A
// peer restarted with the same identity reads them back (KnownPeers) and
// can find its job through any of them when every bootstrap peer it was
// given has gone — in a job that churns for hours, the peers first named
// may all have left. The file is written whole or not at all (a
// temporary file renamed over it), readable by its owner alone.
func RememberPeers(path string, ps peerstore.Peerstore, ids []peer.ID) error {
	var b bytes.Buffer
	for _, id := range ids[:min(len(ids), maxKnownPeers)] {
		addrs, err := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: id, Addrs: ps.Addrs(id)})
		if err != nil {
			return fmt.Errorf("p2p: remembering %s: %w", id, err)
		}
		for _, a := range addrs {
			fmt.Fprintln(&b, a)
		}
	}
	if b.Len() > maxPeersFile {
		b.Truncate(bytes.LastIndexByte(b.Bytes()[:maxPeersFile], '\n') + 1)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("p2p: remembering the job's peers: %w", err)
	}
	_, werr := tmp.Write(b.Bytes())
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("p2p: remembering the job's peers in %s: %w", path, werr)
	}
	return nil
}

// KnownPeers reads the peers RememberPeers wrote to path, each with the
// addresses given for it; none, without error, where there is no file.
// A line that is not a /…/p2p/<id> multiaddr with an address, more than maxKnownPeers peers or
// a file over maxPeersFile bytes is an error wrapping ErrPeersFile that
// says where.
func KnownPeers(path string) ([]peer.AddrInfo, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("p2p: reading known peers: %w", err)
	}
	defer f.Close()
	var out []peer.AddrInfo
	at := map[peer.ID]int{}
	sc := bufio.NewScanner(io.LimitReader(f, maxPeersFile+1))
	read, line := 0, 1
	for ; sc.Scan(); line++ {
		read += len(sc.Bytes()) + 1
		if read > maxPeersFile {
			return nil, fmt.Errorf("%w: %s is over %d bytes", ErrPeersFile, path, maxPeersFile)
		}
		s := strings.TrimSpace(sc.Text())
		if s == "" {
			continue
		}
		ais, err := ParseBootstrap([]string{s})
		if err != nil {
			return nil, fmt.Errorf("%w: %s line %d: %w", ErrPeersFile, path, line, err)
		}
		ai := ais[0]
		if len(ai.Addrs) == 0 {
			return nil, fmt.Errorf("%w: %s line %d: %q names a peer but no address of it", ErrPeersFile, path, line, s)
		}
		k, ok := at[ai.ID]
		if !ok {
			if len(out) == maxKnownPeers {
				return nil, fmt.Errorf("%w: %s names over %d peers", ErrPeersFile, path, maxKnownPeers)
			}
			k, at[ai.ID] = len(out), len(out)
			out = append(out, peer.AddrInfo{ID: ai.ID})
		}
		out[k].Addrs = append(out[k].Addrs, ai.Addrs...)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %s line %d: %w", ErrPeersFile, path, line, err)
	}
	return out, nil
}
