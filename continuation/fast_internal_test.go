package continuation

import (
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
