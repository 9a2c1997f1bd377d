package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/p2p"
)

// withLocalSettings is a handed-out config with settings of the joiner's
// machine added, as a hostile peer would hand it out: where to write a
// checkpoint and a cache, how few samples to fetch, how long to wait.
func withLocalSettings(handedOut []byte, dir string) string {
	return `{"checkpoint_dir":"` + dir + `/planted","checkpoint_every":1,"cache_dir":"` + dir + `/cache","request_size":1,"step_timeout":"1ms","join_timeout":"1ms",` + string(handedOut[1:])
}

// TestJoinJobTakesOnlyTheJob: a peer that knows a job's name@hash hands
// out, to a peer that joins with --job, a config of its own making — one
// that names a local file as data, or the honest job plus settings of the
// joiner's machine (where to write checkpoints and caches, how few samples
// to fetch, how long to wait). The joiner takes none of them: it fetches
// the honest config from the honest peer, reads no file the hostile one
// named, and keeps its own settings.
func TestJoinJobTakesOnlyTheJob(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("SECRET-BYTES"), 0o600); err != nil {
		t.Fatal(err)
	}
	job, err := parseJobFile([]byte(`{"name": "j", "world_size": 2, "epochs": 1, "batch_size": 8, "model": "mlp", "data": {"served": "`+strings.Repeat("ab", 32)+`"}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	good, err := job.handedOut()
	if err != nil {
		t.Fatal(err)
	}
	withLocal := withLocalSettings(good, dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	host := func() *p2p.Host {
		h, err := p2p.NewHost(ctx, p2p.HostConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Logger: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}
	for _, tc := range []struct{ name, hostile string }{
		{"a local file as data", `{"name":"j","world_size":2,"epochs":1,"batch_size":8,"model":"mlp","data":"` + secret + `"}`},
		{"the job plus this machine's settings", withLocal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			joiner := host()
			hostile := host()
			defer p2p.ServeJobConfig(hostile, "j", job.hash, []byte(tc.hostile), zerolog.Nop())()
			connect := func(to *p2p.Host) {
				if err := joiner.Connect(ctx, peer.AddrInfo{ID: to.ID(), Addrs: to.Addrs()}); err != nil {
					t.Fatal(err)
				}
			}
			connect(hostile)
			f := &joinFlags{job: job.jobRef()}
			// With only the hostile peer to ask, nothing is taken.
			if c, _, err := f.fetchJobConfig(ctx, joiner, 2*time.Second, zerolog.Nop()); err == nil {
				t.Fatalf("took the hostile peer's config: %+v", c.localSettings)
			} else if strings.Contains(err.Error(), "SECRET") || !strings.Contains(err.Error(), "does not hash to the job's hash") {
				t.Fatalf("with only the hostile peer: %v; want a refusal for the hash, with nothing of the file", err)
			}
			honest := host()
			defer p2p.ServeJobConfig(honest, "j", job.hash, good, zerolog.Nop())()
			connect(honest)
			c, _, err := f.fetchJobConfig(ctx, joiner, 10*time.Second, zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			if c.hash != job.hash || c.CheckpointDir != "" || c.CacheDir != "" || c.CheckpointEvery != 0 || c.RequestSize != 256 ||
				time.Duration(c.StepTimeout) != time.Minute || time.Duration(c.JoinTimeout) != time.Minute {
				t.Fatalf("fetched %s with settings %+v; want the job's hash and this machine's defaults", c.hash[:16], c.localSettings)
			}
		})
	}
}

// bigManifest is a manifest that announces n samples of h×w×c, encoded
// by hand as a publisher would: the magic, the header, a record a sample.
func bigManifest(n int, h, w, c uint32) []byte {
	hj := fmt.Sprintf(`{"transforms":[{"name":"ToTensor","args":[]}],"classes":["a"],"splits":[{"name":"train","samples":%d}]}`, n)
	b := append([]byte("ringtrain dataset 1\n"), binary.LittleEndian.AppendUint32(nil, uint32(len(hj)))...)
	b = append(b, hj...)
	for range n {
		for _, v := range []uint32{h, w, c, 0} {
			b = binary.LittleEndian.AppendUint32(b, v)
		}
		b = append(b, make([]byte, 32)...)
	}
	return b
}

// TestServedDatasetOverBudgetIsRefused: a dataset publisher's manifest may
// announce samples that add up to more than this machine's memory (1,024
// of 4096×4096×4: 64 GiB), or samples the job's model cannot take. A peer
// whose job names it refuses it, saying why, before it fetches a sample
// or takes memory for them.
func TestServedDatasetOverBudgetIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name, model, want string
		manifest          []byte
	}{
		{"64 GiB of samples", `"mlp"`, "over this machine's budget", bigManifest(1024, 4096, 4096, 4)},
		{"samples the model cannot take", `{"input": [784], "layers": [{"type": "linear", "out": 10}]}`, "the data's samples become 1×32×32", bigManifest(10, 32, 32, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enc := tc.manifest
			id := data.ManifestID(enc)
			publisher, err := p2p.NewHost(ctx, p2p.HostConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Logger: zerolog.Nop()})
			if err != nil {
				t.Fatal(err)
			}
			defer publisher.Close()
			publisher.SetStreamHandler(p2p.DataProtocol, func(st network.Stream) {
				defer st.Close()
				var req [33]byte
				if _, err := io.ReadFull(st, req[:]); err != nil {
					return
				}
				st.Write(append(binary.LittleEndian.AppendUint64([]byte{0}, uint64(len(enc))), enc...))
			})
			h, err := p2p.NewHost(ctx, p2p.HostConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Logger: zerolog.Nop(),
				Bootstrap: []peer.AddrInfo{{ID: publisher.ID(), Addrs: publisher.Addrs()}}})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			cfg, err := parseJobFile([]byte(`{"name": "j", "world_size": 1, "epochs": 1, "batch_size": 8, "model": `+tc.model+`, "data": {"served": "`+id+`"}}`), "")
			if err != nil {
				t.Fatal(err)
			}
			_, _, _, err = loadSplits(ctx, cfg, h, nil, 10*time.Second, zerolog.Nop())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v; want an error saying %q", err, tc.want)
			}
		})
	}
}
