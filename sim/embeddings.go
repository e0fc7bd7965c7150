package sim

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// Embeddings, as vLLM's POST /v1/embeddings answers them: "input" is a
// string, a list of strings, a list of token ids, or a list of lists of
// token ids; each input gets a unit-length vector of "dimensions" floats
// (embeddingDims by default) drawn from a PRNG seeded with (--seed, hash of
// its tokens), so equal inputs get equal vectors, on every run.
// "encoding_format": "base64" sends the little-endian float32 bytes in
// base64. The vectors are not computed by the scheduler: embedding a prompt
// takes no decode steps, and the simulator models generation.

// embeddingDims is the vector size when the request gives no dimensions.
const embeddingDims = 32

// maxEmbeddingDims bounds "dimensions".
const maxEmbeddingDims = 4096

// embeddings serves POST /v1/embeddings.
func (s *Server) embeddings(ctx *fasthttp.RequestCtx) {
	var r request
	body, ok := s.readRequest(ctx, &r)
	if !ok {
		return
	}
	dims := int64(embeddingDims)
	if r.dimensions >= 0 {
		if r.dimensions < 1 || r.dimensions > maxEmbeddingDims {
			s.writeError(ctx, fasthttp.StatusBadRequest, "dimensions must be between 1 and "+strconv.Itoa(maxEmbeddingDims))
			return
		}
		dims = r.dimensions
	}
	inputs, err := embeddingInputs(body, r.input)
	if err != nil {
		s.writeError(ctx, fasthttp.StatusBadRequest, clientMessage(err))
		return
	}
	q := getSeq()
	defer putSeq(q)
	bp := getBuf()
	b := append((*bp)[:0], `{"id":"`...)
	b = s.appendID(b, "embd-")
	b = append(b, `","object":"list","created":`...)
	b = strconv.AppendInt(b, time.Now().Unix(), 10)
	b = append(b, `,"model":`...)
	b = append(b, s.nameJSON...)
	b = append(b, `,"data":[`...)
	total := 0
	var vec []float32
	for i, in := range inputs {
		q.tokens, q.text, err = appendPromptTokens(q.tokens[:0], q.text, body, in, s.hf)
		if err == nil && len(q.tokens) == 0 {
			err = badRequest("input %d is empty", i)
		}
		if err == nil && len(q.tokens) >= s.cfg.MaxModelLen {
			err = badRequest("This model's maximum context length is %d tokens. However, input %d has %d tokens.", s.cfg.MaxModelLen, i, len(q.tokens))
		}
		if err != nil {
			*bp = b
			putBuf(bp)
			s.writeError(ctx, fasthttp.StatusBadRequest, clientMessage(err))
			return
		}
		total += len(q.tokens)
		var h uint64
		h, q.scratch = hashTokens(rootHash, q.tokens, q.scratch)
		vec = embeddingVector(vec[:0], uint64(s.cfg.Seed), h, int(dims))
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `,"object":"embedding","embedding":`...)
		b = appendEmbedding(b, vec, r.base64)
		b = append(b, '}')
	}
	b = append(b, `],"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(total), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(total), 10)
	b = append(b, `,"completion_tokens":0,"prompt_tokens_details":null}}`...)
	ctx.SetContentType(contentJSON)
	ctx.SetBody(b)
	*bp = b
	putBuf(bp)
}

// embeddingInputs splits "input" into the spans of its inputs, each one a
// value appendPromptTokens reads (a string or a list of token ids).
func embeddingInputs(body []byte, in span) ([]span, error) {
	if in.empty() {
		return nil, badRequest("input is required")
	}
	s := newScanner(body[:in.end], in.start)
	switch s.peek() {
	case '"':
		return []span{in}, nil
	case '[':
	default:
		return nil, badRequest("input must be a string, a list of strings or a list of token ids")
	}
	var spans []span
	ids := false
	s.array(func() bool {
		c := s.peek()
		if c != '"' && c != '[' {
			ids = true
		}
		st := s.peekPos()
		if !s.skip() {
			return false
		}
		spans = append(spans, span{st, s.I})
		return true
	})
	switch {
	case len(spans) == 0:
		return nil, badRequest("input must not be empty")
	case ids:
		return []span{in}, nil // one input of token ids (checked when read)
	}
	return spans, nil
}

// embeddingVector appends a deterministic unit vector of n floats for
// (seed, hash) to dst.
func embeddingVector(dst []float32, seed, hash uint64, n int) []float32 {
	state := splitmix64(seed ^ splitmix64(hash))
	var norm float64
	for range n {
		state = splitmix64(state)
		// 53 random bits → [-1, 1).
		v := float64(state>>11)/(1<<52) - 1
		dst = append(dst, float32(v))
		norm += v * v
	}
	if norm == 0 {
		dst[0], norm = 1, 1
	}
	inv := 1 / math.Sqrt(norm)
	for i := range dst {
		dst[i] = float32(float64(dst[i]) * inv)
	}
	return dst
}

// appendEmbedding appends vec as a JSON array of floats, or as a base64
// string of its little-endian float32 bytes.
func appendEmbedding(b []byte, vec []float32, b64 bool) []byte {
	if b64 {
		raw := make([]byte, 4*len(vec))
		for i, v := range vec {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
		}
		b = append(b, '"')
		b = base64.StdEncoding.AppendEncode(b, raw)
		return append(b, '"')
	}
	b = append(b, '[')
	for i, v := range vec {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendFloat(b, float64(v), 'g', -1, 32)
	}
	return append(b, ']')
}
