package natsreq

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/infera/infera/natsx"
)

// The wire names and values of Infera's requests over NATS.
const (
	SubjectPrefix = "infera.req"
	CancelPrefix  = "infera.cancel"
	// StreamName is the work-queue stream of --nats-req-max-pending > 0.
	StreamName = "INFERA_REQUESTS"

	HeaderType   = "rs-type"
	HeaderStatus = "rs-status"
	HeaderInbox  = "rs-inbox"

	TypeData  = "data"
	TypeDone  = "done"
	TypeError = "error"

	// DrainingNotice is the error frame of a migratable request a draining
	// worker hands back.
	DrainingNotice = "infera: worker draining"
	// CancelledText and MaxDurationText are the worker's error frames when
	// the router cancelled a request or the total deadline passed.
	CancelledText   = "request cancelled"
	MaxDurationText = "request exceeded max duration"

	// DefaultIdleTimeout is --nats-req-idle-timeout's default (0 = off).
	DefaultIdleTimeout = 900 * time.Second
	// CancelResends and CancelGap: the router publishes a cancelled
	// request's inbox to the cancel subject 3 times, 1 s apart.
	CancelResends = 3
	CancelGap     = time.Second
	// AckWait and pendingCacheTTL as the reference.
	AckWait         = time.Hour
	pendingCacheTTL = 200 * time.Millisecond
	// pendingMaxAge: a backlog read longer ago than this (its refreshes
	// failing or hanging, as in a NATS outage) is unknown, which admits,
	// as the reference admits a backlog it cannot read.
	pendingMaxAge = time.Second
	// pendingReadTimeout bounds one background read of a backlog (no
	// pick waits for it).
	pendingReadTimeout = time.Second
	// pendingForget: a worker whose backlog nobody asked for this long
	// (gone from the fleet) is dropped from the cache.
	pendingForget = time.Minute
	// queuedPoll is the drain's poll of the consumer's undelivered backlog.
	queuedPoll = 200 * time.Millisecond
	// maxEnvelopeBytes bounds an envelope a worker accepts.
	maxEnvelopeBytes = 64 << 20
)

// Subject is the request subject of a worker.
func Subject(workerID string) string { return SubjectPrefix + "." + natsx.Token(workerID) }

// CancelSubject is the cancel subject of a worker.
func CancelSubject(workerID string) string { return CancelPrefix + "." + natsx.Token(workerID) }

// Durable is the name of a worker's durable consumer on StreamName.
func Durable(workerID string) string { return natsx.Token(workerID) }

// ErrBadEnvelope reports a request payload a worker cannot serve.
var ErrBadEnvelope = errors.New("natsreq: bad envelope")

// Envelope is one request as the router publishes it.
type Envelope struct {
	Path    string            `json:"path"`
	Stream  bool              `json:"stream"`
	Headers map[string]string `json:"headers"`
	// Body is the JSON request body (an object).
	Body       json.RawMessage `json:"body"`
	Migratable bool            `json:"migratable"`
}

