package kvd

// Entry points for the tiers and listeners outside this package (the RESP
// listener in kvd/resp, the Redis tier in kvd/l4): a delete across RAM and
// L3, a copy of a hit that is checked against a concurrent rewrite, and
// the composite key's parts.

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

// SlotWrite is an arena slot a listener fills in place and then stores
// under a key, so a large value read from a socket goes straight into its
// slot (the RESP listener's large SET): BeginWrite takes the slot for a
// value's length, CommitWrite stores it, AbortWrite gives it back. Until
// CommitWrite the slot is nobody's value (leased, its version odd) and the
// key keeps its previous value. A SlotWrite belongs to one goroutine.
type SlotWrite struct {
	slot   int // the slot's offset in the arena
	length int // the value's length; 0: no slot held
}

// Held reports whether w holds a slot (between BeginWrite and
// CommitWrite or AbortWrite).
func (w *SlotWrite) Held() bool { return w.length > 0 }

// BeginWrite takes an arena slot for a value of length bytes stored with
// retention (wire name; nil = short), evicting as a Set of that retention
// would, and returns the slot's payload to fill. ok is false when the value
// cannot go to the arena or no slot is free for it (a Set of the value then
// gives the reason).
func (s *Store) BeginWrite(w *SlotWrite, length int, retention []byte) (payload []byte, ok bool) {
	ret, ok := parseRetentionDefault(retention)
	if !ok || s.sl == nil || length <= 0 || w.Held() {
		return nil, false
	}
	cls := s.sl.classFor(length)
	if cls < 0 {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	base, ok := s.allocSlot(cls, ret)
	if !ok {
		return nil, false
	}
	beginWrite(s.arena.mem, base)
	*w = SlotWrite{slot: base, length: length}
	return s.arena.mem[base+HeaderBytes : base+HeaderBytes+length : base+HeaderBytes+length], true
}

// CommitWrite stores w's filled slot under a's key with a's retention and
// TTL (a.Value is not used), as Set stores a value; the slot is given back
// when the set is refused (or, as Set does, acked without storing for a
// TTL ≤ 0). w holds nothing afterwards.
func (s *Store) CommitWrite(w *SlotWrite, a *SetArgs) (bool, string) {
	if !w.Held() {
		return false, ReasonBadSize
	}
	ret, ok := parseRetentionDefault(a.Retention)
	reason := ""
	switch {
	case !ok:
		reason = ReasonBadRetention
	case len(a.Key) == 0:
		reason = ReasonEmptyKey
	case a.HasTTL && a.TTL <= 0:
		s.AbortWrite(w)
		return true, "" // the reference acks and does not store
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	slot, length := w.slot, w.length
	*w = SlotWrite{}
	s.c.Sets++
	if reason == "" {
		var expires int64
		if a.HasTTL {
			expires = s.nowNs() + int64(min(a.TTL, maxTTLSeconds)*1e9)
		}
		s.kb = Composite(s.kb, a.Model, a.CompatKey, a.Key)
		endWrite(s.arena.mem, slot, length)
		if ok, reason = s.publishLocked(a.Model, a.CompatKey, slot, length, ret, expires, false); ok {
			return true, ""
		}
	} else {
		s.releaseLocked(slot)
	}
	s.c.Rejected++
	return false, reason
}

// AbortWrite gives w's slot back unused; nothing when w holds none.
func (s *Store) AbortWrite(w *SlotWrite) {
	if !w.Held() {
		return
	}
	s.mu.Lock()
	s.releaseLocked(w.slot)
	s.mu.Unlock()
	*w = SlotWrite{}
}

// parseRetentionDefault is ParseRetention with nil meaning short.
func parseRetentionDefault(b []byte) (Retention, bool) {
	if b == nil {
		return RetentionShort, true
	}
	return ParseRetention(b)
}
