package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's added_tokens.
type addedToken struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// addedMatcher finds added tokens in text, leftmost first and longest among
// those starting at the same byte, as Hugging Face's Aho-Corasick
// (LeftmostLongest) does. It is a byte trie: added tokens are few and short,
// and a text is only walked where a token's first byte occurs.
type addedMatcher struct {
	first  [256]bool
	only   int // the one first byte of every token, -1 if they differ
	nodes  []trieNode
	tokens []addedToken
}

type trieNode struct {
	edges []byte  // sorted
	kids  []int32 // node index per edge
	tok   int32   // index into tokens, -1 if no token ends here
}

func newAddedMatcher(tokens []addedToken) *addedMatcher {
	if len(tokens) == 0 {
		return nil
	}
	m := &addedMatcher{nodes: []trieNode{{tok: -1}}, tokens: tokens, only: -2}
	for ti, t := range tokens {
		if t.Content == "" {
			continue
		}
		m.first[t.Content[0]] = true
		switch c := int(t.Content[0]); m.only {
		case -2:
			m.only = c
		case c:
		default:
			m.only = -1
		}
		n := int32(0)
		for i := 0; i < len(t.Content); i++ {
			n = m.child(n, t.Content[i])
		}
		if m.nodes[n].tok < 0 {
			m.nodes[n].tok = int32(ti)
		}
	}
	return m
}

func (m *addedMatcher) child(n int32, b byte) int32 {
	node := &m.nodes[n]
	k := sort.Search(len(node.edges), func(i int) bool { return node.edges[i] >= b })
	if k < len(node.edges) && node.edges[k] == b {
		return node.kids[k]
	}
	m.nodes = append(m.nodes, trieNode{tok: -1})
	id := int32(len(m.nodes) - 1)
	node = &m.nodes[n] // append may have moved it
	node.edges = append(node.edges, 0)
	node.kids = append(node.kids, 0)
	copy(node.edges[k+1:], node.edges[k:])
	copy(node.kids[k+1:], node.kids[k:])
	node.edges[k], node.kids[k] = b, id
	return id
}

func (m *addedMatcher) step(n int32, b byte) int32 {
	node := &m.nodes[n]
	e := node.edges
	// Edge lists are short; a linear scan beats binary search here.
	for i, eb := range e {
		if eb == b {
			return node.kids[i]
		}
		if eb > b {
			break
		}
	}
	return -1
}

// longestAt returns the end of the longest token starting at text[i] and its
// index, or -1.
func (m *addedMatcher) longestAt(text string, i int) (int, int32) {
	end, tok := -1, int32(-1)
	n := int32(0)
	for j := i; j < len(text); j++ {
		n = m.step(n, text[j])
		if n < 0 {
			break
		}
		if t := m.nodes[n].tok; t >= 0 {
			end, tok = j+1, t
		}
	}
	return end, tok
}

// next finds the next added token in text[from:], with lstrip/rstrip widening
// the match over neighbouring whitespace (never before floor) and single_word
// rejecting matches inside a word. It returns start < 0 when none is left.
func (m *addedMatcher) next(text string, from, floor int) (start, end int, id uint32) {
	for i := from; i < len(text); i++ {
		if m.only >= 0 {
			// Every token starts with one byte (Qwen, Llama and DeepSeek
			// tokens all start with '<'): find it with IndexByte.
			k := strings.IndexByte(text[i:], byte(m.only))
			if k < 0 {
				break
			}
			i += k
		} else if !m.first[text[i]] {
			continue
		}
		e, ti := m.longestAt(text, i)
		if ti < 0 {
			continue
		}
		t := &m.tokens[ti]
		if t.SingleWord && (endsWithWordRune(text[:i]) || startsWithWordRune(text[e:])) {
			// Hugging Face drops such a match and resumes after it.
			i = e - 1
			continue
		}
		s := i
		if t.LStrip {
			for s > floor {
				r, w := utf8.DecodeLastRuneInString(text[floor:s])
				if !unicode.IsSpace(r) {
					break
				}
				s -= w
			}
		}
		if t.RStrip {
			for e < len(text) {
				r, w := utf8.DecodeRuneInString(text[e:])
				if !unicode.IsSpace(r) {
					break
				}
				e += w
			}
		}
		return s, e, t.ID
	}
	return -1, -1, 0
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) }

func endsWithWordRune(s string) bool {
	if s == "" {
		return false
	}
	r, _ := utf8.DecodeLastRuneInString(s)
	return isWordRune(r)
}

func startsWithWordRune(s string) bool {
	if s == "" {
		return false
	}
	r, _ := utf8.DecodeRuneInString(s)
	return isWordRune(r)
}
