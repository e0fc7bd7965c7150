package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
)

// startEtcdCluster runs an n-member etcd cluster of real etcd processes on
// loopback ports and waits until every member is healthy.
func startEtcdCluster(t *testing.T, n int) []*etcdServer {
	t.Helper()
	for try := 1; ; try++ {
		members := make([]*etcdServer, n)
		var cluster []string
		for i := range members {
			e := newEtcdServer(t)
			e.name = fmt.Sprintf("m%d", i)
			e.dir = filepath.Join(t.TempDir(), e.name)
			members[i] = e
			cluster = append(cluster, e.name+"="+e.peerURL())
		}
		for _, e := range members {
			e.cluster = strings.Join(cluster, ",")
			e.launch()
		}
		taken := false
		for _, e := range members {
			if e.awaitHealthy(60 * time.Second) {
				continue
			}
			// A member's port was taken before it bound it (see
			// etcdServer.start): the cluster starts again on other ports,
			// since its members name each other's peer URLs.
			if try == 3 || !e.portTaken() {
				t.Fatalf("etcd %s exited before it was healthy; log:\n%s", e.name, e.p.logText())
			}
			taken = true
			break
		}
		if !taken {
			return members
		}
		t.Logf("etcd cluster: a port picked for a member was taken before it bound it; starting the cluster again on others")
		for _, e := range members {
			e.p.stop(syscall.SIGKILL)
		}
	}
}

// etcdStatus is the part of etcd's /v3/maintenance/status answer (its JSON
// gateway writes uint64s as strings) that names the member and its leader.
type etcdStatus struct {
	Header struct {
		MemberID string `json:"member_id"`
	} `json:"header"`
	Leader string `json:"leader"`
}

// etcdLeader returns the index of the member that is the cluster's leader
// according to a member that answers, or -1.
func etcdLeader(members []*etcdServer) int {
	ids := make([]string, len(members))
	leader := ""
	for i, e := range members {
		resp, err := http.Post(e.endpoint()+"/v3/maintenance/status", "application/json", strings.NewReader("{}"))
		if err != nil {
			continue
		}
		var st etcdStatus
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			continue
		}
		ids[i] = st.Header.MemberID
		if st.Leader != "" && st.Leader != "0" {
			leader = st.Leader
		}
	}
	return slices.Index(ids, leader)
}

// kvFleetWorkers is the number of simulated workers of the fleet e2e
// (INFERA_E2E_KV_FLEET_WORKERS for a larger run on a bigger machine).
func kvFleetWorkers(t *testing.T) int {
	n := 5
	if v := os.Getenv("INFERA_E2E_KV_FLEET_WORKERS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 2 {
			t.Fatalf("INFERA_E2E_KV_FLEET_WORKERS=%q: want a count of at least 2", v)
		}
	}
	return n
}

