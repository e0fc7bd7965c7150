package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/redistest"
	"github.com/infera/infera/internal/testkit"
)

// Issue 35, acceptance 2: a real Prometheus (Debian's) scrapes serve, the
// workers' engines and a kvd; every panel query of deploy/grafana/infera.json
// and every rule expression of deploy/prometheus/infera-rules.yml returns a
// series; promtool accepts the rules.

const (
	rulesFile     = "../deploy/prometheus/infera-rules.yml"
	dashboardFile = "../deploy/grafana/infera.json"
)

func TestPrometheusRulesCheck(t *testing.T) {
	out, err := exec.Command(toolPath(t, "promtool"), "check", "rules", rulesFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

func toolPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed (apt-get install prometheus; .ci/run installs it)", name)
	}
	return p
}

// alertQuery splits an alert expression `<query> <op> <number>` into the
// query, which must return a series on a healthy fleet.
var alertQuery = regexp.MustCompile(`^(?s)(.*\S)\s*(==|!=|>=|<=|>|<)\s*[0-9.eE+-]+\s*$`)

// ruleQueries returns each recording rule's name and each alert's query.
func ruleQueries(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	// The file keeps one rule per "- record:" or "- alert:" line, its
	// expression on one "expr:" line (checked here), so no YAML decoder.
	q := map[string]string{}
	var name string
	for _, line := range strings.Split(string(data), "\n") {
		l := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(l, "- record:"):
			name = strings.TrimSpace(strings.TrimPrefix(l, "- record:"))
			q["record "+name] = name // evaluated by Prometheus itself
			name = ""
		case strings.HasPrefix(l, "- alert:"):
			name = strings.TrimSpace(strings.TrimPrefix(l, "- alert:"))
		case strings.HasPrefix(l, "expr:") && name != "":
			expr := strings.TrimSpace(strings.TrimPrefix(l, "expr:"))
			m := alertQuery.FindStringSubmatch(expr)
			if m == nil {
				t.Fatalf("alert %s: expression %q is not `<query> <op> <number>` on one line", name, expr)
			}
			q["alert "+name] = m[1]
			name = ""
		}
	}
	if len(q) < 10 {
		t.Fatalf("only %d rules read from %s", len(q), rulesFile)
	}
	return q
}

// panelQueries returns every target expression of the Grafana dashboard,
// with Grafana's $__rate_interval replaced.
func panelQueries(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	q := map[string]string{}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			q["panel "+p.Title+" "+tg.RefID] = strings.ReplaceAll(tg.Expr, "$__rate_interval", "1m")
		}
	}
	if len(q) == 0 {
		t.Fatal("the dashboard has no panels")
	}
	return q
}

func TestPrometheusScrapesFleet(t *testing.T) {
	promBin := toolPath(t, "prometheus")
	rules, panels := ruleQueries(t), panelQueries(t)

	// A kvd with a Redis L4.
	rs := redistest.Start(t)
	kvdAdmin := "127.0.0.1:" + strconv.Itoa(testkit.FreePort(t))
	kp := start(t, "kvd", "kvd", "--socket", filepath.Join(t.TempDir(), "kvd.sock"), "--max-bytes", "16MiB",
		"--shared-arena-bytes", "8MiB", "--arena-mlock=false", "--admin-listen", kvdAdmin, "--l4-redis", rs.URL())
	kp.waitLog("kvd serving", 20*time.Second)

	// serve (kv-aware), two mixed sims and a prefill/decode pair.
	f := startServe(t, "--router-policy", "kv-aware")
	for i := range 2 {
		f.startWorker(fmt.Sprintf("sim%d", i))
	}
	for _, role := range []string{"prefill", "decode"} {
		p := start(t, "sim-"+role, "worker", "--engine", "sim", "--etcd-endpoints", f.etcd,
			"--lease-ttl", "5s", "--keepalive-interval", "1s", "--drain-timeout", "10s", "--stop-grace", "5s",
			"--disaggregation-allow-tcp", "--", "--model", "pd-model", "--time-scale", "0.05",
			"--pd-role", role, "--pd-protocol", "vllm-nixl")
		p.waitLog("worker registered", 60*time.Second)
	}
	f.waitWorkers("4 workers", 30*time.Second, func(m map[string]string) bool { return len(m) == 4 })
	var engines []string
	for _, w := range fleetJSON(t, f.base).Workers {
		u, err := url.Parse(w.URL)
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, strconv.Quote(u.Host))
	}

	dir := t.TempDir()
	abs, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: infera-serve
    static_configs: [{targets: [%q]}]
  - job_name: infera-workers
    static_configs: [{targets: [%s]}]
  - job_name: infera-kvd
    static_configs: [{targets: [%q]}]
`, abs, strings.TrimPrefix(f.base, "http://"), strings.Join(engines, ", "), kvdAdmin)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	promAddr := "127.0.0.1:" + strconv.Itoa(testkit.FreePort(t))
	prom := exec.Command(promBin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+promAddr, "--log.level=warn")
	prom.Stdout, prom.Stderr = io.Discard, io.Discard
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prom.Process.Kill(); _ = prom.Wait() })

	// Traffic: streams on the mixed model (TTFT, kv-aware picks with
	// repeated prefixes) and requests of the disaggregated one (PD legs).
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for i := range 12 {
		if status, _, body, err := chat(ctx, f.base, true, fmt.Sprintf("a shared system prefix for the cache, turn %d", i%3), 8); err != nil || status != 200 {
			t.Fatalf("chat: %d %v %s", status, err, body)
		}
	}
	for i := range 3 {
		if status, _, _, body := pdDo(t, f, fmt.Sprintf("a disaggregated question %d", i), false, 4); status != 200 {
			t.Fatalf("pd: %d %s", status, body)
		}
	}

	query := func(q string) (int, error) {
		resp, err := http.Get("http://" + promAddr + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var r struct {
			Status string `json:"status"`
			Error  string `json:"error"`
			Data   struct {
				Result []json.RawMessage `json:"result"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return 0, err
		}
		if r.Status != "success" {
			return 0, fmt.Errorf("query %q: %s", q, r.Error)
		}
		return len(r.Data.Result), nil
	}
	all := map[string]string{}
	for k, v := range rules {
		all[k] = v
	}
	for k, v := range panels {
		all[k] = v
	}
	// Two scrapes (for rate) and a rule evaluation after them; the loop
	// keeps a little traffic going so that rates see it.
	deadline := time.Now().Add(90 * time.Second)
	missing := map[string]string{}
	for {
		for k := range missing {
			delete(missing, k)
		}
		for name, q := range all {
			n, err := query(q)
			if err != nil {
				if strings.Contains(err.Error(), "connection refused") {
					missing[name] = q
					continue
				}
				t.Fatalf("%s: %v", name, err)
			}
			if n == 0 {
				missing[name] = q
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for name, q := range missing {
				t.Errorf("%s: no series for %s", name, q)
			}
			t.FailNow()
		}
		_, _, _, _ = chat(ctx, f.base, true, "a shared system prefix for the cache, turn 0", 4)
		time.Sleep(time.Second)
	}
	t.Logf("%d panel queries and %d rule expressions return series", len(panels), len(rules))
}
