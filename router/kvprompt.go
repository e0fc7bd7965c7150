package router

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/openai"
	"github.com/infera/infera/tokenizer"
)

// Tokenization as the engine does it (DESIGN §5): a chat's messages (with
// its tools and chat_template_kwargs) rendered by the model's chat template
// with add_generation_prompt=true, then encoded without special tokens; a
// completion's prompt string encoded as is; a token-array prompt used as
// given. A batch prompt is routed by its first element.

var errTokenize = errors.New("router: engine tokenize failed")

// imageVisit hashes every image reference of messages into sc.img.
func imageVisit(messages []byte, sc *kvScratch) int {
	return openai.VisitImages(messages, sc.imageRef)
}

// tokenizeLocal fills sc.tokens with the configured tokenizer; false when
// the prompt cannot be tokenized (the request is then keyed by text).
func (p *KVAware) tokenizeLocal(in *PickInput, sc *kvScratch) bool {
	req, body := in.Request, in.Body
	if !req.Messages.Empty() {
		c := tokenizer.Chat{Messages: body[req.Messages.Start:req.Messages.End]}
		if !req.Tools.Empty() {
			c.Tools = body[req.Tools.Start:req.Tools.End]
		}
		if !req.ChatTemplateKwargs.Empty() {
			c.Kwargs = body[req.ChatTemplateKwargs.Start:req.ChatTemplateKwargs.End]
		}
		if p.chat != nil {
			var err error
			sc.text, err = p.chat.AppendRenderChat(sc.text[:0], c)
			if err != nil {
				p.tokenizeFailed("render chat", err)
				return false
			}
			sc.tokens = p.tok.AppendEncode(sc.tokens[:0], bytesString(sc.text))
			return true
		}
		// Template engines build values: this allocates (once per chat
		// request), which is the cost of exact chat tokenization.
		text, err := p.tok.RenderChatRequest(c)
		if err != nil {
			p.tokenizeFailed("render chat", err)
			return false
		}
		sc.tokens = p.tok.AppendEncode(sc.tokens[:0], text)
		return true
	}
	pr, err := openai.FirstPrompt(body[req.Prompt.Start:req.Prompt.End])
	if err != nil {
		p.tokenizeFailed("read prompt", err)
		return false
	}
	switch pr.Kind {
	case openai.PromptTokens:
		sc.tokens, err = openai.AppendTokenIDs(sc.tokens[:0], pr.Raw)
		if err != nil {
			p.tokenizeFailed("read prompt", err)
			return false
		}
	case openai.PromptText:
		text := pr.Raw
		if pr.Escaped {
			sc.text = openai.AppendUnescaped(sc.text[:0], pr.Raw)
			text = sc.text
		}
		sc.tokens = p.tok.AppendEncode(sc.tokens[:0], bytesString(text))
	}
	return true
}

// promptTokenArray fills sc.tokens from a token-array prompt, the one case
// that needs no tokenizer.
func (sc *kvScratch) promptTokenArray(in *PickInput) bool {
	req, body := in.Request, in.Body
	if req.Prompt.Empty() {
		return false
	}
	pr, err := openai.FirstPrompt(body[req.Prompt.Start:req.Prompt.End])
	if err != nil || pr.Kind != openai.PromptTokens {
		return false
	}
	sc.tokens, err = openai.AppendTokenIDs(sc.tokens[:0], pr.Raw)
	return err == nil
}

// maxTokenizeResponse bounds an engine's /tokenize answer we read.
const maxTokenizeResponse = 16 << 20

