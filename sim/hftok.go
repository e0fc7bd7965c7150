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
// Output: words from the same list as in bytes mode, each one model token:
// the words whose " word" (with its leading space) encodes to a single
// token (or, for a tokenizer that has none, the first token of each), so
// usage.completion_tokens is exact and a stream sends one model token per
// event. Each token is drawn from the hash of every token id before it, so
// that an exact continuation (prompt ids + the output ids so far, sent to
// another worker) yields what an unbroken run would. For byte-level BPE
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
	// pieces are the output vocabulary: single-token " word"s.
	pieces []wordTokens
}

func newHFCodec(tok *tokenizer.HF) (*hfCodec, error) {
	c := &hfCodec{tok: tok, chat: tok.HasChatTemplate(), vocab: tok.VocabSize()}
	var firsts []wordTokens
	for _, w := range words {
		wt, err := c.wordTokens(" " + w)
		if err != nil {
			return nil, err
		}
		if len(wt.ids) == 1 {
			c.pieces = append(c.pieces, wt)
		}
		firsts = append(firsts, wordTokens{text: wt.text[:wt.ends[0]], ids: wt.ids[:1], ends: wt.ends[:1]})
	}
	if len(c.pieces) == 0 {
		c.pieces = firsts
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

// generate appends n output tokens continuing ids (the prompt): their text
// to out, their ids to ids and each token's end offset in out to ends.
func (c *hfCodec) generate(out []byte, ids []uint32, ends []int32, seed uint64, n int) ([]byte, []uint32, []int32) {
	h := contextRoot
	for _, id := range ids {
		h = h.add(id)
	}
	for range n {
		p := &c.pieces[h.pick(seed, len(c.pieces))]
		ids = append(ids, p.ids[0])
		out = append(out, p.text...)
		ends = append(ends, int32(len(out)))
		h = h.add(p.ids[0])
	}
	return out, ids, ends
}
