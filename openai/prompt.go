package openai

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/bits"

	"github.com/infera/infera/jsonx"
)

// The helpers below read parts of a request that Scan has already validated
// (its Messages and Prompt spans), for routing policies that need the prompt
// itself. They do not allocate. Given input that is not well-formed JSON they
// return errors or partial results but never panic; FirstPrompt does not
// validate a token array (AppendTokenIDs does).

// ErrBadPrompt: a prompt value is not a string, an array of token ids, or an
// array of those.
var ErrBadPrompt = errors.New("prompt must be a string, an array of token ids, or an array of those")

// AppendUnescaped appends the decoded form of a JSON string's raw content
// (the bytes between the quotes, validated) to dst, exactly as
// encoding/json decodes it.
func AppendUnescaped(dst, raw []byte) []byte { return jsonx.AppendUnescaped(dst, raw) }

// PromptKind says what a completions prompt holds.
type PromptKind uint8

const (
	// PromptNone: no prompt (absent, null, or an empty batch).
	PromptNone PromptKind = iota
	// PromptText: a string; Raw is its raw content, Escaped says whether it
	// holds escape sequences.
	PromptText
	// PromptTokens: an array of token ids; Raw is the whole array.
	PromptTokens
)

// Prompt is the first prompt of a completions request's "prompt" value. A
// batch (an array of strings or of token arrays) is routed by its first
// element, which is the prompt the engine schedules first.
type Prompt struct {
	Kind    PromptKind
	Raw     []byte
	Escaped bool
}

// FirstPrompt returns the first prompt of v, the raw "prompt" value.
func FirstPrompt(v []byte) (Prompt, error) {
	s := newScanner(v)
	s.SkipWS()
	if s.I >= len(v) {
		return Prompt{}, nil
	}
	switch v[s.I] {
	case 'n':
		return Prompt{}, nil
	case '"':
		st, en, esc, err := s.String()
		if err != nil {
			return Prompt{}, err
		}
		return Prompt{Kind: PromptText, Raw: v[st:en], Escaped: esc}, nil
	case '[':
	default:
		return Prompt{}, ErrBadPrompt
	}
	start := s.I
	s.I++
	s.SkipWS()
	if s.I >= len(v) {
		return Prompt{}, ErrBadPrompt
	}
	switch c := v[s.I]; {
	case c == ']':
		return Prompt{}, nil
	case c == '"':
		st, en, esc, err := s.String()
		if err != nil {
			return Prompt{}, err
		}
		return Prompt{Kind: PromptText, Raw: v[st:en], Escaped: esc}, nil
	case c == '[':
		// A batch of token arrays: the first one ends at its first ']'
		// (ids nest nothing); AppendTokenIDs validates its content.
		end := bytes.IndexByte(v[s.I:], ']')
		if end < 0 {
			return Prompt{}, ErrBadPrompt
		}
		return Prompt{Kind: PromptTokens, Raw: v[s.I : s.I+end+1]}, nil
	case c == '-' || (c >= '0' && c <= '9'):
		// The whole value is the token array; not scanned twice here, as
		// it can be hundreds of kilobytes.
		end := len(v)
		for end > start && (v[end-1] == ' ' || v[end-1] == '\t' || v[end-1] == '\n' || v[end-1] == '\r') {
			end--
		}
		return Prompt{Kind: PromptTokens, Raw: v[start:end]}, nil
	}
	return Prompt{}, ErrBadPrompt
}

