package router

import (
	"errors"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/jsonx"
	"github.com/infera/infera/openai"
	"github.com/infera/infera/tokenizer"
)

// POST /tokenize and /detokenize (vLLM's), answered by the router's own
// tokenizer.

// Tokenize errors.
var (
	// ErrNoTokenizer: the router has no tokenizer of its own (kv-aware
	// with --tokenizer bytes or a directory), so /tokenize and
	// /detokenize are not served.
	ErrNoTokenizer = errors.New("router: the router has no tokenizer")
	// ErrNoDecode: the router's tokenizer cannot turn ids back into text.
	ErrNoDecode = errors.New("router: the router's tokenizer cannot detokenize")
)

// tokenizeRequest is what /tokenize and /detokenize read beyond openai.Scan.
type tokenizeRequest struct {
	tokens    []uint32
	hasTokens bool
}

// serveTokenize answers POST /tokenize and /detokenize in vLLM's shapes
// with the router's tokenizer:
//
//	/tokenize   {"model","prompt"} or {"model","messages"[,"tools","chat_template_kwargs"]}
//	            → {"count","max_model_len":null,"tokens","token_strs":null}
//	/detokenize {"model","tokens"} → {"prompt"}
//
// A chat is rendered with the tokenizer's chat template and the generation
// prompt; text is encoded without special tokens (the router cannot know
// the engine's BOS policy). Without a router tokenizer both answer 501 with
// code tokenizer_unavailable.
func (r *Router) serveTokenize(ctx *fasthttp.RequestCtx, rt Route) {
	if !ctx.IsPost() {
		ctx.Response.Header.Set("Allow", "POST")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "use POST for "+rt.Path(), openai.TypeInvalidRequest, "method_not_allowed")
		r.metrics.request(rt, outcomeMethodNotAllowed).Inc()
		return
	}
	body := ctx.PostBody()
	var scan openai.Request
	var tr tokenizeRequest
	err := openai.Scan(body, &scan)
	if err == nil && rt == RouteDetokenize {
		tr, err = readTokens(body)
	}
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, "invalid request body: "+err.Error(), openai.TypeInvalidRequest, "invalid_body")
		r.metrics.request(rt, outcomeBadRequest).Inc()
		return
	}
	v := r.view.Load()
	if v == nil || v.models[string(scan.Model)] == nil {
		writeError(ctx, fasthttp.StatusNotFound, "The model `"+clip(scan.Model)+"` does not exist.", openai.TypeNotFound, "model_not_found")
		r.metrics.request(rt, outcomeModelNotFound).Inc()
		return
	}
	tok := r.routerTokenizer()
	if tok == nil {
		writeError(ctx, fasthttp.StatusNotImplemented, ErrNoTokenizer.Error()+": "+rt.Path()+" is served with --policy kv-aware and --tokenizer (bytes or a tokenizer directory); ask a worker's engine directly", openai.TypeInvalidRequest, "tokenizer_unavailable")
		r.metrics.request(rt, outcomeNotFound).Inc()
		return
	}
	var out []byte
	if rt == RouteTokenize {
		out, err = appendTokenize(ctx.Response.Body()[:0], tok, body, &scan)
	} else {
		out, err = appendDetokenize(ctx.Response.Body()[:0], tok, tr)
	}
	switch {
	case errors.Is(err, ErrNoDecode):
		writeError(ctx, fasthttp.StatusNotImplemented, err.Error(), openai.TypeInvalidRequest, "tokenizer_unavailable")
		r.metrics.request(rt, outcomeNotFound).Inc()
		return
	case err != nil:
		writeError(ctx, fasthttp.StatusBadRequest, err.Error(), openai.TypeInvalidRequest, "invalid_request")
		r.metrics.request(rt, outcomeBadRequest).Inc()
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(out)
	r.metrics.request(rt, outcomeOK).Inc()
}

