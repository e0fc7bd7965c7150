package kvd

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestAdminMetrics(t *testing.T) {
	d := startDaemon(t, daemonOpts{arenaBytes: 1 << 20})
	c := dial(t, d, ClientOptions{SharedArena: true})
	c.Set(ns, key(1), value(1, 100), SetOptions{Retention: "none"})
	c.Get(ns, key(1), nil)
	c.Get(ns, key(2), nil)
	ts := httptest.NewServer(d.srv.AdminHandler())
	defer ts.Close()
	resp, err := ts.Client().Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`infera_kvd_entries{placement="arena"} 1`,
		`infera_kvd_requests_total{op="get"} 2`,
		`infera_kvd_hits_total 1`,
		`infera_kvd_misses_total 1`,
		`infera_kvd_host_bytes 100`,
		`infera_kvd_arena_capacity_bytes 1.048576e+06`,
		`infera_kvd_connections 1`,
		`infera_kvd_prefetch_total{stage="useful"} 0`,
		`infera_kvd_arena_pages{state="held"} 1`,
		`infera_kvd_arena_class_slots{slot_bytes="128",state="used"} 1`,
		`infera_kvd_arena_class_value_bytes{slot_bytes="128"} 100`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	resp, err = ts.Client().Get(ts.URL + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatal("health", err)
	}
	resp.Body.Close()
}
