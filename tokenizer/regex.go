package tokenizer

import (
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// span is a byte range [start, end) of the text being split.
type span struct{ start, end int }

// regexMatcher runs a split regex that has no scanner through regexp2, which
// supports the lookaheads and Unicode classes these patterns use. It is the
// slow path: correct for any such pattern, several times slower than a
// scanner, and it allocates.
type regexMatcher struct{ re *regexp2.Regexp }

func (r *regexMatcher) appendMatches(s string, dst []span, sc *scratch) []span {
	runes := sc.runes[:0]
	offs := sc.offs[:0]
	for i := 0; i < len(s); {
		c, w := utf8.DecodeRuneInString(s[i:])
		runes = append(runes, c)
		offs = append(offs, i)
		i += w
	}
	offs = append(offs, len(s))
	sc.runes, sc.offs = runes, offs
	m, err := r.re.FindRunesMatch(runes)
	for err == nil && m != nil {
		if m.Length > 0 {
			dst = append(dst, span{offs[m.Index], offs[m.Index+m.Length]})
		}
		m, err = r.re.FindNextMatch(m)
	}
	return dst
}

func (f scanner) appendMatches(s string, dst []span, _ *scratch) []span {
	for i := 0; i < len(s); {
		if end := f(s, i); end > i {
			dst = append(dst, span{i, end})
			i = end
			continue
		}
		_, w := classAt(s, i)
		i += w
	}
	return dst
}

func (l literalMatcher) appendMatches(s string, dst []span, _ *scratch) []span {
	for i := 0; i < len(s); {
		start, end := l.find(s, i)
		if start < 0 {
			break
		}
		dst = append(dst, span{start, end})
		i = end
	}
	return dst
}
