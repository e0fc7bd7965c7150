package router

import (
	"crypto/sha256"
	"crypto/subtle"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/openai"
)

// keySet holds API keys as SHA-256 digests: every comparison is then over
// 32 bytes whatever the lengths, so neither a key's content nor its length
// leaks through timing.
type keySet struct {
	digests [][sha256.Size]byte
}

func newKeySet(keys []string) keySet {
	ks := keySet{digests: make([][sha256.Size]byte, 0, len(keys))}
	for _, k := range keys {
		if k != "" {
			ks.digests = append(ks.digests, sha256.Sum256([]byte(k)))
		}
	}
	return ks
}

func (ks *keySet) enabled() bool { return len(ks.digests) > 0 }

// match reports whether token is one of the keys. It compares against
// every key, without an early exit, in constant time per key.
func (ks *keySet) match(token []byte) bool {
	d := sha256.Sum256(token)
	found := 0
	for i := range ks.digests {
		found |= subtle.ConstantTimeCompare(d[:], ks.digests[i][:])
	}
	return found == 1
}

// maxBearerBytes bounds a token worth hashing.
const maxBearerBytes = 4096

// parseBearer extracts the token of an "Authorization: Bearer <token>"
// header value. The scheme is case-insensitive (RFC 9110), separated by
// spaces or tabs; the token is visible ASCII; trailing blanks are ignored.
func parseBearer(h []byte) ([]byte, bool) {
	const scheme = "bearer"
	if len(h) <= len(scheme) {
		return nil, false
	}
	for i := range len(scheme) {
		if h[i]|0x20 != scheme[i] {
			return nil, false
		}
	}
	rest := h[len(scheme):]
	if rest[0] != ' ' && rest[0] != '\t' {
		return nil, false
	}
	for len(rest) > 0 && (rest[0] == ' ' || rest[0] == '\t') {
		rest = rest[1:]
	}
	for len(rest) > 0 && (rest[len(rest)-1] == ' ' || rest[len(rest)-1] == '\t') {
		rest = rest[:len(rest)-1]
	}
	if len(rest) == 0 || len(rest) > maxBearerBytes {
		return nil, false
	}
	for _, c := range rest {
		if c <= ' ' || c > '~' {
			return nil, false
		}
	}
	return rest, true
}

// parseAPIKey validates an x-api-key header value: visible ASCII, blanks
// around it ignored.
func parseAPIKey(h []byte) ([]byte, bool) {
	for len(h) > 0 && (h[0] == ' ' || h[0] == '\t') {
		h = h[1:]
	}
	for len(h) > 0 && (h[len(h)-1] == ' ' || h[len(h)-1] == '\t') {
		h = h[:len(h)-1]
	}
	if len(h) == 0 || len(h) > maxBearerBytes {
		return nil, false
	}
	for _, c := range h {
		if c <= ' ' || c > '~' {
			return nil, false
		}
	}
	return h, true
}

// authorized checks the request's Bearer token against ks; on failure it
// answers 401 in the OpenAI envelope.
func (r *Router) authorized(ctx *fasthttp.RequestCtx, ks *keySet, rt Route) bool {
	tok, ok := parseBearer(ctx.Request.Header.Peek("Authorization"))
	if !ok {
		// Anthropic's clients send the key as x-api-key.
		tok, ok = parseAPIKey(ctx.Request.Header.Peek("X-Api-Key"))
	}
	if ok && ks.match(tok) {
		return true
	}
	msg := "Incorrect API key provided."
	if !ok {
		msg = "Missing or malformed API key: send Authorization: Bearer <key> or x-api-key: <key>."
	}
	ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="infera"`)
	if rt == RouteMessages || rt == RouteCountTokens {
		writeAnthropicError(ctx, fasthttp.StatusUnauthorized, msg, "", "")
	} else {
		writeError(ctx, fasthttp.StatusUnauthorized, msg, openai.TypeInvalidRequest, "invalid_api_key")
	}
	r.metrics.request(rt, outcomeUnauthorized).Inc()
	r.metrics.rejected[rejected401].Inc()
	return false
}
