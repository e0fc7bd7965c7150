package router

import (
	"errors"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/anthropic"
	"github.com/infera/infera/jsonx"
	"github.com/infera/infera/openai"
	"github.com/infera/infera/tokenizer"
)

// The Anthropic Messages routes: POST /v1/messages goes to the workers'
// chat API through the anthropic package's translation (request, unary
// answer, event stream, errors), and POST /v1/messages/count_tokens is
// answered by the router's tokenizer (or a worker's /tokenize).

// anthropicDialect speaks Anthropic Messages to the client.
var anthropicDialect = &dialect{
	name: "anthropic",
	request: func(dst, body []byte) ([]byte, error) {
		out, _, err := anthropic.AppendChatRequest(dst, body)
		return out, err
	},
	stream:     true,
	response:   anthropicResponse,
	writeError: writeAnthropicError,
	errorEvent: func(dst []byte, message, errType, code string) []byte {
		t := anthropic.TypeAPI
		if errType == openai.TypeUnavailable || code == "too_many_requests" {
			t = anthropic.TypeOverloaded
		}
		return anthropic.AppendErrorEvent(dst, t, message)
	},
}

// writeAnthropicError replaces the response with Anthropic's error
// envelope: its type follows the status, and an unavailable service
// answers 529 (overloaded) as Anthropic does.
func writeAnthropicError(ctx *fasthttp.RequestCtx, status int, message, _, _ string) {
	var buf [512]byte
	ctx.SetStatusCode(anthropic.Status(status))
	ctx.SetContentType("application/json")
	ctx.SetBody(anthropic.AppendError(buf[:0], anthropic.ErrorType(status), message))
}

