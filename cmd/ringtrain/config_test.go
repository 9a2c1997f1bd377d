package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ringtrain/ringtrain/p2p"
	"github.com/ringtrain/ringtrain/train"
)

// TestConfigHashCoversSharedFields: the fields every peer must share change
// the config hash — min_world_size among them, since peers holding
// different values would decide differently whether a ring that lost a
// peer carries on — and each machine's own (timeouts, checkpoint_dir) do
// not.
func TestConfigHashCoversSharedFields(t *testing.T) {
	dataCfg, err := filepath.Abs("../../testdata/data-config.json")
	if err != nil {
		t.Fatal(err)
	}
	base := `"name": "h", "world_size": 4, "epochs": 1, "batch_size": 8, "model": "mlp", "data": "` + dataCfg + `"`
	hash := func(extra string) string {
		t.Helper()
		p := filepath.Join(t.TempDir(), "job.json")
		if err := os.WriteFile(p, []byte("{"+base+extra+"}"), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := loadJobConfig(p)
		if err != nil {
			t.Fatal(err)
		}
		return c.hash
	}
	plain := hash("")
	// The hash of a plain config is pinned, so a change to it is seen: it
	// is the SHA-256 of the job spec's canonical JSON, so any change to
	// that form makes peers of two versions refuse each other.
	if want := "afcbfc1dea9a7b6874d93e06e61cafac6410ed4b5eaa4ba1851af91afe3a9f94"; plain != want {
		t.Errorf("config hash %s; want %s", plain, want)
	}
	for _, bad := range []string{`, "grad_norm_guard": 1`, `, "grad_norm_guard": -3`, `, "compression": "zip"`, `, "bucket_mb": -1`, `, "bucket_mb": "25"`,
		`, "sync": {"every": 0, "outer": {"lr": 0.7}}`, `, "sync": {"every": 5, "outer": {"name": "adam", "lr": 0.7}}`,
		`, "sync": {"every": 5, "outer": {"momentum": 0.9}}`, `, "sync": {"every": 5, "outer": {"lr": 0.7, "momentum": 1}}`, `, "request_size": 9000`, `, "request_size": -1`,
		`, "sync": {"every": 5, "outer": {"lr": 0.7}, "sparse": {"fraction": 0, "bits": 2}}`, `, "sync": {"every": 5, "outer": {"lr": 0.7}, "sparse": {"fraction": 0.01, "bits": 3}}`,
		`, "sync": {"every": 5, "outer": {"lr": 0.7}, "sparse": {"fraction": 2, "bits": 2}}`, `, "sync": {"every": 5, "outer": {"lr": 0.7}, "sparse": {"top": 0.01}}`,
		`, "compression": "int8", "sync": {"every": 5, "outer": {"lr": 0.7}, "sparse": {"fraction": 0.01, "bits": 2}}`,
		`, "sync": {"every": 5, "fragments": 6}`, `, "sync": {"every": 8, "fragments": 4, "overlap": 2}`, `, "sync": {"every": 8, "overlap": -1}`,
		`, "compression": "bf16", "sync": {"every": 8, "fragments": 4}`,
		`, "sync": {"every": 8, "deadline": "-1s"}`, `, "sync": {"every": 8, "deadline": 50}`, `, "sync": {"every": 8, "deadline": "50ms", "fragments": 4}`,
		`, "compression": "int8", "sync": {"every": 8, "deadline": "50ms"}`, `, "grad_norm_guard": 3, "sync": {"every": 8, "deadline": "50ms"}`,
		`, "max_world_size": 3`, `, "max_world_size": 5000`, `, "world_size": 5000`,
		`, "limits": {"burst": -1}`, `, "limits": {"ban_for": "-1s"}`, `, "limits": {"streams_per_peer": 100000}`, `, "limits": {"strikes": "many"}`, `, "limits": {"flood": 1}`,
		`, "optimizer": {"name": "adamw", "lr": 0}`, `, "optimizer": {"name": "lion", "lr": 1e-3}`, `, "optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9]}`,
		`, "optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 1]}`, `, "optimizer": {"name": "sgd", "lr": 0.1, "betas": [0.9, 0.99]}`,
		`, "optimizer": {"name": "adamw", "lr": 1e-3, "eps": -1}`, `, "optimizer": {"name": "adamw", "lr": 1e-3, "clip_grad_norm": -1}`,
		`, "optimizer": {"name": "adamw", "lr": 1e-3, "warmup_steps": -5}`, `, "optimizer": {"name": "adamw", "lr": 1e-3, "min_lr": 0.1}`,
		`, "limits": {"conns_per_ip": -1}`, `, "limits": {"peer_memory_mb": -1}`, `, "limits": {"data_streams": -1}`, `, "limits": {"data_samples_per_request": 2000000}`, `, "ring_order": "fastest"`,
		`, "sync": {"every": 5, "robust": {}}`, `, "sync": {"every": 5, "sparse": {"fraction": 0.01, "bits": 2}, "robust": {"clip": -1, "iters": 3}}`,
		`, "sync": {"every": 5, "sparse": {"fraction": 0.01, "bits": 2}, "robust": {"clip": 2, "iters": 0}}`,
		`, "sync": {"every": 5, "sparse": {"fraction": 0.01, "bits": 2}, "robust": {"name_after": -1}}`,
		`, "sync": {"every": 5, "sparse": {"fraction": 0.01, "bits": 2}, "robust": {"name_above": -2}}`,
		`, "update_checks": {"dims": -1}`, `, "update_checks": {"dims": 5000}`, `, "update_checks": {"window": -3}`, `, "update_checks": {"name_after": -1}`, `, "update_checks": {"audit_every": -1}`, `, "update_checks": {"suspect_below": 0.5}`,
		`, "update_checks": {}, "sync": {"every": 5}`, `, "non_iid_shards": -1`} {
		p := filepath.Join(t.TempDir(), "job.json")
		if err := os.WriteFile(p, []byte("{"+base+bad+"}"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := loadJobConfig(p); err == nil {
			t.Errorf("a config with %s loads; want an error", bad)
		}
	}
	for _, tc := range []struct {
		extra string
		same  bool
	}{
		{`, "min_world_size": 3`, false},
		{`, "min_world_size": 4`, true}, // the default, written out
		{`, "max_world_size": 6`, false},
		{`, "max_world_size": 4`, true}, // the default, written out
		{`, "seed": 2`, false},
		{`, "grad_norm_guard": 10`, false},
		{`, "grad_norm_guard": 0`, true}, // off, the default, written out
		{`, "compression": "bf16"`, false},
		{`, "compression": "none"`, true},
		{`, "ring_order": "measured"`, true}, // the default, written out
		{`, "ring_order": "id"`, false},
		{`, "compression": "int8"`, false},
		{`, "bucket_mb": 25`, true}, // the default, written out
		{`, "bucket_mb": 0`, false},
		{`, "bucket_mb": 4`, false},
		{`, "sync": {"every": 50, "outer": {"name": "nesterov", "lr": 0.7, "momentum": 0.9}}`, false},
		{`, "join_timeout": "5s", "step_timeout": "9s", "admission_timeout": "3s", "checkpoint_dir": "/tmp/x"`, true},
		{`, "request_size": 64, "cache_dir": "/tmp/c", "checkpoint_every": 5, "gpus": 1`, true},
		{`, "limits": {"requests_per_second": 10, "burst": 20, "streams_per_peer": 4, "strikes": 9, "ban_for": "1h", "max_banned": 10}`, true}, // this machine's own
		{`, "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}`, true},                                                                  // the default, written out
		{`, "nodes": 4, "rank": 2`, true},
	} {
		if got := hash(tc.extra); (got == plain) != tc.same {
			t.Errorf("config hash with %s: same as without = %v; want %v", tc.extra, got == plain, tc.same)
		}
	}
	// Without "outer", the outer step is the plain average: the same job
	// as one that says so, another than DiLoCo's published settings.
	if hash(`, "sync": {"every": 50}`) != hash(`, "sync": {"every": 50, "outer": {"name": "sgd", "lr": 1, "momentum": 0}}`) ||
		hash(`, "sync": {"every": 50}`) == hash(`, "sync": {"every": 50, "outer": {"lr": 0.7, "momentum": 0.9}}`) {
		t.Error("sync without outer: want the plain average's hash, not Nesterov's")
	}
	// Peers that send pseudo-gradients sparse and peers that send them
	// whole cannot share a ring: their outer steps call other collectives.
	dense := `, "sync": {"every": 50, "outer": {"lr": 0.7}}`
	if hash(dense) == hash(dense[:len(dense)-1]+`, "sparse": {"fraction": 0.01, "bits": 2}}`) {
		t.Error("sparse and dense DiLoCo jobs have one config hash")
	}
	// Peers that aggregate robustly and peers that average cannot share a
	// ring either; "robust": {} is its defaults written out.
	sp := dense[:len(dense)-1] + `, "sparse": {"fraction": 0.01, "bits": 2}`
	if hash(sp+`}`) == hash(sp+`, "robust": {}}`) || hash(sp+`, "robust": {}}`) != hash(sp+`, "robust": {"clip": 2, "iters": 3, "name_after": 3, "name_above": 3}}`) {
		t.Error(`"robust": want its own hash, and {} the same as clip 2, 3 iterations, naming after 3 rounds past 3 τ`)
	}
	if hash(sp+`, "robust": {}}`) == hash(sp+`, "robust": {"name_after": 0}}`) {
		t.Error(`"robust": peers that name and peers that never do share a hash`)
	}
	// Sketches ride in every step's trailer: peers with and without them,
	// or with other ones, cannot share a ring; {} is the defaults.
	if hash(`, "update_checks": {}`) == hash(``) || hash(`, "update_checks": {}`) != hash(`, "update_checks": {"dims": 32, "window": 16, "name_after": 3, "name_above": 3, "suspect_below": -0.3}`) ||
		hash(`, "update_checks": {}`) == hash(`, "update_checks": {"dims": 16}`) || hash(`, "update_checks": {}`) == hash(`, "update_checks": {"name_after": 0}`) ||
		hash(`, "update_checks": {}`) == hash(`, "update_checks": {"audit_every": 8}`) || hash(`, "update_checks": {}`) == hash(`, "update_checks": {"suspect_below": -1}`) {
		t.Error(`"update_checks": want its own hash, {} the defaults written out`)
	}
	// Nor can peers that stream the outer sync and peers that do not, or
	// that stream it otherwise; a sync section without them is as before.
	streams := map[string]bool{hash(dense): true}
	for _, s := range []string{`, "fragments": 4}`, `, "fragments": 4, "overlap": 2}`, `, "overlap": 2}`, `, "deadline": "50ms"}`, `, "deadline": "80ms"}`} {
		h := hash(dense[:len(dense)-1] + s)
		if streams[h] {
			t.Errorf("sync with %s: a config hash another sync section has", s)
		}
		streams[h] = true
	}
	if hash(dense) != hash(dense[:len(dense)-1]+`, "fragments": 0, "overlap": 0}`) {
		t.Error("sync with fragments and overlap 0, written out: another hash than without")
	}
}

// handOutAndBack parses a job file's body, hands the job out as `join
// --job` does, and parses that back as a peer with dataFile would.
func handOutAndBack(t *testing.T, body, dataFile string) (orig, got *jobConfig, b []byte) {
	t.Helper()
	orig, err := parseJobFile([]byte(body), "")
	if err != nil {
		t.Fatal(err)
	}
	if b, err = orig.handedOut(); err != nil {
		t.Fatal(err)
	}
	if got, err = parseHandedOut(b, "h", orig.hash, localSettings{}, dataFile); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	return orig, got, b
}

// TestHandedOutDeadline: a sync deadline is written out as it is read, so
// a config fetched with --job parses into the same job.
func TestHandedOutDeadline(t *testing.T) {
	orig, got, b := handOutAndBack(t, `{"name": "h", "world_size": 4, "min_world_size": 3, "epochs": 2, "batch_size": 8, "seed": 4, "model": "mlp",
		"sync": {"every": 50, "outer": {"lr": 1}, "sparse": {"fraction": 0.05, "bits": 4}, "deadline": "40ms"},
		"optimizer": {"name": "adam", "lr": 0.001}, "data": {"served": "`+strings.Repeat("cd", 32)+`"}}`, "")
	if got.hash != orig.hash || time.Duration(got.Sync.Deadline) != 40*time.Millisecond {
		t.Fatalf("handed out and read back: hash %s deadline %v; want %s and 40ms\n%s", got.hash, time.Duration(got.Sync.Deadline), orig.hash, b)
	}
}

// TestHandedOutConfigHasTheHash: the config a peer hands to those that
// join with --job is the job's spec, whose SHA-256 is the job's hash; on a
// machine with none of its paths it parses into the same job — for a
// served dataset, and for local files once --data says where they are —
// and a served dataset's ID stands in the hash for its transforms and
// classes.
func TestHandedOutConfigHasTheHash(t *testing.T) {
	dataCfg := mustAbs(t, "../../testdata/data-config.json")
	id := strings.Repeat("ab", 32)
	for _, c := range []struct{ name, data, dataFlag string }{
		{"served", `{"served": "` + id + `"}`, ""},
		{"local files", `"` + dataCfg + `"`, dataCfg},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := `{"name": "h", "world_size": 3, "epochs": 2, "batch_size": 8, "seed": 4, "model": "cnn", "gpus": 1,
				"optimizer": {"name": "adam", "lr": 0.001, "schedule": "cosine"}, "compression": "bf16", "bucket_mb": 3.3,
				"sync": {"every": 4, "outer": {"lr": 0.7, "momentum": 0.9}}, "grad_norm_guard": 5, "min_world_size": 2,
				"checkpoint_dir": "/somewhere", "join_timeout": "9s", "request_size": 17, "data": ` + c.data + `}`
			orig, got, b := handOutAndBack(t, body, c.dataFlag)
			if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != orig.hash {
				t.Fatalf("the handed-out bytes hash to %x; the job's hash is %s", sum, orig.hash)
			}
			if got.hash != orig.hash || got.jobRef() != orig.jobRef() {
				t.Fatalf("handed-out config hashes to %s; want %s\n%s", got.hash, orig.hash, b)
			}
			for _, local := range []string{"somewhere", "9s", "17", dataCfg, "gpus"} {
				if strings.Contains(string(b), local) {
					t.Fatalf("handed-out config carries this machine's %q:\n%s", local, b)
				}
			}
			if got.GPUs != 0 || got.CheckpointDir != "" || got.RequestSize != 256 || time.Duration(got.JoinTimeout) != time.Minute {
				t.Fatalf("a fetched config's local settings are %+v; want the defaults", got.localSettings)
			}
		})
	}
	served := func(id string) string {
		c, err := parseJobFile([]byte(`{"name": "h", "world_size": 3, "epochs": 2, "batch_size": 8, "model": "mlp", "data": {"served": "`+id+`"}}`), "")
		if err != nil {
			t.Fatal(err)
		}
		return c.hash
	}
	if served(id) == served(strings.Repeat("cd", 32)) {
		t.Fatal("two served datasets give one config hash")
	}
	for _, bad := range []string{`{"served": "abc"}`, `{"served": "` + id + `", "transforms": []}`, `{"served": "` + strings.ToUpper(id) + `"}`} {
		if _, err := parseJobFile([]byte(`{"name": "h", "world_size": 3, "epochs": 2, "batch_size": 8, "model": "mlp", "data": `+bad+`}`), ""); err == nil {
			t.Errorf("data %s parses; want an error", bad)
		}
	}
}

// TestFetchedConfigIsData: what a peer hands out for name@hash is checked
// against the hash before a byte of it is read, and can define a job and
// nothing else. Each row is a config a hostile peer hands out; none is
// taken, none makes this machine open a file or take a setting.
func TestFetchedConfigIsData(t *testing.T) {
	dir := t.TempDir()
	honest, err := parseJobFile([]byte(`{"name": "j", "world_size": 2, "epochs": 1, "batch_size": 8, "model": "mlp", "data": {"served": "`+strings.Repeat("ab", 32)+`"}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	good, err := honest.handedOut()
	if err != nil {
		t.Fatal(err)
	}
	hashOf := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	// A file that must never be read: its bytes would show in an error.
	secret := filepath.Join(dir, "secret")
	os.WriteFile(secret, []byte("SECRET-BYTES"), 0o600)
	withLocal := withLocalSettings(good, dir)
	for _, tc := range []struct {
		name, body string
		hash       string // "" for the honest job's
	}{
		{"a local path for data", `{"name":"j","world_size":2,"epochs":1,"batch_size":8,"model":"mlp","data":"` + secret + `"}`, ""},
		{"a device for data", `{"name":"j","world_size":2,"epochs":1,"batch_size":8,"model":"mlp","data":"/dev/zero"}`, ""},
		{"the honest job plus local settings", withLocal, ""},
		{"the honest job, indented", strings.ReplaceAll(string(good), ",", ", "), ""},
		// A job of the attacker's own, that a victim was pointed at: the
		// bytes hash to what was asked, and are still no instructions.
		{"its own job, naming a local path", `{"name":"j","world_size":2,"epochs":1,"batch_size":8,"model":"mlp","data":"/dev/zero"}`, "self"},
		{"its own job, naming a dataset path", `{"name":"j","world_size":2,"epochs":1,"batch_size":8,"model":"mlp","data":{"dataset_path":{"train":"` + secret + `"}}}`, "self"},
		{"its own job, with a checkpoint_dir", `{"name":"j","world_size":2,"epochs":1,"batch_size":8,"model":"mlp","checkpoint_dir":"` + dir + `/planted","data":{"served":"` + strings.Repeat("ab", 32) + `"}}`, "self"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hash := honest.hash
			if tc.hash == "self" {
				hash = hashOf([]byte(tc.body))
			}
			c, err := parseHandedOut([]byte(tc.body), "j", hash, localSettings{}, "")
			if err == nil {
				t.Fatalf("taken: %+v", c)
			}
			if tc.hash == "" && !errors.Is(err, ErrConfigHash) {
				t.Errorf("%v; want ErrConfigHash", err)
			}
			if strings.Contains(err.Error(), "SECRET") {
				t.Errorf("the error shows a local file's bytes: %v", err)
			}
		})
	}
	for _, p := range []string{"planted", "cache"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err == nil {
			t.Errorf("%s was made at a path a peer chose", p)
		}
	}
	c, err := parseHandedOut(good, "j", honest.hash, localSettings{CheckpointDir: "mine"}, "")
	if err != nil || c.CheckpointDir != "mine" || c.RequestSize != 256 {
		t.Fatalf("the honest config: %v, %+v; want this machine's settings", err, c)
	}
}

// FuzzParseJobConfig: a job config comes from other peers with --job.
// A job file that parses hands out bytes that hash to its hash and parse
// back into the same job; bytes a peer hands out that hash to what was
// asked (an attacker's own job) parse only into a job spec in its
// canonical form, without touching this machine's files.
func FuzzParseJobConfig(f *testing.F) {
	f.Add([]byte(`{"name": "h", "world_size": 3, "epochs": 2, "batch_size": 8, "model": "mlp", "data": {"served": "` + strings.Repeat("ab", 32) + `"}}`))
	f.Add([]byte(`{"name": "h", "world_size": 2, "epochs": 1, "batch_size": 8, "model": {"layers": [{"type": "linear", "out": 10}]}, "data": {"transforms": [{"name": "ToTensor", "args": []}], "dataset_path": {"train": "x"}}, "sync": {"every": 2, "outer": {"lr": 1}}}`))
	f.Add([]byte(`{"name":"h","world_size":2,"min_world_size":2,"epochs":1,"batch_size":8,"seed":0,"model":"mlp","optimizer":{"name":"sgd","lr":0.05,"momentum":0.9,"weight_decay":0,"schedule":"","step_size":0,"gamma":0},"data":{"served":"` + strings.Repeat("ab", 32) + `"},"bucket_bytes":26214400}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		sum := sha256.Sum256(b)
		if c, err := parseHandedOut(b, "h", hex.EncodeToString(sum[:]), localSettings{}, ""); err == nil {
			if out, err := c.handedOut(); err != nil || !bytes.Equal(out, b) {
				t.Fatalf("handed-out config %q is taken but hands out %q (%v)", b, out, err)
			}
		}
		c, err := parseJobFile(b, "")
		if err != nil {
			return
		}
		out, err := c.handedOut()
		if err != nil {
			t.Fatal(err)
		}
		again, err := parseHandedOut(out, c.Name, c.hash, localSettings{}, "")
		if err != nil && c.Data.Served != "" {
			t.Fatalf("handed-out config of %q does not parse: %v\n%s", b, err, out)
		}
		if err == nil && again.hash != c.hash {
			t.Fatalf("handed-out config of %q hashes to %s, not %s\n%s", b, again.hash, c.hash, out)
		}
	})
}

// TestLimitsReachTheHost: "limits" in a job file become the p2p.Limits
// that join hands its host's guard, each field where it belongs.
func TestLimitsReachTheHost(t *testing.T) {
	body := `{"name": "l", "world_size": 2, "epochs": 1, "batch_size": 8, "model": "mlp", "data": "` + mustAbs(t, "../../testdata/data-config.json") + `",
		"limits": {"requests_per_second": 10, "burst": 20, "streams_per_peer": 4, "strikes": 9, "ban_for": "1h", "max_banned": 10,
		"conns_per_ip": 3, "new_conns_per_ip": 5, "peer_streams": 64, "peer_memory_mb": 32, "data_samples_per_request": 100, "data_streams": 7, "data_streams_per_peer": 2, "data_mb_per_second_per_peer": 5}}`
	c, err := parseJobFile([]byte(body), "")
	if err != nil {
		t.Fatal(err)
	}
	want := p2p.Limits{RequestsPerSecond: 10, Burst: 20, StreamsPerPeer: 4, Strikes: 9, BanFor: time.Hour, MaxBanned: 10, ConnsPerIP: 3, ConnBurstPerIP: 5, PeerStreams: 64, PeerMemory: 32 << 20}
	if got := c.Limits.p2p(); got != want {
		t.Errorf("limits %+v; want %+v", got, want)
	}
	if got := c.Limits.dataServer(); got.MaxRequest != 100 || got.MaxStreams != 7 || got.MaxPerPeer != 2 || got.PeerBytesPerSecond != 5<<20 {
		t.Errorf("data server limits %+v; want 100 samples a request, 7 streams, 2 a peer", got)
	}
}

// An AdamW job: the optimizer with the config's betas, eps and decay on
// the weights only, a per-step warm-up and cosine, and clipping.
func TestAdamWConfig(t *testing.T) {
	dataCfg, err := filepath.Abs("../../testdata/data-config.json")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "job.json")
	body := `{"name": "h", "world_size": 2, "epochs": 1, "batch_size": 8, "model": "mlp", "data": "` + dataCfg + `",
		"optimizer": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.99], "eps": 1e-6,
		"schedule": "cosine", "warmup_steps": 10, "total_steps": 100, "min_lr": 1e-4, "clip_grad_norm": 1}}`
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := loadJobConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	w, ok := c.optimizer([]string{"0.linear.weight", "0.linear.bias"}).(*train.AdamW)
	if !ok || w.Beta1 != 0.9 || w.Beta2 != 0.99 || w.Eps != 1e-6 || w.WeightDecay != 0.1 || !slices.Equal(w.Decay, []bool{true, false}) {
		t.Fatalf("optimizer %+v; want AdamW, betas (0.9, 0.99), eps 1e-6, decay on the weight alone", w)
	}
	if s := c.schedule(); !s.PerStep() || math.Abs(float64(s.StepLR(0, 0))-1e-4) > 1e-9 || math.Abs(float64(s.StepLR(100, 0))-1e-4) > 1e-9 {
		t.Errorf("schedule %+v; want a warm-up from 1e-4 and a cosine down to 1e-4 at step 100", s)
	}
	spec, err := train.BuiltinSpec("mlp", 1, 28, 28, 10)
	if err != nil {
		t.Fatal(err)
	}
	m, err := train.NewModel(train.ModelConfig{Spec: spec, Batch: 8, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if rep := c.replica(m, w); rep.ClipNorm != 1 {
		t.Errorf("replica clips at %v; want 1", rep.ClipNorm)
	}
}

// A language model's job: the gpt preset is checked (heads that do not
// divide dim, a context of none or past the bound, a misspelt field), a
// text corpus wants a language model and a language model text.
func TestGPTConfig(t *testing.T) {
	text, err := filepath.Abs("../../testdata/text")
	if err != nil {
		t.Fatal(err)
	}
	images, err := filepath.Abs("../../testdata/data-config.json")
	if err != nil {
		t.Fatal(err)
	}
	load := func(model, dataCfg string) (*jobConfig, error) {
		p := filepath.Join(t.TempDir(), "job.json")
		body := `{"name": "g", "world_size": 1, "epochs": 1, "batch_size": 4, "model": ` + model + `, "data": ` + dataCfg + `}`
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return loadJobConfig(p)
	}
	textData := `{"text": {"folder": "` + text + `"}}`
	for _, bad := range []string{
		`{"gpt": {"layers": 1, "dim": 30, "heads": 4, "context": 16}}`,
		`{"gpt": {"layers": 1, "dim": 32, "heads": 4, "context": 0}}`,
		`{"gpt": {"layers": 1, "dim": 32, "heads": 4, "context": 100000}}`,
		`{"gpt": {"layers": 1, "dim": 32, "heads": 4, "ctx": 16}}`,
	} {
		if _, err := load(bad, textData); err == nil {
			t.Errorf("model %s: taken", bad)
		}
	}
	c, err := load(`{"gpt": {"layers": 1, "dim": 32, "heads": 4, "context": 16}}`, textData)
	if err != nil {
		t.Fatal(err)
	}
	split, err := c.data.Load("train")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.textContext(split); err != nil || split.W != 16 || c.context() != 16 || !c.Data.Text {
		t.Errorf("text for a gpt: %v, windows of %d; want none, 16", err, split.W)
	}
	c, err = load(`{"gpt": {"layers": 1, "dim": 32, "heads": 4, "context": 16}}`, `"`+images+`"`)
	if err != nil {
		t.Fatal(err)
	}
	imageSplit, err := c.data.Load("train")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.textContext(imageSplit); err == nil {
		t.Error("images for a gpt: taken")
	}
	c, err = load(`"mlp"`, textData)
	if err != nil {
		t.Fatal(err)
	}
	if split, err = c.data.Load("train"); err != nil {
		t.Fatal(err)
	}
	if err := c.textContext(split); err == nil {
		t.Error("text for an mlp: taken")
	}
}

// TestLossConfig: a loss other than cross-entropy wants a table's target
// columns and a model with one output a target, and the other way round;
// every mismatch is refused with what to change, and the targets and the
// loss are in the job's hash.
func TestLossConfig(t *testing.T) {
	reg := mustAbs(t, "../../testdata/regression")
	table := `{"dataset_path": {"train": "` + reg + `/train.csv"}, "targets": ["y"]}`
	images := `"` + mustAbs(t, "../../testdata/data-config.json") + `"`
	mlp := func(out int) string {
		return `{"layers": [{"type": "linear", "out": 8}, {"type": "relu"}, {"type": "linear", "out": ` + strconv.Itoa(out) + `}]}`
	}
	load := func(extra, model, dataCfg string) (*jobConfig, error) {
		p := filepath.Join(t.TempDir(), "job.json")
		body := `{"name": "r", "world_size": 1, "epochs": 1, "batch_size": 4, ` + extra + `"model": ` + model + `, "data": ` + dataCfg + `}`
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return loadJobConfig(p)
	}
	for _, tt := range []struct {
		name, extra, model, data, want string
	}{
		{"unknown loss", `"loss": "hinge", `, mlp(1), table, `loss "hinge"; want cross_entropy`},
		{"mse without targets", `"loss": "mse", `, mlp(10), images, "name its target columns"},
		{"targets without a loss", ``, mlp(1), table, `set "loss": "mse"`},
		{"two losses", `"loss": "bce", `, `{"loss": "mse", "layers": [{"type": "linear", "out": 1}]}`, table, "name it once"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := load(tt.extra, tt.model, tt.data); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v; want one saying %q", err, tt.want)
			}
		})
	}
	c, err := load(`"loss": "mse", `, mlp(2), table)
	if err != nil {
		t.Fatal(err)
	}
	split, err := c.data.Load("train")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.modelSpec(split.C, split.H, split.W, outputsOf(split)); err == nil || !strings.Contains(err.Error(), "2 outputs; the data has 1 target") {
		t.Errorf("two outputs for one target: %v", err)
	}
	c, err = load(`"loss": "cross_entropy", `, mlp(10), images)
	if err != nil || c.Loss != "" {
		t.Errorf("cross_entropy by name: %v, loss %q; want the default, written out as none", err, c.Loss)
	}
	mse, err := load(`"loss": "mse", `, mlp(1), table)
	if err != nil {
		t.Fatal(err)
	}
	bce, err := load(`"loss": "bce", `, mlp(1), table)
	if err != nil {
		t.Fatal(err)
	}
	if mse.hash == bce.hash {
		t.Error("jobs of mse and bce share a hash")
	}
}

