package kvd

// The Store's calls for the listeners and tiers outside this package (the
// RESP listener in kvd/resp, the remote tiers in kvd/l4): a delete across
// RAM and L3, a copy of a hit that is checked against a concurrent
// rewrite, and the composite key's parts. A value written in place into
// its slot is slotwrite.go.

// Delete removes a key from RAM and, when there is one, from the L3 tier
// (an L3 below it, such as the Redis tier, deletes there too). It reports
// whether the key was present in RAM or L3.
func (s *Store) Delete(model, compat, key []byte, sc *Scratch) bool {
	s.mu.Lock()
	s.kb = Composite(s.kb, model, compat, key)
	e := s.lookup(s.nowNs())
	if e != nil {
		s.removeLocked(e)
	}
	s.mu.Unlock()
	found := e != nil
	if s.opt.Long == nil {
		return found
	}
	if sc == nil {
		sc = &Scratch{}
	}
	sc.Key = Composite(sc.Key, model, compat, key)
	if s.opt.Long.Exists(sc.Key) {
		found = true
	}
	if err := s.opt.Long.Delete(sc.Key); err != nil {
		s.log.Warn().Err(err).Msg("l3 delete failed")
	}
	return found
}

// AppendHit appends a hit's value to dst: inline bytes as they are, an
// arena slot's bytes copied out and then checked against a rewrite that
// raced the copy (ok false: treat as a miss, dst is returned unchanged).
func (s *Store) AppendHit(dst []byte, h Hit) (out []byte, ok bool) {
	if !h.Found {
		return dst, false
	}
	if !h.Arena {
		return append(dst, h.Inline...), true
	}
	n := len(dst)
	dst = append(dst, s.arena.mem[h.Offset:h.Offset+h.Length]...)
	if !s.StillValid(h) {
		return dst[:n], false
	}
	return dst, true
}

// SplitComposite is the inverse of Composite: the model, compat_key and
// key of a store (and L3) key; ok is false for a malformed key.
func SplitComposite(k []byte) (model, compat, key []byte, ok bool) {
	return splitComposite(k)
}

// parseRetentionDefault is ParseRetention with nil meaning short.
func parseRetentionDefault(b []byte) (Retention, bool) {
	if b == nil {
		return RetentionShort, true
	}
	return ParseRetention(b)
}
