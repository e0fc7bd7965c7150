package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/discovery/etcdtest"
	"github.com/infera/infera/internal/testkit"
	"github.com/infera/infera/kvd"
	"github.com/infera/infera/kvd/peer"
	"github.com/infera/infera/transport"
)

// TestKVDPeerPullRouted (issue 32, acceptance 2): the router directs a
// kvd-to-kvd pull. Two "hosts" on loopback, G (127.0.0.2) and H
// (127.0.0.3), each an `infera kvd` with a peer listener on its host's
// address, registered in the kvd registry of the fleet's etcd (kvd
// --etcd-endpoints), and an `infera worker --engine sim` on the same
// address using it (--kvd-write-through: the sim stores what it computes,
// as vLLM's kvd connector does). No worker record names a kvd: the router
// finds each worker's kvd in the registry by the host of its id, and the
// kvds serve their peer listeners only to registered kvds (and to the
// router's address, --peer-allow). A prompt's prefix is computed on host
// G; while G is busy (two long streams in flight), the next request for
// it goes to host H. Without a kvd registered for H's host (the worker on
// 127.0.0.4) the router cannot direct a pull and H recomputes the prefix;
// with it the router first hints H's kvd, naming G's registered kvd as the
// source, H's kvd pulls the 10 blocks before the sim asks, and the sim
// loads them: 160 cached tokens and a lower modelled TTFT (the sim's own
// step model, not wall time). The summary line ("kvd-peer routed") is
// what docs/performance.md records.
func TestKVDPeerPullRouted(t *testing.T) {
	dir := t.TempDir()
	const secret = "fleet-secret"
	type host struct {
		ip, sock, admin, peer string
	}
	// The block cost with a low overlap weight, so that a busy G loses the
	// prompt it holds to an idle H: what this test needs is the pull, not
	// the pick. (Under --kv-cost ttft, serve's default, the estimate kept
	// the prompt on G in session 26's run: it judged G's two decoding
	// streams a shorter wait than H's prefill of the 20 blocks again.)
	f := startServe(t, "--router-policy", "kv-aware", "--kv-cost", "blocks", "--tokenizer", "bytes", "--kv-overlap-weight", "1",
		"--kvd-peer-hints", "--kvd-peer-secret", secret, "--kvd-peer-wait", "3s")
	startKVD := func(name, ip string) host {
		port := testkit.FreePortPair(t)
		h := host{ip: ip, sock: filepath.Join(dir, name+".sock"), admin: "127.0.0.1:" + strconv.Itoa(testkit.FreePort(t)),
			peer: ip + ":" + strconv.Itoa(port)}
		p := start(t, name, "kvd", "--socket", h.sock, "--max-bytes", "32MiB", "--shared-arena-bytes", "16MiB",
			"--arena-slot-bytes", "64KiB", "--arena-mlock=false", "--admin-listen", h.admin,
			"--peer-listen", h.peer, "--peer-secret", secret, "--peer-allow", "127.0.0.1/32",
			"--etcd-endpoints", f.etcd, "--lease-ttl", "5s", "--keepalive-interval", "1s")
		line := p.waitLog("kvd registered", 20*time.Second)
		if line["host"] != ip || line["peer"] != h.peer || line["transport"] != "tcp" {
			t.Fatalf("%s registered %v", name, line)
		}
		p.waitLog("kvd serving", 20*time.Second)
		return h
	}
	g, h := startKVD("kvd-g", "127.0.0.2"), startKVD("kvd-h", "127.0.0.3")

	startWorker := func(name string, kv host, ip string, simArgs ...string) (*proc, string, string) {
		args := []string{"worker", "--engine", "sim", "--etcd-endpoints", f.etcd,
			"--lease-ttl", "5s", "--keepalive-interval", "1s", "--drain-timeout", "5s", "--stop-grace", "5s",
			"--kvd-socket", kv.sock}
		args = append(append(args, "--", "--host", ip, "--model", "sim-model", "--max-model-len", "8192", "--kvd-block-bytes", "4096",
			"--kvd-write-through"), simArgs...)
		p, line := startRegistered(t, name, args...)
		id, _ := line["worker_id"].(string)
		if !strings.HasPrefix(id, ip+":") {
			t.Fatalf("worker registered line has worker_id %q, want one on %s: %v", id, ip, line)
		}
		return p, id, "http://" + id
	}
	waitListed := func(id string) {
		t.Helper()
		f.waitWorkers(id+" listed", 30*time.Second, func(ws map[string]string) bool { _, ok := ws[id]; return ok })
	}

	client := &http.Client{Timeout: 60 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	getText := func(url string) string {
		t.Helper()
		resp, err := client.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	metric := func(url, name string, filters ...string) float64 {
		return metricValue(getText(url+"/metrics"), name, filters...)
	}
	// ask sends a one-token completion through the router and returns the
	// worker that served it and its cached tokens.
	ask := func(prompt string) (string, int) {
		t.Helper()
		body := fmt.Sprintf(`{"model":"sim-model","prompt":%q,"max_tokens":1}`, prompt)
		resp, err := client.Post(f.base+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("completion: %d %s", resp.StatusCode, b)
		}
		var r struct {
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("answer %s: %v", b, err)
		}
		return resp.Header.Get("X-Infera-Worker"), r.Usage.Details.Cached
	}
	// A prompt of 10 full 16-token blocks and one token.
	prompt := func(c byte) string { return strings.Repeat(fmt.Sprintf("%c-shared-prefix:", c), 12)[:161] }
	p1, p2 := prompt('A'), prompt('B')

	// Host G computes both prefixes; its KV events tell the router.
	_, gID, _ := startWorker("worker-g", g, g.ip, "--step-overhead-ms", "50")
	waitListed(gID)
	for _, p := range []string{p1, p2} {
		if w, c := ask(p); w != gID || c != 0 {
			t.Fatalf("first ask went to %s with %d cached, want %s and 0", w, c, gID)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, err := f.cacheView(gID)
		if err == nil && v.BlockCount >= 20 && v.Mode == "precise" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("router's view of G: %+v %v", v, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// G gets busy: two long streams whose 20-block prompts are in flight.
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	started := make(chan string, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, _, _ = streamWithStart(ctx, f.base, strings.Repeat(fmt.Sprintf("busy stream %d keeps G occupied. ", i), 11), 4000, started)
		}()
	}
	for range 2 {
		select {
		case w := <-started:
			if w != gID {
				t.Fatalf("stream went to %s, want G %s", w, gID)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("streams did not start")
		}
	}

	// measure sends p to H (whose sim is at url) and returns its cached
	// tokens, modelled TTFT and the wall-clock time of the request.
	measure := func(p, hID, hURL string) (int, float64, time.Duration) {
		t.Helper()
		before := metric(hURL, "infera_sim_model_ttft_seconds_total")
		begin := time.Now()
		w, cached := ask(p)
		wall := time.Since(begin)
		if w != hID {
			t.Fatalf("request went to %s, want H %s (G %s is busy)", w, hID, gID)
		}
		for deadline := time.Now().Add(20 * time.Second); metric(hURL, "infera_sim_first_tokens_total") != 1; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("H's first-token counter did not settle")
			}
		}
		return cached, metric(hURL, "infera_sim_model_ttft_seconds_total") - before, wall
	}

	// Without the pull: no kvd is registered for the host of H's worker
	// (127.0.0.4; it still uses H's kvd), the router cannot direct one,
	// and H recomputes p2.
	hp, hID, hURL := startWorker("worker-h-plain", h, "127.0.0.4")
	waitListed(hID)
	cachedWithout, ttftWithout, wallWithout := measure(p2, hID, hURL)
	hp.stop(syscall.SIGTERM)
	f.waitWorkers(hID+" gone", 30*time.Second, func(ws map[string]string) bool { _, ok := ws[hID]; return !ok })

	// With it: H's worker on H's host, where the registry names H's kvd;
	// the router hints it to pull p1's blocks from G's registered kvd and
	// waits for the pull; H's sim loads them.
	_, hID, hURL = startWorker("worker-h", h, h.ip)
	waitListed(hID)
	cachedWith, ttftWith, wallWith := measure(p1, hID, hURL)

	routerMetrics := getText(f.base + "/metrics")
	pulledHints := metricValue(routerMetrics, "infera_router_kvd_peer_hints_total", `outcome="pulled"`)
	otherHints := metricValue(routerMetrics, "infera_router_kvd_peer_hints_total") - pulledHints
	hMetrics := scrape(t, "http://"+h.admin+"/metrics")
	kvdPulled := metricValue(hMetrics, "infera_kvd_peer_pulled_blocks_total")
	useful := metricValue(hMetrics, "infera_kvd_prefetch_total", `stage="useful"`)
	simLoaded := metric(hURL, "infera_sim_kvd_hit_blocks_total")
	t.Logf("kvd-peer routed: modelled TTFT %.4fs with the pull (%d cached tokens), %.4fs without (%d cached), %.2fx; wall %v with, %v without (not asserted); hints pulled %v other %v, blocks pulled by H's kvd %v, useful %v, loaded by H's sim %v",
		ttftWith, cachedWith, ttftWithout, cachedWithout, ttftWithout/ttftWith, wallWith.Round(time.Millisecond), wallWithout.Round(time.Millisecond),
		pulledHints, otherHints, kvdPulled, useful, simLoaded)
	if cachedWithout != 0 {
		t.Fatalf("without the pull H had %d cached tokens, want 0", cachedWithout)
	}
	// useful: H's sim read every pulled block, each after its pull
	// finished (a get before it would have been a miss, not a hit).
	if pulledHints != 1 || otherHints != 0 || kvdPulled != 10 || useful != 10 || simLoaded != 10 || cachedWith != 160 {
		t.Fatalf("with the pull: hints pulled %v (others %v), H's kvd pulled %v (useful %v), H's sim loaded %v, cached %d; want 1, 0, 10 (10), 10, 160",
			pulledHints, otherHints, kvdPulled, useful, simLoaded, cachedWith)
	}
	if !(ttftWith < ttftWithout) {
		t.Fatalf("modelled TTFT %vs with the pull, %vs without", ttftWith, ttftWithout)
	}
	// The hint named H's and G's kvds as the registry has them.
	directed := f.serve.waitLog("kvd peer pull directed", 10*time.Second)
	if directed["kvd"] != h.peer || directed["source"] != g.peer {
		t.Fatalf("hint sent to %v naming source %v, want %s and %s", directed["kvd"], directed["source"], h.peer, g.peer)
	}
	// Nothing was refused: H's kvd pulled from its registered address.
	if n := metricValue(scrape(t, "http://"+g.admin+"/metrics"), "infera_kvd_peer_connections_refused_total"); n != 0 {
		t.Fatalf("G's kvd refused %v connections", n)
	}
}

// TestKVDPeerUnregisteredRefused: a kvd registered in the kvd registry
// (G, 127.0.0.2) serves its peer listener only to registered kvds. A kvd
// that is not registered (X, 127.0.0.4, no --etcd-endpoints), hinted to
// pull a block from G, is refused before any request: G counts and logs
// the refusal, X's pull fails and it holds nothing. A registered kvd (Y,
// 127.0.0.5) hinted the same pulls the block.
func TestKVDPeerUnregisteredRefused(t *testing.T) {
	dir := t.TempDir()
	const secret = "fleet-secret"
	etcd := etcdtest.Start(t)[0]
	type host struct {
		proc              *proc
		sock, admin, peer string
	}
	startKVD := func(name, ip string, extra ...string) host {
		port := testkit.FreePortPair(t)
		h := host{sock: filepath.Join(dir, name+".sock"), admin: "127.0.0.1:" + strconv.Itoa(testkit.FreePort(t)), peer: ip + ":" + strconv.Itoa(port)}
		h.proc = start(t, name, append([]string{"kvd", "--socket", h.sock, "--max-bytes", "32MiB", "--shared-arena-bytes", "16MiB",
			"--arena-slot-bytes", "64KiB", "--arena-mlock=false", "--admin-listen", h.admin, "--peer-listen", h.peer, "--peer-secret", secret,
			"--log-level", "debug"}, extra...)...)
		h.proc.waitLog("kvd serving", 20*time.Second)
		return h
	}
	registered := []string{"--etcd-endpoints", etcd, "--lease-ttl", "5s", "--keepalive-interval", "1s"}
	g := startKVD("kvd-g", "127.0.0.2", registered...)
	x := startKVD("kvd-x", "127.0.0.4")
	// The test's hints come from 127.0.0.1, as a router's would.
	y := startKVD("kvd-y", "127.0.0.5", append(registered, "--peer-allow", "127.0.0.1/32")...)

	ns := kvd.Namespace{Model: "m", CompatKey: "c"}
	cl, err := kvd.Dial(t.Context(), g.sock, kvd.ClientOptions{ClientID: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	block := []byte(strings.Repeat("registered bytes ", 200))
	if ok, reason, err := cl.Set(ns, []byte("k"), block, kvd.SetOptions{Retention: "short"}); err != nil || !ok {
		t.Fatalf("set on G: %v %s", err, reason)
	}
	hinter := peer.NewHinter([]byte(secret))
	defer hinter.Close()
	hint := func(to host) peer.HintReply {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		r, err := hinter.Send(ctx, to.peer, peer.Hint{Model: []byte(ns.Model), Compat: []byte(ns.CompatKey), Source: g.peer,
			Keys: [][]byte{[]byte("k")}, Deadline: 30 * time.Second, Wait: 5 * time.Second})
		if err != nil {
			t.Fatalf("hint to %s: %v", to.peer, err)
		}
		return r
	}

	if r := hint(x); !r.Done || r.Pulled != 0 {
		t.Fatalf("unregistered X: %+v, want done with nothing pulled", r)
	}
	g.proc.waitLog("kvd peer: connection refused: source is not a registered kvd's host nor in --peer-allow", 10*time.Second)
	if n := metricValue(scrape(t, "http://"+g.admin+"/metrics"), "infera_kvd_peer_connections_refused_total", `reason="unregistered"`); n < 1 {
		t.Fatalf("G counted %v unregistered refusals", n)
	}
	if n := metricValue(scrape(t, "http://"+x.admin+"/metrics"), "infera_kvd_peer_pulls_failed_total"); n < 1 {
		t.Fatalf("X's failed pulls %v", n)
	}
	// Nor can an unregistered host read G's arena over its byte port (the
	// one after the peer listener) without asking where blocks lie.
	refusedBefore := metricValue(scrape(t, "http://"+g.admin+"/metrics"), "infera_kvd_peer_connections_refused_total", `reason="unregistered"`)
	eng, err := transport.NewTCP(transport.TCPConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	scratch, err := eng.Register("scratch", make([]byte, 64))
	if err != nil {
		t.Fatal(err)
	}
	gHost, gPort, _ := net.SplitHostPort(g.peer)
	gp, _ := strconv.Atoi(gPort)
	arena := transport.Desc{Peer: net.JoinHostPort(gHost, strconv.Itoa(gp+1)), Name: peer.RegionName, Len: 16 << 20}
	if err := transport.Transfer(t.Context(), eng, []transport.Op{{Kind: transport.Read, Local: scratch, Remote: arena, Len: 64}}); err == nil {
		t.Fatal("an unregistered host read G's arena over its byte port")
	}
	if n := metricValue(scrape(t, "http://"+g.admin+"/metrics"), "infera_kvd_peer_connections_refused_total", `reason="unregistered"`); n <= refusedBefore {
		t.Fatalf("G's byte port refusal not counted (%v, before %v)", n, refusedBefore)
	}
	xc, err := kvd.Dial(t.Context(), x.sock, kvd.ClientOptions{ClientID: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	defer xc.Close()
	if _, _, ok, err := xc.Get(ns, []byte("k"), nil); err != nil || ok {
		t.Fatalf("X holds the block after a refused pull: %v %v", ok, err)
	}

	// Y is registered: G admits it once its registry view lists Y.
	deadline := time.Now().Add(20 * time.Second)
	for hint(y).Pulled != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("registered Y never pulled from G; G's log:\n%s", g.proc.logText())
		}
		time.Sleep(200 * time.Millisecond)
	}
	yc, err := kvd.Dial(t.Context(), y.sock, kvd.ClientOptions{ClientID: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	defer yc.Close()
	if v, _, ok, err := yc.Get(ns, []byte("k"), nil); err != nil || !ok || string(v) != string(block) {
		t.Fatalf("Y's pulled block: ok %v err %v, %d bytes", ok, err, len(v))
	}
}