// Audits are refused where they could not recompute a peer's gradients,
// with why; the same config without them loads.
func TestAuditsRefusedWhereTheyCannotRun(t *testing.T) {
	dataCfg, err := filepath.Abs("../../testdata/data-config.json")
	if err != nil {
		t.Fatal(err)
	}
	dropout := `"model": {"input": [1, 28, 28], "layers": [{"type": "flatten"}, {"type": "dropout", "p": 0.5}, {"type": "linear", "out": 10}]}`
	for _, tc := range []struct{ extra, why string }{
		{`"compression": "int8"`, "int8"},
		{dropout, "dropout"},
		{`"data": {"served": "` + strings.Repeat("ab", 32) + `"}`, "served"},
	} {
		write := func(checks string) string {
			p := filepath.Join(t.TempDir(), "job.json")
			body := `{"name": "a", "world_size": 2, "epochs": 1, "batch_size": 8, "model": "mlp", "data": "` + dataCfg + `", "update_checks": ` + checks + `, ` + tc.extra + `}`
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			return p
		}
		if _, err := loadJobConfig(write(`{"audit_every": 8}`)); err == nil || !strings.Contains(err.Error(), "audit_every 8") || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("audits with %s: %v; want an error naming audit_every and %s", tc.extra, err, tc.why)
		}
		if _, err := loadJobConfig(write(`{}`)); err != nil {
			t.Errorf("update checks without audits, with %s: %v; want it to load", tc.extra, err)
		}
	}
}

// TestTestFigure: the summary line's score is what users of each kind of
// job compare: an image model's accuracy, a regression's loss, a language
// model's validation bits per byte.
func TestTestFigure(t *testing.T) {
	gpt := train.GPTSpec(1, 32, 4, 16)
	for _, tc := range []struct {
		name string
		cfg  jobConfig
		want string
	}{
		{"classifier", jobConfig{}, "test accuracy 0.3825"},
		{"regression", jobConfig{jobSpec: jobSpec{Loss: "mse"}}, "test loss (mse) 2.14722"},
		{"language model", jobConfig{spec: &gpt}, "validation 3.098 bits per byte (next-byte accuracy 0.3825)"},
	} {
		if got := tc.cfg.testFigure(0.3825, 2.1472217); got != tc.want {
			t.Errorf("%s: %q; want %q", tc.name, got, tc.want)
		}
	}
}
