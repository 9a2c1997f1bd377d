// Package p2p is how ringtrain peers find each other with no coordinator:
// a libp2p host with a persistent identity (TLS preferred over Noise, yamux,
// optional private swarm and allowlist), a Kademlia DHT in server mode under
// the /ringtrain protocol prefix, rendezvous on a key derived from the job
// name (used only where no member of the job is at hand), a hello protocol
// on which peers that prove the same job agree on one rank-ordered ring,
// passing on each other's signed Statements so that a star of connections
// suffices (the decisions are Agreement's, a state machine with no I/O),
// re-formation and admission on the same Agreement, and the ring's
// Transport, accepted only from the members a Gate expects: by default
// direct TLS links, each bound to both peers' libp2p identities and to the
// job, generation and place in the ring, carrying large AEAD records keyed
// from the TLS handshake and rolled before a key has sealed 2^34 bytes,
// over several striped connections where the round trip is long
// (falling back to libp2p streams where no direct
// connection can be had); or libp2p streams; or token-gated TCP in the
// clear. DataServer and DataClient serve and fetch
// datasets (data.Manifest) over DataProtocol, announced in the DHT; a
// joined peer hands its job config to peers that name the job
// (ServeJobConfig, FetchJobConfig). Peers behind NAT are reached through go-libp2p's
// AutoNAT, circuit relay v2 (a job's verified peers under RelayResources,
// strangers under libp2p's own limits, StrangerRelayResources), AutoRelay and DCUtR hole punching — a peer whose every
// address is private takes itself for private at once, and a relayed ring
// link asks for a direct connection again (Host.DirectConnect,
// PunchProtocol) until it has one, for the next generation; ring links log
// whether they are direct or relayed, and the clear TCP plane refuses links
// that cross a NAT (ErrPlaneBehindNAT). A link belongs to a Channel of its
// generation, so one formation holds the ring of all members, a pipeline
// stage's ring (RingLinks.ConnectRing), the links between stages
// (RingLinks.Pair) and a newcomer's links straight from each donor of its
// state (Membership.DirectLinks) at once. Membership wraps a Node and its RingLinks as the
// train/elastic.Membership (and StageNet) the elastic runner drives; at
// each formation its members measure the links between them (probes of
// bounded bytes and time over the data plane, round trips from the
// kernel's measure of each probe's connection or else by libp2p ping,
// pairs measured before in the job skipped), sign what they measured,
// pass the rows round the ring by ID both ways, and rank themselves in
// the order ring.Order solves from them (Membership.Order; OrderID keeps
// the ranks by peer ID).
// Every handler set on a Host passes through its Guard, which enforces
// Limits per peer and protocol — and every DHT message, per peer and
// address — and cuts off peers that break them; the DHT's provider records
// are held in a bounded store. A claim that the job's ring formed without
// this peer counts only when every member it names makes it, and a
// standby whose claimed ring never shows itself forms again
// (ErrClaimGone).
//
// # Usage
//
//	h, err := p2p.NewHost(ctx, p2p.HostConfig{Identity: key, Bootstrap: boots})
//	defer h.Close()
//	node, err := p2p.NewNode(h, p2p.Job{Name: "fmnist", ConfigHash: hash, WorldSize: 4}, p2p.NodeConfig{Logger: log})
//	defer node.Close()
//	f, err := node.Join(ctxWithJoinTimeout) // ErrJoinTimeout, ErrRefused, ErrStandby
//	links := p2p.NewRingLinks(h.Host, node, p2p.LinksConfig{Plane: p2p.PlaneTLS, Logger: log}) // or p2p.PlaneTCP on trusted networks
//	defer links.Close()
//	t, err := links.Connect(ctx, f)
//	r, err := ring.New(t, ring.Config{Rank: f.Rank, Size: len(f.Members), Generation: f.Generation})
//
//	srv := p2p.NewDataServer(h, p2p.DataServerConfig{Logger: log}) // serving
//	err = srv.Serve(manifest, train, test)
//	c, err := p2p.OpenServedData(ctx, h, id, p2p.DataClientConfig{}) // fetching: c is a data.Fetcher
package p2p
