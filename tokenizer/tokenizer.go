package tokenizer

import (
	"slices"
	"unsafe"
)

// Tokenizer turns prompt text into the token ids an engine would compute.
// Implementations are safe for concurrent use.
type Tokenizer interface {
	// Name identifies the tokenizer in logs and metrics.
	Name() string
	// Encode returns the ids of text without adding special tokens.
	Encode(text string) []uint32
	// AppendEncode appends the ids of text to dst: the allocation-free
	// form of Encode for hot paths.
	AppendEncode(dst []uint32, text string) []uint32
	// RenderChat renders an OpenAI-style messages array (raw JSON) into
	// the prompt text, with add_generation_prompt=true.
	RenderChat(messages []byte) (string, error)
	// RenderChatRequest is RenderChat with the request's tools and
	// chat_template_kwargs, which change the prompt of some templates.
	RenderChatRequest(c Chat) (string, error)
}

// Open returns the tokenizer a --tokenizer flag names: "bytes", or a
// directory holding tokenizer.json (and optionally tokenizer_config.json or
// chat_template.jinja).
func Open(spec string) (Tokenizer, error) {
	if spec == "bytes" {
		return Bytes{}, nil
	}
	return Load(spec)
}

var (
	_ Tokenizer = (*HF)(nil)
	_ Tokenizer = Bytes{}
)

// Bytes is the tokenizer of tests and simulations: each byte is one token,
// its id the byte's value.
type Bytes struct{}

// Name returns "bytes".
func (Bytes) Name() string { return "bytes" }

// Encode returns one id per byte of text.
func (b Bytes) Encode(text string) []uint32 {
	return b.AppendEncode(make([]uint32, 0, len(text)), text)
}

// AppendEncode appends one id per byte of text to dst.
func (Bytes) AppendEncode(dst []uint32, text string) []uint32 { return AppendByteIDs(dst, text) }

// AppendByteIDs appends the bytes tokenizer's ids of text (one per byte, the
// byte's value) to dst, growing it at most once. The router's Bytes and the
// simulator's bytes mode share it.
func AppendByteIDs[S ~string | ~[]byte](dst []uint32, text S) []uint32 {
	n := len(dst)
	dst = slices.Grow(dst, len(text))[:n+len(text)]
	out := dst[n:]
	i := 0
	if haveWiden && len(out) >= 32 {
		// 32 bytes a round in vector registers (widen_amd64.s): the
		// eight-byte loop below was 3.3 instructions a byte, a tenth of
		// a kv-aware pick's own (issue 36, docs/performance.md).
		i = len(out) &^ 31
		widenBytes(&out[0], textData(text), i)
	}
	// Eight at a time, on fixed-length windows the compiler checks once:
	// byte by byte, the bounds checks were most of a kv-aware pick's
	// encode (issue 36, docs/performance.md).
	for ; i+8 <= len(out); i += 8 {
		o, t := out[i:i+8:i+8], text[i:i+8]
		o[0], o[1], o[2], o[3] = uint32(t[0]), uint32(t[1]), uint32(t[2]), uint32(t[3])
		o[4], o[5], o[6], o[7] = uint32(t[4]), uint32(t[5]), uint32(t[6]), uint32(t[7])
	}
	for ; i < len(out); i++ {
		out[i] = uint32(text[i])
	}
	return dst
}

// textData is the first byte of text, which must not be empty: a string's
// and a slice's headers both start with their data pointer, so one read
// serves both of S's kinds without converting (a conversion could copy).
func textData[S ~string | ~[]byte](text S) *byte {
	return *(**byte)(unsafe.Pointer(&text))
}

// Decode returns the bytes of ids; an id above 255 is an error.
func (Bytes) Decode(ids []uint32) (string, error) {
	out := make([]byte, len(ids))
	for i, id := range ids {
		if id > 0xFF {
			return "", ErrUnknownID
		}
		out[i] = byte(id)
	}
	return string(out), nil
}

// RenderChat renders messages as ChatML, the layout of the Qwen family:
// "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message, then
// "<|im_start|>assistant\n". There is no model behind Bytes, so any fixed,
// documented layout serves; ChatML keeps bytes-mode prompts realistic.
func (b Bytes) RenderChat(messages []byte) (string, error) {
	return b.RenderChatRequest(Chat{Messages: messages})
}

// RenderChatRequest renders c.Messages as RenderChat does; tools and kwargs
// do not change the bytes layout.
func (b Bytes) RenderChatRequest(c Chat) (string, error) {
	out, err := b.AppendRenderChat(nil, c)
	if err != nil {
		return "", err
	}
	return string(out), nil
}