// anthropicResponse turns the worker's buffered chat answer into an
// Anthropic message, or its error (any status from 400) into Anthropic's
// envelope with the worker's message and status.
func anthropicResponse(ctx *fasthttp.RequestCtx, rel *relay) {
	body := ctx.Response.Body()
	status := ctx.Response.StatusCode()
	if status >= 400 {
		rel.reqBuf = anthropic.AppendEngineError(rel.reqBuf[:0], body, status)
		ctx.SetStatusCode(anthropic.Status(status))
	} else {
		out, err := anthropic.AppendMessage(rel.reqBuf[:0], body)
		if err != nil {
			rel.reqBuf = anthropic.AppendError(out[:0], anthropic.TypeAPI, "the worker's answer could not be translated: "+err.Error())
			ctx.SetStatusCode(fasthttp.StatusBadGateway)
		} else {
			rel.reqBuf = out
		}
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(rel.reqBuf)
}

// ErrNoTokenCount: count_tokens found neither a router tokenizer nor a
// worker that counts.
var ErrNoTokenCount = errors.New("router: no tokenizer to count with")

// countTokens serves POST /v1/messages/count_tokens: the request is
// translated as for /v1/messages and its chat prompt rendered and counted
// by the router's tokenizer; without one a worker of the model counts it
// (its POST /tokenize with the messages).
func (r *Router) countTokens(ctx *fasthttp.RequestCtx) {
	const rt = RouteCountTokens
	if !ctx.IsPost() {
		ctx.Response.Header.Set("Allow", "POST")
		writeAnthropicError(ctx, fasthttp.StatusMethodNotAllowed, "use POST for "+rt.Path(), "", "")
		r.metrics.request(rt, outcomeMethodNotAllowed).Inc()
		return
	}
	// count_tokens needs no max_tokens: give the translation one.
	body := ctx.PostBody()
	var tmp []byte
	if b, err := jsonx.SetField(nil, body, "max_tokens", []byte("1"), openai.MaxDepth); err == nil {
		tmp = b
	} else {
		tmp = body
	}
	chat, _, err := anthropic.AppendChatRequest(nil, tmp)
	var scan openai.Request
	if err == nil {
		err = openai.Scan(chat, &scan)
	}
	if err != nil {
		writeAnthropicError(ctx, fasthttp.StatusBadRequest, "invalid request body: "+err.Error(), "", "")
		r.metrics.request(rt, outcomeBadRequest).Inc()
		return
	}
	v := r.view.Load()
	if v == nil || v.models[string(scan.Model)] == nil {
		writeAnthropicError(ctx, fasthttp.StatusNotFound, "The model `"+clip(scan.Model)+"` does not exist.", "", "")
		r.metrics.request(rt, outcomeModelNotFound).Inc()
		return
	}
	n, err := r.promptTokens(chat, &scan, v.models[string(scan.Model)])
	if err != nil {
		writeAnthropicError(ctx, fasthttp.StatusBadGateway, "count tokens: "+err.Error(), "", "")
		r.metrics.request(rt, outcomeUpstreamError).Inc()
		return
	}
	out := append(ctx.Response.Body()[:0], `{"input_tokens":`...)
	out = append(out, itoa(n)...)
	ctx.SetContentType("application/json")
	ctx.SetBody(append(out, '}'))
	r.metrics.request(rt, outcomeOK).Inc()
}

// routerTokenizer is the kv-aware policy's tokenizer, if it has one.
func (r *Router) routerTokenizer() tokenizer.Tokenizer {
	if p, ok := r.policy.(*KVAware); ok {
		return p.tok
	}
	return nil
}

// promptTokens counts the chat prompt of body (scanned into scan).
func (r *Router) promptTokens(body []byte, scan *openai.Request, c *Candidates) (int, error) {
	chat := tokenizer.Chat{Messages: body[scan.Messages.Start:scan.Messages.End]}
	if !scan.Tools.Empty() {
		chat.Tools = body[scan.Tools.Start:scan.Tools.End]
	}
	if tok := r.routerTokenizer(); tok != nil {
		text, err := tok.RenderChatRequest(chat)
		if err != nil {
			return 0, err
		}
		return len(tok.Encode(text)), nil
	}
	if len(c.Workers) == 0 {
		return 0, ErrNoTokenCount
	}
	return workerTokenCount(c.Workers[int(c.Next()%uint64(len(c.Workers)))], body, scan)
}

// workerTokenCount asks worker w's POST /tokenize (vLLM's form, with
// messages) for the count of the chat prompt.
func workerTokenCount(w *Worker, body []byte, scan *openai.Request) (int, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(w.tokenize)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	b := append([]byte(`{"model":`), jsonx.AppendQuoted(nil, scan.Model)...)
	b = append(b, `,"messages":`...)
	b = append(b, body[scan.Messages.Start:scan.Messages.End]...)
	if !scan.Tools.Empty() {
		b = append(append(b, `,"tools":`...), body[scan.Tools.Start:scan.Tools.End]...)
	}
	req.SetBodyRaw(append(b, '}'))
	if err := w.doUnary(req, resp, 30e9); err != nil {
		return 0, errors.Join(ErrNoTokenCount, err)
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return 0, errors.Join(ErrNoTokenCount, errors.New("worker /tokenize answered "+itoa(resp.StatusCode())))
	}
	n, ok := readCount(resp.Body())
	if !ok {
		return 0, errors.Join(ErrNoTokenCount, errors.New("worker /tokenize answer has no count"))
	}
	return n, nil
}

// readCount reads "count" of a /tokenize answer (or the length of
// "tokens").
func readCount(b []byte) (int, bool) {
	s := jsonx.Scanner{B: b, MaxDepth: openai.MaxDepth}
	s.SkipWS()
	n, found := 0, false
	s.Members(func(ks, ke int, _ bool) bool {
		st := s.I
		if s.Value() != nil {
			return false
		}
		switch string(b[ks:ke]) {
		case "count":
			if v, ok := jsonx.ParseInt(b[st:s.I]); ok {
				n, found = int(v), true
			}
		case "tokens":
			if !found {
				k := 0
				sc := jsonx.Scanner{B: b[:s.I], I: st, MaxDepth: openai.MaxDepth}
				if sc.Elements(func() bool { k++; return sc.Value() == nil }) {
					n, found = k, true
				}
			}
		}
		return true
	})
	return n, found
}
