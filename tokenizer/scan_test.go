package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

var scannerPatterns = []string{patGPT2, patQwen2, patLlama3, patDigits3, patDSCJK, patDSMain, patDSMainEsc}

// scanAtoms are the pieces random test strings are made of: every class the
// patterns distinguish, contractions, and whitespace of each kind.
var scanAtoms = []string{
	" ", "  ", "\t", "\n", "\r\n", "\r", "\v", "\f", "\u00a0", "\u3000", "\u2028", "\u0085", "\ufeff", "\u200b",
	"a", "Z", "abc", "é", "e\u0301", "\u0301", "中文", "ア", "ー", "ひ", "가", "ก", "\u0e31",
	"0", "42", "1234", "٣", "²", "½", "Ⅻ", "'", "'s", "'S", "'ll", "'LL", "'Re", "'ve", "'d", "'m", "'t", "'x", "’s",
	".", ",", "!", "?", "...", "-", "_", "(", ")", "$", "€", "+", "=", "<", ">", "|", "\\", "/", "`", "~", "^", "\"",
	"😀", "👍🏽", "\u200d", "\ufe0f", "🇺🇸", "\x00", "\x01", "\x7f", "𝔘", "𠀀", "  x", " .", "\n\n", " \n ",
}

func randomText(r *rand.Rand) string {
	var sb strings.Builder
	for range 1 + r.IntN(24) {
		sb.WriteString(scanAtoms[r.IntN(len(scanAtoms))])
	}
	return sb.String()
}

func regexSpans(t testing.TB, re *regexp2.Regexp, s string) []span {
	t.Helper()
	return (&regexMatcher{re: re}).appendMatches(s, nil, &scratch{})
}

// checkScanner compares a scanner with regexp2 running the same pattern. The
// only intended difference is Oniguruma's folding of U+017F to s, which
// regexp2 does not do.
func checkScanner(t testing.TB, pattern string, re *regexp2.Regexp, s string) {
	t.Helper()
	if !utf8.ValidString(s) || strings.ContainsRune(s, 'ſ') {
		return
	}
	got := knownScanner(pattern).appendMatches(s, nil, &scratch{})
	want := regexSpans(t, re, s)
	if !slices.Equal(got, want) {
		t.Fatalf("pattern %q on %q:\nscanner %v\nregexp2 %v", pattern, s, got, want)
	}
}

func TestScannersMatchRegex(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 2))
	var texts []string
	for range 1000 {
		texts = append(texts, randomText(r))
	}
	for _, c := range readGolden(t, goldenPath(t, "qwen3", "golden-text.jsonl")) {
		texts = append(texts, c.Text)
	}
	for _, p := range scannerPatterns {
		re := regexp2.MustCompile(p, regexp2.None)
		for _, s := range texts {
			checkScanner(t, p, re, s)
		}
	}
}

func FuzzScanners(f *testing.F) {
	r := rand.New(rand.NewPCG(9, 9))
	for range 20 {
		f.Add(randomText(r))
	}
	res := make([]*regexp2.Regexp, len(scannerPatterns))
	for i, p := range scannerPatterns {
		res[i] = regexp2.MustCompile(p, regexp2.None)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for i, p := range scannerPatterns {
			checkScanner(t, p, res[i], s)
		}
	})
}

func TestContractionLongS(t *testing.T) {
	// Oniguruma: (?i:'s) matches 'ſ; so must the scanner.
	got := scanner(scanGPT4Digits1).appendMatches("'ſa", nil, nil)
	if want := []span{{0, 3}, {3, 4}}; !slices.Equal(got, want) {
		t.Errorf("got %v want %v", got, want)
	}
}