// AppendTokenIDs appends the ids of a JSON array of token ids (non-negative
// integers below 2^32) to dst. It is the hot path of token-array prompts:
// one pass, no allocation beyond growing dst.
func AppendTokenIDs(dst []uint32, arr []byte) ([]uint32, error) {
	i := jsonx.SkipSpace(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return dst, ErrBadPrompt
	}
	i = jsonx.SkipSpace(arr, i+1)
	if i < len(arr) && arr[i] == ']' {
		if jsonx.SkipSpace(arr, i+1) != len(arr) {
			return dst, ErrBadPrompt
		}
		return dst, nil
	}
	// Bulk: 64 bytes at a time (the chunk functions). A chunk that stops
	// early (other white space, an id of 9+ digits, a leading zero, the
	// end) leaves the bytes after it to the per-id path below, a span
	// that doubles with every such chunk in a row, so that an array the
	// chunks do not fit (pretty-printed, one id a line) costs little more
	// than the per-id path alone.
	var st chunkState
	chunkAt := i // where the next chunk may start; before it, the per-id path
	for {
		if i >= chunkAt {
			if i+72 > len(arr) {
				chunkAt = math.MaxInt
			} else {
				var k, skip int
				dst, k, skip = st.read(dst, (*[72]byte)(arr[i:i+72]))
				chunkAt = i + k + skip
				if k > 0 {
					if i += k; arr[i] <= ' ' {
						i = jsonx.SkipSpace(arr, i)
					}
					continue
				}
			}
		}
		// The common case: up to 7 digits and a comma, read 8 bytes at a
		// time without a branch per digit (token ids of a large
		// vocabulary are 5 or 6 digits in random mix, which a per-digit
		// loop mispredicts at every end). Anything else — spaces, 8+
		// digits, a leading zero, the last id, the end of the input —
		// takes the loop below, which decides validity.
		if i+8 <= len(arr) {
			w := binary.LittleEndian.Uint64(arr[i:])
			if n := leadingDigits(w); n > 0 && n < 8 && arr[i+n] == ',' && (n == 1 || arr[i] != '0') {
				dst = append(dst, uint32(parseDigits(w, n)))
				if i += n + 1; i < len(arr) && arr[i] <= ' ' {
					i = jsonx.SkipSpace(arr, i)
				}
				continue
			}
		}
		start := i
		var v uint64
		for i < len(arr) {
			d := arr[i] - '0'
			if d > 9 {
				break
			}
			v = v*10 + uint64(d)
			i++
		}
		// At most 10 digits cannot overflow v; the value must fit 32 bits
		// and have no leading zero.
		n := i - start
		if n == 0 || n > 10 || v > 1<<32-1 || (n > 1 && arr[start] == '0') {
			return dst, ErrBadPrompt
		}
		dst = append(dst, uint32(v))
		i = jsonx.SkipSpace(arr, i)
		if i >= len(arr) {
			return dst, ErrBadPrompt
		}
		switch arr[i] {
		case ',':
			i = jsonx.SkipSpace(arr, i+1)
		case ']':
			if jsonx.SkipSpace(arr, i+1) != len(arr) {
				return dst, ErrBadPrompt
			}
			return dst, nil
		default:
			return dst, ErrBadPrompt
		}
	}
}

// chunkState is AppendTokenIDs's choice of chunk function, kept out of
// its per-id loop.
type chunkState struct {
	backoff uint8 // log2 of the bytes/64 the next chunk that stops early leaves
	spaced  bool  // the last chunk had spaces: skip compactTokenIDChunk
}

// read reads one chunk (below) and returns how many bytes after it the
// per-id path reads before the next chunk: none after a chunk that read to
// its end, 64, 128, … 2048 after each chunk in a row that stopped early,
// and 1 after one that read nothing.
//
//go:noinline
func (st *chunkState) read(dst []uint32, b *[72]byte) (out []uint32, k, skip int) {
	ok := false
	if !st.spaced {
		dst, k, ok = compactTokenIDChunk(dst, b)
	}
	if !ok {
		if dst, k, ok = commaSpaceTokenIDChunk(dst, b); !ok {
			dst, k, ok = spacedTokenIDChunk(dst, b)
		}
		st.spaced = ok
	}
	if ok {
		st.backoff = 0
	} else {
		skip = 64 << st.backoff
		st.backoff = min(st.backoff+1, 5)
	}
	if k == 0 {
		skip = max(skip, 1)
	}
	return dst, k, skip
}

// The chunk functions append the ids of b's first 64 bytes that end there
// with a comma and return the offset just past the last such comma (0 when
// there is none). b starts at an id (not white space). Each id is 1..8
// digits without a leading zero; an id that is not so stops the chunk (the
// caller's per-id path then reads it, and decides). The loads of 8 bytes
// run up to 7 bytes past the 64. Commas are found for all 64 bytes at once
// (SWAR masks, bit k for byte k), so that where an id starts does not wait
// on parsing the one before it: the ids of a chunk are parsed in parallel.

