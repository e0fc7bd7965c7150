package openai

import "testing"

// TestGatherHigh: every pattern of high bits packs to its byte mask.
func TestGatherHigh(t *testing.T) {
	for m := range uint64(256) {
		var x uint64
		for k := range 8 {
			if m>>k&1 != 0 {
				x |= 0x80 << (8 * k)
			}
		}
		if got := gatherHigh(x); got != m {
			t.Fatalf("gatherHigh(%#x) = %#x, want %#x", x, got, m)
		}
	}
}
