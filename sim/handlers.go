package sim

import (
	"encoding/json"
	"math"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/config"
)

// owner is the "owned_by" of /v1/models: the imitated engine.
func (s *Server) owner() string {
	if s.cfg.Flavor != "" {
		return s.cfg.Flavor
	}
	return "vllm"
}

const (
	contentJSON = "application/json"
	contentSSE  = "text/event-stream; charset=utf-8"
	contentProm = "text/plain; version=0.0.4; charset=utf-8"
)

// handle routes a request. Paths and methods follow vLLM's OpenAI server;
// unknown paths and wrong methods answer like FastAPI does.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/v1/chat/completions":
		if s.method(ctx, true) {
			s.completion(ctx, true)
		}
	case "/v1/completions":
		if s.method(ctx, true) {
			s.completion(ctx, false)
		}
	case "/health":
		if s.method(ctx, false) {
			if !s.isReady() {
				ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			}
		}
	case "/metrics":
		if s.method(ctx, false) {
			s.metrics(ctx)
		}
	case "/v1/models":
		if s.method(ctx, false) {
			ctx.SetContentType(contentJSON)
			ctx.SetBody(s.models)
		}
	case "/tokenize":
		if s.method(ctx, true) {
			s.tokenize(ctx)
		}
	case "/v1/embeddings":
		if s.method(ctx, true) {
			s.embeddings(ctx)
		}
	case "/reset_prefix_cache":
		if s.method(ctx, true) {
			if !s.sched.resetPrefixCache(ctx) {
				s.writeError(ctx, fasthttp.StatusServiceUnavailable, "the engine is stopping")
			}
		}
	case "/flush_cache": // SGLang's reset, GET or POST
		if s.cfg.Flavor != config.FlavorSGLang {
			notFound(ctx)
			return
		}
		if !s.sched.resetPrefixCache(ctx) {
			s.writeError(ctx, fasthttp.StatusServiceUnavailable, "the engine is stopping")
			return
		}
		ctx.SetBodyString("Cache flushed.\n")
	case "/get_server_info", "/get_model_info":
		if s.cfg.Flavor != config.FlavorSGLang {
			notFound(ctx)
			return
		}
		if s.method(ctx, false) {
			ctx.SetContentType(contentJSON)
			if string(ctx.Path()) == "/get_server_info" {
				ctx.SetBody(s.serverInfo)
			} else {
				ctx.SetBody(s.modelInfo)
			}
		}
	default:
		notFound(ctx)
	}
}

func notFound(ctx *fasthttp.RequestCtx) {
	ctx.SetStatusCode(fasthttp.StatusNotFound)
	ctx.SetContentType(contentJSON)
	ctx.SetBodyString(`{"detail":"Not Found"}`)
}

// method checks the request method (POST, or GET/HEAD) and answers 405.
func (s *Server) method(ctx *fasthttp.RequestCtx, post bool) bool {
	if post && ctx.IsPost() || !post && (ctx.IsGet() || ctx.IsHead()) {
		return true
	}
	ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
	ctx.SetContentType(contentJSON)
	ctx.SetBodyString(`{"detail":"Method Not Allowed"}`)
	return false
}

// errorType is the vLLM error "type" for an HTTP status.
func errorType(status int) string {
	switch status {
	case fasthttp.StatusBadRequest:
		return "BadRequestError"
	case fasthttp.StatusNotFound:
		return "NotFoundError"
	case fasthttp.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	default:
		return "InternalServerError"
	}
}

