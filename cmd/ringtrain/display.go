package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
)

// statusRecord is what the live display reads of a peer's JSON log
// record, or of a progress report (message "progress").
type statusRecord struct {
	Level         string   `json:"level"`
	Message       string   `json:"message"`
	Error         string   `json:"error"`
	Rank          *int     `json:"rank"`
	Generation    int      `json:"generation"`
	WorldSize     int      `json:"world_size"`
	Stage         *int     `json:"stage"`
	Epoch         int      `json:"epoch"`
	Epochs        int      `json:"epochs"`
	Step          int      `json:"step"`
	Steps         int      `json:"steps"`
	Loss          float64  `json:"loss"`
	SamplesPerSec float64  `json:"samples_per_sec"`
	ElapsedS      float64  `json:"elapsed_s"`
	TestAccuracy  *float64 `json:"test_accuracy"`
	TestBPB       *float64 `json:"test_bits_per_byte"` // a language model's, said instead of the accuracy
	ParamHash     string   `json:"param_hash"`
	Path          string   `json:"path"`
}

// parseStatus reads one JSON log line; ok is false for anything else.
func parseStatus(line []byte) (statusRecord, bool) {
	var r statusRecord
	if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &r) != nil || r.Message == "" {
		return r, false
	}
	return r, true
}

// progressMessage marks the status records that only move a bar.
const progressMessage = "progress"

// eventMessages are the info records worth a line above the bars: what
// changed for the job. Warnings and errors always are.
var eventMessages = []string{
	"ring formed", "ring re-formed", "ring grew", "pipeline formed", "pipeline re-formed",
	"a peer was lost", "peers are leaving", "peers told the others", "newcomers were gone",
	"admitted to the ring", "left the job", "interrupted", "resuming", "checkpoint written",
	"stage checkpoint written", "back to the latest snapshot", "a peer came to take the stage",
	"the stages' parameters gathered", "summary", "epoch done",
}

// setsRank says whether a status record gives the peer's rank in a new
// ring: one formed (or re-formed, or grown), and then the ranks the
// measured links ordered (p2p), which come after and may differ.
func setsRank(r statusRecord) bool {
	return r.Rank != nil && (strings.Contains(r.Message, "formed") || strings.HasPrefix(r.Message, "ring ordered by measured links"))
}

// isEvent says whether a record is printed above the bars.
func isEvent(r statusRecord) bool {
	if r.Level == "warn" || r.Level == "error" || r.Level == "fatal" {
		return true
	}
	for _, m := range eventMessages {
		if strings.HasPrefix(r.Message, m) {
			return true
		}
	}
	return false
}

// testFigure is a record's score of the test set as a clause: a language
// model's validation bits per byte, else the test accuracy, if it has one.
func (r statusRecord) testFigure() string {
	switch {
	case r.TestBPB != nil:
		return fmt.Sprintf(", validation %.3f bits per byte", *r.TestBPB)
	case r.TestAccuracy != nil:
		return fmt.Sprintf(", test accuracy %.4f", *r.TestAccuracy)
	}
	return ""
}

// sentence is an event as one short line.
func sentence(who string, r statusRecord) string {
	var b strings.Builder
	b.WriteString(who)
	b.WriteString(": ")
	switch {
	case r.Message == "epoch done":
		fmt.Fprintf(&b, "epoch %d done, loss %.4f", r.Epoch, r.Loss)
		b.WriteString(r.testFigure())
	case r.Message == "summary":
		b.WriteString("finished")
		b.WriteString(r.testFigure())
		if len(r.ParamHash) >= 16 {
			fmt.Fprintf(&b, ", parameter hash %s", r.ParamHash[:16])
		}
	default:
		b.WriteString(r.Message)
		if r.WorldSize > 0 && strings.Contains(r.Message, "formed") {
			fmt.Fprintf(&b, " (%d peers, generation %d)", r.WorldSize, r.Generation)
		}
		if r.Path != "" {
			fmt.Fprintf(&b, " (%s)", r.Path)
		}
		if r.Error != "" {
			fmt.Fprintf(&b, ": %s", r.Error)
		}
	}
	return b.String()
}

// display is the live view of a run on a terminal: a line per peer
// (rank, epoch, step/steps, loss, samples/s, ETA) and, printed above them,
// the job's events as short sentences. Built on mpb, which redraws the
// bars in place and lets lines be written above them.
type display struct {
	p     *mpb.Progress
	newMu sync.Mutex // held while a line is added
	mu    sync.Mutex // guards what follows and every peerView's fields
	peers map[int]*peerView
	seen  map[string]bool // job events already printed, by what and when
}

// peerView is one peer's line.
type peerView struct {
	bar             *mpb.Bar
	peer, rank      int // rank is −1 until the ring forms
	epoch, epochs   int // epoch counts from 1
	step, steps     int
	loss, rate, eta float64
	state           string // "" while training; done, left or failed
}

// barScale is a bar's units: it shows the epoch under way, and is full
// only when the peer is done.
const barScale = 1000

func newDisplay(w io.Writer) *display {
	return &display{
		p:     mpb.New(mpb.WithOutput(w), mpb.WithWidth(16), mpb.WithRefreshRate(200*time.Millisecond), mpb.WithAutoRefresh()),
		peers: map[int]*peerView{}, seen: map[string]bool{},
	}
}

