package router

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/router/upstream"
)

// Worker is one engine endpoint as the router sees it. A Worker lives as long
// as its worker_id keeps the same URL across fleet snapshots, so its
// connection pool, in-flight count and policy state survive status changes
// (active → draining → active) and unrelated fleet updates.
type Worker struct {
	id string
	// idHeader is id as the X-Infera-Worker header's value (SetCanonical);
	// headLine its line in a head the relay writes (relayhead.go).
	idHeader []byte
	headLine []byte
	url      string
	rec      atomic.Pointer[discovery.Record]
	pool     *upstream.Pool // its connections (newPool)
	// host and path are each proxied route's upstream request line and
	// Host header in origin form, as fasthttp's parse of the route's full
	// URI gives them (originForm): the relay sets both as they are, so no
	// request parses a URI on its way out (upstream.Exchange.Do).
	host string
	path [numProxyRoutes]string
	// reqLine and hostLine are the lines a request that writes itself writes
	// (ownrequest.go): "POST <path> HTTP/1.1\r\n" and "Host: <host>\r\n".
	reqLine  [numProxyRoutes]string
	hostLine string
	tokenize string // the engine's POST /tokenize
	addr     string // host:port dialed
	tls      bool
	inflight atomic.Int64
	// rankCursor rotates the DP rank a rank-multiplexed worker's requests
	// are pinned to when the policy picks the worker only (dprank.go).
	rankCursor atomic.Uint64
	picks      prometheus.Counter
	breaker    breaker
	stall      workerStall    // progress and stall state (stall.go)
	prog       workerProgress // the stall state as its connections see it (upstream.go)
	health     string         // the engine's GET /health, the stall probe

	// PolicyState belongs to the policy: a FleetAware policy may set it in
	// Attach, before the worker is visible to Pick, and read it afterwards.
	PolicyState any
}

// ID returns the worker_id (host:port).
func (w *Worker) ID() string { return w.id }

// Record returns the worker's current record. Callers must not modify it.
func (w *Worker) Record() *discovery.Record { return w.rec.Load() }

// InFlight returns the number of requests routed to the worker that have not
// finished yet.
func (w *Worker) InFlight() int64 { return w.inflight.Load() }

// view is one immutable fleet view, swapped as a whole on every snapshot.
type view struct {
	revision int64
	// models maps every model some worker serves (any status) to its active
	// candidates, which may be empty: known model, nobody to take it.
	models   map[string]*Candidates
	workers  []*Worker
	active   int
	routable int  // active mixed workers: candidates of whole requests (/ready)
	nats     bool // the router sends requests over NATS (natsleg.go)

	// modelNames lists the models with active candidates, sorted, for
	// GET /v1/models (rendered per request: created is the request time).
	modelNames []string
	// Bodies of the read-only endpoints, rendered once per view: each
	// worker's /v1/workers object (its live state is added per request,
	// appendWorkers), /health and /ready.
	workerObjs [][]byte
	healthJSON []byte
	readyJSON  []byte
}