// writeError answers in vLLM's OpenAI error envelope:
// {"error":{"message","type","param","code"}} with the HTTP status as code.
func (s *Server) writeError(ctx *fasthttp.RequestCtx, status int, message string) {
	bp := getBuf()
	b := append((*bp)[:0], `{"error":{"message":`...)
	b = appendJSONString(b, []byte(message))
	b = append(b, `,"type":"`...)
	b = append(b, errorType(status)...)
	b = append(b, `","param":null,"code":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, "}}"...)
	ctx.SetStatusCode(status)
	ctx.SetContentType(contentJSON)
	ctx.SetBody(b)
	*bp = b
	putBuf(bp)
}

// modelOK reports whether the request names the served model (or none).
func (s *Server) modelOK(body []byte, r *request) bool {
	if !r.hasModel {
		return true
	}
	return keyIs(body, r.model.start, r.model.end, r.modelEsc, s.name)
}

func (s *Server) modelNotFound(ctx *fasthttp.RequestCtx, body []byte, r *request) {
	s.writeError(ctx, fasthttp.StatusNotFound,
		"The model `"+string(appendRaw(nil, body[r.model.start:r.model.end], r.modelEsc))+"` does not exist.")
}

// completion serves /v1/chat/completions (chat) and /v1/completions.
func (s *Server) completion(ctx *fasthttp.RequestCtx, chat bool) {
	if !s.isReady() {
		s.writeError(ctx, fasthttp.StatusServiceUnavailable, "the engine is starting")
		return
	}
	if s.dead.Load() {
		dropConn(ctx)
		return
	}
	s.countDPRank(ctx.Request.Header.Peek("X-Data-Parallel-Rank"))
	var r request
	body, ok := s.readRequest(ctx, &r)
	if !ok {
		return
	}
	if s.reqLog != nil {
		s.reqLog.record(ctx, s.cfg.PDRole, body)
	}
	var pdr pdRequest
	if s.pd != nil {
		var err error
		if pdr, err = s.pd.classify(body, ctx.Request.Header.Peek("X-Request-Id"), ctx.Request.Header.Peek("X-Data-Parallel-Rank")); err != nil {
			s.log.Error().Err(err).Str("role", s.cfg.PDRole).Msg("pd request refused")
			s.writeError(ctx, fasthttp.StatusBadRequest, err.Error())
			return
		}
		if pdr.serveKV {
			// A prefill answers unary: the router drains its answer.
			r.stream, r.hasStreamOpt, r.includeUsage = false, false, false
		}
	}
	if r.hasStreamOpt && !r.stream {
		s.writeError(ctx, fasthttp.StatusBadRequest, "Stream options can only be defined when `stream=True`.")
		return
	}
	if r.n < 1 || r.n > MaxChoices {
		s.writeError(ctx, fasthttp.StatusBadRequest, nMessage(r.n))
		return
	}
	ids := s.idsFor(r.returnIDs)
	if ids == idsSGLang && chat && r.stream {
		s.writeError(ctx, fasthttp.StatusBadRequest, "return_token_ids is not supported for streaming chat completions")
		return
	}

	q := getSeq()
	var err error
	switch {
	case chat && r.messages.empty():
		err = badRequest("messages is required")
	case !chat && r.prompt.empty():
		err = badRequest("prompt is required")
	default:
		err = s.promptTokens(q, body, &r, chat)
	}
	if err == nil {
		err = s.sizeRequest(q, chat, &r)
	}
	if err != nil {
		putSeq(q)
		s.writeError(ctx, fasthttp.StatusBadRequest, clientMessage(err))
		return
	}
	if s.cfg.ErrorRate > 0 && s.draw() < s.cfg.ErrorRate {
		putSeq(q)
		s.writeError(ctx, fasthttp.StatusInternalServerError, "simulated engine error (--error-rate)")
		return
	}
	if chat {
		q.tool = append(q.tool[:0], toolCallName(body, &r)...)
	}
	maxTokens := q.maxTokens
	prepareSeq(q, s.cfg.BlockSize, s.seed, s.hf, body, r.stop)
	q.stream = r.stream
	if pdr.fetchKV && !s.fetchKV(ctx, q, &pdr) {
		putSeq(q)
		return
	}

	if s.cfg.HangBeforeFirstToken > 0 && s.draw() < s.cfg.HangBeforeFirstToken {
		s.hang(ctx, q, r.stream)
		return
	}
	if s.ttftLog != nil {
		q.logTTFT = true
		q.requestID = append(q.requestID[:0], ctx.Request.Header.Peek("X-Request-Id")...)
	}
	if r.n > 1 {
		s.addChoices(q, int(r.n), maxTokens, body, r.stop)
	}
	if r.stream {
		s.startStream(ctx, q, chat, r.includeUsage, ids)
		return
	}
	if !s.sched.submitChoices(q) {
		s.writeError(ctx, fasthttp.StatusServiceUnavailable, "the engine is stopping")
		return
	}
	switch s.waitUnary(ctx, q) {
	case seqFinished:
	case seqRunning:
		// The client went away: the scheduler frees the slots and
		// recycles the choices, as it does for a stream whose client left.
		s.sched.abortChoices(q)
		dropConn(ctx)
		return
	default:
		// Abandoned by a stopping scheduler: not ours to recycle.
		s.writeError(ctx, fasthttp.StatusServiceUnavailable, "the engine is stopping")
		return
	}
	if !s.sendTokens(q.completionTokens()) {
		putChoices(q)
		dropConn(ctx)
		return
	}
	if pdr.serveKV && !s.serveKV(ctx, q, &pdr, chat) {
		putChoices(q)
		return
	}
	s.writeUnary(ctx, q, chat, ids)
	putChoices(q)
}

// nMessage is the 400 message for an "n" out of [1, MaxChoices].
func nMessage(n int64) string {
	if n < 1 {
		return "n must be at least 1, got " + strconv.FormatInt(n, 10) + "."
	}
	return "n must be at most " + strconv.Itoa(MaxChoices) + ", got " + strconv.FormatInt(n, 10) + "."
}

// sizeRequest checks the prompt against the context length and settles the
// number of completion tokens, with vLLM's messages.
func (s *Server) sizeRequest(q *seq, chat bool, r *request) error {
	p := len(q.tokens)
	maxLen := s.cfg.MaxModelLen
	if p == 0 {
		return badRequest("The prompt cannot be empty.")
	}
	if p >= maxLen {
		return badRequest("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", maxLen, p)
	}
	want := r.maxTokens
	if chat && r.maxCompl >= 0 {
		want = r.maxCompl
	}
	switch {
	case want < 0:
		q.maxTokens = min(s.cfg.MaxTokensDefault, maxLen-p)
	case want < 1:
		return badRequest("max_tokens must be at least 1, got %d.", want)
	case want > int64(maxLen-p):
		// Compared against what is left of the context, so that a huge
		// max_tokens cannot overflow the sum (p < maxLen here).
		return badRequest("This model's maximum context length is %d tokens. However, you requested %s tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			maxLen, sumTokens(p, want), p, want)
	default:
		q.maxTokens = int(want)
	}
	q.promptLen = p
	return nil
}

// sumTokens renders p+want for an error message without overflowing.
func sumTokens(p int, want int64) string {
	if want > math.MaxInt64-int64(p) {
		return "more than " + strconv.FormatInt(math.MaxInt64, 10)
	}
	return strconv.FormatInt(int64(p)+want, 10)
}

// promptTokens fills q.tokens with the prompt of a chat (messages) or
// completion (prompt) request, with the configured tokenizer.
func (s *Server) promptTokens(q *seq, body []byte, r *request, chat bool) error {
	var err error
	switch {
	case chat && s.hf != nil && s.hf.chat:
		var text string
		if text, err = s.hf.renderChat(body, r); err == nil {
			q.tokens = s.hf.tok.AppendEncode(q.tokens[:0], text)
		}
	case chat:
		q.text, err = renderChat(q.text[:0], body, r.messages, r.addGenPrompt)
		if s.hf != nil {
			q.tokens = s.hf.encode(q.tokens[:0], q.text)
		} else {
			q.tokens = TokenizeBytes(q.tokens[:0], q.text)
		}
	default:
		q.tokens, q.text, err = appendPromptTokens(q.tokens[:0], q.text, body, r.prompt, s.hf)
	}
	return err
}

// prepareSeq generates q's output, cuts it at the first of the stop strings
// (the raw "stop" value in body; empty: none), and hashes its blocks.
// Handlers run it on their own goroutine so the scheduler only does
// bookkeeping. hf is nil for the bytes tokenizer.
func prepareSeq(q *seq, blockSize int, seed uint64, hf *hfCodec, body []byte, stop span) {
	q.hashes, q.scratch = appendBlockHashes(q.hashes[:0], q.tokens, blockSize, q.scratch)
	if hf != nil {
		q.out, q.tokens, q.outEnds = hf.generate(q.out[:0], q.tokens, q.outEnds[:0], seed, q.maxTokens)
	} else {
		q.out = appendGenerated(q.out[:0], seed, q.tokens, q.maxTokens)
		q.tokens = TokenizeBytes(q.tokens, q.out)
	}
	applyStop(q, body, stop)
	q.hashes, q.scratch = appendBlockHashes(q.hashes, q.tokens, blockSize, q.scratch)
}

// allowTokens accounts n tokens about to be sent for --die-after-tokens and
// returns how many of them may go out before the engine "crashes".
func (s *Server) allowTokens(n int) (allowed int, die bool) {
	limit := s.cfg.DieAfterTokens
	if limit <= 0 {
		return n, false
	}
	total := s.tokensOK.Add(int64(n))
	if total < limit {
		return n, false
	}
	over := min(total-limit, int64(n))
	return n - int(over), true
}

// sendTokens accounts a unary answer of n tokens; false means the engine
// dies instead of answering (an answer cannot be cut mid-way, so one that
// reaches the limit is never sent).
func (s *Server) sendTokens(n int) bool {
	if _, die := s.allowTokens(n); die {
		s.die()
		return false
	}
	return true
}

// dropConn closes the client connection without an answer, as a crashed
// engine would.
func dropConn(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	_ = ctx.Conn().Close()
}

// hang holds a request without ever producing a token until its client goes
// away (or the server stops). It counts as running, as a stuck request does
// on a real engine.
func (s *Server) hang(ctx *fasthttp.RequestCtx, q *seq, stream bool) {
	s.hung.Add(1)
	if stream {
		st := getStream()
		st.s, st.q, st.hung, st.conn = s, q, true, ctx.Conn()
		ctx.SetContentType(contentSSE)
		ctx.Response.ImmediateHeaderFlush = true // headers out, then silence
		ctx.Response.SetBodyStream(st, -1)
		return
	}
	s.waitGone(ctx.Conn())
	s.hung.Add(-1)
	putSeq(q)
	ctx.SetConnectionClose()
	s.writeError(ctx, fasthttp.StatusServiceUnavailable, "the engine is stopping")
}

// appendID appends a response id: prefix and 32 hex digits, unique per
// server (random base) and cheap (a counter through a mixer).
func (s *Server) appendID(b []byte, prefix string) []byte {
	n := s.ids.Add(1)
	b = append(b, prefix...)
	b = appendHex64(b, splitmix64(s.idBase[0]+n))
	return appendHex64(b, splitmix64(s.idBase[1]^n))
}

func appendHex64(b []byte, v uint64) []byte {
	const digits = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, digits[(v>>uint(shift))&0xf])
	}
	return b
}

// appendUsage appends vLLM's usage object: the prompt once, the completion
// tokens of every choice.
func appendUsage(b []byte, q *seq) []byte {
	p, c := int64(q.promptLen), int64(q.completionTokens())
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, p, 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, p+c, 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, c, 10)
	b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
	b = strconv.AppendInt(b, int64(q.cached.Load()), 10)
	return append(b, "}}"...)
}

// appendKVParams closes a unary answer with its kv_transfer_params value
// (null unless a PD prefill handed KV off) and the closing brace.
func appendKVParams(b []byte, q *seq) []byte {
	if q.kvParams == nil {
		return append(b, "null}"...)
	}
	b = append(b, q.kvParams...)
	return append(b, '}')
}

// writeUnary writes a finished sequence as one chat.completion or
// text_completion object.
func (s *Server) writeUnary(ctx *fasthttp.RequestCtx, q *seq, chat bool, ids idsShape) {
	bp := getBuf()
	b := append((*bp)[:0], `{"id":"`...)
	if chat {
		b = s.appendID(b, "chatcmpl-")
		b = append(b, `","object":"chat.completion","created":`...)
	} else {
		b = s.appendID(b, "cmpl-")
		b = append(b, `","object":"text_completion","created":`...)
	}
	b = strconv.AppendInt(b, time.Now().Unix(), 10)
	b = append(b, `,"model":`...)
	b = append(b, s.nameJSON...)
	b = append(b, `,"choices":[`...)
	for i := range q.numChoices() {
		c := q.choice(i)
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		switch {
		case chat && len(c.tool) > 0:
			b = append(b, `,"message":`...)
			b = s.appendToolCallMessage(b, c)
			b = append(b, `,"logprobs":null,"finish_reason":"tool_calls","stop_reason":null}`...)
		case chat:
			b = append(b, `,"message":{"role":"assistant","content":`...)
			b = appendJSONString(b, c.answer())
			b = append(b, `,"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":null},"logprobs":null,`...)
			b = c.appendFinish(b)
			if ids == idsVLLM {
				b = appendIDsField(b, `,"token_ids":`, c.outputIDs(0, c.maxTokens))
			}
			b = append(b, '}')
		default:
			b = append(b, `,"text":`...)
			b = appendJSONString(b, c.answer())
			b = append(b, `,"logprobs":null,`...)
			b = c.appendFinish(b)
			b = append(b, `,"prompt_logprobs":null`...)
			if ids == idsVLLM {
				b = appendIDsField(b, `,"prompt_token_ids":`, c.promptIDs())
				b = appendIDsField(b, `,"token_ids":`, c.outputIDs(0, c.maxTokens))
			}
			b = append(b, '}')
		}
	}
	b = append(b, ']')
	switch {
	case ids == idsVLLM && chat:
		b = appendIDsField(b, `,"prompt_token_ids":`, q.promptIDs())
	case ids == idsSGLang:
		b = appendSGLangUnaryIDs(b, q)
	}
	switch {
	case chat && len(q.tool) > 0:
		b = append(b, `,"usage":`...)
		b = appendUsage(b, q)
		b = append(b, `,"prompt_logprobs":null,"kv_transfer_params":`...)
		b = appendKVParams(b, q)
	case chat:
		b = append(b, `,"service_tier":null,"system_fingerprint":null,"usage":`...)
		b = appendUsage(b, q)
		b = append(b, `,"prompt_logprobs":null,"kv_transfer_params":`...)
		b = appendKVParams(b, q)
	default:
		b = append(b, `,"service_tier":null,"system_fingerprint":null,"usage":`...)
		b = appendUsage(b, q)
		b = append(b, `,"kv_transfer_params":`...)
		b = appendKVParams(b, q)
	}
	ctx.SetContentType(contentJSON)
	ctx.SetBody(b)
	*bp = b
	putBuf(bp)
}

// readRequest parses the request body into r and checks its model; on
// bad input or an unknown model it has answered the client and reports
// false.
func (s *Server) readRequest(ctx *fasthttp.RequestCtx, r *request) (body []byte, ok bool) {
	body = ctx.PostBody()
	if err := parseRequest(body, r); err != nil {
		s.writeError(ctx, fasthttp.StatusBadRequest, clientMessage(err))
		return nil, false
	}
	if !s.modelOK(body, r) {
		s.modelNotFound(ctx, body, r)
		return nil, false
	}
	return body, true
}

// tokenize serves POST /tokenize: {"prompt"} or {"messages"} →
// {"count","max_model_len","tokens","token_strs":null}, as vLLM.
func (s *Server) tokenize(ctx *fasthttp.RequestCtx) {
	var r request
	body, ok := s.readRequest(ctx, &r)
	if !ok {
		return
	}
	q := getSeq()
	defer putSeq(q)
	var err error
	switch {
	case !r.messages.empty():
		err = s.promptTokens(q, body, &r, true)
	case !r.prompt.empty():
		err = s.promptTokens(q, body, &r, false)
	default:
		err = badRequest("prompt or messages is required")
	}
	if err != nil {
		s.writeError(ctx, fasthttp.StatusBadRequest, clientMessage(err))
		return
	}
	bp := getBuf()
	b := append((*bp)[:0], `{"count":`...)
	b = strconv.AppendInt(b, int64(len(q.tokens)), 10)
	b = append(b, `,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(s.cfg.MaxModelLen), 10)
	b = append(b, `,"tokens":[`...)
	for i, t := range q.tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(t), 10)
	}
	b = append(b, `],"token_strs":null}`...)
	ctx.SetContentType(contentJSON)
	ctx.SetBody(b)
	*bp = b
	putBuf(bp)
}

// renderSGLangInfo builds SGLang's /get_server_info (the resolved server
// arguments and the scheduler's token pool; the worker reads page_size
// and max_total_num_tokens from it) and /get_model_info.
func (s *Server) renderSGLangInfo() {
	info := map[string]any{
		"model_path":           s.cfg.Model,
		"tokenizer_path":       s.cfg.Model,
		"served_model_name":    s.name,
		"host":                 s.cfg.Host,
		"port":                 s.cfg.Port,
		"page_size":            s.cfg.BlockSize,
		"max_total_num_tokens": s.cfg.KVBlocks * s.cfg.BlockSize,
		"context_length":       s.cfg.MaxModelLen,
		"max_running_requests": s.cfg.MaxNumSeqs,
		"chunked_prefill_size": s.cfg.MaxNumBatchedTokens,
		"random_seed":          s.cfg.Seed,
		"dp_size":              1,
		"disaggregation_mode":  "null",
		"version":              "infera-sim",
	}
	if s.cfg.KVEventsEndpoint != "" {
		ev, _ := json.Marshal(map[string]any{"publisher": "zmq", "endpoint": s.cfg.KVEventsEndpoint,
			"replay_endpoint": s.cfg.KVEventsReplayEndpoint, "topic": s.cfg.KVEventsTopic})
		info["kv_events_config"] = string(ev)
	}
	s.serverInfo, _ = json.Marshal(info)
	s.modelInfo, _ = json.Marshal(map[string]any{"model_path": s.cfg.Model, "tokenizer_path": s.cfg.Model, "is_generation": true})
}

// renderModels builds the GET /v1/models body once.
func (s *Server) renderModels(created int64) []byte {
	b := []byte(`{"object":"list","data":[{"id":`)
	b = append(b, s.nameJSON...)
	b = append(b, `,"object":"model","created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"owned_by":"`...)
	b = append(b, s.owner()...)
	b = append(b, `","root":`...)
	b = appendJSONString(b, []byte(s.cfg.Model))
	b = append(b, `,"parent":null,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(s.cfg.MaxModelLen), 10)
	b = append(b, `,"permission":[{"id":"`...)
	b = s.appendID(b, "modelperm-")
	b = append(b, `","object":"model_permission","created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"allow_create_engine":false,"allow_sampling":true,"allow_logprobs":true,"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":false,"organization":"*","group":null,"is_blocking":false}]}]}`...)
	return b
}
