package tablespace

import (
	"fmt"
	"testing"
)

// DeletePrefix removes exactly the prefixed keys, across stripes, and the
// removals survive a crash (they are journalled, not only unindexed).
func TestDeletePrefixIsDurable(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir()}
	cfg := testConfig(dirs[0], 32)
	cfg.Paths = dirs
	cfg.Bytes = 64 * 8192
	ts := mustOpen(t, cfg)
	for i := range 8 {
		for _, ns := range []string{"a/", "ab/"} {
			k := fmt.Sprintf("%s%d", ns, i)
			if err := ts.Put([]byte(k), val(k, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	n, err := ts.DeletePrefix([]byte("a/"))
	if err != nil || n != 8 {
		t.Fatalf("DeletePrefix = %d, %v; want 8", n, err)
	}
	if n, err := ts.DeletePrefix([]byte("a/")); err != nil || n != 0 {
		t.Fatalf("second DeletePrefix = %d, %v; want 0", n, err)
	}
	crash(ts)
	ts = mustOpen(t, cfg)
	for i := range 8 {
		if ts.Exists([]byte(fmt.Sprintf("a/%d", i))) {
			t.Fatalf("a/%d came back after a crash", i)
		}
		k := fmt.Sprintf("ab/%d", i)
		mustGet(t, ts, k, val(k, i))
	}
	if ts.Len() != 8 {
		t.Fatalf("len %d after recovery, want 8", ts.Len())
	}
	ts.Close()
	if _, err := ts.DeletePrefix([]byte("ab/")); err != ErrClosed {
		t.Fatalf("DeletePrefix on a closed tablespace: %v", err)
	}
}
