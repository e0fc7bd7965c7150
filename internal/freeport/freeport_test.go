package freeport

import (
	"testing"
	"time"
)

func TestLedgerClaim(t *testing.T) {
	l := ledger{blocks: map[int]lease{}}
	now := time.Unix(1000, 0)
	if !l.claim(40000, 4, now) {
		t.Fatal("first claim refused")
	}
	for _, c := range []struct{ base, n int }{{40000, 1}, {40003, 1}, {39998, 3}, {39990, 20}} {
		if l.claim(c.base, c.n, now.Add(time.Minute)) {
			t.Errorf("block %d+%d overlaps 40000+4 handed out a minute ago: claimed", c.base, c.n)
		}
	}
	if !l.claim(40004, 1, now) || !l.claim(39999, 1, now) {
		t.Error("blocks next to 40000+4 refused")
	}
	if !l.claim(40001, 1, now.Add(HeldFor+time.Second)) {
		t.Error("a port handed out longer ago than HeldFor refused")
	}
}

// The kernel hands out a released port again soon: 500 picks without the
// ledger repeated one within 50 (measured), which is how an engine's HTTP
// port and its KV-event replay port once came out equal.
func TestPickNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for i := 0; i < 500; i++ {
		p, err := Pick("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("pick %d: port %d handed out twice", i, p)
		}
		seen[p] = true
	}
}