// AppendJSON appends the envelope as the reference's json.dumps writes
// it: keys in the order path, stream, headers, body, migratable, ", " and
// ": " separators, headers sorted by name (null when none); the body is
// embedded as the router holds it.
func (e *Envelope) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"path": `...)
	dst = appendPyString(dst, e.Path)
	dst = append(dst, `, "stream": `...)
	dst = strconv.AppendBool(dst, e.Stream)
	dst = append(dst, `, "headers": `...)
	if e.Headers == nil {
		dst = append(dst, "null"...)
	} else {
		keys := make([]string, 0, len(e.Headers))
		for k := range e.Headers {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		dst = append(dst, '{')
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = appendPyString(dst, k)
			dst = append(dst, ": "...)
			dst = appendPyString(dst, e.Headers[k])
		}
		dst = append(dst, '}')
	}
	dst = append(dst, `, "body": `...)
	if len(e.Body) == 0 {
		dst = append(dst, "{}"...)
	} else {
		dst = append(dst, e.Body...)
	}
	dst = append(dst, `, "migratable": `...)
	dst = strconv.AppendBool(dst, e.Migratable)
	return append(dst, '}')
}

// appendPyString writes s as Python's json.dumps does (ensure_ascii):
// non-ASCII as \uXXXX escapes (surrogate pairs above the BMP).
func appendPyString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for _, r := range s {
		switch {
		case r == '"':
			dst = append(dst, '\\', '"')
		case r == '\\':
			dst = append(dst, '\\', '\\')
		case r == '\n':
			dst = append(dst, '\\', 'n')
		case r == '\r':
			dst = append(dst, '\\', 'r')
		case r == '\t':
			dst = append(dst, '\\', 't')
		case r == '\b':
			dst = append(dst, '\\', 'b')
		case r == '\f':
			dst = append(dst, '\\', 'f')
		case r < 0x20 || (r >= 0x7f && r < 0x10000):
			if r == 0x7f {
				dst = append(dst, byte(r))
				continue
			}
			dst = append(dst, '\\', 'u', hex[r>>12&15], hex[r>>8&15], hex[r>>4&15], hex[r&15])
		case r >= 0x10000:
			r -= 0x10000
			hi, lo := 0xd800+(r>>10), 0xdc00+(r&0x3ff)
			dst = append(dst, '\\', 'u', hex[hi>>12&15], hex[hi>>8&15], hex[hi>>4&15], hex[hi&15])
			dst = append(dst, '\\', 'u', hex[lo>>12&15], hex[lo>>8&15], hex[lo>>4&15], hex[lo&15])
		default:
			dst = append(dst, byte(r))
		}
	}
	return append(dst, '"')
}

// ParseEnvelope decodes and validates a request payload: a JSON object
// whose path is an absolute URL path (no scheme, host, query tricks or
// dot segments), whose headers are strings and whose body is an object.
// A missing path is /v1/chat/completions, a missing body {}, as the
// reference reads them.
func ParseEnvelope(b []byte) (Envelope, error) {
	var e Envelope
	if len(b) > maxEnvelopeBytes {
		return e, fmt.Errorf("%w: %d bytes", ErrBadEnvelope, len(b))
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&e); err != nil {
		return e, fmt.Errorf("%w: %w", ErrBadEnvelope, err)
	}
	if dec.More() {
		return e, fmt.Errorf("%w: data after the object", ErrBadEnvelope)
	}
	if e.Path == "" {
		e.Path = "/v1/chat/completions"
	}
	if !validPath(e.Path) {
		return e, fmt.Errorf("%w: path %q", ErrBadEnvelope, e.Path)
	}
	if len(e.Body) == 0 || string(e.Body) == "null" {
		e.Body = json.RawMessage("{}")
	}
	if e.Body[0] != '{' {
		return e, fmt.Errorf("%w: body is no JSON object", ErrBadEnvelope)
	}
	for k, v := range e.Headers {
		if k == "" || strings.ContainsAny(k, "\r\n: ") || strings.ContainsAny(v, "\r\n") {
			return e, fmt.Errorf("%w: header %q", ErrBadEnvelope, k)
		}
	}
	return e, nil
}

func validPath(p string) bool {
	if len(p) > 1024 || !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") {
		return false
	}
	for _, seg := range strings.Split(strings.SplitN(p, "?", 2)[0], "/") {
		if seg == "." || seg == ".." {
			return false
		}
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c >= 0x7f || c == '#' || c == '\\' {
			return false
		}
	}
	return true
}

// Admission refusals as the reference answers them: 429 with
// Retry-After: 1 and one of these bodies.
const (
	RetryAfter = "1"
	// PDBacklogBody is the body when either leg of a disaggregated
	// request is refused (no retry).
	PDBacklogBody = `{"error":"PD worker request backlog over limit"}`
)

// AppendBacklogBody appends the body of a mixed request refused because
// every candidate's backlog is over the limit (workerID: the last one
// tried), JSON-escaped.
func AppendBacklogBody(dst []byte, workerID string) []byte {
	dst = append(dst, `{"error":"worker `...)
	q, _ := json.Marshal(workerID)
	dst = append(dst, q[1:len(q)-1]...)
	return append(dst, ` request backlog over limit"}`...)
}
