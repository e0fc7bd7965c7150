package servetest

import (
	"context"
	"net"
	"testing"
)

// Serve is the shape every in-process server's Serve method has.
type Serve func(ctx context.Context, ln net.Listener) error

// Run serves on ln until the test ends; at cleanup it cancels the
// server's context, waits for serve to return and reports its error. L is
// the listener type serve takes (kvd's socket server takes a
// *net.UnixListener).
func Run[L net.Listener](t testing.TB, name string, ln L, serve func(context.Context, L) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: serve: %v", name, err)
		}
	})
}

// Loopback listens on a free 127.0.0.1 TCP port, serves on it as Run
// does and returns the address.
func Loopback(t testing.TB, name string, serve Serve) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("%s: listen: %v", name, err)
	}
	Run(t, name, ln, serve)
	return ln.Addr().String()
}