// tokenizeEngine asks worker w's POST /tokenize (vLLM and the simulator
// serve it) for the prompt's ids, with the engine's own defaults: chats
// render with add_generation_prompt=true and no special tokens; prompts get
// whatever special tokens the engine adds to a completion. It costs a round
// trip per request and allocates; failures fall back to text keying.
func (p *KVAware) tokenizeEngine(in *PickInput, sc *kvScratch, w *Worker) bool {
	req, body := in.Request, in.Body
	b := append(sc.text[:0], `{"model":`...)
	b = openai.AppendQuoted(b, string(req.Model))
	if !req.Messages.Empty() {
		b = append(b, `,"add_generation_prompt":true,"messages":`...)
		b = append(b, body[req.Messages.Start:req.Messages.End]...)
		if !req.Tools.Empty() {
			b = append(b, `,"tools":`...)
			b = append(b, body[req.Tools.Start:req.Tools.End]...)
		}
		if !req.ChatTemplateKwargs.Empty() {
			b = append(b, `,"chat_template_kwargs":`...)
			b = append(b, body[req.ChatTemplateKwargs.Start:req.ChatTemplateKwargs.End]...)
		}
	} else {
		pr, err := openai.FirstPrompt(body[req.Prompt.Start:req.Prompt.End])
		if err != nil {
			p.tokenizeFailed("read prompt", err)
			return false
		}
		switch pr.Kind {
		case openai.PromptTokens:
			sc.tokens, err = openai.AppendTokenIDs(sc.tokens[:0], pr.Raw)
			return err == nil
		case openai.PromptText:
			b = append(b, `,"prompt":"`...)
			b = append(b, pr.Raw...)
			b = append(b, '"')
		default:
			return true // nothing to tokenize: no blocks
		}
	}
	b = append(b, '}')
	sc.text = b

	kw, _ := w.PolicyState.(*kvWorker)
	if kw == nil || kw.tokClient == nil {
		return false
	}
	hreq := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(hreq)
	defer fasthttp.ReleaseResponse(resp)
	hreq.SetRequestURI(w.tokenize)
	hreq.Header.SetMethod(fasthttp.MethodPost)
	hreq.Header.SetContentType("application/json")
	hreq.SetBodyRaw(b)
	err := kw.tokClient.DoTimeout(hreq, resp, p.cfg.EngineTokenizeTimeout)
	if err == nil && resp.StatusCode() != fasthttp.StatusOK {
		err = fmt.Errorf("%w: status %d", errTokenize, resp.StatusCode())
	}
	if err == nil {
		sc.tokens, err = parseTokenizeResponse(sc.tokens[:0], resp.Body())
	}
	if err != nil {
		p.tokenizeFailed("engine "+w.id, err)
		return false
	}
	return true
}

// newTokenizeClient is the connection pool for one worker's /tokenize in
// engine mode: separate from the request pool, whose connections stream
// and carry the long upstream timeout, so that one tokenize is bounded by
// EngineTokenizeTimeout as a whole.
func (p *KVAware) newTokenizeClient(w *Worker) *fasthttp.HostClient {
	t := p.cfg.EngineTokenizeTimeout
	return &fasthttp.HostClient{
		Addr:                      w.addr,
		IsTLS:                     w.tls,
		Name:                      "infera",
		MaxConns:                  256,
		MaxIdleConnDuration:       p.cfg.EngineIdleConnTimeout,
		MaxIdemponentCallAttempts: 1,
		ReadTimeout:               t,
		WriteTimeout:              t,
		MaxResponseBodySize:       maxTokenizeResponse,
		DisablePathNormalizing:    true,
		Dial: func(addr string) (net.Conn, error) {
			return (&net.Dialer{Timeout: t}).Dial("tcp", addr)
		},
	}
}

// parseTokenizeResponse reads the "tokens" array of vLLM's /tokenize answer
// {"count":N,"max_model_len":M,"tokens":[...],"token_strs":null}.
func parseTokenizeResponse(dst []uint32, body []byte) ([]uint32, error) {
	k := bytes.Index(body, []byte(`"tokens"`))
	if k < 0 {
		return dst, fmt.Errorf(`%w: no "tokens" in the answer`, errTokenize)
	}
	rest := body[k+len(`"tokens"`):]
	open := bytes.IndexByte(rest, '[')
	if open < 0 || len(bytes.TrimSpace(bytes.TrimPrefix(bytes.TrimSpace(rest[:open]), []byte(":")))) != 0 {
		return dst, fmt.Errorf(`%w: "tokens" is not an array`, errTokenize)
	}
	end := bytes.IndexByte(rest[open:], ']')
	if end < 0 {
		return dst, fmt.Errorf(`%w: unterminated "tokens"`, errTokenize)
	}
	ids, err := openai.AppendTokenIDs(dst, rest[open:open+end+1])
	if err != nil {
		return dst, fmt.Errorf("%w: %w", errTokenize, err)
	}
	return ids, nil
}

// tokenizeFailed counts a prompt that fell back to text keying and warns at
// most every 10s, so a broken tokenizer is visible without a log line per
// request.
func (p *KVAware) tokenizeFailed(what string, err error) {
	p.m.tokenizeErrors.Inc()
	now := time.Now().UnixNano()
	last := p.lastTokWarn.Load()
	if now-last < int64(10*time.Second) || !p.lastTokWarn.CompareAndSwap(last, now) {
		return
	}
	p.log.Warn().Str("step", what).Err(err).Msg("tokenization failed; request keyed by its text (see infera_router_kv_tokenize_errors_total)")
}

// bytesString returns b's bytes as a string without copying. The string is used
// only during the tokenizer call that receives it, which copies whatever it
// keeps (its word cache copies keys), and b is not modified meanwhile.
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}
