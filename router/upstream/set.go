package upstream

import "sync"

// Set tracks open upstream connections so that shutdown can cut the
// streams still running when its grace period ends. The zero Set is ready.
type Set struct {
	mu     sync.Mutex
	conns  map[*Conn]struct{}
	closed bool
}

func (s *Set) add(c *Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.conns == nil {
		s.conns = make(map[*Conn]struct{})
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Set) remove(c *Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Len is the number of open connections in the set.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
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
