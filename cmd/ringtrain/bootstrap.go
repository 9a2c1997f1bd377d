package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/ringtrain/ringtrain/p2p"
)

// natFlags are the NAT traversal flags join and bootstrap share.
type natFlags struct {
	relay        bool
	reachability string
}

// addNATFlags adds them with reachability's default: auto for a training
// peer, public for a bootstrap peer — whose address everyone is given to
// dial, and whose AutoNAT could not tell anyway where every other peer is
// behind NAT (libp2p's AutoNAT service answers only from public peers).
func addNATFlags(fs *flag.FlagSet, reachability string) *natFlags {
	var f natFlags
	fs.BoolVar(&f.relay, "relay", true, "relay for peers behind NAT while this peer is publicly reachable (circuit relay v2: a job's verified peers without a per-circuit time or byte limit, strangers within libp2p's)")
	fs.StringVar(&f.reachability, "reachability", reachability, "auto (private at once if every address of this machine is private and a bootstrap peer's is public, else AutoNAT finds out), public (this peer is reachable: relay at once), or private (behind NAT: reserve a relay at once)")
	return &f
}

// apply sets cfg's NAT fields from the flags.
func (f *natFlags) apply(cfg *p2p.HostConfig) error {
	r, ok := map[string]network.Reachability{"auto": network.ReachabilityUnknown, "public": network.ReachabilityPublic,
		"private": network.ReachabilityPrivate}[f.reachability]
	if !ok {
		return fmt.Errorf("--reachability %q; want auto, public or private: %w", f.reachability, errUsage)
	}
	cfg.Relay, cfg.Reachability = f.relay, r
	return nil
}

// runBootstrap is `ringtrain bootstrap`: a peer that trains nothing. It
// holds the DHT others meet in, answers AutoNAT's dial-back requests and,
// when reachable, relays for peers behind NAT — what hivemind's DHT-only
// peers and libp2p's public relays do — until it is stopped.
func runBootstrap(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runHostOnly(ctx, "bootstrap", args, stdout, stderr)
}

// runHostOnly is a peer that trains nothing: bootstrap, or serve, which
// also serves a dataset (--data).
func runHostOnly(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var listen, boot stringList
	fs.Var(&listen, "listen", "multiaddr to listen on (repeatable; default /ip4/0.0.0.0/tcp/0)")
	fs.Var(&boot, "bootstrap", "multiaddr of another bootstrap peer, /ip4/…/tcp/…/p2p/<id> (repeatable)")
	identity := fs.String("identity", "", "identity key file, created on first use, so that the address stays the same across restarts")
	swarmKey := fs.String("swarm-key", "", "private swarm key file: only its holders can connect, and so be relayed")
	nat := addNATFlags(fs, "public")
	unlimited := fs.Bool("relay-unlimited", false, "relay whole ring links (no time or byte limit per circuit) for every peer that can connect; without it, strangers get libp2p's limits (2 minutes or 128 KiB a circuit), enough to meet and hole-punch. Use it with --swarm-key, or where only the job's peers reach this one")
	lf := addLogFlags(fs)
	var dataConfig *string
	if name == "serve" {
		dataConfig = fs.String("data", "", "data config (JSON: transforms, dataset_path) of the dataset to serve")
	}
	if err := parseFlags(fs, args); err != nil {
		return fmt.Errorf("%s: %w: %w", name, errUsage, err)
	}
	if dataConfig != nil && *dataConfig == "" {
		return fmt.Errorf("serve: --data is required: %w", errUsage)
	}
	log, closeLog, err := lf.open(stderr, nil, false)
	if err != nil {
		return err
	}
	defer closeLog()
	cfg, err := hostConfig(listen, boot, *identity, *swarmKey, nat, log)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	cfg.RelayUnlimited = *unlimited
	h, err := p2p.NewHost(ctx, cfg)
	if err != nil {
		return err
	}
	defer h.Close()
	printAddrs(stdout, h)
	if dataConfig != nil {
		s, err := startServing(h, *dataConfig, p2p.DataServerConfig{}, stdout, log)
		if err != nil {
			return err
		}
		defer s.close()
	}
	// Who comes and goes, for --log-level debug: a relay's reservations
	// last as long as the reserving peer's connection.
	h.Network().Notify(&network.NotifyBundle{
		ConnectedF: func(_ network.Network, c network.Conn) {
			log.Debug().Stringer("peer", c.RemotePeer()).Stringer("addr", c.RemoteMultiaddr()).Msg("connected")
		},
		DisconnectedF: func(_ network.Network, c network.Conn) {
			log.Debug().Stringer("peer", c.RemotePeer()).Stringer("addr", c.RemoteMultiaddr()).Msg("disconnected")
		},
	})
	log.Info().Bool("relay", cfg.Relay).Bool("relay_unlimited", cfg.RelayUnlimited).Str("reachability", nat.reachability).Msg(name + " peer up; stop it with Ctrl-C")
	<-ctx.Done()
	return nil
}