// TestKVFleetReplicasEtcdLeaderKill (issue 37, acceptance 3, on real
// processes): four kv-aware serve replicas on one 3-member etcd cluster in
// front of simulated workers with KV events.
//   - Every replica lists the same workers and, once the events have landed,
//     holds the same cache view (blocks per worker); a long prompt placed
//     through one replica is routed to the same worker by every replica.
//   - A worker joining or leaving is seen by every replica; the time until
//     the last one sees it is logged (the issue asks ≤ 1 s; asserted
//     loosely here, the box is shared).
//   - Under load through all four replicas the etcd leader is SIGKILLed: no
//     request fails, the workers' leases survive (they stay active), and a
//     worker joining and one leaving after the kill are seen by every
//     replica.
//
// The pick's own time at this fleet size is logged from the replicas'
// infera_router_kv_pick_seconds histograms.
func TestKVFleetReplicasEtcdLeaderKill(t *testing.T) {
	const replicas = 4
	members := startEtcdCluster(t, 3)
	var eps []string
	for _, e := range members {
		eps = append(eps, e.endpoint())
	}
	// Each process lists the members starting at another one, so that
	// whichever member dies was the first endpoint of some replicas and
	// workers.
	endpoints := func(k int) string {
		return strings.Join(append(slices.Clone(eps[k%len(eps):]), eps[:k%len(eps)]...), ",")
	}

	var rs []*fleet
	for r := range replicas {
		f := startServe(t, "--log-level", "info", "--etcd-endpoints", endpoints(r),
			"--router-policy", "kv-aware", "--tokenizer", "bytes")
		f.etcd = endpoints(r)
		rs = append(rs, f)
	}

	started := 0
	worker := func(name string) (*proc, string) {
		started++
		args := workerArgs(endpoints(started), append([]string{"--kv-blocks", "2000"}, simTiming...)...)
		p, line := startRegistered(t, name, args...)
		id, _ := line["worker_id"].(string)
		if id == "" {
			t.Fatalf("worker registered line has no worker_id: %v", line)
		}
		return p, id
	}
	ids := map[string]bool{}
	procs := map[string]*proc{}
	for i := range kvFleetWorkers(t) {
		p, id := worker(fmt.Sprintf("fleet-worker-%d", i))
		ids[id], procs[id] = true, p
	}
	allActive := func(want map[string]bool) func(map[string]string) bool {
		return func(w map[string]string) bool {
			for id := range want {
				if w[id] != "active" {
					return false
				}
			}
			return true
		}
	}
	for i, f := range rs {
		f.waitWorkers(fmt.Sprintf("replica %d to list every worker", i), 30*time.Second, allActive(ids))
		f.waitPrecise(ids, 30*time.Second)
	}
	sameList(t, rs, "after start-up")

	// Same picks: four long prompts, each placed through another replica,
	// then asked again (with a new last line) through every replica.
	const prompts = 4
	holder := make([]string, prompts)
	prefix := func(k int) string {
		return strings.Repeat(fmt.Sprintf("conversation %d of the fleet test: the quick brown fox jumps over the lazy dog. ", k), 30)
	}
	for k := range prompts {
		status, w, body, err := chat(t.Context(), rs[k%replicas].base, false, prefix(k)+"first question", 4)
		if err != nil || status != http.StatusOK || w == "" {
			t.Fatalf("placing prompt %d: status %d worker %q err %v body %s", k, status, w, err, body)
		}
		holder[k] = w
	}
	sameCacheView(t, rs, ids)
	for k := range prompts {
		for r, f := range rs {
			status, w, body, err := chat(t.Context(), f.base, r%2 == 1, prefix(k)+fmt.Sprintf("follow-up %d", r), 4)
			if err != nil || status != http.StatusOK {
				t.Fatalf("prompt %d through replica %d: status %d err %v body %s", k, r, status, err, body)
			}
			if w != holder[k] {
				t.Errorf("prompt %d through replica %d went to %s, not to %s that holds its prefix", k, r, w, holder[k])
			}
		}
	}

	// Join and leave before the fault.
	late, lateID := worker("fleet-worker-late-0")
	join := seenBy(t, rs, func(w map[string]string) bool { return w[lateID] == "active" })
	procs[lateID], ids[lateID] = late, true
	leaving := holder[0]
	procs[leaving].signal(syscall.SIGTERM)
	leave := seenBy(t, rs, func(w map[string]string) bool { _, ok := w[leaving]; return !ok })
	delete(ids, leaving)
	t.Logf("before the fault: a join seen by every replica after %v, a leave after %v (from SIGTERM); lost quorum reads per replica %v", join, leave, lostQuorum(rs))

	// Load through every replica across the leader's death.
	var loads []*bgBench
	for r, f := range rs {
		loads = append(loads, startBench(t, "--url", f.base, "--model", "sim-model",
			"--workload", "shared-prefix", "--prefix-groups", "8", "--prefix-len", "150", "--suffix-len", "10",
			"--output-len", "8", "--requests", "0", "--duration", "20s", "--concurrency", "2",
			"--seed", strconv.Itoa(r+1), fmt.Sprintf("--stream=%t", r%2 == 0), "--timeout", "2m"))
	}
	time.Sleep(4 * time.Second) // pacing: let the load run before the fault
	lead := etcdLeader(members)
	if lead < 0 {
		t.Fatal("no etcd member names a leader")
	}
	var marks []int
	for _, f := range rs {
		marks = append(marks, logMark(f.serve))
	}
	members[lead].kill()
	killed := time.Now()
	for {
		if l := etcdLeader(members); l >= 0 && l != lead {
			t.Logf("SIGKILLed etcd leader %s; %s leads after %v", members[lead].name, members[l].name, time.Since(killed))
			break
		}
		if time.Since(killed) > 30*time.Second {
			t.Fatal("the surviving etcd members elected no leader within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	late1, late1ID := worker("fleet-worker-late-1")
	joins := seenByEach(t, rs, func(w map[string]string) bool { return w[late1ID] == "active" })
	procs[late1ID], ids[late1ID] = late1, true
	var gone string
	for id := range ids {
		if id != lateID && id != late1ID {
			gone = id
			break
		}
	}
	procs[gone].signal(syscall.SIGTERM)
	leaves := seenByEach(t, rs, func(w map[string]string) bool { _, ok := w[gone]; return !ok })
	delete(ids, gone)
	t.Logf("after the leader kill, per replica: a join seen after %v (from the worker's registration), a leave after %v (from SIGTERM, under load)", joins, leaves)
	checkAfterLeaderKill(t, rs, marks, joins, leaves)

	total := 0
	for r, b := range loads {
		rep, out, err := b.wait(t, 3*time.Minute)
		if err != nil || len(rep.Errors) != 0 || rep.Requests == 0 {
			t.Errorf("load through replica %d across the leader kill: %v; %d requests, errors %v; output:\n%s", r, err, rep.Requests, rep.Errors, out)
		}
		total += rep.Requests
	}
	t.Logf("load across the leader kill: %d requests through %d replicas, none failed", total, replicas)

	// The leases of the workers survived the leader (two lease TTLs later
	// every remaining worker is still active on every replica), and the
	// replicas agree.
	time.Sleep(10 * time.Second) // pacing: two lease TTLs of the workers
	for i, f := range rs {
		f.waitWorkers(fmt.Sprintf("replica %d to list the fleet after the fault", i), 30*time.Second, func(w map[string]string) bool {
			return allActive(ids)(w) && len(w) == len(ids)
		})
	}
	sameList(t, rs, "after the leader kill")
	sameCacheView(t, rs, ids)

	for r, f := range rs {
		p50, p99, n := pickQuantiles(scrape(t, f.base+"/metrics"))
		t.Logf("replica %d: %d kv-aware picks, p50 ≤ %g ms, p99 ≤ %g ms (histogram bucket bounds)", r, int(n), 1e3*p50, 1e3*p99)
		if n == 0 {
			t.Errorf("replica %d observed no kv-aware pick", r)
		}
	}
}

// seenBy polls every replica until cond holds on each one's worker list
// and returns how long the last one took.
func seenBy(t *testing.T, rs []*fleet, cond func(map[string]string) bool) time.Duration {
	t.Helper()
	return slices.Max(seenByEach(t, rs, cond))
}

// seenByEach polls every replica until cond holds on each one's worker
// list and returns how long each took (to within the 10 ms poll).
func seenByEach(t *testing.T, rs []*fleet, cond func(map[string]string) bool) []time.Duration {
	t.Helper()
	began := time.Now()
	took := make([]time.Duration, len(rs))
	for left := len(rs); left > 0; time.Sleep(10 * time.Millisecond) {
		if time.Since(began) > 15*time.Second {
			t.Fatalf("not every replica saw the change within 15 s (0: not seen): %v", took)
		}
		for i, f := range rs {
			if took[i] != 0 {
				continue
			}
			if w, err := f.workers(); err == nil && cond(w) {
				took[i] = max(time.Since(began), time.Nanosecond)
				left--
			}
		}
	}
	return took
}

// afterLeaderKill bounds the time until every replica sees a join or a
// leave after the etcd leader was killed, for a replica that kept quorum
// reads throughout (the issue asks 1 s; this shared box gets slack, and the
// failure it catches is a leader change treated as an outage, whose
// removals wait --etcd-outage-grace, 10 s).
const afterLeaderKill = 5 * time.Second

// logMark returns how many lines p has logged so far, for logSince.
func logMark(p *proc) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.raw)
}

// logSince returns the lines p logged after mark.
func logSince(p *proc, mark int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.raw[mark:], "\n")
}

