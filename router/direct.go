package router

import (
	"slices"
	"time"

	"github.com/valyala/fasthttp"
)

// GAIE direct mode (--router-mode direct): a Gateway API Inference
// Extension endpoint picker has already chosen the worker and names it in
// a request header; the router dispatches to exactly that worker (no
// policy pick, no failover, no breaker, no DP-rank pin), or, with the
// prefill header too, runs PD on exactly that pair. Without the header a
// request is routed as usual. Nothing is written into the body (the
// reference leaks an internal body key to engines; not copied).
//
// --router-mode direct (INFERA_ROUTER_MODE) sets Config.Direct; proxy,
// once the model's candidates are found, calls pickDirect, answers a
// Refusal with 503 (outcome no_worker), and sends a pick with Prefill to
// the PD path and one without to the mixed path whatever the model's
// pools; begin and beginLeg take the named worker as the only candidate
// (beginDirect: no policy Pick, no breaker or stall skip, no DP-rank pin);
// retryable answers false.
const (
	// HeaderDirectWorker names the worker (decode worker of a PD pair).
	HeaderDirectWorker = "X-Worker-Instance-Id"
	// HeaderDirectPrefill names the prefill worker of a PD pair.
	HeaderDirectPrefill = "X-Prefill-Instance-Id"
)

// maxDirectIDBytes bounds a header's worker id (host:port, or a longer id
// a fleet chose): a longer value names no worker.
const maxDirectIDBytes = 512

// DirectPick is what direct mode makes of one request's headers against
// the model's candidates.
type DirectPick struct {
	// Present: the request names a worker; when false it is routed as usual.
	Present bool
	// Worker is the named worker (the decode side of a pair); Prefill the
	// named prefill worker, nil without the prefill header. Both are nil
	// when Refusal is set.
	Worker, Prefill *Worker
	// Refusal is the 503 message when a named worker is not an active
	// candidate of the model (gone, draining, another model's): the
	// reference's "worker '<id>' not found (stale gateway routing?)".
	Refusal string
}

// pickDirect resolves the endpoint picker's headers among c's active
// workers. With both headers the worker must be a decode and the prefill
// header a prefill candidate; with the worker header alone any active
// candidate of the model (mixed, decode or prefill) is taken, as the
// reference looks it up in its pool. It allocates only for a refusal.
func pickDirect(h *fasthttp.RequestHeader, c *Candidates) DirectPick {
	id := h.Peek(HeaderDirectWorker)
	if len(id) == 0 {
		return DirectPick{}
	}
	pid := h.Peek(HeaderDirectPrefill)
	if len(pid) == 0 {
		w := findWorker(id, c.Workers)
		if w == nil {
			w = findWorker(id, c.Decode)
		}
		if w == nil {
			w = findWorker(id, c.Prefill)
		}
		if w == nil {
			return DirectPick{Present: true, Refusal: directRefusal(id)}
		}
		return DirectPick{Present: true, Worker: w}
	}
	w := findWorker(id, c.Decode)
	if w == nil {
		return DirectPick{Present: true, Refusal: directRefusal(id)}
	}
	p := findWorker(pid, c.Prefill)
	if p == nil {
		return DirectPick{Present: true, Refusal: directRefusal(pid)}
	}
	return DirectPick{Present: true, Worker: w, Prefill: p}
}

func findWorker(id []byte, ws []*Worker) *Worker {
	if len(id) > maxDirectIDBytes {
		return nil
	}
	for _, w := range ws {
		if w.id == string(id) { // compiled without a conversion
			return w
		}
	}
	return nil
}

// directRefusal writes the reference's message, the id quoted as
// Python's repr quotes it and clipped.
func directRefusal(id []byte) string {
	return "worker " + pyQuote(clip(id)) + " not found (stale gateway routing?)"
}

// pyQuote quotes s as Python's repr quotes a str: single quotes unless s
// holds one and no double quote; backslashes, that quote and control
// characters escaped.
func pyQuote(s string) string {
	q := byte('\'')
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			q = '"'
		}
		if s[i] == '"' {
			q = '\''
			break
		}
	}
	const hex = "0123456789abcdef"
	b := make([]byte, 0, len(s)+2)
	b = append(b, q)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == q || c == '\\':
			b = append(b, '\\', c)
		case c == '\t':
			b = append(b, '\\', 't')
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c < 0x20 || c == 0x7f:
			b = append(b, '\\', 'x', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return string(append(b, q))
}

// beginDirect starts attempt a on w, the worker the endpoint picker named
// (hdr: the response header naming it): an admission slot (a full worker
// is ErrSaturated: the picker chose it), the breaker's probe admission,
// no policy pick. A worker already tried is not tried again.
func (rel *relay) beginDirect(a *attempt, w *Worker, hdr string) error {
	r := rel.r
	if w == nil || slices.Contains(rel.tried, w) {
		return errNoCandidate
	}
	if !r.admit.reserve(w) {
		return ErrSaturated
	}
	now := r.cfg.Now()
	body, hb, ht, x := a.body, a.hintBuf[:0], a.hintTmp[:0], a.x
	*a = attempt{rel: rel, body: body, hintBuf: hb, hintTmp: ht, x: x, ticket: Ticket{Worker: w}, start: time.Now()}
	a.probe = w.breaker.admit(now)
	rel.tried = append(rel.tried, w)
	w.picks.Inc()
	rel.ctx.Response.Header.Set(hdr, w.id)
	return nil
}
