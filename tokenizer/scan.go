package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// A matcher finds the non-empty, non-overlapping matches of a split pattern
// in one pre-token, left to right, and appends them to dst. Matching is
// relative to s alone: lookarounds see the ends of s, as Hugging Face applies
// each Split to each piece separately.
type matcher interface {
	appendMatches(s string, dst []span, sc *scratch) []span
}

// scanner is a hand-written matcher for one known split regex. It returns the
// end of the match that starts exactly at i (as the regex's alternation, in
// order, with its backtracking, would), or -1 when none starts there.
type scanner func(s string, i int) int

// literalMatcher implements Split patterns given as {"String": "..."}.
type literalMatcher string

func (l literalMatcher) find(s string, from int) (int, int) {
	if len(l) == 0 {
		return -1, -1
	}
	k := strings.Index(s[from:], string(l))
	if k < 0 {
		return -1, -1
	}
	return from + k, from + k + len(l)
}

// Split regexes that have a scanner. The keys are the patterns exactly as they
// appear in tokenizer.json (after JSON unescaping); anything else goes through
// the general regex engine. Families: GPT-2 (ByteLevel use_regex), Qwen2/2.5/3,
// Llama 3.x (also cl100k), DeepSeek V2/V3/R1.
const (
	patGPT2      = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	patQwen2     = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patLlama3    = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patDigits3   = `\p{N}{1,3}`
	patDSCJK     = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
	patDSMain    = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
	patDSMainEsc = `[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_` + "`" + `{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// knownScanners maps a split regex to its scanner.
func knownScanner(pattern string) matcher {
	switch pattern {
	case patGPT2:
		return scanner(scanGPT2)
	case patQwen2:
		return scanner(scanGPT4Digits1)
	case patLlama3:
		return scanner(scanGPT4Digits3)
	case patDigits3:
		return scanner(scanDigits3)
	case patDSCJK:
		return scanner(scanDSCJK)
	case patDSMain, patDSMainEsc:
		return scanner(scanDSMain)
	}
	return nil
}

// contraction returns the length of an English contraction suffix ('s 't 're
// 've 'm 'll 'd) starting at s[i] (just after the apostrophe), or 0.
// foldCase selects the (?i:...) form, folding as Oniguruma (the engine of
// Hugging Face tokenizers) does: ASCII case plus U+017F (ſ) for s. regexp2
// and transformers.js fold ASCII only.
func contraction(s string, i int, foldCase bool) int {
	if i >= len(s) {
		return 0
	}
	lower := func(b byte) byte {
		if foldCase && b >= 'A' && b <= 'Z' {
			return b + ('a' - 'A')
		}
		return b
	}
	if foldCase && s[i] == 0xC5 && i+1 < len(s) && s[i+1] == 0xBF {
		return 2 // U+017F LATIN SMALL LETTER LONG S case-folds to s in Oniguruma
	}
	switch lower(s[i]) {
	case 's', 't', 'm', 'd':
		return 1
	case 'r', 'v':
		if i+1 < len(s) && lower(s[i+1]) == 'e' {
			return 2
		}
	case 'l':
		if i+1 < len(s) && lower(s[i+1]) == 'l' {
			return 2
		}
	}
	return 0
}

// runOf returns the end of the run of runes starting at i whose class has any
// bit of mask.
func runOf(s string, i int, mask uint8) int {
	for i < len(s) && s[i] < utf8.RuneSelf && asciiClasses[s[i]]&mask != 0 {
		i++ // ASCII: no decoding
	}
	for i < len(s) {
		c, w := classAt(s, i)
		if c&mask == 0 {
			break
		}
		i += w
	}
	return i
}

// runNotOf returns the end of the run of runes starting at i whose class has
// no bit of mask.
func runNotOf(s string, i int, mask uint8) int {
	for i < len(s) {
		c, w := classAt(s, i)
		if c&mask != 0 {
			break
		}
		i += w
	}
	return i
}

func newlines(s string, i int) int {
	for i < len(s) && (s[i] == '\r' || s[i] == '\n') {
		i++
	}
	return i
}

// whitespace resolves the three whitespace alternatives shared by every
// pattern here, at i where s[i] is whitespace:
//
//	\s*[\r\n]+   → up to and including the run's last CR or LF, if any;
//	\s+(?!\S)    → the whole run at the end of s, else all but its last rune;
//	\s+          → the single rune left when the run is one rune long.
func whitespace(s string, i int, withNewlineAlt bool) int {
	j, lastNL := i, -1
	for j < len(s) {
		c, w := classAt(s, j)
		if c&clsSpace == 0 {
			break
		}
		if s[j] == '\r' || s[j] == '\n' {
			lastNL = j
		}
		j += w
	}
	if withNewlineAlt && lastNL >= 0 {
		return lastNL + 1
	}
	if j == len(s) {
		return j
	}
	_, w := utf8.DecodeLastRuneInString(s[i:j])
	if j-w > i {
		return j - w
	}
	return j
}

func scanGPT4Digits1(s string, i int) int { return scanGPT4(s, i, 1) }
func scanGPT4Digits3(s string, i int) int { return scanGPT4(s, i, 3) }

// scanGPT4 implements patQwen2 (maxDigits 1) and patLlama3 (maxDigits 3).
// Every rune starts a match, so it never returns -1 for i < len(s).
func scanGPT4(s string, i, maxDigits int) int {
	b := s[i]
	// Most words of text: " word" or "word" in ASCII, the second
	// alternative with or without its one-rune prefix.
	if i+1 < len(s) && b == ' ' && s[i+1] < utf8.RuneSelf && asciiClasses[s[i+1]]&clsL != 0 {
		return runOf(s, i+1, clsL)
	}
	if b == '\'' {
		if n := contraction(s, i+1, true); n > 0 {
			return i + 1 + n
		}
	}
	c, w := classAt(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c&clsL != 0 {
		return runOf(s, i, clsL)
	}
	if b != '\r' && b != '\n' && c&clsN == 0 && i+w < len(s) {
		if c2, _ := classAt(s, i+w); c2&clsL != 0 {
			return runOf(s, i+w, clsL)
		}
	}
	// \p{N}{1,maxDigits}
	if c&clsN != 0 {
		j := i + w
		for n := 1; n < maxDigits && j < len(s); n++ {
			c2, w2 := classAt(s, j)
			if c2&clsN == 0 {
				break
			}
			j += w2
		}
		return j
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	const notOther = clsSpace | clsL | clsN
	if b == ' ' && i+1 < len(s) {
		if c2, _ := classAt(s, i+1); c2&notOther == 0 {
			return newlines(s, runNotOf(s, i+1, notOther))
		}
	}
	if c&notOther == 0 {
		return newlines(s, runNotOf(s, i, notOther))
	}
	return whitespace(s, i, true)
}

// scanGPT2 implements patGPT2.
func scanGPT2(s string, i int) int {
	b := s[i]
	if b == '\'' {
		if n := contraction(s, i+1, false); n > 0 {
			return i + 1 + n
		}
	}
	const notOther = clsSpace | clsL | clsN
	start := i
	c, _ := classAt(s, i)
	if b == ' ' && i+1 < len(s) {
		if c2, _ := classAt(s, i+1); c2&clsSpace == 0 {
			start, c = i+1, c2
		}
	}
	switch {
	case c&clsL != 0:
		return runOf(s, start, clsL)
	case c&clsN != 0:
		return runOf(s, start, clsN)
	case c&notOther == 0:
		return runNotOf(s, start, notOther)
	}
	return whitespace(s, i, false)
}

// scanDigits3 implements \p{N}{1,3}.
func scanDigits3(s string, i int) int {
	j := i
	for n := 0; n < 3 && j < len(s); n++ {
		c, w := classAt(s, j)
		if c&clsN == 0 {
			break
		}
		j += w
	}
	if j == i {
		return -1
	}
	return j
}

func isDSCJK(r rune) bool {
	return (r >= 0x4e00 && r <= 0x9fa5) || (r >= 0x3040 && r <= 0x309f) || (r >= 0x30a0 && r <= 0x30ff)
}

// scanDSCJK implements DeepSeek's [一-龥぀-ゟ゠-ヿ]+.
func scanDSCJK(s string, i int) int {
	j := i
	for j < len(s) && s[j] >= utf8.RuneSelf {
		r, w := utf8.DecodeRuneInString(s[j:])
		if !isDSCJK(r) {
			break
		}
		j += w
	}
	if j == i {
		return -1
	}
	return j
}

func isASCIIPunct(b byte) bool {
	return (b >= '!' && b <= '/') || (b >= ':' && b <= '@') || (b >= '[' && b <= '`') || (b >= '{' && b <= '~')
}

func isASCIILetter(b byte) bool { return (b|0x20) >= 'a' && (b|0x20) <= 'z' }

// scanDSMain implements patDSMain. Unlike the GPT-4 patterns, runes such as
// digits or lone control characters can match nothing here.
func scanDSMain(s string, i int) int {
	b := s[i]
	// [!"#...~][A-Za-z]+
	if isASCIIPunct(b) && i+1 < len(s) && isASCIILetter(s[i+1]) {
		j := i + 1
		for j < len(s) && isASCIILetter(s[j]) {
			j++
		}
		return j
	}
	c, w := classAt(s, i)
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	if c&(clsL|clsM) != 0 {
		return runOf(s, i, clsL|clsM)
	}
	if b != '\r' && b != '\n' && c&(clsL|clsP|clsS) == 0 && i+w < len(s) {
		if c2, _ := classAt(s, i+w); c2&(clsL|clsM) != 0 {
			return runOf(s, i+w, clsL|clsM)
		}
	}
	//  ?[\p{P}\p{S}]+[\r\n]*
	if b == ' ' && i+1 < len(s) {
		if c2, _ := classAt(s, i+1); c2&(clsP|clsS) != 0 {
			return newlines(s, runOf(s, i+1, clsP|clsS))
		}
	}
	if c&(clsP|clsS) != 0 {
		return newlines(s, runOf(s, i, clsP|clsS))
	}
	if c&clsSpace != 0 {
		return whitespace(s, i, true)
	}
	return -1
}
