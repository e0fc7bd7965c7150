package resp

import (
	"bytes"
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/infera/infera/kvd"
)

// TestValuesOfEverySize (issue 31, acceptance 1): on one kvd whose RAM is
// its arena alone (no inline budget), `SET foo bar` does not fix the
// geometry: 28-byte, 4 KiB, 256 KiB and 1 MiB values are stored and read
// back beside it; then, after redis-benchmark -d 4096 ran against the
// same kvd, LMCache's redis backend sequence (28-byte metadata beside
// 300 KiB payloads) passes.
func TestValuesOfEverySize(t *testing.T) {
	l := startListener(t, Options{}, func(o *kvd.StoreOptions) {
		o.SlotBytes = 0 // the default pages: arena/16 = 4 MiB
		o.MaxBytes = o.Arena.Size()
	})
	c := dialRaw(t, l.addr)
	expect := func(req []byte, want []byte) {
		t.Helper()
		if got := c.do(req); !bytes.Equal(got, want) {
			t.Fatalf("%.60q: got %.80q, want %.80q", req, got, want)
		}
	}
	expect(encode("SET", "foo", "bar"), []byte("+OK\r\n"))
	sizes := []int{28, 4 << 10, 256 << 10, 1 << 20}
	for _, n := range sizes {
		v := bytes.Repeat([]byte{byte(n % 251)}, n)
		k := "v" + string(rune('a'+n%26))
		expect(encode("SET", k, string(v)), []byte("+OK\r\n"))
		expect(encode("GET", k), appendBulk(nil, v))
	}
	expect(encode("GET", "foo"), appendBulk(nil, []byte("bar")))
	if c := l.store.Counters(); c.InlineEntries != 0 || len(c.Classes) < len(sizes) {
		t.Fatalf("values not side by side in the arena: %+v", c)
	}

	bench := tool(t, "redis-benchmark")
	host, port, _ := net.SplitHostPort(l.addr)
	out, err := exec.Command(bench, "-h", host, "-p", port, "-t", "set,get", "-d", "4096", "-n", "2000", "-c", "4", "-q").CombinedOutput()
	if err != nil || strings.Contains(string(out), "rror") || !strings.Contains(string(out), "GET:") {
		t.Fatalf("redis-benchmark -d 4096: %v\n%s", err, out)
	}
	lmcacheRedisSequence(t, c)
}
