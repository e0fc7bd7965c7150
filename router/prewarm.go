package router

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/jsonx"
	"github.com/infera/infera/kvd"
	"github.com/infera/infera/openai"
)

// POST /v1/cache/prewarm asks kvd to bring blocks up from its long tiers
// (L3, L4) into RAM before the requests that need them arrive (kvd.md §8.6):
//
//	{"model": "m", "block_hashes": ["00112233aabbccdd", ...],
//	 "compat_key": "tp0of1_pp0of1", "deadline_ms": 1000}
//
// Each block hash is a kvd key (8 bytes, as 16 hex digits) in the
// namespace (model, compat_key) the engines' connectors store blocks under;
// compat_key defaults to a single-rank engine's (DefaultPrewarmCompatKey).
// The router forwards one prefetch_hint and answers 202 with the number of
// keys; kvd warms them in the background (prefetch_hint has no reply), each
// staying in RAM for deadline_ms.

// Prewarm limits.
const (
	// MaxPrewarmKeys bounds the block hashes of one prewarm request.
	MaxPrewarmKeys = 4096
	// MaxPrewarmDeadline bounds deadline_ms.
	MaxPrewarmDeadline = 10 * time.Minute
	// DefaultPrewarmDeadline is kvd's own default deadline_ms.
	DefaultPrewarmDeadline = time.Second
	// DefaultPrewarmCompatKey is the compat_key of an engine with one
	// tensor- and one pipeline-parallel rank, as the vLLM kvd connector
	// (and the simulator) name their namespace.
	DefaultPrewarmCompatKey = "tp0of1_pp0of1"
	// maxPrewarmName bounds model and compat_key.
	maxPrewarmName = 1024
	// prewarmKeyBytes is the size of a kvd key.
	prewarmKeyBytes = 8
	// kvdDialTimeout bounds dialing kvd and one prefetch_hint write.
	kvdDialTimeout = 2 * time.Second
)

// Prewarm errors.
var (
	// ErrPrewarmBody wraps every reason a prewarm body is refused.
	ErrPrewarmBody = errors.New("router: invalid prewarm request")
	// ErrNoKVD is returned when the router has no --kvd-socket.
	ErrNoKVD = errors.New("router: no kvd configured")
)

// PrewarmRequest is a parsed prewarm body.
type PrewarmRequest struct {
	Model     string
	CompatKey string
	Keys      [][]byte
	Deadline  time.Duration
}

