package tablespace

import (
	"errors"
	"fmt"
	"strings"
)

// DeletePrefix removes, durably, every entry whose key starts with prefix
// and returns how many it removed. kvd clears one namespace with it: its
// keys are the namespace's composite prefix followed by the key. Each
// removal is journalled like Delete, so a crash after DeletePrefix returns
// never brings one back; an entry put under the prefix while DeletePrefix
// runs may survive it, as it would a Delete issued just before the Put.
func (t *Tablespace) DeletePrefix(prefix []byte) (int, error) {
	if t.closed.Load() {
		return 0, ErrClosed
	}
	p := string(prefix)
	n := 0
	var errs []error
	for _, s := range t.shards {
		s.mu.Lock()
		var keys []string
		for k := range s.index {
			if strings.HasPrefix(k, p) {
				keys = append(keys, k)
			}
		}
		s.mu.Unlock()
		for _, k := range keys {
			if err := s.delete([]byte(k)); err != nil {
				errs = append(errs, fmt.Errorf("tablespace delete prefix %s: %w", s.dir, err))
				break
			}
			n++
		}
	}
	return n, errors.Join(errs...)
}
