package train

import (
	"errors"
	"math"
	"testing"
)

// TestControlMessages: a message goes round as written; every row no
// honest rank writes is refused as malformed, none is taken for a message
// or for silence.
func TestControlMessages(t *testing.T) {
	const max = 128
	w := msgWidth(max)
	row := make([]float32, w)
	sent := claim{Epochs: 2, Steps: 1234567, Skip: 77, Hash: paramHash([32]byte{1, 2, 3})}
	if err := putMsg(row, &sent, max); err != nil {
		t.Fatal(err)
	}
	var got claim
	if ok, err := getMsg(row, &got, max); !ok || err != nil || got != sent {
		t.Fatalf("round trip: %+v, %v, %v; want %+v", got, ok, err, sent)
	}
	if ok, err := getMsg(make([]float32, w), &got, max); ok || err != nil {
		t.Errorf("a row of zeros: %v, %v; want no message and no error", ok, err)
	}
	if err := putMsg(row, &peerList{Peers: []string{string(make([]byte, max))}}, max); err == nil {
		t.Error("a message over the bound was written")
	}
	encoded := func(s string) []float32 {
		r := make([]float32, w)
		packBytes(r, []byte(s))
		return r
	}
	for _, tc := range []struct {
		name string
		row  func() []float32
	}{
		{"a payload with no length", func() []float32 { r := make([]float32, w); r[3] = 1; return r }},
		{"a length over the bound", func() []float32 { r := slicesClone(row); r[0] = max + 1; return r }},
		{"a negative length", func() []float32 { r := slicesClone(row); r[0] = -4; return r }},
		{"a fractional length", func() []float32 { r := slicesClone(row); r[0] += 0.5; return r }},
		{"a piece over 16 bits", func() []float32 { r := slicesClone(row); r[2] = 70000; return r }},
		{"a fractional piece", func() []float32 { r := slicesClone(row); r[2] += 0.25; return r }},
		{"a NaN piece", func() []float32 { r := slicesClone(row); r[1] = float32(math.NaN()); return r }},
		{"a piece after the message", func() []float32 { r := slicesClone(row); r[len(r)-1] = 7; return r }},
		{"a high byte past the end", func() []float32 { r := encoded(`{"epochs":12}`); r[1+len(`{"epochs":12}`)/2] = 0x4100 | '}'; return r }},
		{"not JSON", func() []float32 { return encoded(`{"epochs":`) }},
		{"an unknown field", func() []float32 { return encoded(`{"epochs":1,"steps":2,"skip":3,"hash":"x","lie":1}`) }},
		{"data after the message", func() []float32 { return encoded(`{"epochs":1} {}`) }},
		{"a number where a count goes", func() []float32 { return encoded(`{"epochs":1.5}`) }},
		{"a key in another case", func() []float32 { return encoded(`{"EPOCHS":1,"steps":2,"skip":3,"hash":"x"}`) }},
		{"an & that encodes as six bytes", func() []float32 { return encoded(`{"epochs":1,"steps":2,"skip":3,"hash":"a&b"}`) }},
		{"spaces", func() []float32 { return encoded(`{"epochs": 1,"steps":2,"skip":3,"hash":"x"}`) }},
	} {
		var c claim
		if ok, err := getMsg(tc.row(), &c, max); ok || !errors.Is(err, errMalformed) {
			t.Errorf("%s: %v, %v; want errMalformed", tc.name, ok, err)
		}
	}
	if (&claim{Epochs: 1, Steps: -1, Hash: paramHash([32]byte{})}).valid() || (&claim{Hash: "zz"}).valid() {
		t.Error("a negative position or a hash that is not 16 bytes of hex passes as valid")
	}
}

func slicesClone(v []float32) []float32 { return append([]float32(nil), v...) }

// FuzzControlMessage: whatever a row holds, getMsg returns a message, no
// message or an error — never a panic — and a message it returns encodes
// within the bound.
func FuzzControlMessage(f *testing.F) {
	f.Add([]byte(`{"epochs":1,"steps":2,"skip":3,"hash":"00112233445566778899aabbccddeeff"}`), uint16(0))
	f.Add([]byte(`{"peers":["a","b"]}`), uint16(3))
	f.Add([]byte{}, uint16(0))
	f.Fuzz(func(t *testing.T, b []byte, flip uint16) {
		const max = 128
		row := make([]float32, msgWidth(max))
		packBytes(row, b)
		if k := int(flip) % len(row); flip != 0 {
			row[k] += float32(flip) / 7
		}
		var c claim
		if ok, err := getMsg(row, &c, max); ok && err == nil {
			if err := putMsg(make([]float32, msgWidth(max)), &c, max); err != nil {
				t.Errorf("a decoded claim does not encode within the bound: %v", err)
			}
		}
		var p peerList
		getMsg(row, &p, max)
	})
}
