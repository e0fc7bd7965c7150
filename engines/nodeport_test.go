package engines

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

func env(kv ...string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i] == k {
				return kv[i+1], true
			}
		}
		return "", false
	}
}

// INFERA_NODEPORT_RANGE as the reference reads it: "lo-hi", none/off to
// drop the guard, and the default kept for an empty or unreadable value.
func TestReservedPorts(t *testing.T) {
	for _, tc := range []struct {
		env    []string
		lo, hi int
		ok     bool
	}{
		{nil, 30000, 32767, true},
		{[]string{"INFERA_NODEPORT_RANGE", ""}, 30000, 32767, true},
		{[]string{"INFERA_NODEPORT_RANGE", " 20000-22767 "}, 20000, 22767, true},
		{[]string{"INFERA_NODEPORT_RANGE", "garbage"}, 30000, 32767, true},
		{[]string{"INFERA_NODEPORT_RANGE", "9-3"}, 30000, 32767, true},
		{[]string{"INFERA_NODEPORT_RANGE", "none"}, 0, 0, false},
		{[]string{"INFERA_NODEPORT_RANGE", "OFF"}, 0, 0, false},
	} {
		lo, hi, ok := reservedPorts(env(tc.env...))
		if lo != tc.lo || hi != tc.hi || ok != tc.ok {
			t.Errorf("%v: %d-%d %v, want %d-%d %v", tc.env, lo, hi, ok, tc.lo, tc.hi, tc.ok)
		}
	}
}

// A window covering the kernel's whole ephemeral range: every port the
// kernel offers is refused and the block comes from below the window.
func TestFreePortBlockAvoidsNodePorts(t *testing.T) {
	raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(raw))
	lo, _ := strconv.Atoi(f[0])
	hi, _ := strconv.Atoi(f[1])
	if lo < 2048 {
		t.Fatalf("ephemeral range %d-%d leaves no room below it", lo, hi)
	}
	window := strconv.Itoa(lo) + "-" + strconv.Itoa(hi)
	for range 5 {
		base, err := freePortBlockOutside("127.0.0.1", 4, env("INFERA_NODEPORT_RANGE", window))
		if err != nil {
			t.Fatal(err)
		}
		if base < 1024 || base+3 >= lo {
			t.Fatalf("block %d-%d touches the window %s", base, base+3, window)
		}
	}
	base, err := freePortBlockOutside("127.0.0.1", 2, env("INFERA_NODEPORT_RANGE", "none"))
	if err != nil || base < lo || base > hi {
		t.Fatalf("without a window: %d %v, want a kernel port in %s", base, err, window)
	}
}

// A multi-node group member's rank: --node-rank (sglang), else
// LWS_WORKER_INDEX; anything unreadable is the leader's 0.
func TestFollowerRank(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  []string
		want int
	}{
		{nil, nil, 0},
		{nil, []string{"LWS_WORKER_INDEX", "2"}, 2},
		{nil, []string{"LWS_WORKER_INDEX", "0"}, 0},
		{nil, []string{"LWS_WORKER_INDEX", "x"}, 0},
		{[]string{"--model", "m", "--node-rank", "1"}, []string{"LWS_WORKER_INDEX", "0"}, 1},
		{[]string{"--node-rank=0"}, []string{"LWS_WORKER_INDEX", "3"}, 0},
	} {
		if got := followerRank(tc.args, env(tc.env...)); got != tc.want {
			t.Errorf("%v %v: %d, want %d", tc.args, tc.env, got, tc.want)
		}
	}
}
