package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/cli"
	"github.com/ringtrain/ringtrain/internal/ringbench"
	"github.com/ringtrain/ringtrain/p2p"
)

// peerAddr is the first line a `bench allreduce-peer` prints: where the
// others reach it.
type peerAddr struct {
	Addr string `json:"addr"`
}

// allreducePeers is `bench allreduce --procs` over a data plane: every
// rank its own process (`ringtrain bench allreduce-peer`) with its own
// libp2p host, the ring formed and linked as `join` does it, the first
// rank the others' bootstrap peer. Rows are named transport-procs, or
// transport-netns. With netns, rank i runs in the network
// namespace netns+i at subnet.(i+1) (testdata/bench-planes.sh makes them);
// otherwise all run on 127.0.0.1.
func allreducePeers(ctx context.Context, cfg ringbench.Config, sizes, transport string, plane p2p.DataPlane, order p2p.RingOrder, netns, subnet string, emit func(ringbench.Result)) error {
	n := cfg.Peers
	if n < 2 {
		return fmt.Errorf("%d peers; want at least 2: %w", n, cli.ErrUsage)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	keys, err := netnsKeys(netns, n)
	if err != nil {
		return err
	}
	if keys != nil {
		defer os.RemoveAll(filepath.Dir(keys[0]))
	}
	var salt [8]byte
	rand.Read(salt[:])
	job := "bench-peers-" + hex.EncodeToString(salt[:])
	listen := func(i int) string { return "127.0.0.1" }
	if netns != "" {
		listen = func(i int) string { return fmt.Sprintf("%s.%d", subnet, i+1) }
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make([][]ringbench.RankResult, n) // by process, by size
	errs := make([]error, n)
	first := make(chan string, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range n {
		args := peerArgs(job, plane, cfg, sizes, listen(i), order)
		if keys != nil {
			args = append(args, "--identity", keys[i])
		}
		if i > 0 {
			select {
			case a := <-first:
				first <- a
				args = append(args, "--bootstrap", a)
			case <-ctx.Done():
				return errors.Join(append(errs, ctx.Err())...)
			}
		}
		cmd, out, stderr, err := startPeer(ctx, exe, netns, i, args)
		if err != nil {
			return err
		}
		wg.Go(func() {
			defer func() {
				if err := cmd.Wait(); err != nil && errs[i] == nil {
					errs[i] = fmt.Errorf("peer %d: %w: %s", i, err, strings.TrimSpace(stderr.String()))
				}
				if errs[i] != nil {
					cancel() // the others would wait for this one for ever
				}
			}()
			dec := json.NewDecoder(bufio.NewReader(out))
			var a peerAddr
			if err := dec.Decode(&a); err != nil {
				errs[i] = fmt.Errorf("peer %d's address: %w", i, err)
				return
			}
			if i == 0 {
				first <- a.Addr
			}
			var err error
			if results[i], err = readRankResults(dec); err != nil {
				errs[i] = fmt.Errorf("peer %d's output: %w", i, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return emitRows(loopName(rowName(transport, netns, order), cfg.Loop), results, len(cfg.Sizes), emit)
}

// peerArgs are the arguments of one `bench allreduce-peer` of the ring.
func peerArgs(job string, plane p2p.DataPlane, cfg ringbench.Config, sizes, listen string, order p2p.RingOrder) []string {
	return []string{"bench", "allreduce-peer", "--job", job, "--plane", plane.String(), "--peers", strconv.Itoa(cfg.Peers),
		"--listen", listen, "--sizes", sizes, "--iters", strconv.Itoa(cfg.Iters), "--chunk", strconv.Itoa(cfg.ChunkBytes), "--ring-order", order.String(),
		"--loop=" + strconv.FormatBool(cfg.Loop)}
}

// rowName is a row's transport: transport-procs, or transport-netns
// between namespaces, with -measured where the ring was ordered so.
func rowName(transport, netns string, order p2p.RingOrder) string {
	name := transport + "-procs"
	if netns != "" {
		name = transport + "-netns"
	}
	if order == p2p.OrderMeasured {
		name += "-measured"
	}
	return name
}

// loopName marks the rows of --loop.
func loopName(name string, loop bool) string {
	if loop {
		return name + "-loop"
	}
	return name
}

// netnsKeys makes, where the peers run in namespaces, their keys in a
// folder of their own (keysByID); nil elsewhere.
func netnsKeys(netns string, n int) ([]string, error) {
	if netns == "" {
		return nil, nil
	}
	dir, err := os.MkdirTemp("", "bench-peers-")
	if err != nil {
		return nil, err
	}
	keys, err := keysByID(dir, n)
	if err != nil {
		os.RemoveAll(dir)
	}
	return keys, err
}

// keysByID makes n peer keys in dir and returns their files in the order
// of their peer IDs: the peer in network namespace i is i-th by ID, so a
// script that builds sites from namespaces knows how IDs place them.
func keysByID(dir string, n int) ([]string, error) {
	type key struct {
		file string
		id   peer.ID
	}
	ks := make([]key, n)
	for i := range ks {
		ks[i].file = filepath.Join(dir, fmt.Sprintf("peer-%d.key", i))
		priv, err := p2p.LoadOrCreateIdentity(ks[i].file)
		if err != nil {
			return nil, err
		}
		if ks[i].id, err = peer.IDFromPrivateKey(priv); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(ks, func(a, b key) int { return strings.Compare(string(a.id), string(b.id)) })
	files := make([]string, n)
	for i, k := range ks {
		files[i] = k.file
	}
	return files, nil
}

// peerHost is an allreduce-peer's host: listening on ip, with the key in
// identity ("" for a fresh one) and bootstrap ("" for none) to meet.
func peerHost(ip net.IP, identity, bootstrap string) (p2p.HostConfig, error) {
	hc := p2p.HostConfig{Listen: []string{fmt.Sprintf("/ip4/%s/tcp/0", ip)}}
	var err error
	if identity != "" {
		if hc.Identity, err = p2p.LoadOrCreateIdentity(identity); err != nil {
			return hc, fmt.Errorf("bench allreduce-peer: %w", err)
		}
	}
	if bootstrap != "" {
		a, err := ma.NewMultiaddr(bootstrap)
		if err != nil {
			return hc, fmt.Errorf("bench allreduce-peer: --bootstrap: %w: %w", err, cli.ErrUsage)
		}
		info, err := peer.AddrInfoFromP2pAddr(a)
		if err != nil {
			return hc, fmt.Errorf("bench allreduce-peer: --bootstrap: %w: %w", err, cli.ErrUsage)
		}
		hc.Bootstrap = []peer.AddrInfo{*info}
	}
	return hc, nil
}

// startPeer starts peer i (peerCommand), its output to read and its
// standard error kept.
func startPeer(ctx context.Context, exe, netns string, i int, args []string) (*exec.Cmd, io.ReadCloser, *bytes.Buffer, error) {
	cmd := peerCommand(ctx, exe, netns, i, args)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, err
	}
	return cmd, out, &stderr, nil
}

// peerCommand runs this binary with args as peer i: in network namespace
// netns+i where netns is set, else here.
func peerCommand(ctx context.Context, exe, netns string, i int, args []string) *exec.Cmd {
	if netns != "" {
		return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", fmt.Sprintf("%s%d", netns, i), exe}, args...)...)
	}
	return exec.CommandContext(ctx, exe, args...)
}

// AllreducePeer is `ringtrain bench allreduce-peer`, one peer that
// allreducePeers started: it prints its address, forms the ring of --peers
// with the others of --job over --plane and prints a JSON line per size.
func AllreducePeer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench allreduce-peer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	job := fs.String("job", "", "the job name the peers form a ring of")
	planeName := fs.String("plane", "tls", "the data plane: tls, libp2p or tcp")
	peers := fs.Int("peers", 0, "ranks in the ring")
	listen := fs.String("listen", "127.0.0.1", "the IP address to listen on")
	bootstrap := fs.String("bootstrap", "", "the first peer's multiaddr")
	sizes := fs.String("sizes", "", "comma-separated buffer sizes")
	iters := fs.Int("iters", 5, "timed calls per size")
	chunk := fs.Int("chunk", 0, "pipelining chunk size in bytes (0: the ring's)")
	orderName := fs.String("ring-order", "id", "how the peers rank themselves: id or measured")
	identity := fs.String("identity", "", "the peer's key file (default: a fresh key)")
	loop := fs.Bool("loop", false, "time the calls back to back after one barrier")
	if err := cli.ParseFlags(fs, args); err != nil {
		return fmt.Errorf("bench allreduce-peer: %w: %w", cli.ErrUsage, err)
	}
	plane, err := p2p.ParsePlane(*planeName)
	if err != nil {
		return fmt.Errorf("bench allreduce-peer: %w: %w", err, cli.ErrUsage)
	}
	order, err := p2p.ParseRingOrder(*orderName)
	if err != nil {
		return fmt.Errorf("bench allreduce-peer: %w: %w", err, cli.ErrUsage)
	}
	cfg := ringbench.Config{Peers: *peers, Iters: *iters, ChunkBytes: *chunk, Loop: *loop}
	if cfg.Sizes, err = parseSizes(*sizes); err != nil {
		return fmt.Errorf("bench allreduce-peer: --sizes: %w: %w", err, cli.ErrUsage)
	}
	ip := net.ParseIP(*listen)
	if ip == nil || *job == "" || *peers < 2 {
		return fmt.Errorf("bench allreduce-peer: want --job, --peers ≥ 2 and an IP to --listen on: %w", cli.ErrUsage)
	}
	hc, err := peerHost(ip, *identity, *bootstrap)
	if err != nil {
		return err
	}
	jctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	h, err := p2p.NewHost(jctx, hc)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := json.NewEncoder(stdout).Encode(peerAddr{Addr: fmt.Sprintf("%s/p2p/%s", h.Addrs()[0], h.ID())}); err != nil {
		return err
	}
	node, err := p2p.NewNode(h, p2p.Job{Name: *job, ConfigHash: *job, WorldSize: *peers}, p2p.NodeConfig{})
	if err != nil {
		return err
	}
	defer node.Close()
	links := p2p.NewRingLinks(h.Host, node, p2p.LinksConfig{Plane: plane, TCPListen: net.JoinHostPort(ip.String(), "0"), Logger: zerolog.Nop()})
	defer links.Close()
	f, err := formOrdered(jctx, node, links, order)
	if err != nil {
		return err
	}
	t, err := links.Connect(jctx, f)
	if err != nil {
		return fmt.Errorf("bench allreduce-peer: linking the ring: %w", err)
	}
	enc := json.NewEncoder(stdout)
	var encErr error
	err = ringbench.RunRank(ctx, t, f.Rank, cfg, func(r ringbench.RankResult) {
		if err := enc.Encode(r); err != nil && encErr == nil {
			encErr = err
		}
	})
	return errors.Join(err, encErr)
}

// formOrdered forms the ring as join does and ranks its members as order
// says.
func formOrdered(ctx context.Context, node *p2p.Node, links *p2p.RingLinks, order p2p.RingOrder) (*p2p.Formation, error) {
	f, err := node.Join(ctx)
	if err != nil {
		return nil, fmt.Errorf("bench allreduce-peer: forming the ring: %w", err)
	}
	m := p2p.NewMembership(node, links, time.Minute)
	m.Order = order
	if f, err = m.Ordered(ctx, f); err != nil {
		return nil, fmt.Errorf("bench allreduce-peer: ordering the ring: %w", err)
	}
	return f, nil
}
