package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestComposeExample: examples/compose's services each run a ringtrain
// command line that ringtrain's own parser takes (with the .env values a
// user sets), and, where Docker's compose is installed, docker compose
// config accepts the file.
func TestComposeExample(t *testing.T) {
	dir := filepath.Join("..", "..", "examples", "compose")
	raw, err := os.ReadFile(filepath.Join(dir, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Services map[string]struct {
			Command []string `yaml:"command"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	env := strings.NewReplacer("${BOOT_ID:?set BOOT_ID in .env: ringtrain id --identity keys/data.key}", "12D3KooWADxsiMjVKvE5Ptb9wyqjorbCvargoGzaNQiAGi68RvLZ")
	for _, name := range []string{"data", "worker"} {
		s, ok := file.Services[name]
		if !ok || len(s.Command) == 0 {
			t.Fatalf("no %s service with a command", name)
		}
		args := make([]string, len(s.Command))
		for i, a := range s.Command {
			args[i] = env.Replace(a)
		}
		// --version stops once the flags are parsed: a flag ringtrain
		// does not know, or a stray word, fails here.
		if _, _, err := runArgs(append(args, "--version")...); err != nil {
			t.Errorf("service %s: ringtrain %s: %v", name, strings.Join(args, " "), err)
		}
	}
	var compose []string
	switch {
	case exec.Command("docker", "compose", "version").Run() == nil:
		compose = []string{"docker", "compose"}
	case exec.Command("docker-compose", "version").Run() == nil:
		compose = []string{"docker-compose"}
	default:
		t.Skip("SKIPPED docker compose config: Docker's compose is not installed here; the command lines were checked")
	}
	cmd := exec.Command(compose[0], append(compose[1:], "-f", "docker-compose.yml", "config", "-q")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "BOOT_ID=12D3KooWADxsiMjVKvE5Ptb9wyqjorbCvargoGzaNQiAGi68RvLZ")
	if out, err := cmd.CombinedOutput(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Errorf("%s config: %v\n%s", strings.Join(compose, " "), err, out)
		}
	}
}
