package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/dlclark/regexp2"
)

// Files read from a tokenizer directory.
const (
	fileTokenizer    = "tokenizer.json"
	fileConfig       = "tokenizer_config.json"
	fileChatTemplate = "chat_template.jinja"
)

// maxFileSize bounds what Load reads: the largest real tokenizer.json files are
// tens of MiB.
const maxFileSize = 256 << 20

// HF is a Hugging Face byte-level BPE tokenizer loaded from a model
// directory. It is immutable after Load and safe for concurrent use.
type HF struct {
	name      string
	model     bpe
	normalize normalizer
	steps     []preStep
	leaf      int           // steps from leaf on split nothing: a piece there is a word
	rawAdded  *addedMatcher // added tokens with normalized=false, matched on raw text
	normAdded *addedMatcher // added tokens with normalized=true, matched after normalizing
	idBytes   [][]byte      // decoded bytes per id
	chat      *chatTemplate // nil when the directory has none
	pool      sync.Pool     // *encodeState
	vocabSize int
	segs      *segmentCache // ids of recent long segments; nil: off
}

// Options tune Load. The zero value is the default.
type Options struct {
	// CacheWords bounds the per-tokenizer cache of encoded words; 0 means
	// the default (65536), negative disables the cache.
	CacheWords int
	// CacheSegmentTokens bounds the cache of long segments (the text
	// between two special tokens: about one chat message) in ids; 0 means
	// the default (1Mi ids, 4 MiB), negative disables it.
	CacheSegmentTokens int
}

const defaultCacheWords = 1 << 16

// maxCachedWord is the longest word (in bytes) kept in the word cache: longer
// words rarely repeat and would dominate its memory.
const maxCachedWord = 64

// Load reads tokenizer.json, and tokenizer_config.json and chat_template.jinja
// when present, from dir.
func Load(dir string) (*HF, error) { return LoadOptions(dir, Options{}) }

// LoadOptions is Load with options.
func LoadOptions(dir string, opt Options) (*HF, error) {
	raw, err := readLimited(filepath.Join(dir, fileTokenizer))
	if err != nil {
		return nil, err
	}
	t, err := parseTokenizer(raw, opt)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", filepath.Join(dir, fileTokenizer), err)
	}
	t.name = filepath.Base(filepath.Clean(dir))
	chat, err := loadChatTemplate(dir)
	if err != nil {
		return nil, err
	}
	t.chat = chat
	return t, nil
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open tokenizer file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read tokenizer file: %w", err)
	}
	if len(b) > maxFileSize {
		return nil, fmt.Errorf("%s is over the %d byte limit: %w", path, maxFileSize, ErrInvalidTokenizer)
	}
	return b, nil
}

// jsonTokenizer is the subset of tokenizer.json that encoding depends on.
// post_processor is ignored on purpose: it only adds special tokens, which
// Encode never does.
type jsonTokenizer struct {
	AddedTokens  []addedToken     `json:"added_tokens"`
	Normalizer   *jsonComponent   `json:"normalizer"`
	PreTokenizer *jsonComponent   `json:"pre_tokenizer"`
	Model        *jsonModel       `json:"model"`
	Decoder      *jsonComponent   `json:"decoder"`
	Truncation   *json.RawMessage `json:"truncation"`
}

type jsonComponent struct {
	Type           string          `json:"type"`
	Normalizers    []jsonComponent `json:"normalizers"`
	Pretokenizers  []jsonComponent `json:"pretokenizers"`
	Decoders       []jsonComponent `json:"decoders"`
	Pattern        *jsonPattern    `json:"pattern"`
	Behavior       string          `json:"behavior"`
	Invert         bool            `json:"invert"`
	AddPrefixSpace bool            `json:"add_prefix_space"`
	UseRegex       *bool           `json:"use_regex"`
}

type jsonPattern struct {
	Regex  *string `json:"Regex"`
	String *string `json:"String"`
}

