package router

import "github.com/valyala/fasthttp"

// The request-id headers: X-Request-Id and Infera's Python server's
// X-Infera-Request-Id, both accepted and both echoed (docs/operations.md,
// "Moving from Python Infera").

// inferaRequestIDHeader is the request-id header of Infera's Python server;
// it is accepted and echoed beside X-Request-Id.
const inferaRequestIDHeader = "X-Infera-Request-Id"

// The request-id header names, in fasthttp's canonical form: looked up and
// set with PeekCanonical and SetCanonical, they are not copied and
// normalized again on every request.
var (
	requestIDKey       = []byte("X-Request-Id")
	inferaRequestIDKey = []byte(inferaRequestIDHeader)
)

// clientRequestID returns the id the client sent: X-Infera-Request-Id first
// (Infera's), else X-Request-Id; nil when neither is present.
func clientRequestID(h *fasthttp.RequestHeader) []byte {
	if id := h.PeekCanonical(inferaRequestIDKey); len(id) > 0 {
		return id
	}
	return h.PeekCanonical(requestIDKey)
}

// setRequestID appends the request's id to dst (the client's own when it is
// valid, else a fresh one) and echoes it in both headers of the response.
func (r *Router) setRequestID(ctx *fasthttp.RequestCtx, dst []byte) []byte {
	dst = r.appendRequestID(dst, clientRequestID(&ctx.Request.Header))
	echoRequestID(&ctx.Response.Header, dst)
	return dst
}

// echoRequestID sets both request-id headers of a response to id.
func echoRequestID(h *fasthttp.ResponseHeader, id []byte) {
	h.SetCanonical(requestIDKey, id)
	h.SetCanonical(inferaRequestIDKey, id)
}