// lostQuorum counts, per replica, the times its fleet watcher found that
// etcd could not serve a linearizable read (two probes in a row, or a
// list, failed): the outages after which removals are held at the same
// leader term.
func lostQuorum(rs []*fleet) []int {
	var n []int
	for _, f := range rs {
		n = append(n, strings.Count(f.serve.logText(), "etcd unreachable: keeping the last"))
	}
	return n
}

// checkAfterLeaderKill checks what each replica's fleet watcher did after
// the leader kill (its log from marks[r]): it never re-listed (a broken
// watch resumes on another member), and unless its probe found no quorum
// at the same leader term — an outage by the watcher's rule, whose
// removals are held by design — it held no removal and saw the join and
// the leave within afterLeaderKill.
func checkAfterLeaderKill(t *testing.T, rs []*fleet, marks []int, join, leave []time.Duration) {
	t.Helper()
	for r, f := range rs {
		log := logSince(f.serve, marks[r])
		interrupted := strings.Count(log, "etcd watch interrupted, resuming")
		outages := strings.Count(log, "etcd unreachable: keeping the last")
		relists := strings.Count(log, "re-listed")
		held := grepLines(log, "kept while it may re-register")
		t.Logf("replica %d after the kill: %d watch interruptions, %d lost quorum reads, %d re-lists, %d held removals",
			r, interrupted, outages, relists, strings.Count(held, "\n")+min(len(held), 1))
		if relists > 0 {
			t.Errorf("replica %d re-listed after the leader kill:\n%s", r, grepLines(log, "re-list", "etcd"))
		}
		if outages > 0 {
			continue
		}
		if held != "" {
			t.Errorf("replica %d held a removal across the leader change:\n%s", r, held)
		}
		if join[r] > afterLeaderKill || leave[r] > afterLeaderKill {
			t.Errorf("replica %d saw the join after the leader kill after %v and the leave after %v, want within %v", r, join[r], leave[r], afterLeaderKill)
		}
	}
}

