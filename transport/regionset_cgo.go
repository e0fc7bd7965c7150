//go:build (mooncake || mori) && cgo

package transport

import "fmt"

// regionSet holds the distinct local regions of a batch for its duration
// (each once: RWMutex read locks must not nest).
type regionSet struct{ rs []*Region }

// acquire holds every op's local region, or none and ErrNotRegistered.
func (s *regionSet) acquire(ops []Op) error {
	s.rs = s.rs[:0]
next:
	for i := range ops {
		r := ops[i].Local
		for _, h := range s.rs {
			if h == r {
				continue next
			}
		}
		if !r.acquire() {
			s.release()
			return fmt.Errorf("local region %q: %w", r.name, ErrNotRegistered)
		}
		s.rs = append(s.rs, r)
	}
	return nil
}

func (s *regionSet) release() {
	for i, r := range s.rs {
		r.release()
		s.rs[i] = nil
	}
	s.rs = s.rs[:0]
}

// drain empties the list, returning what it held.
func (f *freeList[T]) drain() []*T {
	f.mu.Lock()
	defer f.mu.Unlock()
	items := f.items
	f.items = nil
	return items
}
