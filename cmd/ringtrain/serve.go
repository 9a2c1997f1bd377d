package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/p2p"
)

// servedData is a dataset this peer serves: its manifest, the splits it
// holds, and the server.
type servedData struct {
	m           *data.Manifest
	train, test *data.Split
	srv         *p2p.DataServer
}

func (s *servedData) close() { s.srv.Close() }

// startServing loads the data config's splits, hashes them into a
// manifest and serves them on h, printing what Ember's data server
// printed — transforms, classes, sizes — and the dataset's ID, which job
// configs name it by.
func startServing(h *p2p.Host, dataConfig string, limits p2p.DataServerConfig, stdout io.Writer, log zerolog.Logger) (*servedData, error) {
	cfg, err := data.LoadConfig(dataConfig)
	if err != nil {
		return nil, err
	}
	s := &servedData{}
	if cfg.Text != nil {
		return s.serveText(h, cfg, limits, stdout, log)
	}
	if cfg.Targets != nil {
		return nil, fmt.Errorf("%s: a table with targets is not served; put its CSV files beside each peer and name them in the job's data config: %w", dataConfig, data.ErrConfig)
	}
	if s.train, err = cfg.Load("train"); err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "train: %s\n", s.train.Describe())
	splits := []*data.Dataset{s.train.Dataset}
	if cfg.DatasetPath.Test != "" {
		if s.test, err = cfg.Load("test"); err != nil {
			return nil, err
		}
		fmt.Fprintf(stdout, "test: %s\n", s.test.Describe())
		splits = append(splits, s.test.Dataset)
	}
	start := time.Now()
	var test *data.Dataset
	if s.test != nil {
		test = s.test.Dataset
	}
	if s.m, err = data.NewManifest(cfg, s.train.Dataset, test); err != nil {
		return nil, err
	}
	limits.Logger = log
	s.srv = p2p.NewDataServer(h, limits)
	if err := s.srv.Serve(s.m, splits...); err != nil {
		s.srv.Close()
		return nil, err
	}
	log.Info().Str("dataset", s.m.ID()).Dur("hashed_in", time.Since(start)).Msg("serving data")
	fmt.Fprintf(stdout, "serving dataset %s\n", s.m.ID())
	fmt.Fprintf(stdout, "a job config trains on it with: \"data\": {\"served\": \"%s\"}\n", s.m.ID())
	return s, nil
}

// serveText serves a text corpus: its training and validation parts, as
// chunks (data.NewTextManifest). A peer of this process trains on the
// parts themselves (train, test).
func (s *servedData) serveText(h *p2p.Host, cfg *data.Config, limits p2p.DataServerConfig, stdout io.Writer, log zerolog.Logger) (*servedData, error) {
	var err error
	if s.train, err = cfg.Load("train"); err != nil {
		return nil, err
	}
	if s.test, err = cfg.Load("test"); err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "text: %s (%d bytes), %s (%d bytes)\n", s.train.Source, len(s.train.Text.Bytes), s.test.Source, len(s.test.Text.Bytes))
	m, chunks, err := data.NewTextManifest(s.train, s.test)
	if err != nil {
		return nil, err
	}
	s.m = m
	limits.Logger = log
	s.srv = p2p.NewDataServer(h, limits)
	if err := s.srv.Serve(m, chunks...); err != nil {
		s.srv.Close()
		return nil, err
	}
	log.Info().Str("dataset", m.ID()).Msg("serving text")
	fmt.Fprintf(stdout, "serving dataset %s\n", m.ID())
	fmt.Fprintf(stdout, "a job config trains on it with: \"data\": {\"served\": \"%s\"}\n", m.ID())
	return s, nil
}

// runServe is `ringtrain serve --data <data config>`: Ember's data server
// as a peer. It serves the dataset to whoever names its ID, holds the DHT
// like `ringtrain bootstrap` (so workers can be pointed at it alone), and
// keeps serving until it is stopped, whether or not anyone trains.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runHostOnly(ctx, "serve", args, stdout, stderr)
}
