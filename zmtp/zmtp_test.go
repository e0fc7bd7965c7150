package zmtp

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestLimitConnScan(t *testing.T) {
	c := &LimitConn{Max: 300, greeting: GreetingLen}
	stream := make([]byte, GreetingLen)
	stream = append(stream, 0x04, 3, 'a', 'b', 'c')          // short command frame
	stream = append(stream, 0x03, 0, 0, 0, 0, 0, 0, 1, 0x2c) // long frame of 300, more
	stream = append(stream, make([]byte, 300)...)            //
	stream = append(stream, 0x00, 0)                         // empty final frame
	for i := range stream {                                  // byte by byte: worst split
		if err := c.Scan(stream[i : i+1]); err != nil {
			t.Fatalf("byte %d: %v", i, err)
		}
	}
	if err := c.Scan([]byte{0x02, 0, 0, 0, 0, 0, 0, 1, 0x2d}); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("301-byte frame: %v", err)
	}
	c = &LimitConn{Max: 1 << 20}
	if err := c.Scan([]byte{0x02, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("huge frame: %v", err)
	}
}

func TestEndpoints(t *testing.T) {
	if got, err := DialAddr("tcp://10.0.0.5:5557"); err != nil || got != "10.0.0.5:5557" {
		t.Errorf("DialAddr: %q %v", got, err)
	}
	for _, ep := range []string{"ipc:///x", "tcp://*:5557", "tcp://:5557", "tcp://h:0", "tcp://h:x", "tcp://h"} {
		if _, err := DialAddr(ep); !errors.Is(err, ErrBadEndpoint) {
			t.Errorf("DialAddr(%q): %v", ep, err)
		}
	}
	if got, err := RankEndpoint("tcp://[::1]:5557", 2); err != nil || got != "tcp://[::1]:5559" {
		t.Errorf("RankEndpoint: %q %v", got, err)
	}
	if _, err := RankEndpoint("tcp://h:65535", 1); !errors.Is(err, ErrBadEndpoint) {
		t.Errorf("RankEndpoint past the range: %v", err)
	}
}

func TestReaderRoundTrip(t *testing.T) {
	var b []byte
	b = AppendSeqMsg(b, []byte("topic"), 7, bytes.Repeat([]byte{'x'}, 300))
	b = AppendFrame(b, FlagCommand, []byte("\x04PING\x00\x0actx"))
	z := Reader{R: bufio.NewReader(bytes.NewReader(b)), MaxFrame: 1 << 10, MaxFrames: 4}
	frames, scratch, cmd, err := z.ReadMsg(nil, nil)
	if err != nil || cmd || len(frames) != 3 || string(frames[0]) != "topic" || Seq(frames[1]) != 7 || len(frames[2]) != 300 {
		t.Fatalf("message: %q %v %v", frames, cmd, err)
	}
	frames, _, cmd, err = z.ReadMsg(frames, scratch)
	if err != nil || !cmd || len(frames) != 1 {
		t.Fatalf("command: %q %v %v", frames, cmd, err)
	}
	if pong := PongFor(frames[0]); !bytes.Equal(pong, AppendFrame(nil, FlagCommand, []byte("\x04PONGctx"))) {
		t.Fatalf("pong %q", pong)
	}
	if _, _, _, err := z.ReadMsg(nil, nil); !errors.Is(err, io.EOF) {
		t.Fatalf("end: %v", err)
	}
	small := Reader{R: bufio.NewReader(bytes.NewReader(AppendFrame(nil, 0, make([]byte, 20)))), MaxFrame: 10, MaxFrames: 4}
	if _, _, _, err := small.ReadMsg(nil, nil); !errors.Is(err, ErrProtocol) {
		t.Fatalf("large frame: %v", err)
	}
	many := AppendFrame(AppendFrame(nil, FlagMore, nil), 0, nil)
	one := Reader{R: bufio.NewReader(bytes.NewReader(many)), MaxFrame: 10, MaxFrames: 1}
	if _, _, _, err := one.ReadMsg(nil, nil); !errors.Is(err, ErrProtocol) {
		t.Fatalf("too many frames: %v", err)
	}
}

// FuzzReader feeds arbitrary bytes to the frame reader and the handshake
// limit: neither may panic, and the reader keeps within its frame-count
// and frame-size bounds.
func FuzzReader(f *testing.F) {
	f.Add(AppendSeqMsg(nil, []byte("kv"), 1, []byte("payload")))
	f.Add([]byte{0x02, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x01, 0x00, 0x01, 0x00, 0x00, 0x01, 'x'})
	f.Fuzz(func(t *testing.T, b []byte) {
		z := Reader{R: bufio.NewReader(bytes.NewReader(b)), MaxFrame: 1 << 12, MaxFrames: 8}
		var frames [][]byte
		var scratch []byte
		for {
			var err error
			frames, scratch, _, err = z.ReadMsg(frames, scratch)
			if err != nil {
				break
			}
			if len(frames) > 8 || cap(scratch) > 8*(1<<12)+len(b) {
				t.Fatalf("bounds: %d frames, %d scratch", len(frames), cap(scratch))
			}
		}
		c := LimitConn{Max: 1 << 12, greeting: GreetingLen}
		_ = c.Scan(b)
	})
}
