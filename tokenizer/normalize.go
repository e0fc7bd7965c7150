package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites one segment of text (between added tokens) before
// pre-tokenization. It returns s itself when nothing changes, so the common
// case allocates nothing.
type normalizer func(s string) string

func buildNormalizer(c *jsonComponent) (normalizer, error) {
	if c == nil {
		return nil, nil
	}
	switch c.Type {
	case "NFC":
		return unicodeForm(norm.NFC), nil
	case "NFD":
		return unicodeForm(norm.NFD), nil
	case "NFKC":
		return unicodeForm(norm.NFKC), nil
	case "NFKD":
		return unicodeForm(norm.NFKD), nil
	case "Lowercase":
		return strings.ToLower, nil
	case "Sequence":
		var fs []normalizer
		for i := range c.Normalizers {
			f, err := buildNormalizer(&c.Normalizers[i])
			if err != nil {
				return nil, err
			}
			if f != nil {
				fs = append(fs, f)
			}
		}
		switch len(fs) {
		case 0:
			return nil, nil
		case 1:
			return fs[0], nil
		}
		return func(s string) string {
			for _, f := range fs {
				s = f(s)
			}
			return s
		}, nil
	}
	return nil, fmt.Errorf("normalizer %q: %w", c.Type, ErrUnsupported)
}

func unicodeForm(f norm.Form) normalizer {
	return func(s string) string {
		// QuickSpanString answers "already normal" for almost all real
		// text without allocating (IsNormalString allocates).
		if isASCII(s) || f.QuickSpanString(s) == len(s) {
			return s
		}
		return f.String(s)
	}
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