type jsonModel struct {
	Type                    string            `json:"type"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  []jsonMerge       `json:"merges"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
}

// jsonMerge accepts both merge formats: "a b" (older files) and ["a", "b"]
// (files written since tokenizers 0.20, which allow spaces inside tokens).
type jsonMerge [2]string

func (m *jsonMerge) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("merge: %w: %w", ErrInvalidTokenizer, err)
		}
		left, right, ok := strings.Cut(s, " ")
		if !ok || left == "" || right == "" || strings.Contains(right, " ") {
			return fmt.Errorf("merge %q is not two tokens: %w", s, ErrInvalidTokenizer)
		}
		m[0], m[1] = left, right
		return nil
	}
	var pair []string
	if err := json.Unmarshal(b, &pair); err != nil {
		return fmt.Errorf("merge: %w: %w", ErrInvalidTokenizer, err)
	}
	if len(pair) != 2 || pair[0] == "" || pair[1] == "" {
		return fmt.Errorf("merge %v is not two tokens: %w", pair, ErrInvalidTokenizer)
	}
	m[0], m[1] = pair[0], pair[1]
	return nil
}

func parseTokenizer(raw []byte, opt Options) (*HF, error) {
	var jt jsonTokenizer
	if err := json.Unmarshal(raw, &jt); err != nil {
		return nil, fmt.Errorf("decode json: %w: %w", ErrInvalidTokenizer, err)
	}
	if jt.Model == nil {
		return nil, fmt.Errorf("no model: %w", ErrInvalidTokenizer)
	}
	t := &HF{}
	var err error
	if t.normalize, err = buildNormalizer(jt.Normalizer); err != nil {
		return nil, err
	}
	if t.steps, err = buildPreTokenizer(jt.PreTokenizer); err != nil {
		return nil, err
	}
	t.leaf = leafLevel(t.steps)
	if err := buildModel(t, jt.Model, opt); err != nil {
		return nil, err
	}
	if jt.Decoder != nil && jt.Decoder.Type != "ByteLevel" {
		return nil, fmt.Errorf("decoder %q: %w", jt.Decoder.Type, ErrUnsupported)
	}
	if err := buildAdded(t, jt.AddedTokens); err != nil {
		return nil, err
	}
	t.pool.New = func() any { return new(encodeState) }
	return t, nil
}

func buildModel(t *HF, jm *jsonModel, opt Options) error {
	if jm.Type != "" && jm.Type != "BPE" {
		return fmt.Errorf("model %q: %w", jm.Type, ErrUnsupported)
	}
	if jm.Dropout != nil && *jm.Dropout > 0 {
		return fmt.Errorf("bpe dropout %v makes encoding random: %w", *jm.Dropout, ErrUnsupported)
	}
	if (jm.ContinuingSubwordPrefix != nil && *jm.ContinuingSubwordPrefix != "") ||
		(jm.EndOfWordSuffix != nil && *jm.EndOfWordSuffix != "") {
		return fmt.Errorf("bpe subword prefix or suffix: %w", ErrUnsupported)
	}
	if len(jm.Vocab) == 0 {
		return fmt.Errorf("empty vocab: %w", ErrInvalidTokenizer)
	}
	m := &t.model
	m.ignoreMerges = jm.IgnoreMerges
	m.words = make(map[string]uint32, len(jm.Vocab))
	maxID := uint32(0)
	for _, id := range jm.Vocab {
		maxID = max(maxID, id)
	}
	if maxID > 1<<24 {
		return fmt.Errorf("vocab id %d out of range: %w", maxID, ErrInvalidTokenizer)
	}
	t.idBytes = make([][]byte, maxID+1)
	for tok, id := range jm.Vocab {
		b, ok := byteLevelDecode(tok)
		if !ok {
			// Not in the byte-level alphabet: such an entry can only be
			// produced as an added token, so it needs no word key.
			t.idBytes[id] = []byte(tok)
			continue
		}
		t.idBytes[id] = b
		m.words[string(b)] = id
	}
	for b := range 256 {
		id, ok := jm.Vocab[string(byteToRune[b])]
		m.byteIDs[b], m.byteOK[b] = id, ok
	}
	if jm.UnkToken != nil {
		if id, ok := jm.Vocab[*jm.UnkToken]; ok {
			m.unk, m.hasUnk = id, true
		}
	}
	m.merges = newMergeTable(len(jm.Merges))
	for rank, mg := range jm.Merges {
		left, okL := jm.Vocab[mg[0]]
		right, okR := jm.Vocab[mg[1]]
		res, okM := jm.Vocab[mg[0]+mg[1]]
		if !okL || !okR || !okM {
			return fmt.Errorf("merge %q %q uses a token outside the vocab: %w", mg[0], mg[1], ErrInvalidTokenizer)
		}
		m.merges.put(left, right, uint32(rank), res)
	}
	n := opt.CacheWords
	if n == 0 {
		n = defaultCacheWords
	}
	m.cache = newWordCache(n, maxCachedWord)
	ns := opt.CacheSegmentTokens
	if ns == 0 {
		ns = defaultCacheSegmentTokens
	}
	t.segs = newSegmentCache(ns)
	t.vocabSize = len(t.idBytes)
	return nil
}