// ParsePrewarm parses and validates a prewarm body.
func ParsePrewarm(body []byte) (PrewarmRequest, error) {
	req := PrewarmRequest{CompatKey: DefaultPrewarmCompatKey, Deadline: DefaultPrewarmDeadline}
	s := jsonx.Scanner{B: body, MaxDepth: 4}
	s.SkipWS()
	if s.I >= len(body) || body[s.I] != '{' {
		return req, fmt.Errorf("%w: the body must be a JSON object", ErrPrewarmBody)
	}
	var seen [4]bool
	var fieldErr error
	err := s.Object(func(ks, ke int, kesc bool) error {
		field := -1
		for i, name := range [...]string{"model", "block_hashes", "compat_key", "deadline_ms"} {
			if jsonx.Equal(body[ks:ke], kesc, name) {
				field = i
			}
		}
		if field < 0 {
			fieldErr = fmt.Errorf("%w: unknown field %q (want model, block_hashes, compat_key, deadline_ms)", ErrPrewarmBody, clip(jsonx.AppendUnescaped(nil, body[ks:ke])))
			return fieldErr
		}
		if seen[field] {
			fieldErr = fmt.Errorf("%w: duplicate field %s", ErrPrewarmBody, [...]string{"model", "block_hashes", "compat_key", "deadline_ms"}[field])
			return fieldErr
		}
		seen[field] = true
		switch field {
		case 0, 2:
			v, err := prewarmString(&s)
			if err != nil {
				return err
			}
			if field == 0 {
				req.Model = v
			} else {
				req.CompatKey = v
			}
		case 1:
			if body[s.I] != '[' {
				fieldErr = fmt.Errorf("%w: block_hashes must be an array of hex strings", ErrPrewarmBody)
				return fieldErr
			}
			return s.Array(func() error {
				if len(req.Keys) == MaxPrewarmKeys {
					fieldErr = fmt.Errorf("%w: more than %d block_hashes", ErrPrewarmBody, MaxPrewarmKeys)
					return fieldErr
				}
				if body[s.I] != '"' {
					fieldErr = fmt.Errorf("%w: block_hashes[%d] must be a string of %d hex digits", ErrPrewarmBody, len(req.Keys), 2*prewarmKeyBytes)
					return fieldErr
				}
				vs, ve, esc, err := s.String()
				if err != nil {
					return err
				}
				raw := body[vs:ve]
				key := make([]byte, prewarmKeyBytes)
				if esc || len(raw) != 2*prewarmKeyBytes {
					fieldErr = fmt.Errorf("%w: block_hashes[%d]: want %d hex digits (an %d-byte kvd key)", ErrPrewarmBody, len(req.Keys), 2*prewarmKeyBytes, prewarmKeyBytes)
					return fieldErr
				}
				if _, err := hex.Decode(key, raw); err != nil {
					fieldErr = fmt.Errorf("%w: block_hashes[%d] %q is not hex", ErrPrewarmBody, len(req.Keys), raw)
					return fieldErr
				}
				req.Keys = append(req.Keys, key)
				return nil
			})
		case 3:
			start := s.I
			if err := s.Number(); err != nil {
				return err
			}
			n, ok := jsonx.ParseInt(body[start:s.I])
			if !ok || n < 1 || n > MaxPrewarmDeadline.Milliseconds() { // compared in ms: n*time.Millisecond could wrap
				fieldErr = fmt.Errorf("%w: deadline_ms must be an integer from 1 to %d", ErrPrewarmBody, MaxPrewarmDeadline.Milliseconds())
				return fieldErr
			}
			req.Deadline = time.Duration(n) * time.Millisecond
		}
		return nil
	})
	if err == nil {
		err = s.End()
	}
	switch {
	case fieldErr != nil:
		return req, fieldErr
	case err != nil:
		return req, fmt.Errorf("%w: %w", ErrPrewarmBody, err)
	case req.Model == "":
		return req, fmt.Errorf("%w: model is required", ErrPrewarmBody)
	case len(req.Keys) == 0:
		return req, fmt.Errorf("%w: block_hashes must hold at least one hash", ErrPrewarmBody)
	}
	return req, nil
}

// prewarmString reads a string value of at most maxPrewarmName bytes.
func prewarmString(s *jsonx.Scanner) (string, error) {
	if s.B[s.I] != '"' {
		return "", fmt.Errorf("%w: model and compat_key must be strings", ErrPrewarmBody)
	}
	vs, ve, esc, err := s.String()
	if err != nil {
		return "", err
	}
	v := s.B[vs:ve]
	if esc {
		v = jsonx.AppendUnescaped(nil, v)
	}
	if len(v) > maxPrewarmName {
		return "", fmt.Errorf("%w: model and compat_key must be at most %d bytes", ErrPrewarmBody, maxPrewarmName)
	}
	return string(v), nil
}

// prewarmer holds the router's idle kvd connections. A hint takes one
// (or dials a new one) under a lock held only to pick it, so concurrent
// hints against a stalled kvd each wait out their own dial in parallel.
type prewarmer struct {
	socket string
	mu     sync.Mutex
	idle   []*kvd.Client // at most maxIdlePrewarmConns
	closed bool
}

// maxIdlePrewarmConns bounds the kvd connections kept between hints.
const maxIdlePrewarmConns = 4

// errKVDUnavailable is what a client sees when a hint failed; the cause,
// with the socket path, goes to the log only.
var errKVDUnavailable = errors.New("kvd unavailable: the prefetch hint was not delivered")

