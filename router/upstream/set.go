package upstream

import (
	"net"
	"sync"
)

// Set tracks open upstream connections so that shutdown can cut the
// streams still running when its grace period ends. The zero Set is ready.
type Set struct {
	mu      sync.Mutex
	conns   map[*Conn]struct{}
	byLocal map[net.Addr]*Conn // by local address: how a response finds its connection
	closed  bool
}

func (s *Set) add(c *Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.conns == nil {
		s.conns = make(map[*Conn]struct{})
		s.byLocal = make(map[net.Addr]*Conn)
	}
	s.conns[c] = struct{}{}
	s.byLocal[c.local] = c
	return true
}

func (s *Set) remove(c *Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	if s.byLocal[c.local] == c {
		delete(s.byLocal, c.local)
	}
	s.mu.Unlock()
}

// Lookup returns the connection a response came over: fasthttp records the
// connection's local address in the response (the same net.Addr value the
// connection returns, which is the map key), and exposes nothing else of it.
func (s *Set) Lookup(local net.Addr) *Conn {
	if local == nil {
		return nil
	}
	s.mu.Lock()
	c := s.byLocal[local]
	s.mu.Unlock()
	return c
}

// CloseAll closes every tracked connection and refuses new ones; it
// returns how many it closed.
func (s *Set) CloseAll() int {
	s.mu.Lock()
	s.closed = true
	conns := make([]*Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	return len(conns)
}
