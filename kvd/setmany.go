package kvd

// SetManyArgs is one all-or-nothing set of several keys (RESP's MSET):
// Pairs is key, value, key, value, … in one namespace and retention, no
// TTL. Keep one per caller and reuse it: its scratch makes a set of keys
// that exist allocate nothing.
type SetManyArgs struct {
	Model, CompatKey []byte
	Pairs            [][]byte
	Retention        []byte // wire name; nil = short
	slots            []int  // arena slot per pair (-1: inline), under the call
}

// SetMany stores every pair of a.Pairs or none: when one value cannot be
// stored (empty key, retention downgrade, too large, no room without
// displacing higher retention) nothing is stored and the reason is the
// first refusal's. Room is found (evicting lower or equal retention, as a
// Set does) and every arena slot is taken before the first key is
// published, and all keys are published under one hold of the mutex, so
// no reader sees some of the pairs and not the others. A later pair of the
// same key wins, as in Redis.
func (s *Store) SetMany(a *SetManyArgs) (bool, string) {
	ret := RetentionShort
	if a.Retention != nil {
		r, ok := ParseRetention(a.Retention)
		if !ok {
			return false, ReasonBadRetention
		}
		ret = r
	}
	n := len(a.Pairs) / 2
	s.mu.Lock()
	defer s.mu.Unlock()
	s.c.Sets += int64(n)
	ok, reason := s.setManyLocked(a, ret)
	if !ok {
		s.c.Rejected += int64(n)
	}
	return ok, reason
}

func (s *Store) setManyLocked(a *SetManyArgs, ret Retention) (bool, string) {
	n := len(a.Pairs) / 2
	if reason := s.checkManyLocked(a, ret); reason != "" {
		return false, reason
	}
	// Every arena slot first (leased: no eviction takes them meanwhile).
	a.slots = a.slots[:0]
	unlocked := false
	for i := range n {
		v := a.Pairs[2*i+1]
		slot := -1
		if s.sl != nil {
			if cls := s.sl.classFor(len(v)); cls >= 0 {
				var ok bool
				if slot, ok = s.allocSlot(cls, ret); !ok {
					s.releaseMany(a.slots, false)
					return false, ReasonDisplaceHigher
				}
				unlocked = unlocked || len(v) >= unlockedCopyBytes
			}
		}
		a.slots = append(a.slots, slot)
	}
	// The values into their slots: large ones without the mutex (the
	// slots are leased to this call), then the checks again, since other
	// writers ran meanwhile.
	if unlocked {
		s.mu.Unlock()
	}
	for i, slot := range a.slots {
		if slot >= 0 {
			v := a.Pairs[2*i+1]
			beginWrite(s.arena.mem, slot)
			copy(s.arena.mem[slot+HeaderBytes:], v)
			endWrite(s.arena.mem, slot, len(v))
		}
	}
	if unlocked {
		s.mu.Lock()
		if reason := s.checkManyLocked(a, ret); reason != "" {
			s.releaseMany(a.slots, true)
			return false, reason
		}
	}
	// Room for the inline values, counting a replaced value as still held
	// (it may be evicted to make the room, which is what a Set does).
	var inline int64
	for i, slot := range a.slots {
		if slot < 0 {
			inline += int64(len(a.Pairs[2*i+1]))
		}
	}
	for s.inlineBytes+inline > s.inlineBudget {
		if !s.evictLocked(&s.inlineLRU, ret) {
			s.releaseMany(a.slots, true)
			return false, ReasonDisplaceHigher
		}
	}
	now := s.nowNs()
	for i, slot := range a.slots {
		key, v := a.Pairs[2*i], a.Pairs[2*i+1]
		s.kb = Composite(s.kb, a.Model, a.CompatKey, key)
		// An overwrite reuses the replaced entry, as putLocked does.
		e := s.lookup(now)
		if e != nil {
			s.removeLocked(e)
		} else {
			e = &entry{key: string(s.kb)}
		}
		*e = entry{key: e.key, nsLen: 4 + len(a.Model) + len(a.CompatKey), ret: ret, slot: slot, length: len(v)}
		if slot >= 0 {
			s.arenaBytes += int64(len(v))
			s.arenaEntries++
		} else {
			e.inline = append(make([]byte, 0, len(v)), v...)
			s.inlineBytes += int64(len(v))
		}
		s.index[e.key] = e
		if slot >= 0 {
			s.sl.own(e, true)
		}
		s.touch(e)
		if ret == RetentionLong {
			s.writeThroughLocked(e.key)
		}
	}
	return true, ""
}

// checkManyLocked is the refusals that do not depend on room: an empty
// key, a value larger than any room, a downgrade of a stored key's
// retention.
func (s *Store) checkManyLocked(a *SetManyArgs, ret Retention) string {
	now := s.nowNs()
	for i := 0; i+1 < len(a.Pairs); i += 2 {
		key, v := a.Pairs[i], a.Pairs[i+1]
		if len(key) == 0 {
			return ReasonEmptyKey
		}
		if (s.sl == nil || s.sl.classFor(len(v)) < 0) && int64(len(v)) > s.inlineBudget {
			return ReasonLargerThanStore
		}
		s.kb = Composite(s.kb, a.Model, a.CompatKey, key)
		if old := s.lookup(now); old != nil && ret < old.ret {
			return ReasonDowngrade
		}
	}
	return ""
}

// releaseMany gives back the slots taken for a refused SetMany; written
// says their versions were moved (beginWrite) and must end even.
func (s *Store) releaseMany(slots []int, written bool) {
	for _, slot := range slots {
		if slot < 0 {
			continue
		}
		if written {
			s.releaseLocked(slot)
		} else {
			s.sl.release(slot, nil, true)
		}
	}
}
