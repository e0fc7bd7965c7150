package sim

// The generated text is a stream of words from a fixed list, chosen by a
// PRNG seeded with (--seed, hash of the prompt tokens): the same seed and
// prompt give the same text, whatever max_tokens is (a shorter answer is a
// prefix of a longer one), streamed or not. With the bytes tokenizer every
// output byte is one token, so the words are plain ASCII and re-tokenizing
// the answer in the next turn of a chat gives the same token ids, which
// keeps multi-turn prefix caching faithful. With a Hugging Face tokenizer
// the same words are counted in model tokens (hfCodec.generate).

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

// appendGenerated appends n bytes of deterministic text for (seed,
// promptHash) to dst.
func appendGenerated(dst []byte, seed, promptHash uint64, n int) []byte {
	state := splitmix64(seed ^ splitmix64(promptHash))
	want := len(dst) + n
	for len(dst) < want {
		state = splitmix64(state)
		w := words[state%uint64(len(words))]
		if len(dst) > want-n { // not the first word
			dst = append(dst, ' ')
		}
		dst = append(dst, w...)
	}
	return dst[:want]
}