func buildAdded(t *HF, tokens []addedToken) error {
	var raw, norm []addedToken
	size := len(t.idBytes)
	for _, a := range tokens {
		if a.Content == "" {
			return fmt.Errorf("added token %d is empty: %w", a.ID, ErrInvalidTokenizer)
		}
		if a.ID > 1<<24 {
			return fmt.Errorf("added token id %d out of range: %w", a.ID, ErrInvalidTokenizer)
		}
		size = max(size, int(a.ID)+1)
	}
	if size > len(t.idBytes) {
		grown := make([][]byte, size)
		copy(grown, t.idBytes)
		t.idBytes = grown
	}
	for _, a := range tokens {
		if b, ok := byteLevelDecode(a.Content); ok {
			t.idBytes[a.ID] = b
		} else {
			t.idBytes[a.ID] = []byte(a.Content)
		}
		// Hugging Face matches non-normalized tokens on the raw text and
		// the others on the normalized text; without a normalizer the two
		// are the same text.
		if a.Normalized && t.normalize != nil {
			norm = append(norm, a)
		} else {
			raw = append(raw, a)
		}
	}
	t.rawAdded = newAddedMatcher(raw)
	t.normAdded = newAddedMatcher(norm)
	t.vocabSize = len(t.idBytes)
	return nil
}

// preStep is one flattened pre-tokenizer: a split, or the byte-level step.
type preStep struct {
	split          matcher
	behavior       splitBehavior
	invert         bool
	byteLevel      bool
	addPrefixSpace bool
}

type splitBehavior uint8

const (
	behaviorRemoved splitBehavior = iota
	behaviorIsolated
	behaviorMergedWithPrevious
	behaviorMergedWithNext
	behaviorContiguous
)

func parseBehavior(s string) (splitBehavior, error) {
	switch s {
	case "Removed":
		return behaviorRemoved, nil
	case "Isolated":
		return behaviorIsolated, nil
	case "MergedWithPrevious":
		return behaviorMergedWithPrevious, nil
	case "MergedWithNext":
		return behaviorMergedWithNext, nil
	case "Contiguous":
		return behaviorContiguous, nil
	}
	return 0, fmt.Errorf("split behavior %q: %w", s, ErrUnsupported)
}

// leafLevel returns the first level from which no step changes a piece
// (no split, no prefix space).
func leafLevel(steps []preStep) int {
	n := len(steps)
	for n > 0 && steps[n-1].split == nil && !steps[n-1].addPrefixSpace {
		n--
	}
	return n
}

