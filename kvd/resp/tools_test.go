package resp

import (
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/infera/infera/kvd"
)

func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is required (Debian: apt-get install redis-tools): %v", name, err)
	}
	return p
}

// TestRedisTools: redis-cli and redis-benchmark (Debian redis-tools) run
// against the listener without errors (acceptance 2 of issue 15).
func TestRedisTools(t *testing.T) {
	cli, bench := tool(t, "redis-cli"), tool(t, "redis-benchmark")
	l := startListener(t, Options{}, func(o *kvd.StoreOptions) { o.SlotBytes = 72 << 10 })
	host, port, _ := net.SplitHostPort(l.addr)
	run := func(bin string, args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", bin, args, err, out)
		}
		return string(out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"PING"}, "PONG\n"}, {[]string{"SET", "greeting", "hello world"}, "OK\n"}, {[]string{"GET", "greeting"}, "hello world\n"},
		{[]string{"MSET", "a", "1", "b", "2"}, "OK\n"}, {[]string{"MGET", "a", "b", "c"}, "1\n2\n\n"}, {[]string{"EXISTS", "a", "b", "c"}, "2\n"},
		{[]string{"DEL", "a"}, "1\n"}, {[]string{"--no-raw", "GET", "a"}, "(nil)\n"}, {[]string{"SET", "t", "v", "EX", "100", "NX"}, "OK\n"},
	} {
		if got := run(cli, c.args...); got != c.want {
			t.Errorf("redis-cli %v: %q, want %q", c.args, got, c.want)
		}
	}
	if info := run(cli, "INFO"); !strings.Contains(info, "redis_version:"+RedisVersion) {
		t.Errorf("redis-cli INFO: %q", info)
	}
	for _, d := range []string{"1024", "65536"} {
		out := run(bench, "-t", "set,get,mset", "-d", d, "-n", "2000", "-c", "8", "-q")
		for _, bad := range []string{"ERR", "Error", "WARNING", "rror"} {
			if strings.Contains(out, bad) {
				t.Fatalf("redis-benchmark -d %s: %q in output:\n%s", d, bad, out)
			}
		}
		for _, test := range []string{"SET:", "GET:", "MSET (10 keys):"} {
			if !strings.Contains(out, test) {
				t.Errorf("redis-benchmark -d %s: no %s result:\n%s", d, test, out)
			}
		}
	}
	// The benchmark's key holds its last value.
	if got := run(cli, "--no-raw", "EXISTS", "key:__rand_int__"); got != "(integer) 1\n" {
		t.Errorf("benchmark key: %q", got)
	}
}
