package kvd

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rs/zerolog"
)

// daemon is an in-process kvd on a temporary socket.
type daemon struct {
	store *Store
	srv   *Server
	path  string
}

type daemonOpts struct {
	arenaBytes int64 // 0: no arena
	maxBytes   int64
	long       LongStore
	serverOpt  ServerOptions
	storeOpt   func(*StoreOptions)
}

func startDaemon(t testing.TB, o daemonOpts) *daemon {
	t.Helper()
	if o.maxBytes == 0 {
		o.maxBytes = max(o.arenaBytes, 1<<20)
	}
	so := StoreOptions{MaxBytes: o.maxBytes, Long: o.long, LongNotFound: errMemNotFound, Log: zerolog.Nop()}
	if o.arenaBytes > 0 {
		a, _, err := OpenArena(o.arenaBytes, false, false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		so.Arena = a
	}
	if o.storeOpt != nil {
		o.storeOpt(&so)
	}
	st, err := NewStore(so)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kvd.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(st, o.serverOpt)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		st.Close()
	})
	return &daemon{store: st, srv: srv, path: path}
}

func dial(t testing.TB, d *daemon, o ClientOptions) *Client {
	t.Helper()
	if o.ClientID == "" {
		o.ClientID = t.Name()
	}
	c, err := Dial(context.Background(), d.path, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var errMemNotFound = errors.New("mem: not found")

// memLong is an in-memory LongStore with the tablespace's contract, so the
// store's L3 paths (write-through, promotion, prefetch) are tested without
// the tablespace package.
type memLong struct {
	mu   sync.Mutex
	m    map[string][]byte
	puts int
}

func newMemLong() *memLong { return &memLong{m: map[string][]byte{}} }

func (l *memLong) Put(k, v []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[string(k)] = append([]byte(nil), v...)
	l.puts++
	return nil
}

func (l *memLong) Get(k, dst []byte) ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.m[string(k)]
	if !ok {
		return dst, errMemNotFound
	}
	return append(dst[:0], v...), nil
}

func (l *memLong) Exists(k []byte) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.m[string(k)]
	return ok
}

func (l *memLong) Delete(k []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, string(k))
	return nil
}

func (l *memLong) Clear() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.m)
	return nil
}

func (l *memLong) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

func (l *memLong) UsedBytes() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for _, v := range l.m {
		n += int64(len(v))
	}
	return n
}

func (l *memLong) Close() error { return nil }
