package continuation

import (
	"bytes"
	"testing"
	"unsafe"
)

// TestTemplateLines holds the layout matchSteady relies on: what a steady
// chunk reads of its template in the template's first cache line, and
// templates that each start one (layouts starts with them, and a heap
// object of layouts' size is 64-byte aligned).
func TestTemplateLines(t *testing.T) {
	var tm template
	var l layouts
	if got := unsafe.Sizeof(tm); got%64 != 0 {
		t.Errorf("template is %d bytes, want a multiple of 64", got)
	}
	if got := unsafe.Offsetof(l.tmpls); got != 0 {
		t.Errorf("layouts.tmpls at %d, want 0", got)
	}
	if end := unsafe.Offsetof(tm.at) + unsafe.Sizeof(tm.at); end > 64 {
		t.Errorf("the fields a steady chunk reads end at byte %d of its template, want within 64", end)
	}
	// Go's size classes from 1 KiB up are multiples of 128 bytes, so a
	// layouts on the heap starts a cache line.
	if got := unsafe.Sizeof(l); got < 1024 {
		t.Errorf("layouts is %d bytes: a size class below 1 KiB may not be 64-byte aligned", got)
	}
}

// TestEqualFixed: equalFixed agrees with bytes.Equal on every length up
// to three words and a difference at every offset (the words it loads,
// the last one overlapping, and the short byte loop).
func TestEqualFixed(t *testing.T) {
	for n := range 25 {
		a := make([]byte, n)
		for i := range a {
			a[i] = byte('a' + i)
		}
		if !equalFixed(a, bytes.Clone(a)) {
			t.Fatalf("%q: not equal to its copy", a)
		}
		if n > 0 && equalFixed(a, a[:n-1]) {
			t.Fatalf("%q: equal to a shorter slice", a)
		}
		for i := range n {
			for _, bit := range []byte{1, 0x80} {
				b := bytes.Clone(a)
				b[i] ^= bit
				if equalFixed(a, b) || equalFixed(b, a) {
					t.Fatalf("%q and %q (byte %d): equal", a, b, i)
				}
			}
		}
	}
	// Two differences that cancel in an OR-then-XOR of the words.
	a, b := []byte("0123456789abcdef"), []byte("0123456789abcdef")
	a[1], b[9] = a[1]|0x40, b[9]^0x01
	if equalFixed(a, b) {
		t.Fatalf("%q and %q: equal", a, b)
	}
}