// compactTokenIDChunk reads 64 bytes of only digits and commas (ok false,
// nothing read, otherwise): one validity test for the chunk, and ids
// written without append's capacity test when dst has room for the most a
// chunk holds (32).
func compactTokenIDChunk(dst []uint32, b *[72]byte) (out []uint32, k int, ok bool) {
	const hi = 0x8080808080808080
	c0, v0 := compactWord(binary.LittleEndian.Uint64(b[0:]))
	c1, v1 := compactWord(binary.LittleEndian.Uint64(b[8:]))
	c2, v2 := compactWord(binary.LittleEndian.Uint64(b[16:]))
	c3, v3 := compactWord(binary.LittleEndian.Uint64(b[24:]))
	c4, v4 := compactWord(binary.LittleEndian.Uint64(b[32:]))
	c5, v5 := compactWord(binary.LittleEndian.Uint64(b[40:]))
	c6, v6 := compactWord(binary.LittleEndian.Uint64(b[48:]))
	c7, v7 := compactWord(binary.LittleEndian.Uint64(b[56:]))
	commas := c0 | c1<<8 | c2<<16 | c3<<24 | c4<<32 | c5<<40 | c6<<48 | c7<<56
	valid := v0 & v1 & v2 & v3 & v4 & v5 & v6 & v7 & hi
	if valid != hi {
		return dst, 0, false
	}
	s := 0
	if cap(dst)-len(dst) < 32 {
		for commas != 0 {
			c := bits.TrailingZeros64(commas)
			commas &= commas - 1
			n := c - s
			w := binary.LittleEndian.Uint64(b[s&63:])
			if uint(n-1) >= 8 || (n > 1 && byte(w) == '0') {
				break
			}
			dst = append(dst, uint32(parseDigits(w, n)))
			s = c + 1
		}
		return dst, s, true
	}
	m := len(dst)
	o := dst[m : m+32]
	j := 0
	for commas != 0 {
		c := bits.TrailingZeros64(commas)
		commas &= commas - 1
		n := c - s
		w := binary.LittleEndian.Uint64(b[s&63:])
		if uint(n-1) >= 8 || (n > 1 && byte(w) == '0') {
			break
		}
		o[j&31] = uint32(parseDigits(w, n))
		j++
		s = c + 1
	}
	return dst[:m+j], s, true
}

// compactWord returns the comma bits of w's bytes (byte k's in bit k) and
// their validity (byte k's high bit set when it is a digit or a comma).
func compactWord(w uint64) (commas, valid uint64) {
	const (
		ones = 0x0101010101010101
		hi   = 0x8080808080808080
		lo7  = 0x7f7f7f7f7f7f7f7f
	)
	l := w & lo7
	digit := (l + 0x50*ones) &^ (l + 0x46*ones) &^ w
	z := w ^ ','*ones
	comma := ^(((z & lo7) + lo7) | z) & hi
	return gatherHigh(comma), digit | comma
}

// commaSpaceTokenIDChunk is compactTokenIDChunk for ids separated by ", "
// (Python's json.dumps, and so most Python clients): 64 bytes of digits,
// commas and spaces where every comma and only a comma is followed by a
// space (ok false, nothing read, otherwise).
func commaSpaceTokenIDChunk(dst []uint32, b *[72]byte) (out []uint32, k int, ok bool) {
	const hi = 0x8080808080808080
	// Each word's spaces must be its commas moved one byte up, the top
	// comma of the word before moving into its first byte.
	c0, s0, v0 := commaSpaceWord(binary.LittleEndian.Uint64(b[0:]))
	c1, s1, v1 := commaSpaceWord(binary.LittleEndian.Uint64(b[8:]))
	c2, s2, v2 := commaSpaceWord(binary.LittleEndian.Uint64(b[16:]))
	c3, s3, v3 := commaSpaceWord(binary.LittleEndian.Uint64(b[24:]))
	c4, s4, v4 := commaSpaceWord(binary.LittleEndian.Uint64(b[32:]))
	c5, s5, v5 := commaSpaceWord(binary.LittleEndian.Uint64(b[40:]))
	c6, s6, v6 := commaSpaceWord(binary.LittleEndian.Uint64(b[48:]))
	c7, s7, v7 := commaSpaceWord(binary.LittleEndian.Uint64(b[56:]))
	bad := (s0 ^ c0<<8) | (s1 ^ (c1<<8 | c0>>56)) | (s2 ^ (c2<<8 | c1>>56)) | (s3 ^ (c3<<8 | c2>>56)) |
		(s4 ^ (c4<<8 | c3>>56)) | (s5 ^ (c5<<8 | c4>>56)) | (s6 ^ (c6<<8 | c5>>56)) | (s7 ^ (c7<<8 | c6>>56)) |
		(^(v0 & v1 & v2 & v3 & v4 & v5 & v6 & v7) & hi)
	commas := gatherHigh(c0) | gatherHigh(c1)<<8 | gatherHigh(c2)<<16 | gatherHigh(c3)<<24 |
		gatherHigh(c4)<<32 | gatherHigh(c5)<<40 | gatherHigh(c6)<<48 | gatherHigh(c7)<<56
	if bad != 0 {
		return dst, 0, false
	}
	s := 0
	for commas != 0 {
		c := bits.TrailingZeros64(commas)
		commas &= commas - 1
		n := c - s
		w := binary.LittleEndian.Uint64(b[s&63:])
		if uint(n-1) >= 8 || (n > 1 && byte(w) == '0') {
			break
		}
		dst = append(dst, uint32(parseDigits(w, n)))
		s = c + 2
	}
	// A comma at 63 leaves s at 65: its space is the next chunk's to skip.
	return dst, min(s, 64), true
}

