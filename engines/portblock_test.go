package engines

import "testing"

// The worker asks for an engine's HTTP port, then for its KV-event ports:
// a block it handed out is not handed out again (internal/freeport), where
// the kernel, asked again, often offers a port just released.
func TestFreePortBlockNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for i := 0; i < 300; i++ {
		p, err := freePortBlock("127.0.0.1", 2)
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] || seen[p+1] {
			t.Fatalf("pick %d: block %d+2 overlaps one handed out before", i, p)
		}
		seen[p], seen[p+1] = true, true
	}
}
