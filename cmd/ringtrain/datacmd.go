package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/ringtrain/ringtrain/data"
)

// runData loads a data config's splits and prints what they hold.
func runData(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("data", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "data config (JSON: transforms, dataset_path)")
	if err := parseFlags(fs, args); err != nil {
		return fmt.Errorf("data: %w: %w", errUsage, err)
	}
	if *config == "" {
		return fmt.Errorf("data: --config is required: %w", errUsage)
	}
	cfg, err := data.LoadConfig(*config)
	if err != nil {
		return err
	}
	for _, split := range []string{"train", "test"} {
		if split == "test" && cfg.DatasetPath.Test == "" && cfg.Text == nil {
			continue
		}
		s, err := cfg.Load(split)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: %s\n", split, s.Describe())
	}
	return nil
}
