package openai

import "bytes"

// NextEvent returns the length of the first complete server-sent event in
// buf, including the blank line that ends it, or -1 when buf holds no
// complete event yet.
//
// Lines end with "\r\n", "\n" or "\r" (the SSE grammar) and an event ends at
// an empty line, so "\n\n", "\r\n\r\n", "\r\r" and their mixes all end one.
// A "\r" as the very last byte of buf ends its line at once: waiting for a
// possible "\n" would stall streams that use bare "\r", and if the "\n" does
// arrive it merely starts the next chunk as an empty line, which a relay
// forwards unchanged.
func NextEvent(buf []byte) int {
	// nl is the absolute index of the next '\n' at or after i, or len(buf)
	// when there is none; it is kept across lines so that a stream of bare
	// "\r" lines is not rescanned to its end for every line.
	nl := -1
	for i := 0; i < len(buf); {
		if nl < i {
			nl = bytes.IndexByte(buf[i:], '\n')
			if nl < 0 {
				nl = len(buf)
			} else {
				nl += i
			}
		}
		// Engines end lines with "\n", found above with the vectorised
		// IndexByte; a bare "\r" is then looked for only within the line.
		var j int // index just past this line's terminator
		if cr := bytes.IndexByte(buf[i:nl], '\r'); cr >= 0 {
			j = i + cr + 1
			if j < len(buf) && buf[j] == '\n' {
				j++
			}
		} else if nl < len(buf) {
			j = nl + 1
		} else {
			return -1
		}
		// The line starting at j is empty if a terminator follows at once.
		if j < len(buf) {
			switch buf[j] {
			case '\n':
				return j + 1
			case '\r':
				if j+1 < len(buf) && buf[j+1] == '\n' {
					return j + 2
				}
				return j + 1
			}
		}
		i = j
	}
	return -1
}
