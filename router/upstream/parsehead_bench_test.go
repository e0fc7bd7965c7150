package upstream

import "testing"

// BenchmarkParseHead: the exchange's own parse of an engine's answer
// head, unary (Date, Content-Type, Content-Length) and a stream's
// (Date, Content-Type, Transfer-Encoding).
func BenchmarkParseHead(b *testing.B) {
	heads := map[string][]byte{
		"unary":  []byte("HTTP/1.1 200 OK\r\n" + simDate + "Content-Type: application/json\r\nContent-Length: 300\r\n\r\n"),
		"stream": []byte(chunkedHead[:len("HTTP/1.1 200 OK\r\n")] + simDate + chunkedHead[len("HTTP/1.1 200 OK\r\n"):]),
	}
	for _, kind := range []string{"unary", "stream"} {
		b.Run(kind, func(b *testing.B) {
			data := heads[kind]
			for b.Loop() {
				if _, ok := parseHead(data); !ok {
					b.Fatal("not parsed")
				}
			}
		})
	}
}
