package resp

import "testing"

// TestHotPathAlloc: GET, MGET, EXISTS, PING, and SET and MSET of keys
// that exist, allocate nothing per command.
func TestHotPathAlloc(t *testing.T) {
	l := startListener(t, Options{}, nil)
	cn := &conn{s: l.srv, authed: true}
	value := make([]byte, 4096)
	run := func(args ...string) func() {
		bs := make([][]byte, len(args))
		for i, a := range args {
			bs[i] = []byte(a)
		}
		bs = append(bs, value)[:len(args)]
		return func() {
			cn.out = cn.out[:0]
			cn.dispatch(bs)
		}
	}
	setArgs := [][]byte{[]byte("SET"), []byte("k"), value}
	set := func() { cn.out = cn.out[:0]; cn.dispatch(setArgs) }
	set()
	run("SET", "k2", "x")()
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"GET", run("GET", "k")}, {"get-miss", run("get", "nope")}, {"MGET", run("MGET", "k", "k2", "nope")},
		{"EXISTS", run("EXISTS", "k", "nope")}, {"PING", run("PING")},
	} {
		c.f()
		if n := testing.AllocsPerRun(200, c.f); n != 0 {
			t.Errorf("%s: %.1f allocations per command", c.name, n)
		}
	}
	run("GET", "k")()
	if len(cn.out) != len(value)+len("$4096\r\n\r\n") {
		t.Fatalf("GET did not answer the value: %q", cn.out[:min(len(cn.out), 40)])
	}
	// Overwriting a key whose value is in the arena reuses its entry.
	if got := testing.AllocsPerRun(200, set); got != 0 {
		t.Errorf("SET: %.1f allocations per command", got)
	}
	if got := testing.AllocsPerRun(200, run("MSET", "k", "v", "k2", "w")); got != 0 {
		t.Errorf("MSET: %.1f allocations per command", got)
	}
}