// take returns an idle connection, or nil to dial one.
func (p *prewarmer) take() (*kvd.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("prewarm: %w", kvd.ErrClientClosed)
	}
	if n := len(p.idle); n > 0 {
		cl := p.idle[n-1]
		p.idle = p.idle[:n-1]
		return cl, nil
	}
	return nil, nil
}

// put keeps a healthy connection for the next hint.
func (p *prewarmer) put(cl *kvd.Client) {
	p.mu.Lock()
	if !p.closed && len(p.idle) < maxIdlePrewarmConns {
		p.idle = append(p.idle, cl)
		cl = nil
	}
	p.mu.Unlock()
	if cl != nil {
		_ = cl.Close()
	}
}

// hint forwards one prefetch_hint.
func (p *prewarmer) hint(req PrewarmRequest) error {
	if p == nil || p.socket == "" {
		return ErrNoKVD
	}
	ctx, cancel := context.WithTimeout(context.Background(), kvdDialTimeout)
	defer cancel()
	ns := kvd.Namespace{Model: req.Model, CompatKey: req.CompatKey}
	for {
		cl, err := p.take()
		if err != nil {
			return err
		}
		reused := cl != nil
		if !reused {
			if cl, err = kvd.Dial(ctx, p.socket, kvd.ClientOptions{ClientID: "infera-serve", Timeout: kvdDialTimeout}); err != nil {
				return fmt.Errorf("prewarm: %w", err)
			}
		}
		err = cl.PrefetchHintCtx(ctx, ns, req.Keys, req.Deadline)
		if err == nil {
			p.put(cl)
			return nil
		}
		// The client gave the connection up. One used before may be to a
		// daemon that restarted since: once more on a new one.
		_ = cl.Close()
		if !reused {
			return fmt.Errorf("prewarm: %w", err)
		}
	}
}

func (p *prewarmer) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, cl := range idle {
		_ = cl.Close()
	}
}

// servePrewarm answers POST /v1/cache/prewarm.
func (r *Router) servePrewarm(ctx *fasthttp.RequestCtx) {
	const rt = RoutePrewarm
	if !ctx.IsPost() {
		ctx.Response.Header.Set("Allow", "POST")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "use POST for "+rt.Path(), openai.TypeInvalidRequest, "method_not_allowed")
		r.metrics.request(rt, outcomeMethodNotAllowed).Inc()
		return
	}
	if r.prewarm == nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "prewarm needs kvd: start infera serve with --kvd-socket", openai.TypeServer, "kvd_not_configured")
		r.metrics.request(rt, outcomeNoWorker).Inc()
		return
	}
	req, err := ParsePrewarm(ctx.PostBody())
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error(), openai.TypeInvalidRequest, "invalid_prewarm")
		r.metrics.request(rt, outcomeBadRequest).Inc()
		return
	}
	if err := r.prewarm.hint(req); err != nil {
		r.log.Warn().Err(err).Str("socket", r.prewarm.socket).Msg("prewarm not forwarded to kvd")
		ctx.Response.Header.Set("Retry-After", "1")
		writeError(ctx, fasthttp.StatusServiceUnavailable, errKVDUnavailable.Error(), openai.TypeServer, "kvd_unavailable")
		r.metrics.request(rt, outcomeUpstreamError).Inc()
		return
	}
	ctx.SetStatusCode(fasthttp.StatusAccepted)
	ctx.SetContentType("application/json")
	b := append(ctx.Response.Body()[:0], `{"object":"cache.prewarm","model":`...)
	b = openai.AppendQuoted(b, req.Model)
	b = append(b, `,"compat_key":`...)
	b = openai.AppendQuoted(b, req.CompatKey)
	b = append(b, `,"keys":`...)
	b = strconv.AppendInt(b, int64(len(req.Keys)), 10)
	b = append(b, `,"deadline_ms":`...)
	b = strconv.AppendInt(b, req.Deadline.Milliseconds(), 10)
	ctx.SetBody(append(b, '}'))
	r.metrics.request(rt, outcomeOK).Inc()
}