// UpdateFleet replaces the fleet view with one built from snap; it is the
// discovery watcher's onChange callback. Workers whose id and URL did not
// change keep their Worker (and connections); removed workers are detached
// from the policy and their idle connections closed. Safe to call from any
// goroutine; calls are serialised.
func (r *Router) UpdateFleet(snap *discovery.Snapshot) {
	if snap == nil {
		return
	}
	r.fleetMu.Lock()
	defer r.fleetMu.Unlock()

	next := make(map[string]*Worker, len(snap.Workers))
	all := make([]*Worker, 0, len(snap.Workers))
	models := make(map[string]*Candidates)
	active, routable := 0, 0
	byMode := make(map[discovery.DisaggMode]int)
	unroutable := make(map[string]int)
	for i := range snap.Workers {
		rec := snap.Workers[i] // a private copy: the snapshot stays untouched
		w := r.workers[rec.WorkerID]
		if w == nil || w.url != rec.URL {
			if w != nil {
				// Same id, new URL: a different endpoint, so a fresh pool.
				r.retire(w)
				delete(r.workers, w.id)
			}
			nw, err := r.newWorker(&rec)
			if err != nil {
				r.log.Warn().Str("worker_id", rec.WorkerID).Str("url", rec.URL).Err(err).Msg("ignoring worker with unusable url")
				continue
			}
			w = nw
			r.log.Info().Str("worker_id", w.id).Str("model", rec.ModelName).Str("status", string(rec.Status)).Msg("worker added")
		} else {
			if old := w.Record(); old.Status != rec.Status {
				r.log.Info().Str("worker_id", w.id).Str("status", string(rec.Status)).Msg("worker status changed")
			}
			w.rec.Store(&rec)
			if ra, ok := r.policy.(RecordAware); ok {
				ra.Update(w)
			}
		}
		next[w.id] = w
		all = append(all, w)

		c := models[rec.ModelName]
		if c == nil {
			cur := r.cursors[rec.ModelName]
			if cur == nil {
				cur = new(atomic.Uint64)
				r.cursors[rec.ModelName] = cur
			}
			c = &Candidates{Model: rec.ModelName, cursor: cur}
			c.prefillCursor, c.decodeCursor = r.poolCursor(rec.ModelName, "prefill"), r.poolCursor(rec.ModelName, "decode")
			models[rec.ModelName] = c
		}
		// Only mixed workers take whole requests; prefill/decode workers
		// are paired by the PD path (pd.go).
		if reason := r.unroutable(&rec); reason != "" {
			unroutable[reason]++
		}
		if !r.active(&rec) {
			continue
		}
		// Infera counts every active worker, whatever its role, in
		// /health and infera_active_workers.
		active++
		mode := rec.DisaggMode
		if mode == "" {
			mode = discovery.DisaggMixed
		}
		byMode[mode]++
		switch mode {
		case discovery.DisaggMixed:
			c.Workers = append(c.Workers, w)
			routable++
		case discovery.DisaggPrefill:
			c.Prefill = append(c.Prefill, w)
		case discovery.DisaggDecode:
			c.Decode = append(c.Decode, w)
		}
	}
	// A disaggregated model is served by pairs: its decode workers count
	// as routable (for /ready) when it has a prefill worker too.
	for _, c := range models {
		if len(c.Prefill) > 0 {
			routable += len(c.Decode)
		}
	}
	for id, w := range r.workers {
		if next[id] == nil {
			r.retire(w)
			r.log.Info().Str("worker_id", id).Msg("worker removed")
		}
	}
	for name := range r.cursors {
		if base, _, _ := strings.Cut(name, "\x00"); models[base] == nil {
			delete(r.cursors, name)
		}
	}
	r.workers = next

	v := &view{revision: snap.Revision, models: models, workers: all, active: active, routable: routable, nats: r.cfg.NATSRequests != nil}
	v.render()
	r.view.Store(v)
	r.metrics.setFleet(byMode, unroutable)
}

// poolCursor returns the rotation cursor of a model's prefill or decode
// pool (kept with the model's own, under "model\x00pool"; fleetMu held).
func (r *Router) poolCursor(model, pool string) *atomic.Uint64 {
	key := model + "\x00" + pool
	cur := r.cursors[key]
	if cur == nil {
		cur = new(atomic.Uint64)
		r.cursors[key] = cur
	}
	return cur
}

// newWorker builds the Worker (and its connection pool) for a record and
// attaches it to the policy.
func (r *Router) newWorker(rec *discovery.Record) (*Worker, error) {
	// Discovery validated the record, but a record can reach the router
	// by other ways (tests, other writers of the prefix): check again what
	// the router relies on before dialing anything.
	if len(rec.URL) > maxWorkerURLBytes || rec.WorkerID == "" || len(rec.WorkerID) > maxWorkerURLBytes {
		return nil, fmt.Errorf("worker record %q: %w", clip([]byte(rec.WorkerID)), errBadWorkerURL)
	}
	u, err := url.Parse(rec.URL)
	if err != nil {
		return nil, fmt.Errorf("parse worker url: %w", err)
	}
	var tls bool
	switch u.Scheme {
	case "http":
	case "https":
		tls = true
	default:
		return nil, fmt.Errorf("worker url scheme %q: %w", u.Scheme, errBadWorkerURL)
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("worker url %q: %w", rec.URL, errBadWorkerURL)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("worker url %q port: %w", rec.URL, errBadWorkerURL)
		}
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("worker url %q host: %w", rec.URL, errBadWorkerURL)
	}
	addr := u.Host
	if u.Port() == "" {
		port := "80"
		if tls {
			port = "443"
		}
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	w := &Worker{
		id:       rec.WorkerID,
		idHeader: []byte(rec.WorkerID),
		headLine: workerHeadLine([]byte(rec.WorkerID)),
		url:      rec.URL,
		addr:     addr,
		tls:      tls,
		picks:    r.metrics.picks.WithLabelValues(rec.WorkerID),
	}
	w.prog = workerProgress{r: r, w: w}
	w.pool = r.newPool(addr, tls, w)
	base := u.Scheme + "://" + u.Host + trimSlash(u.EscapedPath())
	for rt := range Route(numProxyRoutes) {
		if w.host, w.path[rt], err = originForm(base+rt.upstreamPath(), disableUpstreamPathNormalizing); err != nil {
			w.pool.Close()
			return nil, fmt.Errorf("worker url %q: %w", rec.URL, err)
		}
	}
	for rt := range Route(numProxyRoutes) {
		w.reqLine[rt] = fasthttp.MethodPost + " " + w.path[rt] + " HTTP/1.1\r\n"
	}
	w.hostLine = "Host: " + w.host + "\r\n"
	w.tokenize = base + "/tokenize"
	w.health = base + "/health"
	w.rec.Store(rec)
	if fa, ok := r.policy.(FleetAware); ok {
		fa.Attach(w)
	}
	return w, nil
}

