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
	// A config without the newer fields keeps the hash it had before them,
	// so peers of the version before still agree with it.
	if want := "a8bd85d4878acf699c177e5bbbf6ea34fad2a342455b473e625b81865b2c142f"; plain != want {
		t.Errorf("config hash %s; want %s, as before grad_norm_guard existed", plain, want)
	}
	for _, bad := range []string{`, "grad_norm_guard": 1`, `, "grad_norm_guard": -3`, `, "compression": "zip"`} {
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
		{`, "join_timeout": "5s", "step_timeout": "9s", "checkpoint_dir": "/tmp/x"`, true},
	} {
		if got := hash(tc.extra); (got == plain) != tc.same {
			t.Errorf("config hash with %s: same as without = %v; want %v", tc.extra, got == plain, tc.same)
		}
	}
}
