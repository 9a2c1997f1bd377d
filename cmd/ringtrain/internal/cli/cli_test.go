package cli

import "testing"

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int
		ok   bool
	}{
		{"4096", 4096, true},
		{"512KiB", 512 << 10, true},
		{" 16MiB", 16 << 20, true},
		{"1GiB", 1 << 30, true},
		{"8B", 8, true},
		{"0", 0, false},
		{"-1MiB", 0, false},
		{"MiB", 0, false},
		{"1.5MiB", 0, false},
	}
	for _, tt := range tests {
		got, err := ParseBytes(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}
