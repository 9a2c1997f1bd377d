package main

import (
	"os"
	"path/filepath"
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
		`, "sync": {"every": 5}`, `, "sync": {"every": 5, "outer": {"lr": 0.7, "momentum": 1}}`} {
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
	} {
		if got := hash(tc.extra); (got == plain) != tc.same {
			t.Errorf("config hash with %s: same as without = %v; want %v", tc.extra, got == plain, tc.same)
		}
	}
}