// sameList fails the test unless every replica lists the same workers with
// the same status.
func sameList(t *testing.T, rs []*fleet, when string) {
	t.Helper()
	first, err := rs[0].workers()
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range rs[1:] {
		w, err := f.workers()
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(w) != fmt.Sprint(first) {
			t.Errorf("%s: replica %d lists %v, replica 0 %v", when, i+1, w, first)
		}
	}
}

// sameCacheView waits until every replica reports the same number of
// indexed blocks for every worker (the KV events have reached them all)
// and fails the test if they do not converge.
func sameCacheView(t *testing.T, rs []*fleet, ids map[string]bool) {
	t.Helper()
	var last []string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		last = last[:0]
		agree := true
		for id := range ids {
			var counts []int
			for _, f := range rs {
				v, err := f.cacheView(id)
				if err != nil {
					counts = append(counts, -1)
					continue
				}
				counts = append(counts, v.BlockCount)
			}
			last = append(last, fmt.Sprintf("%s: %v", id, counts))
			if slices.Min(counts) < 0 || slices.Min(counts) != slices.Max(counts) {
				agree = false
			}
		}
		if agree {
			return
		}
	}
	t.Errorf("the replicas' cache views did not converge within 30 s (blocks per worker, per replica):\n%s", strings.Join(last, "\n"))
}

// pickQuantiles reads infera_router_kv_pick_seconds from a Prometheus
// exposition and returns the upper bounds (seconds; +Inf above the last
// bucket) of the buckets holding the p50 and the p99, and the count.
func pickQuantiles(text string) (p50, p99, n float64) {
	type bucket struct{ le, cum float64 }
	var bs []bucket
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, `infera_router_kv_pick_seconds_bucket{le="`)
		if !ok {
			continue
		}
		le, val, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		b := bucket{le: math.Inf(1)}
		if le != "+Inf" {
			b.le, _ = strconv.ParseFloat(le, 64)
		}
		b.cum, _ = strconv.ParseFloat(strings.TrimSpace(val), 64)
		bs = append(bs, b)
	}
	if len(bs) == 0 {
		return 0, 0, 0
	}
	n = bs[len(bs)-1].cum
	q := func(f float64) float64 {
		for _, b := range bs {
			if b.cum >= f*n {
				return b.le
			}
		}
		return math.Inf(1)
	}
	return q(0.5), q(0.99), n
}

