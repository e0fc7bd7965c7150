// Package tokenizer turns prompts into the token ids an inference engine
// computes for them, so that the router can hash KV-cache blocks exactly as
// the engine does (DESIGN §5).
//
// It owns:
//
//   - HF: a Hugging Face tokenizer.json loader and encoder for byte-level BPE
//     models (Qwen2/2.5/3, Llama 3.x, DeepSeek V2/V3/R1, GPT-2 style): NFC/NFD/
//     NFKC/NFKD/Lowercase normalizers, Split pre-tokenizers (regex or string,
//     every split behaviour, invert) followed by ByteLevel, added and special
//     tokens matched before BPE (leftmost, then longest; lstrip, rstrip,
//     single_word, normalized), BPE merges in both file formats and
//     ignore_merges. Encode never adds special tokens. Anything else in a
//     tokenizer.json makes Load fail with ErrUnsupported instead of
//     encoding differently from the engine.
//   - Chat templates: tokenizer_config.json's chat_template (a string or a
//     named list, "default" used) or chat_template.jinja, rendered with
//     add_generation_prompt=true and the config's bos/eos/unk/pad tokens by
//     github.com/ardanlabs/jinja.
//   - Bytes: one token per byte, for tests and simulations.
//
// Split regexes of the supported families run through hand-written scanners
// that match Oniguruma (the regex engine of Hugging Face tokenizers) rune for
// rune; other patterns run through regexp2, which supports the lookaheads
// Go's regexp lacks. Tests check every scanner against regexp2, and the
// encoder against goldens produced by transformers.js.
//
// Known differences from Hugging Face tokenizers: none for assigned Unicode
// characters; characters new in a Unicode version that Go's tables (15.0)
// and the engine's Oniguruma do not share may be classed differently, as may
// invalid UTF-8 (which Rust strings cannot hold, so an engine never sees it).
//
// Concurrency: an HF is immutable after Load except for its word and
// segment caches, which are locked, and a sync.Pool of scratch buffers; Encode,
// AppendEncode, Decode and RenderChat are safe for concurrent use. Bytes has
// no state. The package starts no goroutines.
//
// Cost: once warm, AppendEncode allocates nothing; Encode allocates only its
// result. Long segments (the text between special tokens: about one chat
// message) are cached as ids, so a multi-turn chat encodes only its new
// turn. The template engine allocates (it builds template values, from a
// one-pass JSON reader that decodes exactly as encoding/json would); Qwen3's
// template also has a compiled form (qwen3chat.go, recognized by the
// template's sha256) that renders the common chats straight into a caller's
// buffer without allocating. HF and Bytes implement ChatAppender, the
// router's hot path.
package tokenizer
