package tokenizer

// byteToRune is GPT-2's reversible byte → printable rune map used by the
// ByteLevel pre-tokenizer and decoder: printable Latin-1 bytes map to
// themselves and the rest to U+0100 upwards, in byte order.
var byteToRune, runeToByte = func() ([256]rune, map[rune]byte) {
	var fwd [256]rune
	back := make(map[rune]byte, 256)
	n := rune(0)
	for b := range 256 {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			fwd[b] = rune(b)
		} else {
			fwd[b] = 256 + n
			n++
		}
		back[fwd[b]] = byte(b)
	}
	return fwd, back
}()

// byteLevelDecode turns a vocabulary string written in the byte-level alphabet
// back into raw bytes. ok is false when a rune is outside that alphabet (the
// string is then used verbatim, as Hugging Face's ByteLevel decoder does).
func byteLevelDecode(tok string) (raw []byte, ok bool) {
	raw = make([]byte, 0, len(tok))
	for _, r := range tok {
		b, found := runeToByte[r]
		if !found {
			return nil, false
		}
		raw = append(raw, b)
	}
	return raw, true
}
