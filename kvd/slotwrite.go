package kvd

// A value written in place: a listener reads a large value straight into
// its arena slot, then stores it under its key.

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