// errTokenizeInput: /tokenize got neither a prompt string nor messages.
var errTokenizeInput = errors.New("tokenize: give a \"prompt\" string or a \"messages\" array")

// appendTokenize appends the /tokenize answer for the scanned body.
func appendTokenize(dst []byte, tok tokenizer.Tokenizer, body []byte, scan *openai.Request) ([]byte, error) {
	var text string
	switch {
	case !scan.Messages.Empty():
		chat := tokenizer.Chat{Messages: body[scan.Messages.Start:scan.Messages.End]}
		if !scan.Tools.Empty() {
			chat.Tools = body[scan.Tools.Start:scan.Tools.End]
		}
		if !scan.ChatTemplateKwargs.Empty() {
			chat.Kwargs = body[scan.ChatTemplateKwargs.Start:scan.ChatTemplateKwargs.End]
		}
		var err error
		if text, err = tok.RenderChatRequest(chat); err != nil {
			return dst, errors.Join(errTokenizeInput, err)
		}
	case !scan.Prompt.Empty() && body[scan.Prompt.Start] == '"':
		raw := body[scan.Prompt.Start+1 : scan.Prompt.End-1]
		text = string(jsonx.AppendUnescaped(nil, raw))
	default:
		return dst, errTokenizeInput
	}
	ids := tok.Encode(text)
	dst = append(dst, `{"count":`...)
	dst = strconv.AppendInt(dst, int64(len(ids)), 10)
	dst = append(dst, `,"max_model_len":null,"tokens":[`...)
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(id), 10)
	}
	return append(dst, `],"token_strs":null}`...), nil
}

// decoder is implemented by the tokenizers that detokenize (Bytes, HF).
type decoder interface {
	Decode(ids []uint32) (string, error)
}

// appendDetokenize appends the /detokenize answer for tr's tokens.
func appendDetokenize(dst []byte, tok tokenizer.Tokenizer, tr tokenizeRequest) ([]byte, error) {
	d, ok := tok.(decoder)
	if !ok {
		return dst, ErrNoDecode
	}
	if !tr.hasTokens {
		return dst, errors.New("detokenize: \"tokens\" (an array of token ids) is required")
	}
	text, err := d.Decode(tr.tokens)
	if err != nil {
		return dst, errors.Join(errors.New("detokenize"), err)
	}
	dst = append(dst, `{"prompt":`...)
	dst = jsonx.AppendQuoted(dst, text)
	return append(dst, '}'), nil
}

// errBadTokens: "tokens" is not an array of non-negative 32-bit integers.
var errBadTokens = errors.New("\"tokens\" must be an array of non-negative integer token ids")

// readTokens reads the "tokens" array of a /detokenize body (valid JSON:
// openai.Scan accepted it).
func readTokens(body []byte) (tokenizeRequest, error) {
	var tr tokenizeRequest
	var bad bool
	s := jsonx.Scanner{B: body, MaxDepth: openai.MaxDepth}
	s.SkipWS()
	complete := s.Members(func(ks, ke int, kesc bool) bool {
		if !jsonx.Equal(body[ks:ke], kesc, "tokens") {
			return s.Value() == nil
		}
		s.SkipWS()
		if s.I >= len(body) || body[s.I] != '[' {
			bad = true
			return false
		}
		tr.hasTokens, tr.tokens = true, tr.tokens[:0]
		return s.Elements(func() bool {
			st := s.I
			if s.Value() != nil {
				return false
			}
			n, ok := jsonx.ParseUint(body[st:s.I])
			if !ok || n > 1<<32-1 {
				bad = true
				return false
			}
			tr.tokens = append(tr.tokens, uint32(n))
			return true
		})
	})
	if bad {
		return tokenizeRequest{}, errBadTokens
	}
	if !complete {
		// openai.Scan accepted the body, so this is a broken invariant of
		// the two scanners; answer 400 rather than a half-read request.
		return tokenizeRequest{}, jsonx.ErrSyntax
	}
	return tr, nil
}