// commaSpaceWord returns the high bits of w's commas, spaces, and bytes
// that are either or a digit.
func commaSpaceWord(w uint64) (commas, spaces, valid uint64) {
	const (
		ones = 0x0101010101010101
		hi   = 0x8080808080808080
		lo7  = 0x7f7f7f7f7f7f7f7f
	)
	l := w & lo7
	digit := (l + 0x50*ones) &^ (l + 0x46*ones) &^ w
	z := w ^ ','*ones
	commas = ^(((z & lo7) + lo7) | z) & hi
	z = w ^ ' '*ones
	spaces = ^(((z & lo7) + lo7) | z) & hi
	return commas, spaces, digit | commas | spaces
}

// spacedTokenIDChunk reads ids separated by a comma and at most one space
// after it (the ", " of Python's json.dumps) up to the first other byte; ok
// says whether that byte came late enough (48 or more) for chunks to pay.
func spacedTokenIDChunk(dst []uint32, b *[72]byte) (out []uint32, k int, ok bool) {
	const (
		ones = 0x0101010101010101
		hi   = 0x8080808080808080
		lo7  = 0x7f7f7f7f7f7f7f7f
	)
	var commas, spaces uint64
	stop := 64 // the first byte that is not a digit, a comma or a space
	for k := 0; k < 8; k++ {
		w := binary.LittleEndian.Uint64(b[8*k:])
		l := w & lo7
		digit := (l + 0x50*ones) &^ (l + 0x46*ones) &^ w & hi
		z := w ^ ','*ones
		comma := ^(((z & lo7) + lo7) | z) & hi
		z = w ^ ' '*ones
		space := ^(((z & lo7) + lo7) | z) & hi
		commas |= gatherHigh(comma) << (8 * k)
		if space != 0 {
			spaces |= gatherHigh(space) << (8 * k)
		}
		if bad := ^(digit | comma | space) & hi; bad != 0 {
			stop = 8*k + bits.TrailingZeros64(bad)/8
			break
		}
	}
	// A space is allowed only right after a comma.
	if lone := spaces &^ (commas << 1); lone != 0 {
		stop = min(stop, bits.TrailingZeros64(lone))
	}
	commas &= 1<<uint(stop) - 1 // all ones when stop is 64
	after := spaces & (commas << 1)
	s := 0
	for commas != 0 {
		c := bits.TrailingZeros64(commas)
		commas &= commas - 1
		s += int(after>>uint(s)) & 1
		n := c - s
		w := binary.LittleEndian.Uint64(b[s&63:])
		if uint(n-1) >= 8 || (n > 1 && byte(w) == '0') {
			break
		}
		dst = append(dst, uint32(parseDigits(w, n)))
		s = c + 1
	}
	return dst, s, stop >= 48
}

// gatherHigh packs the high bits of x's bytes (x holds no other bits) into
// its low 8 bits, byte k's into bit k.
func gatherHigh(x uint64) uint64 {
	return (x >> 7) * 0x0102040810204080 >> 56
}

// leadingDigits is the number of ASCII digits w starts with, its bytes
// read little-endian (8 when all are digits). A byte b is a digit when its
// high nibble is 3 and b+6 has a high nibble of 3 too (b ≤ '9'); the +6 of
// a byte of 0xfa or more carries into the next byte, which no digit
// before it can cause, so the count of leading digits is exact.
func leadingDigits(w uint64) int {
	const hi = 0xf0f0f0f0f0f0f0f0
	ok := ^((w & hi) ^ 0x3030303030303030) & ^(((w + 0x0606060606060606) & hi) ^ 0x3030303030303030)
	// A digit's byte is now 0xfX: its high nibble all ones. Mark each
	// byte whose high nibble is not.
	return bits.TrailingZeros64(^ok&hi) / 8
}

