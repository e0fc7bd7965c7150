package sim

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Stream endings that drop the connection instead of finishing the body.
var (
	errClientGone = errors.New("client went away")
	errStopping   = errors.New("engine stopping")
	errCrashed    = errors.New("engine crashed (--die-after-tokens)")
	errNoRead     = errors.New("sim stream is written with WriteTo, not read")
)

// sseStream is the body of a streamed answer. fasthttp calls WriteTo on the
// connection's goroutine after the handler returned, and turns every Write
// into one HTTP chunk followed by a flush, so no extra goroutine or pipe is
// involved; a failed Write is how a client disconnect is noticed. Tokens
// that are ready together go out in one Write (each still its own SSE
// event), so the zero-latency mode costs one write per answer. Close runs
// when fasthttp is done with the body, whatever happened, and gives the
// sequence back.
type sseStream struct {
	s            *Server
	q            *seq
	chat         bool
	includeUsage bool
	ids          idsShape // return_token_ids: the engine's shape, or idsNone
	hung         bool
	conn         net.Conn
	sent         []int  // tokens sent, per choice
	avail        []int  // tokens generated, per choice, as last read
	prefix       []byte // `data: {"id":...,"choices":[`
	buf          []byte
}

var streamPool = sync.Pool{New: func() any { return new(sseStream) }}

func getStream() *sseStream { return streamPool.Get().(*sseStream) }

// startStream submits q and installs its stream as the response body.
func (s *Server) startStream(ctx *fasthttp.RequestCtx, q *seq, chat, includeUsage bool, ids idsShape) {
	if !s.sched.submitChoices(q) {
		s.writeError(ctx, fasthttp.StatusServiceUnavailable, "the engine is stopping")
		return
	}
	st := getStream()
	st.s, st.q, st.chat, st.includeUsage, st.ids = s, q, chat, includeUsage, ids
	for range q.numChoices() {
		st.sent, st.avail = append(st.sent, 0), append(st.avail, 0)
	}
	p := append(st.prefix[:0], `data: {"id":"`...)
	if chat {
		p = s.appendID(p, "chatcmpl-")
		p = append(p, `","object":"chat.completion.chunk","created":`...)
	} else {
		p = s.appendID(p, "cmpl-")
		p = append(p, `","object":"text_completion","created":`...)
	}
	p = strconv.AppendInt(p, time.Now().Unix(), 10)
	p = append(p, `,"model":`...)
	p = append(p, s.nameJSON...)
	st.prefix = append(p, `,"choices":[`...)
	ctx.SetContentType(contentSSE)
	// Like vLLM, send the headers at once so a client sees the stream
	// accepted while it waits in the queue; in zero-latency mode the
	// tokens follow immediately and the headers go out with them.
	ctx.Response.ImmediateHeaderFlush = !s.sched.instant
	ctx.Response.SetBodyStream(st, -1)
}

// Read is never used: SupportsBodyWriteTo makes fasthttp call WriteTo.
func (st *sseStream) Read([]byte) (int, error) { return 0, errNoRead }

// SupportsBodyWriteTo lets fasthttp frame each Write as a flushed chunk.
func (st *sseStream) SupportsBodyWriteTo() bool { return true }

// WriteTo streams the answer as tokens become available. The choices of
// n > 1 share one wake-up channel (choices.go); their ready tokens go out
// one of each choice in turn.
func (st *sseStream) WriteTo(w io.Writer) (int64, error) {
	s, q := st.s, st.q
	if st.hung {
		s.waitGone(st.conn)
		return 0, errClientGone
	}
	var written int64
	for {
		ready, shutdown, running := 0, false, false
		for i := range st.sent {
			c := q.choice(i)
			// done before generated: finished implies all generated.
			switch c.done.Load() {
			case seqShutdown:
				shutdown = true
			case seqRunning:
				running = true
			}
			st.avail[i] = int(c.generated.Load())
			ready += st.avail[i] - st.sent[i]
		}
		// Zero-latency mode finishes each choice on admission: wait for
		// them all, so that their chunks interleave (and go out in one
		// write) as they would in lockstep.
		if ready > 0 && !(s.sched.instant && running) {
			allowed, die := s.allowTokens(ready)
			b := st.buf[:0]
			for allowed > 0 {
				for i := range st.sent {
					if allowed > 0 && st.sent[i] < st.avail[i] {
						b = st.appendToken(b, i, st.sent[i])
						st.sent[i]++
						allowed--
					}
				}
			}
			complete := st.complete()
			if complete {
				b = st.appendEnd(b)
			}
			st.buf = b
			if len(b) > 0 {
				n, err := w.Write(b)
				written += int64(n)
				if err != nil {
					return written, errClientGone
				}
			}
			if die {
				s.die()
				return written, errCrashed
			}
			if complete {
				return written, nil
			}
		}
		if shutdown {
			return written, errStopping
		}
		select {
		case <-q.notify:
		case <-s.sched.stopped:
			for i := range st.sent {
				if q.choice(i).done.Load() == seqRunning {
					return written, errStopping
				}
			}
		}
	}
}

