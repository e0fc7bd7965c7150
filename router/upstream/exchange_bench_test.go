package upstream

import (
	"bytes"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// answerServer is a worker of plain sockets: every request ending in "{}"
// gets a 5-byte JSON answer; accepted counts its connections.
func answerServer(tb testing.TB, accepted *atomic.Int64) string {
	return serveEach(tb, func(c net.Conn) {
		accepted.Add(1)
		answer := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\nwhole")
		buf := make([]byte, 0, 4096)
		for {
			if len(buf) == cap(buf) {
				return
			}
			n, err := c.Read(buf[len(buf):cap(buf)])
			if err != nil {
				return
			}
			buf = buf[:len(buf)+n]
			for {
				end := bytes.Index(buf, []byte("\r\n\r\n{}"))
				if end < 0 {
					break
				}
				if _, err := c.Write(answer); err != nil {
					return
				}
				buf = buf[:copy(buf, buf[end+6:])]
			}
		}
	})
}

// unaryExchange returns run, one unary exchange of a POST of {} to addr
// (answerServer's) on an exchange of its own, its request and answer
// reused by every run, and done, which releases them.
func unaryExchange(hc *Pool, addr string) (run func() error, done func()) {
	x := new(Exchange)
	req := fasthttp.AcquireRequest()
	req.Header.SetHost(addr)
	req.Header.SetRequestURI("/whole")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetBodyString("{}")
	resp := fasthttp.AcquireResponse()
	run = func() error {
		resp.Reset()
		x.Begin()
		if err := x.Do(hc, req, resp, time.Now().Add(5*time.Second), nil); err != nil {
			return err
		}
		if string(resp.Body()) != "whole" {
			return errors.New("unexpected answer " + string(resp.Body()))
		}
		return nil
	}
	return run, func() { fasthttp.ReleaseRequest(req); fasthttp.ReleaseResponse(resp) }
}

// BenchmarkExchangeUnary is a unary exchange (a 5-byte answer) on a
// worker's pool of connections Dial made: one exchange at a time on one
// connection, and 64 at once over 64 connections, as serve's upstream
// side runs under 64 client connections (each connection's reader and
// writer then another's, not the one a pool kept hot).
func BenchmarkExchangeUnary(b *testing.B) {
	for _, conns := range []int{1, 64} {
		b.Run("conns="+strconv.Itoa(conns), func(b *testing.B) {
			var accepted atomic.Int64
			addr := answerServer(b, &accepted)
			var set Set
			defer set.CloseAll()
			hc := exchangeClient(&set, addr, func(c *PoolConfig) {
				c.MaxConns = conns
				c.MaxConnWait = time.Second
			})
			defer hc.Close()
			exchange := func(pb func() bool) {
				run, done := unaryExchange(hc, addr)
				defer done()
				for pb() {
					if err := run(); err != nil {
						b.Error(err)
						return
					}
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			if conns == 1 {
				i := 0
				exchange(func() bool { i++; return i <= b.N })
				return
			}
			b.SetParallelism((conns + 1) / 2) // GOMAXPROCS 2: 64 goroutines
			b.RunParallel(func(pb *testing.PB) { exchange(pb.Next) })
		})
	}
}
