package tokenizer

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// Rune class bits used by the hand-written pre-tokenizer scanners. They mirror
// the Unicode properties the Hugging Face split regexes test (\p{L}, \p{N},
// \p{M}, \p{P}, \p{S}, \s), so that a scanner and the regex it replaces agree
// rune for rune.
const (
	clsL     uint8 = 1 << iota // \p{L}
	clsN                       // \p{N}
	clsM                       // \p{M}
	clsP                       // \p{P}
	clsS                       // \p{S}
	clsSpace                   // \s (Unicode White_Space, as Oniguruma and regexp2 use)
)

// bmpClasses holds the class bits of every BMP rune; runes above it are rare
// enough to classify through the unicode tables on each use. The table is
// built on first use (64 KiB, a few milliseconds), not at package init.
var bmpClasses = sync.OnceValue(func() *[0x10000]uint8 {
	var t [0x10000]uint8
	for r := range rune(0x10000) {
		t[r] = classifySlow(r)
	}
	return &t
})

func classifySlow(r rune) uint8 {
	var c uint8
	if unicode.IsLetter(r) {
		c |= clsL
	}
	if unicode.IsNumber(r) {
		c |= clsN
	}
	if unicode.IsMark(r) {
		c |= clsM
	}
	if unicode.IsPunct(r) {
		c |= clsP
	}
	if unicode.IsSymbol(r) {
		c |= clsS
	}
	if unicode.IsSpace(r) {
		c |= clsSpace
	}
	return c
}

// asciiClasses answers the common case without touching the big table.
var asciiClasses = func() (t [utf8.RuneSelf]uint8) {
	for r := range rune(utf8.RuneSelf) {
		t[r] = classifySlow(r)
	}
	return t
}()

// classAt decodes the rune at s[i] and returns its class bits and byte width.
// An invalid byte is one rune of width 1 with no class bits, which places it
// with punctuation-like "other" characters; Rust strings cannot hold such
// bytes, so there is no reference behaviour to match.
func classAt(s string, i int) (uint8, int) {
	b := s[i]
	if b < utf8.RuneSelf {
		return asciiClasses[b], 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	if r == utf8.RuneError && w == 1 {
		return 0, 1
	}
	if r < 0x10000 {
		return bmpClasses()[r], w
	}
	return classifySlow(r), w
}