// complete reports whether every token of every choice was sent.
func (st *sseStream) complete() bool {
	for i, n := range st.sent {
		if n < st.q.choice(i).maxTokens {
			return false
		}
	}
	return true
}

// appendEnd appends what follows the last token: the usage chunk
// (stream_options.include_usage) and [DONE].
func (st *sseStream) appendEnd(b []byte) []byte {
	if st.includeUsage {
		b = append(b, st.prefix...)
		b = append(b, `],"usage":`...)
		b = appendUsage(b, st.q)
		b = append(b, "}\n\n"...)
	}
	return append(b, "data: [DONE]\n\n"...)
}

// appendToken appends the SSE event(s) of output token i of choice c: the
// role chunk before the first chat token, finish_reason on the last token.
func (st *sseStream) appendToken(b []byte, c, i int) []byte {
	q := st.q.choice(c)
	last := i == q.maxTokens-1
	tok := q.tokenText(i, i+1)
	if len(q.outEnds) > 0 {
		start := int32(0)
		if i > 0 {
			start = q.outEnds[i-1]
		}
		tok = q.tokenText(int(start), int(q.outEnds[i]))
	}
	if st.chat && len(q.tool) > 0 {
		b = st.appendToolDelta(b, c, i)
	} else if st.chat {
		if i == 0 {
			b = st.appendChoiceStart(b, c)
			b = append(b, `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null`...)
			b = st.closeChunk(b, c, -1, true)
		}
		b = st.appendChoiceStart(b, c)
		b = append(b, `,"delta":{"content":`...)
		b = appendJSONString(b, tok)
		if last {
			b = append(b, `},"logprobs":null,`...)
			b = q.appendFinish(b)
		} else {
			b = append(b, `},"logprobs":null,"finish_reason":null`...)
		}
		b = st.closeChunk(b, c, i, false)
	} else {
		b = st.appendChoiceStart(b, c)
		b = append(b, `,"text":`...)
		b = appendJSONString(b, tok)
		if last {
			b = append(b, `,"logprobs":null,`...)
			b = q.appendFinish(b)
		} else {
			b = append(b, `,"logprobs":null,"finish_reason":null,"stop_reason":null`...)
		}
		b = st.closeChunk(b, c, i, i == 0)
	}
	return b
}

// closeChunk closes a chunk's choice c, the choices and the chunk. With
// return_token_ids it first adds the ids in the engine's shape (ids.go):
// output token i of choice c (none when i < 0), and the prompt's ids when
// withPrompt.
func (st *sseStream) closeChunk(b []byte, c, i int, withPrompt bool) []byte {
	switch st.ids {
	case idsVLLM:
		if withPrompt && !st.chat {
			b = appendIDsField(b, `,"prompt_token_ids":`, st.q.choice(c).promptIDs())
		}
		if i >= 0 {
			b = appendIDsField(b, `,"token_ids":`, st.q.choice(c).outputIDs(i, i+1))
		}
		b = append(b, "}]"...)
		if withPrompt && st.chat {
			b = appendIDsField(b, `,"prompt_token_ids":`, st.q.promptIDs())
		}
	case idsSGLang:
		b = append(b, "}]"...)
		var prompt []uint32
		if withPrompt {
			prompt = st.q.promptIDs()
		}
		b = appendSGLangIDs(b, prompt, len(st.sent), c, st.q.choice(c).outputIDs(max(i, 0), i+1))
	default:
		b = append(b, "}]"...)
	}
	return append(b, "}\n\n"...)
}

// appendChoiceStart opens a chunk of choice c: the prefix and
// `{"index":c`.
func (st *sseStream) appendChoiceStart(b []byte, c int) []byte {
	b = append(b, st.prefix...)
	b = append(b, `{"index":`...)
	return strconv.AppendInt(b, int64(c), 10)
}

// Close gives the sequence back once fasthttp is done with the body: it
// recycles a finished sequence, aborts an unfinished one (the client went
// away or the write failed) so the engine frees its slot and blocks, and
// leaves an abandoned one alone.
func (st *sseStream) Close() error {
	s, q := st.s, st.q
	if st.hung {
		s.hung.Add(-1)
		putSeq(q)
	} else {
		// The first choice last: it holds the others.
		for i := len(st.sent) - 1; i >= 0; i-- {
			st.release(q.choice(i), st.sent[i])
		}
	}
	*st = sseStream{prefix: st.prefix[:0], buf: st.buf[:0], sent: st.sent[:0], avail: st.avail[:0]}
	if cap(st.buf) <= 1<<20 {
		streamPool.Put(st)
	}
	return nil
}

// release gives back one choice, of which sent tokens went out.
func (st *sseStream) release(q *seq, sent int) {
	s := st.s
	switch {
	case sent == q.maxTokens:
		// Every token was out, so the scheduler has finished or is
		// finishing q this instant.
		if s.sched.wait(q) == seqFinished {
			putSeq(q)
		}
	default:
		switch q.done.Load() {
		case seqFinished:
			putSeq(q)
		case seqRunning:
			s.sched.abort(q)
		}
	}
}