// retire takes a worker out of the router: the policy forgets it, its
// metrics series goes, and its pool closes its idle connections and its
// sweeper. Requests still running on it finish normally; their
// connections are closed at their end.
func (r *Router) retire(w *Worker) {
	if fa, ok := r.policy.(FleetAware); ok {
		fa.Detach(w)
	}
	r.metrics.picks.DeleteLabelValues(w.id)
	r.metrics.breakerTrips.DeleteLabelValues(w.id)
	r.metrics.stalls.DeleteLabelValues(w.id)
	w.pool.Close()
}

// maxWorkerURLBytes bounds a worker's URL and id.
const maxWorkerURLBytes = 2048

// originForm splits a full upstream URI into the Host header and the
// request line's target fasthttp's Request.Write derives from it (with the
// worker client's path normalizing), so that a request given both goes out
// byte for byte as one given the URI, without parsing it again.
func originForm(uri string, disablePathNormalizing bool) (host, target string, err error) {
	var u fasthttp.URI
	if err := u.Parse(nil, []byte(uri)); err != nil {
		return "", "", fmt.Errorf("upstream uri: %w", err)
	}
	u.DisablePathNormalizing = disablePathNormalizing // Parse resets it
	return string(u.Host()), string(u.RequestURI()), nil
}

func trimSlash(p string) string {
	for len(p) > 0 && p[len(p)-1] == '/' {
		p = p[:len(p)-1]
	}
	return p
}

// appendWorkers appends the body of GET /v1/workers: Infera's shape
// {"workers": [...]}, each worker's record with the router's live view of
// it (stalled, in_flight), and the view's revision (ours).
func (v *view) appendWorkers(b []byte) []byte {
	b = append(b, `{"workers":[`...)
	for i, w := range v.workers {
		if i > 0 {
			b = append(b, ',')
		}
		obj := v.workerObjs[i]
		b = append(b, obj[:len(obj)-1]...)
		if len(obj) > 2 {
			b = append(b, ',')
		}
		b = append(b, `"stalled":`...)
		b = strconv.AppendBool(b, w.Stalled())
		b = append(b, `,"in_flight":`...)
		b = strconv.AppendInt(b, w.InFlight(), 10)
		b = append(b, '}')
	}
	b = append(b, `],"revision":`...)
	b = strconv.AppendInt(b, v.revision, 10)
	return append(b, '}')
}

// listedWorker is one entry of GET /v1/workers: the record with the keys
// Infera lists (and ours), plus why the router cannot route it, if so.
type listedWorker struct {
	*discovery.Record
	Unroutable string `json:"unroutable,omitempty"`
}

// render precomputes the JSON bodies of /v1/workers and /health and the
// model list of /v1/models.
func (v *view) render() {
	names := make([]string, 0, len(v.models))
	for name, c := range v.models {
		if len(c.Workers) > 0 || (len(c.Prefill) > 0 && len(c.Decode) > 0) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	v.modelNames = names

	v.workerObjs = make([][]byte, len(v.workers))
	for i, w := range v.workers {
		rec := w.Record()
		data, err := json.Marshal(listedWorker{Record: rec, Unroutable: unroutable(rec, v.nats)})
		if err != nil || len(data) < 2 || data[len(data)-1] != '}' {
			// Records passed discovery's validation and encode by construction.
			data = []byte(`{"worker_id":` + strconv.Quote(w.id) + `}`)
		}
		v.workerObjs[i] = data
	}

	// /health stays 200 "ok" (Infera's contract) and says whether the
	// router can route; /ready is the load balancers' probe.
	b := append([]byte(`{"status":"ok","active_workers":`), strconv.Itoa(v.active)...)
	b = append(b, `,"routable_workers":`...)
	b = strconv.AppendInt(b, int64(v.routable), 10)
	b = append(b, `,"ready":`...)
	b = strconv.AppendBool(b, v.routable > 0)
	b = append(b, `,"workers":`...)
	b = strconv.AppendInt(b, int64(len(v.workers)), 10)
	b = append(b, `,"revision":`...)
	b = strconv.AppendInt(b, v.revision, 10)
	v.healthJSON = append(b, '}')
	v.readyJSON = appendReady(nil, v.routable, v.active)
}

// appendReady renders the body of GET /ready.
func appendReady(b []byte, routable, active int) []byte {
	status := `{"status":"ready","routable_workers":`
	if routable == 0 {
		status = `{"status":"no_routable_worker","routable_workers":`
	}
	b = append(b, status...)
	b = strconv.AppendInt(b, int64(routable), 10)
	b = append(b, `,"active_workers":`...)
	b = strconv.AppendInt(b, int64(active), 10)
	return append(b, '}')
}