// buildPreTokenizer flattens the pre-tokenizer into steps. Encoding works on
// raw bytes and maps them to the byte-level alphabet only inside the model,
// so the ByteLevel step must come last: a split after it would see mapped
// text.
func buildPreTokenizer(c *jsonComponent) ([]preStep, error) {
	var steps []preStep
	var add func(c *jsonComponent) error
	add = func(c *jsonComponent) error {
		if len(steps) > 0 && steps[len(steps)-1].byteLevel {
			return fmt.Errorf("pre-tokenizer %q after ByteLevel: %w", c.Type, ErrUnsupported)
		}
		switch c.Type {
		case "Sequence":
			for i := range c.Pretokenizers {
				if err := add(&c.Pretokenizers[i]); err != nil {
					return err
				}
			}
			return nil
		case "Split":
			m, err := compilePattern(c.Pattern)
			if err != nil {
				return err
			}
			b, err := parseBehavior(c.Behavior)
			if err != nil {
				return err
			}
			steps = append(steps, preStep{split: m, behavior: b, invert: c.Invert})
			return nil
		case "ByteLevel":
			// use_regex defaults to true in Hugging Face.
			if c.UseRegex == nil || *c.UseRegex {
				steps = append(steps, preStep{byteLevel: true, addPrefixSpace: c.AddPrefixSpace, split: scanner(scanGPT2), behavior: behaviorIsolated})
			} else {
				steps = append(steps, preStep{byteLevel: true, addPrefixSpace: c.AddPrefixSpace})
			}
			return nil
		}
		return fmt.Errorf("pre-tokenizer %q: %w", c.Type, ErrUnsupported)
	}
	if c == nil {
		return nil, fmt.Errorf("no pre-tokenizer (byte-level BPE needs ByteLevel): %w", ErrUnsupported)
	}
	if err := add(c); err != nil {
		return nil, err
	}
	if len(steps) == 0 || !steps[len(steps)-1].byteLevel {
		return nil, fmt.Errorf("pre-tokenizer without ByteLevel: %w", ErrUnsupported)
	}
	if len(steps) > maxLevels {
		return nil, fmt.Errorf("%d pre-tokenizer steps, over %d: %w", len(steps), maxLevels, ErrUnsupported)
	}
	return steps, nil
}

func compilePattern(p *jsonPattern) (matcher, error) {
	switch {
	case p == nil:
		return nil, fmt.Errorf("split without pattern: %w", ErrInvalidTokenizer)
	case p.String != nil:
		return literalMatcher(*p.String), nil
	case p.Regex != nil:
		if m := knownScanner(*p.Regex); m != nil {
			return m, nil
		}
		re, err := regexp2.Compile(*p.Regex, regexp2.None)
		if err != nil {
			return nil, fmt.Errorf("split regex %q: %w: %w", *p.Regex, ErrUnsupported, err)
		}
		return &regexMatcher{re: re}, nil
	}
	return nil, fmt.Errorf("split pattern is neither Regex nor String: %w", ErrInvalidTokenizer)
}

// Sentinel errors.
var (
	// ErrInvalidTokenizer: a tokenizer file is malformed.
	ErrInvalidTokenizer = errors.New("invalid tokenizer")
	// ErrUnsupported: the tokenizer uses a feature this package does not
	// implement; it refuses to load rather than encode differently from the
	// engine.
	ErrUnsupported = errors.New("unsupported tokenizer feature")
	// ErrNoChatTemplate: the tokenizer directory has no chat template.
	ErrNoChatTemplate = errors.New("no chat template")
	// ErrInvalidMessages: chat messages are not a JSON array of objects.
	ErrInvalidMessages = errors.New("invalid chat messages")
	// ErrTemplate: the chat template failed to compile or render.
	ErrTemplate = errors.New("chat template error")
	// ErrUnknownID: Decode got an id outside the vocabulary.
	ErrUnknownID = errors.New("unknown token id")
)
