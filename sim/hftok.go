package sim

import (
	"errors"
	"fmt"

	"github.com/infera/infera/tokenizer"
)

// With --tokenizer DIR the simulator computes the token ids a real engine
// serving that model would: chat requests are rendered with the model's chat
// template (tools and chat_template_kwargs included) when the directory has
// one, else with the simulator's ChatML layout, and the text is encoded with
// the Hugging Face tokenizer; completion prompts are encoded likewise, and
// token-id prompts are checked against the model's vocabulary. Those ids
// drive the prefix cache and the KV events, so a router loading the same
// directory hashes the same blocks.
//
// Output: the same deterministic words as in bytes mode, but counted in the
// model's tokens. Each word is encoded on its own (" word" after the first,
// with its leading space), and an answer of max_tokens tokens is the first
// max_tokens tokens of that word stream, so usage.completion_tokens is
// exact and a stream sends one model token per event. For byte-level BPE
// tokenizers, whose pre-tokenizers split before a space-prefixed lowercase
// word, the stream equals the encoding of the whole text; re-encoding the
// answer inside the next turn's template can still differ at its edges, as
// it does on a real engine.

// ErrTokenizer wraps problems loading or using --tokenizer.
var ErrTokenizer = errors.New("sim tokenizer")

// wordTokens is one output word's tokens: ids and the end offset of each
// token's text within text.
type wordTokens struct {
	text string
	ids  []uint32
	ends []int32
}

// hfCodec is the simulator's use of a Hugging Face tokenizer. It is
// immutable after newHFCodec; the tokenizer is safe for concurrent use.
type hfCodec struct {
	tok   *tokenizer.HF
	chat  bool // the directory has a chat template
	vocab int
	// first[i] is words[i] at the start of an answer, rest[i] is
	// " "+words[i].
	first, rest [len(words)]wordTokens
}

func newHFCodec(tok *tokenizer.HF) (*hfCodec, error) {
	c := &hfCodec{tok: tok, chat: tok.HasChatTemplate(), vocab: tok.VocabSize()}
	for i, w := range words {
		var err error
		if c.first[i], err = c.wordTokens(w); err != nil {
			return nil, err
		}
		if c.rest[i], err = c.wordTokens(" " + w); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// wordTokens encodes text and splits it into its tokens' texts, which must
// concatenate back to text: streamed tokens are sent as those pieces.
func (c *hfCodec) wordTokens(text string) (wordTokens, error) {
	wt := wordTokens{text: text, ids: c.tok.Encode(text)}
	end := 0
	for _, id := range wt.ids {
		piece, err := c.tok.Decode([]uint32{id})
		if err != nil {
			return wt, fmt.Errorf("%w: decode token %d of %q: %w", ErrTokenizer, id, text, err)
		}
		if end+len(piece) > len(text) || text[end:end+len(piece)] != piece {
			return wt, fmt.Errorf("%w: tokens of %q do not decode back to it", ErrTokenizer, text)
		}
		end += len(piece)
		wt.ends = append(wt.ends, int32(end))
	}
	if end != len(text) || len(wt.ids) == 0 {
		return wt, fmt.Errorf("%w: tokens of %q do not decode back to it", ErrTokenizer, text)
	}
	return wt, nil
}

// encode appends the ids of text. The tokenizer may keep pieces of the
// string in its word cache, so the text is copied into a string.
func (c *hfCodec) encode(dst []uint32, text []byte) []uint32 {
	return c.tok.AppendEncode(dst, string(text))
}

// renderChat renders a validated chat request's messages with the model's
// template. add_generation_prompt=false is passed to the template as a
// kwarg unless the request sets chat_template_kwargs itself.
func (c *hfCodec) renderChat(body []byte, r *request) (string, error) {
	chat := tokenizer.Chat{Messages: body[r.messages.start:r.messages.end]}
	if !r.tools.empty() {
		chat.Tools = body[r.tools.start:r.tools.end]
	}
	if !r.kwargs.empty() {
		chat.Kwargs = body[r.kwargs.start:r.kwargs.end]
	} else if !r.addGenPrompt {
		chat.Kwargs = []byte(`{"add_generation_prompt":false}`)
	}
	text, err := c.tok.RenderChatRequest(chat)
	if err != nil {
		return "", badRequest("cannot render the chat template: %v", err)
	}
	return text, nil
}

// generate appends n output tokens for (seed, promptHash): their text to
// out, their ids to ids and each token's end offset in out to ends.
func (c *hfCodec) generate(out []byte, ids []uint32, ends []int32, seed, promptHash uint64, n int) ([]byte, []uint32, []int32) {
	state := splitmix64(seed ^ splitmix64(promptHash))
	for k := 0; k < n; {
		state = splitmix64(state)
		w := &c.rest[state%uint64(len(words))]
		if k == 0 {
			w = &c.first[state%uint64(len(words))]
		}
		base := int32(len(out))
		take := min(len(w.ids), n-k)
		ids = append(ids, w.ids[:take]...)
		for _, e := range w.ends[:take] {
			ends = append(ends, base+e)
		}
		out = append(out, w.text[:w.ends[take-1]]...)
		k += take
	}
	return out, ids, ends
}
