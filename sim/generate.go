package sim

// The generated text is a stream of words from a fixed list. Every output
// token is a deterministic function of (--seed, every token before it:
// prompt and output so far), so
//   - the same seed and prompt give the same text, whatever max_tokens is
//     (a shorter answer is a prefix of a longer one), streamed or not;
//   - a generation continued from prompt + the first j output tokens (what
//     a router sends to another worker when a stream breaks: the "exact"
//     continuation) yields the tokens an unbroken run would have produced
//     from j on: the simulator is a model whose "sampling" is greedy.
//
// With the bytes tokenizer every output byte is one token, so the words are
// plain ASCII and re-tokenizing the answer in the next turn of a chat gives
// the same token ids, which keeps multi-turn prefix caching faithful. A word
// is chosen at each word start from the hash of the context up to there
// (the byte after the last space or newline), and spelled out byte by byte;
// a context that ends inside a word completes that word. With a Hugging
// Face tokenizer each output token is one single-token word (hfCodec.generate).

var words = [...]string{
	"the", "a", "model", "token", "cache", "block", "prefix", "router",
	"engine", "worker", "fleet", "request", "stream", "batch", "decode", "prefill",
	"latency", "through", "memory", "page", "hash", "queue", "step", "time",
	"is", "are", "was", "runs", "moves", "keeps", "finds", "sends",
	"fast", "slow", "warm", "cold", "small", "large", "next", "first",
	"of", "in", "on", "to", "with", "from", "and", "or",
	"every", "each", "one", "many", "some", "no", "this", "that",
	"answer", "question", "system", "user", "text", "word", "line", "end",
}

// splitmix64 is a tiny, high-quality 64-bit mixer and PRNG step.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// contextHash is a running FNV-1a hash over token ids: the generator's view
// of everything before the next token.
type contextHash uint64

const contextRoot contextHash = 14695981039346656037

func (h contextHash) add(id uint32) contextHash {
	return (h ^ contextHash(id)) * 1099511628211
}

// pick draws an index in [0, n) for (seed, h).
func (h contextHash) pick(seed uint64, n int) int {
	return int(splitmix64(seed^splitmix64(uint64(h))) % uint64(n))
}

func isWordSep(id uint32) bool { return id == ' ' || id == '\n' }

// appendGenerated appends n bytes of deterministic text continuing ctx (the
// prompt's byte token ids) to dst.
func appendGenerated(dst []byte, seed uint64, ctx []uint32, n int) []byte {
	h, atStart, start := contextRoot, contextRoot, 0
	for i, id := range ctx {
		h = h.add(id)
		if isWordSep(id) {
			atStart, start = h, i+1
		}
	}
	word, k := words[atStart.pick(seed, len(words))], len(ctx)-start
	if k > len(word) || !tailSpells(ctx[start:], word) {
		word, k = "", 0 // not inside a word of the list: a space comes next
	}
	for range n {
		b := byte(' ')
		if k < len(word) {
			b = word[k]
			k++
		}
		dst = append(dst, b)
		h = h.add(uint32(b))
		if b == ' ' {
			word, k = words[h.pick(seed, len(words))], 0
		}
	}
	return dst
}

// tailSpells reports whether ids are the first len(ids) bytes of word.
func tailSpells(ids []uint32, word string) bool {
	for i, id := range ids {
		if id != uint32(word[i]) {
			return false
		}
	}
	return true
}