// TestKVFleet512Replicas (issue 37, acceptance 3 at fleet scale): four
// kv-aware serve replicas on a 3-member etcd cluster of real processes in
// front of 512 workers. The workers are an in-process fleet of records
// (registrars with their own leases, as `infera worker` keeps them) over
// ten real simulator processes with KV events: worker i is
// 127.0.0.<1+i/10>:<port of sim i%10>, its event stream and replay socket
// that sim's (the sims listen on every loopback address), so every replica keeps 512
// event streams and 512 pick targets.
//   - Every replica lists all 512; a join and a leave among them are seen by
//     every replica (the time until each replica's routing view took them,
//     from its log, is logged and, after the leader kill, checked; the issue
//     asks ≤ 1 s).
//   - Under load through every replica, the etcd leader is SIGKILLed: no
//     request fails and no worker's lease is lost.
//   - Logged: the replicas' pick p50/p99 (infera_router_kv_pick_seconds) and
//     resident memory per worker (VmRSS before and after the fleet
//     registered, over the worker count).
//
// INFERA_E2E_KV_FLEET_RECORDS changes the fleet size.
func TestKVFleet512Replicas(t *testing.T) {
	// Ten sims: each holds a tenth of the records' event streams from each
	// replica, 4 × 52 = 208 connections, within a sim's 256 per socket.
	const replicas, sims = 4, 10
	workers := 512
	if v := os.Getenv("INFERA_E2E_KV_FLEET_RECORDS"); v != "" {
		var err error
		if workers, err = strconv.Atoi(v); err != nil || workers < sims || workers > 60*sims {
			t.Fatalf("INFERA_E2E_KV_FLEET_RECORDS=%q: want %d..%d", v, sims, 60*sims)
		}
	}
	members := startEtcdCluster(t, 3)
	var eps []string
	for _, e := range members {
		eps = append(eps, e.endpoint())
	}
	endpoints := func(k int) string {
		return strings.Join(append(slices.Clone(eps[k%len(eps):]), eps[:k%len(eps)]...), ",")
	}

	type simAddr struct{ port, events, replay string }
	var simAddrs []simAddr
	for s := range sims {
		p := start(t, fmt.Sprintf("fleet-sim-%d", s), append([]string{"sim", "--model", "sim-model",
			"--host", "0.0.0.0", "--port", "0", "--kv-events-endpoint", "tcp://*:0", "--kv-events-replay-endpoint", "tcp://*:0",
			"--kv-blocks", "2000"}, simTiming...)...)
		line := p.waitLog("sim listening", 60*time.Second)
		addr, _ := line["addr"].(string)
		ev, _ := line["kv_events_endpoint"].(string)
		replay, _ := line["kv_events_replay_endpoint"].(string)
		_, port, err := net.SplitHostPort(addr)
		evPort, replayPort := ev[strings.LastIndexByte(ev, ':')+1:], replay[strings.LastIndexByte(replay, ':')+1:]
		if err != nil || evPort == "" || replayPort == "" {
			t.Fatalf("sim listening line without addr or KV event endpoints: %v", line)
		}
		simAddrs = append(simAddrs, simAddr{port, evPort, replayPort})
	}

	var rs []*fleet
	for r := range replicas {
		f := startServe(t, "--log-level", "info", "--etcd-endpoints", endpoints(r),
			"--router-policy", "kv-aware", "--tokenizer", "bytes")
		f.etcd = endpoints(r)
		rs = append(rs, f)
	}
	rss := func() []float64 {
		var out []float64
		for _, f := range rs {
			out = append(out, rssBytes(f.serve.cmd.Process.Pid))
		}
		return out
	}
	rss0 := rss()

	cli, err := discovery.NewClient(config.Etcd{Endpoints: eps, Prefix: "/infera/workers/", DialTimeout: 5 * time.Second}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		_ = cli.Close()
	})
	id := func(i int) string {
		return fmt.Sprintf("127.0.0.%d:%s", 1+i/sims, simAddrs[i%sims].port)
	}
	bs := 16
	register := func(i int) *discovery.Registrar {
		host := fmt.Sprintf("127.0.0.%d", 1+i/sims)
		ev := "tcp://" + host + ":" + simAddrs[i%sims].events
		replay := "tcp://" + host + ":" + simAddrs[i%sims].replay
		rec := discovery.Record{WorkerID: id(i), URL: "http://" + id(i), ModelName: "sim-model", Engine: discovery.EngineSim,
			DisaggMode: discovery.DisaggMixed, DPSize: 1, RequestTransport: discovery.TransportHTTP, Status: discovery.StatusActive,
			KVEventsEndpoint: &ev, KVEventsReplayEndpoint: &replay, KVBlockSize: &bs}
		reg := discovery.NewRegistrar(cli, "/infera/workers/", rec,
			discovery.RegistrarOptions{TTL: 10 * time.Second, KeepAliveInterval: 2 * time.Second}, zerolog.Nop())
		// As a worker does (engines' register): a registration that
		// fails, here just after the etcd leader was killed under load on
		// a loaded box (a grant past the TTL bound), is tried again.
		for tried := time.Now(); ; {
			err := reg.Register(ctx)
			if err == nil {
				break
			}
			if time.Since(tried) > time.Minute {
				t.Fatal(err)
			}
			t.Logf("%v; trying again, as a worker does", err)
			time.Sleep(250 * time.Millisecond) // pacing: a worker's first retry pause
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = reg.Run(ctx)
		}()
		return reg
	}
	began := time.Now()
	regs := make([]*discovery.Registrar, workers)
	for i := range workers {
		regs[i] = register(i)
	}
	registered := time.Since(began)
	listed := seenBy(t, rs, func(w map[string]string) bool { return len(w) == workers })
	t.Logf("%d workers registered in %v; every replica listed them %v later", workers, registered, listed)
	// The event streams connect (precise mode) before the measurements.
	all := map[string]bool{}
	for i := range workers {
		all[id(i)] = true
	}
	for _, f := range rs {
		f.waitPrecise(all, 60*time.Second)
	}
	rss1 := rss()
	for r := range rs {
		t.Logf("replica %d: resident memory %.1f MB with no worker, %.1f MB with %d (event streams connected, nothing cached yet): %.1f KB per worker",
			r, rss0[r]/1e6, rss1[r]/1e6, workers, (rss1[r]-rss0[r])/float64(workers)/1e3)
	}

	// joinLeave registers one more worker, then revokes its lease, and
	// returns per replica when its routing view took each change, from the
	// replica's own log, after the registration (lease grant and put) and
	// the revoke returned: from the commits, as near as the test knows them
	// (a replica may be quicker than the answer to the writer: negative).
	// How long etcd took to answer the writer is logged beside: on this
	// shared box, just after an election, it is seconds at times. Then each
	// replica's /v1/workers must show the change. Those polls are not the
	// measure: each is a 512-worker body decoded by this race-instrumented
	// process, which under load takes a second or more, so polling the
	// replicas in turn measured this process rather than the replicas.
	joinLeave := func(when string) (join, leave []time.Duration) {
		t.Helper()
		extra := workers // the next address
		began := time.Now()
		reg := register(extra)
		joined := time.Now()
		for _, f := range rs {
			join = append(join, viewChangedAt(t, f.serve, "worker added", id(extra), began).Sub(joined))
		}
		for r, f := range rs {
			f.waitWorkers(fmt.Sprintf("replica %d to list %s active", r, id(extra)), time.Minute,
				func(w map[string]string) bool { return w[id(extra)] == "active" })
		}
		revoking := time.Now()
		if err := reg.Revoke(ctx); err != nil {
			t.Fatal(err)
		}
		left := time.Now()
		for _, f := range rs {
			leave = append(leave, viewChangedAt(t, f.serve, "worker removed", id(extra), revoking).Sub(left))
		}
		for r, f := range rs {
			f.waitWorkers(fmt.Sprintf("replica %d to drop %s", r, id(extra)), time.Minute,
				func(w map[string]string) bool { _, ok := w[id(extra)]; return !ok })
		}
		t.Logf("%s: with %d workers, per replica: a join in the routing view %v after the registration returned (it took %v: lease grant and put), a leave %v after the revoke returned (it took %v)",
			when, workers, join, joined.Sub(began), leave, left.Sub(revoking))
		return join, leave
	}
	joinLeave("idle")
	t.Logf("idle: lost quorum reads per replica %v", lostQuorum(rs))

	var loads []*bgBench
	for r, f := range rs {
		loads = append(loads, startBench(t, "--url", f.base, "--model", "sim-model",
			"--workload", "shared-prefix", "--prefix-groups", "16", "--prefix-len", "150", "--suffix-len", "10",
			"--output-len", "8", "--requests", "0", "--duration", "16s", "--concurrency", "2",
			"--seed", strconv.Itoa(r+1), fmt.Sprintf("--stream=%t", r%2 == 0), "--timeout", "2m"))
	}
	time.Sleep(3 * time.Second) // pacing: let the load run before the fault
	lead := etcdLeader(members)
	if lead < 0 {
		t.Fatal("no etcd member names a leader")
	}
	var marks []int
	for _, f := range rs {
		marks = append(marks, logMark(f.serve))
	}
	members[lead].kill()
	killed := time.Now()
	for {
		if l := etcdLeader(members); l >= 0 && l != lead {
			t.Logf("SIGKILLed etcd leader %s under load; %s leads after %v", members[lead].name, members[l].name, time.Since(killed))
			break
		}
		if time.Since(killed) > 30*time.Second {
			t.Fatal("the surviving etcd members elected no leader within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	joins, leaves := joinLeave("after the leader kill, under load")
	checkAfterLeaderKill(t, rs, marks, joins, leaves)
	total := 0
	for r, b := range loads {
		rep, out, err := b.wait(t, 3*time.Minute)
		if err != nil || len(rep.Errors) != 0 || rep.Requests == 0 {
			t.Errorf("load through replica %d across the leader kill: %v; %d requests, errors %v; output:\n%s", r, err, rep.Requests, rep.Errors, out)
		}
		total += rep.Requests
	}
	t.Logf("load across the leader kill: %d requests through %d replicas, none failed", total, replicas)

	// No lease was lost: one TTL later every replica still lists the whole
	// fleet, active.
	time.Sleep(10 * time.Second) // pacing: one lease TTL of the records
	for r, f := range rs {
		f.waitWorkers(fmt.Sprintf("replica %d to list all %d workers after the fault", r, workers), 30*time.Second, func(w map[string]string) bool {
			return allActiveIDs(w, all) && len(w) == workers
		})
	}
	sameList(t, rs, "after the leader kill")
	for r, f := range rs {
		p50, p99, n := pickQuantiles(scrape(t, f.base+"/metrics"))
		t.Logf("replica %d: %d kv-aware picks over %d workers, p50 ≤ %g ms, p99 ≤ %g ms (histogram bucket bounds)", r, int(n), workers, 1e3*p50, 1e3*p99)
		if n == 0 {
			t.Errorf("replica %d observed no kv-aware pick", r)
		}
	}
}

// viewChangedAt returns when p, a serve replica, logged msg ("worker
// added", "worker removed") for worker id at or after since: the moment its
// router took the change into the view it routes with. It waits a while for
// the line, which p's stderr may not have delivered yet.
func viewChangedAt(t *testing.T, p *proc, msg, id string, since time.Time) time.Time {
	t.Helper()
	// 30 s: far above what is checked, so that a slow replica's figure is
	// reported rather than cut off.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		p.mu.Lock()
		for i := len(p.lines) - 1; i >= 0; i-- {
			l := p.lines[i]
			if l["message"] != msg || l["worker_id"] != id {
				continue
			}
			stamp, _ := l["time"].(string)
			at, err := time.Parse(time.RFC3339Nano, stamp)
			if err != nil {
				p.mu.Unlock()
				t.Fatalf("%s logged %q for %s without a valid time: %v", p.name, msg, id, l)
			}
			if !at.Before(since) {
				p.mu.Unlock()
				return at
			}
			break // the latest such line is older: wait for the new one
		}
		p.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q for %s after %s", p.name, msg, id, since.Format(time.RFC3339Nano))
		}
	}
}

// rssBytes is a process's resident memory (VmRSS), 0 if unreadable.
func rssBytes(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb * 1024
		}
	}
	return 0
}

func allActiveIDs(w map[string]string, ids map[string]bool) bool {
	for id := range ids {
		if w[id] != "active" {
			return false
		}
	}
	return true
}
