package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	// The hash of a plain config is pinned, so a change to it is seen. It
	// last changed with bucket_mb: gradient buckets change the collectives
	// a step calls, so peers from before them must not agree with these.
	if want := "2184f8561c3c2adfd4a991fcbc126f96e393f18ca0a08741730279d957ad2076"; plain != want {
		t.Errorf("config hash %s; want %s", plain, want)
	}
	for _, bad := range []string{`, "grad_norm_guard": 1`, `, "grad_norm_guard": -3`, `, "compression": "zip"`, `, "bucket_mb": -1`, `, "bucket_mb": "25"`,
		`, "sync": {"every": 0, "outer": {"lr": 0.7}}`, `, "sync": {"every": 5, "outer": {"name": "adam", "lr": 0.7}}`,
		`, "sync": {"every": 5}`, `, "sync": {"every": 5, "outer": {"lr": 0.7, "momentum": 1}}`, `, "request_size": 9000`, `, "request_size": -1`} {
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
		{`, "seed": 2`, false},
		{`, "grad_norm_guard": 10`, false},
		{`, "grad_norm_guard": 0`, true}, // off, the default, written out
		{`, "compression": "bf16"`, false},
		{`, "compression": "none"`, true},
		{`, "compression": "int8"`, false},
		{`, "bucket_mb": 25`, true}, // the default, written out
		{`, "bucket_mb": 0`, false},
		{`, "bucket_mb": 4`, false},
		{`, "sync": {"every": 50, "outer": {"name": "nesterov", "lr": 0.7, "momentum": 0.9}}`, false},
		{`, "join_timeout": "5s", "step_timeout": "9s", "checkpoint_dir": "/tmp/x"`, true},
		{`, "request_size": 64, "cache_dir": "/tmp/c"`, true},
	} {
		if got := hash(tc.extra); (got == plain) != tc.same {
			t.Errorf("config hash with %s: same as without = %v; want %v", tc.extra, got == plain, tc.same)
		}
	}
}

// TestHandedOutConfigHasTheHash: the config a peer hands to those that
// join with --job parses, on a machine with none of its paths, into the
// same hash — for a served dataset, and for local files once --data says
// where they are — and a served dataset's ID stands in the hash for its
// transforms and classes.
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
			orig, err := parseJobConfig([]byte(body), "", "")
			if err != nil {
				t.Fatal(err)
			}
			b, err := orig.handedOut()
			if err != nil {
				t.Fatal(err)
			}
			got, err := parseJobConfig(b, "", c.dataFlag)
			if err != nil {
				t.Fatalf("%v\n%s", err, b)
			}
			if got.hash != orig.hash || got.jobRef() != orig.jobRef() {
				t.Fatalf("handed-out config hashes to %s; want %s\n%s", got.hash, orig.hash, b)
			}
			if strings.Contains(string(b), "somewhere") || strings.Contains(string(b), "9s") || strings.Contains(string(b), dataCfg) {
				t.Fatalf("handed-out config carries a machine's own paths or timeouts:\n%s", b)
			}
		})
	}
	served := func(id string) string {
		c, err := parseJobConfig([]byte(`{"name": "h", "world_size": 3, "epochs": 2, "batch_size": 8, "model": "mlp", "data": {"served": "`+id+`"}}`), "", "")
		if err != nil {
			t.Fatal(err)
		}
		return c.hash
	}
	if served(id) == served(strings.Repeat("cd", 32)) {
		t.Fatal("two served datasets give one config hash")
	}
	for _, bad := range []string{`{"served": "abc"}`, `{"served": "` + id + `", "transforms": []}`, `{"served": "` + strings.ToUpper(id) + `"}`} {
		if _, err := parseJobConfig([]byte(`{"name": "h", "world_size": 3, "epochs": 2, "batch_size": 8, "model": "mlp", "data": `+bad+`}`), "", ""); err == nil {
			t.Errorf("data %s parses; want an error", bad)
		}
	}
}

// FuzzParseJobConfig: a job config comes from other peers with --job, so
// its parser meets a stranger's bytes. Whatever parses hands out a config
// with the same hash.
func FuzzParseJobConfig(f *testing.F) {
	f.Add([]byte(`{"name": "h", "world_size": 3, "epochs": 2, "batch_size": 8, "model": "mlp", "data": {"served": "` + strings.Repeat("ab", 32) + `"}}`))
	f.Add([]byte(`{"name": "h", "world_size": 2, "epochs": 1, "batch_size": 8, "model": {"layers": [{"type": "linear", "out": 10}]}, "data": {"transforms": [{"name": "ToTensor", "args": []}], "dataset_path": {"train": "x"}}, "sync": {"every": 2, "outer": {"lr": 1}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseJobConfig(b, "", "")
		if err != nil {
			return
		}
		out, err := c.handedOut()
		if err != nil {
			t.Fatal(err)
		}
		again, err := parseJobConfig(out, "", "")
		if err != nil {
			t.Fatalf("handed-out config of %q does not parse: %v\n%s", b, err, out)
		}
		if again.hash != c.hash {
			t.Fatalf("handed-out config of %q hashes to %s, not %s\n%s", b, again.hash, c.hash, out)
		}
	})
}
