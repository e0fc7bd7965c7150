package servetest

import (
	"context"
	"net"
	"sync"
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
	Start(t, name, ln, serve)
}

// Server is a server Start runs; a test may stop it before it ends.
type Server struct {
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	err    error
}

// Start is Run for a test that also stops the server itself (Stop) or
// watches it end on its own (Done).
func Start[L net.Listener](t testing.TB, name string, ln L, serve func(context.Context, L) error) *Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cancel: cancel, done: make(chan struct{})}
	go func() {
		s.err = serve(ctx, ln)
		close(s.done)
	}()
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("%s: serve: %v", name, err)
		}
	})
	return s
}

// Stop cancels the server's context, waits for serve to return and
// returns its error; later calls return the same error.
func (s *Server) Stop() error {
	s.once.Do(func() {
		s.cancel()
		<-s.done
	})
	return s.err
}

// Done is closed when serve has returned; Err then holds its error.
func (s *Server) Done() <-chan struct{} { return s.done }

// Err is serve's error once Done is closed.
func (s *Server) Err() error {
	<-s.done
	return s.err
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
