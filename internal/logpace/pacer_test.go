package logpace

import (
	"testing"
	"time"
)

// TestPacerOneLineAPeriod: the first line goes through, the next ones
// within the period are held back and counted, and the first after it
// goes through with that count.
func TestPacerOneLineAPeriod(t *testing.T) {
	var p Pacer
	const every = 50 * time.Millisecond
	if ok, n := p.Allow(every); !ok || n != 0 {
		t.Fatalf("first line: ok %v skipped %d, want true 0", ok, n)
	}
	for i := range 3 {
		if ok, _ := p.Allow(every); ok {
			t.Fatalf("line %d within the period let through", i+2)
		}
	}
	time.Sleep(60 * time.Millisecond) // past the period: only later, never earlier
	if ok, n := p.Allow(every); !ok || n != 3 {
		t.Fatalf("first line after the period: ok %v skipped %d, want true 3", ok, n)
	}
	if ok, _ := p.Allow(every); ok {
		t.Fatal("line right after let through")
	}
}
