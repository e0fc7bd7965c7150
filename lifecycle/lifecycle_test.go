package lifecycle_test

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/infera/infera/lifecycle"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
	)
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// get sends one GET / with Connection: close and returns the whole answer
// (no client pool left behind).
func get(addr string) (string, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

// A context cancelled before the server registered its listener must not
// leave Serve running (it hung before: fasthttp's Shutdown saw no
// listener). 100 runs, each must return; a hang fails by the test timeout.
func TestServeCancelledContextReturns(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 100 {
		ln := listen(t)
		srv := &fasthttp.Server{CloseOnShutdown: true, Handler: func(*fasthttp.RequestCtx) {}}
		if err := lifecycle.Serve(ctx, srv, ln, lifecycle.Options{Grace: time.Second}); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			_ = c.Close()
			t.Fatalf("run %d: listener still accepts after Serve returned", i)
		}
	}
}

func TestServeServesUntilCancelled(t *testing.T) {
	ln := listen(t)
	srv := &fasthttp.Server{CloseOnShutdown: true, Handler: func(c *fasthttp.RequestCtx) { c.SetBodyString("ok") }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- lifecycle.Serve(ctx, srv, ln, lifecycle.Options{Grace: time.Second}) }()
	if resp, err := get(ln.Addr().String()); err != nil || !strings.HasPrefix(resp, "HTTP/1.1 200") || !strings.HasSuffix(resp, "ok") {
		t.Fatalf("get: %q %v", resp, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A request still running when the grace ends triggers Overdue, which may
// cut it; Serve then returns.
func TestServeOverdue(t *testing.T) {
	ln := listen(t)
	release := make(chan struct{})
	entered := make(chan struct{})
	srv := &fasthttp.Server{CloseOnShutdown: true, Handler: func(*fasthttp.RequestCtx) {
		close(entered)
		<-release
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	overdue := make(chan struct{})
	go func() {
		done <- lifecycle.Serve(ctx, srv, ln, lifecycle.Options{Grace: 10 * time.Millisecond, Overdue: func() {
			close(overdue)
			close(release)
		}})
	}()
	got := make(chan error, 1)
	go func() {
		_, err := get(ln.Addr().String())
		got <- err
	}()
	<-entered
	cancel()
	<-overdue
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	<-got
}

func TestServeAcceptFailure(t *testing.T) {
	ln := listen(t)
	_ = ln.Close()
	err := lifecycle.Serve(context.Background(), &fasthttp.Server{}, failingListener{ln}, lifecycle.Options{})
	if !errors.Is(err, lifecycle.ErrServe) {
		t.Fatalf("err = %v, want ErrServe", err)
	}
}

type failingListener struct{ net.Listener }

var errAccept = errors.New("accept broke")

func (failingListener) Accept() (net.Conn, error) { return nil, errAccept }

func TestStackStopsInReverse(t *testing.T) {
	var st lifecycle.Stack
	var order []int
	for i := range 3 {
		st.Push(func() error {
			order = append(order, i)
			if i == 1 {
				return errAccept
			}
			return nil
		})
	}
	if err := st.Stop(); !errors.Is(err, errAccept) {
		t.Fatalf("err = %v", err)
	}
	if !slices.Equal(order, []int{2, 1, 0}) {
		t.Fatalf("order = %v", order)
	}
	if err := st.Stop(); err != nil || len(order) != 3 {
		t.Fatalf("second stop: %v %v", err, order)
	}
}