// view is peer's line, added when first heard of. d.mu is not held:
// mpb's calls wait for its render loop, which calls the decorators, which
// take d.mu.
func (d *display) view(peer int) *peerView {
	d.newMu.Lock()
	defer d.newMu.Unlock()
	d.mu.Lock()
	v, ok := d.peers[peer]
	d.mu.Unlock()
	if ok {
		return v
	}
	v = &peerView{peer: peer, rank: -1}
	v.bar = d.p.New(barScale, mpb.BarStyle().Lbound("[").Filler("=").Tip(">").Padding(" ").Rbound("]"),
		mpb.BarPriority(peer),
		mpb.PrependDecorators(decor.Any(func(decor.Statistics) string { return d.label(v) }, decor.WCSyncSpaceR)),
		mpb.AppendDecorators(decor.Any(func(decor.Statistics) string { return d.figures(v) })))
	d.mu.Lock()
	d.peers[peer] = v
	d.mu.Unlock()
	return v
}

func (d *display) label(v *peerView) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	who := fmt.Sprintf("peer %d", v.peer)
	if v.rank >= 0 {
		who = fmt.Sprintf("rank %d", v.rank)
	}
	return fmt.Sprintf("%s epoch %d/%d", who, max(v.epoch, 1), max(v.epochs, v.epoch, 1))
}

func (d *display) figures(v *peerView) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if v.state != "" {
		return v.state
	}
	if v.steps == 0 {
		return "forming the ring"
	}
	return fmt.Sprintf("%d/%d loss %.4f %.0f/s ETA %v", v.step, v.steps, v.loss, v.rate, time.Duration(v.eta*float64(time.Second)).Round(time.Second))
}

// who names a peer in an event: its rank once it has one.
func (v *peerView) who() string {
	if v.rank >= 0 {
		return fmt.Sprintf("rank %d", v.rank)
	}
	return fmt.Sprintf("peer %d", v.peer)
}

// jobEvents are the changes every member logs: printed once for all.
var jobEvents = []string{"ring formed", "ring re-formed", "pipeline formed", "pipeline re-formed", "epoch done", "a peer was lost",
	"peers are leaving", "peers told the others", "ring grew", "newcomers were gone", "interrupted", "back to the latest snapshot"}

// record takes one of peer's status records: progress moves its line,
// an event is printed above the lines.
func (d *display) record(peer int, r statusRecord) {
	v := d.view(peer)
	d.mu.Lock()
	if setsRank(r) {
		v.rank = *r.Rank
	}
	current := int64(-1)
	switch r.Message {
	case progressMessage, "training", "epoch done":
		v.epoch, v.step, v.steps, v.loss, v.rate = r.Epoch, r.Step, r.Steps, r.Loss, r.SamplesPerSec
		v.epochs = max(v.epochs, r.Epochs)
		if r.Step > 0 && r.Steps > 0 {
			perEpoch := r.ElapsedS * float64(r.Steps) / float64(r.Step)
			v.eta = perEpoch*float64(r.Steps-r.Step)/float64(r.Steps) + perEpoch*float64(max(v.epochs-r.Epoch, 0))
			current = min(int64(barScale*r.Step/r.Steps), barScale-1)
		}
	case "summary":
		v.state, current = "done", barScale
	}
	if strings.HasPrefix(r.Message, "left the job") {
		v.state = "left"
	}
	var line string
	if isEvent(r) {
		line = sentence(v.who(), r)
		for _, m := range jobEvents {
			if r.Level == "info" && strings.HasPrefix(r.Message, m) {
				key := fmt.Sprintf("%s|%d|%d", r.Message, r.Generation, r.Epoch)
				if d.seen[key] {
					line = ""
				}
				d.seen[key] = true
				break
			}
		}
	}
	d.mu.Unlock()
	// The line first: mpb flushes what is written above the bars when it
	// next draws them, and once the last bar is complete it may draw no
	// more — a line written after that would be lost.
	if line != "" {
		d.println(line)
	}
	if current >= 0 {
		v.bar.SetCurrent(current)
	}
}

// println prints a line above the bars.
func (d *display) println(line string) {
	fmt.Fprintln(d.p, line)
}

// failed marks a peer's line as ended by err.
func (d *display) failed(peer int, err error) {
	v := d.view(peer)
	d.mu.Lock()
	v.state = "failed"
	who := v.who()
	d.mu.Unlock()
	d.println(fmt.Sprintf("%s: failed: %v", who, err))
}

// close stops the bars where they are and draws them a last time.
func (d *display) close() {
	d.mu.Lock()
	var bars []*mpb.Bar
	for _, v := range d.peers {
		bars = append(bars, v.bar)
	}
	d.mu.Unlock()
	for _, b := range bars {
		if !b.Completed() {
			b.Abort(false)
		}
	}
	d.p.Wait()
}

// statusWriter is an io.Writer of a peer's JSON log lines for the display:
// each line is one record (what zerolog writes per event).
type statusWriter struct {
	d    *display
	peer int
}

func (w statusWriter) Write(b []byte) (int, error) {
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if r, ok := parseStatus(sc.Bytes()); ok {
			w.d.record(w.peer, r)
		} else if line := strings.TrimSpace(sc.Text()); line != "" {
			w.d.println(line)
		}
	}
	return len(b), nil
}

// duplicatesEvent says whether a line of a peer's ordinary output says
// what the display shows as an event.
func duplicatesEvent(line string) bool {
	for _, s := range []string{"ring formed: ", "ring re-formed: ", "pipeline formed: ", "pipeline re-formed: ", "checkpoint: ", "rank ", "left the job", "interrupted"} {
		if strings.HasPrefix(line, s) {
			return true
		}
	}
	return false
}

// lineWriter prints what is written to it above the bars, a line at a
// time, but for the lines the display shows as events.
type lineWriter struct {
	d   *display
	mu  sync.Mutex
	buf []byte
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		if line := string(w.buf[:i]); !duplicatesEvent(line) {
			w.d.println(line)
		}
		w.buf = w.buf[i+1:]
	}
}
