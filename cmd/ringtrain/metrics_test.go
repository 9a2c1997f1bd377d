package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ringtrain/ringtrain/train"
)

// TestMetricsScrape: what the training loop reports is what a scrape of
// /metrics gives, in Prometheus's text format as its own parser reads it.
func TestMetricsScrape(t *testing.T) {
	m := newMetrics()
	m.observe(train.Progress{Epoch: 0, EpochDone: true, TestAccuracy: 0.81, WorldSize: 3, SamplesPerSec: 1234,
		Stats: train.ReplicaStats{Steps: 40, Skipped: 1, Reforms: 2, BytesSent: 5000,
			Compute: 3 * time.Second, Wait: time.Second, Ring: 2 * time.Second, Optimizer: 500 * time.Millisecond}}, true)
	m.observe(train.Progress{Epoch: 1, Step: 10, WorldSize: 3, SamplesPerSec: 2000, Stats: train.ReplicaStats{Steps: 50, Compute: 4 * time.Second}}, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, stop, err := m.serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("the scrape does not parse: %v", err)
	}
	value := func(name string, labels map[string]string) float64 {
		f, ok := fams[name]
		if !ok {
			t.Fatalf("no %s in the scrape", name)
		}
	next:
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue next
				}
			}
			if c := mt.GetCounter(); c != nil {
				return c.GetValue()
			}
			return mt.GetGauge().GetValue()
		}
		t.Fatalf("no %s%v in the scrape", name, labels)
		return 0
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"ringtrain_steps_total", nil, 50},
		{"ringtrain_samples_per_second", nil, 2000},
		{"ringtrain_world_size", nil, 3},
		{"ringtrain_epoch", nil, 2},
		{"ringtrain_test_accuracy", map[string]string{"epoch": "1"}, 0.81},
		{"ringtrain_step_seconds_total", map[string]string{"part": "compute"}, 4},
	} {
		if got := value(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v; want %v", c.name, c.labels, got, c.want)
		}
	}
	if n := len(fams["ringtrain_step_seconds_total"].GetMetric()); n != 4 {
		t.Errorf("%d parts of the step time; want compute, wait, ring, optimizer", n)
	}
	for _, name := range []string{"ringtrain_skipped_steps_total", "ringtrain_reformations_total", "ringtrain_sent_bytes_total"} {
		value(name, nil)
	}
}