// parseDigits is the value of the first n (1..8) digits of w (read
// little-endian, first digit lowest): shifted to the top so that the bytes
// below are leading zeros, then combined pairwise.
func parseDigits(w uint64, n int) uint64 {
	w = (w << ((64 - 8*uint(n)) & 63)) & 0x0f0f0f0f0f0f0f0f
	w = (w * 2561) >> 8
	w = ((w & 0x00ff00ff00ff00ff) * 6553601) >> 16
	return ((w & 0x0000ffff0000ffff) * 42949672960001) >> 32
}

// VisitImages calls fn with every image reference in a chat messages array
// and returns how many there were. A reference is the raw (still escaped)
// content of the URL string of a content part of type "image_url" (its
// "image_url" value, a string or {"url": ...}) or "input_image" (its
// "image_url", or failing that its "file_id"). Equal references in equal
// order mean the same images, which is all an affinity key needs; the bytes
// passed to fn are valid only during the call.
func VisitImages(messages []byte, fn func(ref []byte)) int {
	if !hasImageType(messages) {
		return 0
	}
	return visitImageParts(messages, fn)
}

// visitImageParts is VisitImages's walk over every content part.
func visitImageParts(messages []byte, fn func(ref []byte)) int {
	s := newScanner(messages)
	s.SkipWS()
	n := 0
	s.eachElement(func() bool {
		if s.B[s.I] != '{' {
			return s.Value() == nil
		}
		return s.eachMember(func(key []byte, esc bool) bool {
			if !keyEquals(key, esc, "content") || s.B[s.I] != '[' {
				return s.Value() == nil
			}
			return s.eachElement(func() bool {
				if s.B[s.I] != '{' {
					return s.Value() == nil
				}
				ref, ok := s.imagePart()
				if ok && ref != nil {
					fn(ref)
					n++
				}
				return ok
			})
		})
	})
	return n
}

// hasImageType reports whether b holds "image_url" or "input_image" raw.
// An image part's type is compared raw (imagePart), so without either there
// is no image and the walk is skipped: for a long text chat, one vectorized
// search for '_' (rare in prose) instead of a JSON scan.
func hasImageType(b []byte) bool {
	for i := 0; ; i++ {
		k := bytes.IndexByte(b[i:], '_')
		if k < 0 {
			return false
		}
		i += k
		if i >= 5 {
			switch string(b[i-5 : i]) {
			case "image":
				if bytes.HasPrefix(b[i+1:], []byte("url")) {
					return true
				}
			case "input":
				if bytes.HasPrefix(b[i+1:], []byte("image")) {
					return true
				}
			}
		}
	}
}

// imagePart reads one content part object and returns its image reference
// (nil when it is not an image part).
func (s *scanner) imagePart() (ref []byte, ok bool) {
	var typ, url, fileID []byte
	ok = s.eachMember(func(key []byte, esc bool) bool {
		c := s.B[s.I]
		switch {
		case keyEquals(key, esc, "type") && c == '"':
			st, en, _, err := s.String()
			typ = s.B[st:en]
			return err == nil
		case keyEquals(key, esc, "image_url") && c == '"':
			st, en, _, err := s.String()
			url = s.B[st:en]
			return err == nil
		case keyEquals(key, esc, "image_url") && c == '{':
			return s.eachMember(func(k []byte, kesc bool) bool {
				if keyEquals(k, kesc, "url") && s.B[s.I] == '"' {
					st, en, _, err := s.String()
					url = s.B[st:en]
					return err == nil
				}
				return s.Value() == nil
			})
		case keyEquals(key, esc, "file_id") && c == '"':
			st, en, _, err := s.String()
			fileID = s.B[st:en]
			return err == nil
		}
		return s.Value() == nil
	})
	if !ok {
		return nil, false
	}
	switch string(typ) {
	case "image_url":
		return url, true
	case "input_image":
		if url != nil {
			return url, true
		}
		return fileID, true
	}
	return nil, true
}

// eachElement walks the array at s.I, calling fn with s.I on each element;
// fn must consume the element. It reports whether the walk completed.
func (s *scanner) eachElement(fn func() bool) bool { return s.Elements(fn) }

// eachMember walks the object at s.I, calling fn with each key's raw
// content and s.I on its value; fn must consume the value.
func (s *scanner) eachMember(fn func(key []byte, escaped bool) bool) bool {
	return s.Members(func(ks, ke int, kesc bool) bool { return fn(s.B[ks:ke], kesc) })
}
